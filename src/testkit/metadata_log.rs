//! A metadata-only native log (databases, partitioned tables, partitions
//! added and dropped, no-ops) and its oracle: each table's partition
//! directories. For tests that need many events quickly (checkpoints,
//! recovery); no file content, so nothing is fetched.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;

use crate::workload::Rng;

/// Each table's partitions (`p=...` directory names).
pub type Oracle = BTreeMap<String, BTreeSet<String>>;

/// A metadata-only log file from id `first_id`: when `o` is empty first 2
/// databases × 4 tables, then `n` events adding and dropping partitions
/// (and no-ops). Updates `o` to match; returns the last id.
pub fn write_metadata_log(dir: &Path, first_id: u64, n: u64, rng: &mut Rng, o: &mut Oracle) -> u64 {
    let mut out =
        BufWriter::new(File::create(dir.join(format!("log-{first_id:012}.jsonl"))).unwrap());
    let mut id = first_id;
    let emit = |out: &mut BufWriter<File>, id: &mut u64, body: String| {
        writeln!(out, "{{\"id\":{id},{body}}}").unwrap();
        *id += 1;
    };
    if o.is_empty() {
        for d in 0..2 {
            emit(
                &mut out,
                &mut id,
                format!("\"op\":\"create_database\",\"db\":\"d{d}\""),
            );
            for t in 0..4 {
                emit(
                    &mut out,
                    &mut id,
                    format!("\"op\":\"create_table\",\"db\":\"d{d}\",\"table\":\"t{t}\",\"partition_keys\":[\"p\"]"),
                );
                o.insert(format!("d{d}.t{t}"), BTreeSet::new());
            }
        }
    }
    let tables: Vec<String> = o.keys().cloned().collect();
    let end = id + n;
    while id < end {
        let key = &tables[rng.below(tables.len())];
        let (db, table) = key.split_once('.').unwrap();
        let parts = o.get_mut(key).unwrap();
        let r = rng.below(10);
        let body = if r < 5 {
            let p = format!("v{id}");
            parts.insert(format!("p={p}"));
            format!("\"op\":\"add_partition\",\"db\":\"{db}\",\"table\":\"{table}\",\"partition\":{{\"p\":\"{p}\"}}")
        } else if r < 8 && !parts.is_empty() {
            let victim = parts.iter().nth(rng.below(parts.len())).unwrap().clone();
            parts.remove(&victim);
            let p = victim.strip_prefix("p=").unwrap();
            format!("\"op\":\"drop_partition\",\"db\":\"{db}\",\"table\":\"{table}\",\"partition\":{{\"p\":\"{p}\"}}")
        } else {
            "\"op\":\"noop\"".to_owned()
        };
        emit(&mut out, &mut id, body);
    }
    out.flush().unwrap();
    id - 1
}
