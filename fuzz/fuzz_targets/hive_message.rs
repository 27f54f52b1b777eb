//! Hostile metastore rows (storage we read from is input too): the Hive
//! message decoders must never panic, whatever a `NOTIFICATION_LOG` or
//! `TXN_WRITE_NOTIFICATION_LOG` row holds.
//!
//! The first input byte chooses how the rest is read:
//! - 0: a whole row as the metastore readers deliver it (the JSON-lines
//!   form of `tests/data/hive-real/`), decoded by `decode_message`; the
//!   seeds are the real Hive 3.1.3 and 4.0.1 metastores' rows;
//! - 1: a `TXN_WRITE_NOTIFICATION_LOG` row, by `decode_txn_write`;
//! - 2: a message body: the next byte picks the event type and the
//!   format, and for the gzip formats the body is compressed and base64
//!   encoded here, so the fuzzer mutates the JSON inside;
//! - 3: text for the parts every message uses: Thrift-JSON objects, file
//!   URIs and their `\u0001`-joined lists, partition names.
//!
//! A message that decodes must decode to the same value again: the
//! decoder's raw-field reading, its tree reading and its thread-local
//! table cache must never disagree.
#![no_main]

use std::io::Write;
use std::sync::Arc;

use base64::Engine;
use libfuzzer_sys::fuzz_target;
use stagefs::source::hive::message::{decode_message, decode_txn_write, MESSAGE_EVENT_TYPES};
use stagefs::source::hive::model::{FileUri, NotificationRow, TxnWriteRow};
use stagefs::source::hive::{thrift, uri};

const FORMATS: [Option<&str>; 4] = [None, Some("json-0.2"), Some("gzip(json-2.0)"), Some("gzip")];

/// Decodes `row` twice and checks both readings agree.
fn decode_twice(row: &NotificationRow) {
    let first = decode_message(row);
    let second = decode_message(row);
    assert_eq!(first, second, "decoding the same row twice differs");
}

fn gzip_base64(body: &[u8]) -> String {
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(body).expect("writing to a Vec");
    let bytes = gz.finish().expect("writing to a Vec");
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

fn message_row(selector: u8, body: &[u8]) -> Option<NotificationRow> {
    let types = MESSAGE_EVENT_TYPES;
    let event_type = types[usize::from(selector >> 2) % types.len()];
    let format = FORMATS[usize::from(selector & 3)];
    let message = match format {
        Some(f) if f.starts_with("gzip") => gzip_base64(body),
        _ => std::str::from_utf8(body).ok()?.to_owned(),
    };
    Some(NotificationRow {
        nl_id: Some(1),
        event_id: 1,
        event_time: Some(1_796_468_887),
        event_type: event_type.to_owned(),
        cat_name: Some("hive".into()),
        db_name: Some("sales".into()),
        tbl_name: Some("facts".into()),
        message: Some(Arc::from(message)),
        message_format: format.map(str::to_owned),
    })
}

fn parts(text: &str) {
    let _ = thrift::parse_struct(text);
    let _ = thrift::database_from_json(text);
    let _ = thrift::table_from_json(text);
    let _ = thrift::partition_from_json(text);
    let _ = FileUri::parse(text).map(|u| (u.file_name().to_owned(), u.cm_path()));
    let _ = uri::split_files(text);
    let _ = uri::unescape_path_name(text);
    if let Ok(kv) = uri::parse_partition_name(text) {
        let keys: Vec<String> = kv.iter().map(|(k, _)| k.clone()).collect();
        let values: Vec<String> = kv.iter().map(|(_, v)| v.clone()).collect();
        let name = uri::make_partition_name(&keys, &values);
        let _ = uri::partition_values_in_key_order(&name, &keys);
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    match mode % 4 {
        0 => {
            if let Ok(row) = serde_json::from_slice::<NotificationRow>(rest) {
                decode_twice(&row);
            }
        }
        1 => {
            if let Ok(row) = serde_json::from_slice::<TxnWriteRow>(rest) {
                let _ = decode_txn_write(&row);
            }
        }
        2 => {
            if let Some((&selector, body)) = rest.split_first() {
                if let Some(row) = message_row(selector, body) {
                    decode_twice(&row);
                }
            }
        }
        _ => {
            if let Ok(text) = std::str::from_utf8(rest) {
                parts(text);
            }
        }
    }
});
