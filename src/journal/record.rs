//! What one journal record holds: the accepted event and the source's
//! [`Position`] after it ([`JournalEntry`]), as JSON.
//!
//! Ingest encodes (from the event's bytes already serialised for the
//! validator, [`journal_payload`], or from the event, [`encode_entry`]);
//! the stager, recovery and bootstrap decode ([`JournalEntry::decode`]).
//! The journal itself stores payloads as opaque bytes: this format is its
//! callers' agreement, kept here so that each of them reads the same.
//!
//! Invariant: [`journal_payload`] and [`encode_entry`] give exactly the
//! bytes `serde_json::to_vec` gives for the entry, so a record reads the
//! same whichever way it was written.

use serde::{Deserialize, Serialize};

use crate::event::Event;
use crate::source::Position;

/// One journal record's payload: the accepted event and where the source
/// continues after it.
#[derive(Debug, Serialize, Deserialize)]
pub struct JournalEntry {
    pub event: Event,
    pub next: Position,
}

impl JournalEntry {
    /// The entry a record's payload holds.
    pub fn decode(payload: &[u8]) -> serde_json::Result<JournalEntry> {
        serde_json::from_slice(payload)
    }
}

/// [`JournalEntry`] by reference, to encode without copying the event.
#[derive(Serialize)]
struct JournalEntryRef<'a> {
    event: &'a Event,
    next: &'a Position,
}

/// The payload of the entry (`event`, `next`), without copying the event.
pub fn encode_entry(event: &Event, next: &Position) -> serde_json::Result<Vec<u8>> {
    serde_json::to_vec(&JournalEntryRef { event, next })
}

/// The bytes of the entry (`event`, `next`) for an event already serialised
/// (`serde_json::to_vec(event)`): the same bytes `serde_json::to_vec`
/// gives for the entry, without serialising the event again.
pub fn journal_payload(event: &[u8], next: &Position) -> serde_json::Result<Vec<u8>> {
    let next = serde_json::to_vec(next)?;
    let mut out = Vec::with_capacity(event.len() + next.len() + 20);
    out.extend_from_slice(br#"{"event":"#);
    out.extend_from_slice(event);
    out.extend_from_slice(br#","next":"#);
    out.extend_from_slice(&next);
    out.push(b'}');
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn journal_payload_from_the_serialised_event_equals_the_entry_serialised_whole() {
        let lines = [
            r#"{"id":7,"op":"create_database","db":"d"}"#,
            r#"{"id":9,"time_ms":1700000000000,"op":"add_files","db":"d","table":"t","partition":{"ds":"2024-01-01","r":"e\"u"},"files":[{"path":"d/t/x","size":3,"sha256":"0000000000000000000000000000000000000000000000000000000000000000"}]}"#,
        ];
        let positions = [
            Position::Hive { hive_event_id: 42 },
            Position::Log(Default::default()),
        ];
        for line in lines {
            let event = Event::parse_line(line.as_bytes()).unwrap();
            for next in &positions {
                let whole = serde_json::to_vec(&JournalEntryRef {
                    event: &event,
                    next,
                })
                .unwrap();
                let once = journal_payload(&serde_json::to_vec(&event).unwrap(), next).unwrap();
                assert_eq!(
                    String::from_utf8(once).unwrap(),
                    String::from_utf8(whole).unwrap()
                );
            }
        }
    }
}
