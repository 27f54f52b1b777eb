//! Arbitrary bytes as source-log lines: `Event::parse_line` and
//! `source::Validator::check` must never panic, and what they accept must
//! survive the journal's serde round trip and really apply.
#![no_main]

use std::sync::Arc;

use libfuzzer_sys::fuzz_target;
use stagefs::catalog::Tree;
use stagefs::event::Event;
use stagefs::source::{Validator, Verdict};

/// A warehouse for the fuzzed lines to act on: ids 1..=3.
const PRELUDE: [&str; 3] = [
    r#"{"id": 1, "op": "create_database", "db": "d"}"#,
    r#"{"id": 2, "op": "create_table", "db": "d", "table": "t", "partition_keys": ["p"]}"#,
    r#"{"id": 3, "op": "add_files", "db": "d", "table": "t", "partition": {"p": "a"}, "files": [{"path": "d/t/p=a/f", "size": 1, "sha256": "ca978112ca1bbdcafac231b39a23dc4da786eff8147c4e72b9807785afee48bb"}]}"#,
];

/// One native log line, parsed then validated as the native source does.
fn check(v: &mut Validator, bytes: &[u8], n: u64) -> Result<Verdict, String> {
    let event = Event::parse_line(bytes).map_err(|e| e.to_string())?;
    v.check(event, Some("log-000001.jsonl".to_owned()), Some(n))
        .map_err(|r| r.to_string())
}

fuzz_target!(|data: &[u8]| {
    // The whole input as one line.
    if let Ok(e) = Event::parse_line(data) {
        let json = serde_json::to_vec(&e).expect("an accepted event serialises");
        let back: Event = serde_json::from_slice(&json).expect("and deserialises");
        assert_eq!(back, e, "journal round trip");
    }
    // The input as a sequence of lines after a small prelude.
    let mut v = Validator::new(Arc::new(Tree::empty()));
    for (i, l) in PRELUDE.iter().enumerate() {
        match check(&mut v, l.as_bytes(), i as u64 + 1) {
            Ok(Verdict::Accepted(_)) => {}
            _ => panic!("prelude rejected"),
        }
    }
    for (i, l) in data.split(|b| *b == b'\n').enumerate().take(64) {
        let before = v.last_id();
        match check(&mut v, l, i as u64 + 4) {
            Ok(Verdict::Accepted(a)) => {
                let e = &a.event;
                assert!(e.id > before, "accepted an id that does not increase");
                assert_eq!(v.last_id(), e.id);
                assert_eq!(v.latest().state_id, e.id);
            }
            Ok(Verdict::Duplicate) => assert_eq!(v.last_id(), before),
            Err(r) => assert_eq!(v.last_id(), before, "a rejection changed the state: {r}"),
        }
    }
});
