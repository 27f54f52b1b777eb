//! PLACEHOLDER until the `hive-decode` branch is merged (it owns this file):
//! decoding of `MESSAGE` texts. Every row is refused with a clear reason.

use super::model::{HiveMessage, NotificationRow, TxnWrite, TxnWriteRow};

pub fn decode_message(row: &NotificationRow) -> Result<HiveMessage, String> {
    Err(format!(
        "this build cannot decode Hive messages yet (event {})",
        row.event_id
    ))
}

pub fn decode_txn_write(_row: &TxnWriteRow) -> Result<TxnWrite, String> {
    Err("this build cannot decode Hive write rows yet".into())
}
