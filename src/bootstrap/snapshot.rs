//! The metastore's own tables read in ONE consistent database snapshot,
//! together with the event id that snapshot is at (HIVE.md "Bootstrap").
//!
//! Owns one short-lived connection per snapshot (a
//! `source::hive::metastore::Session`, opened and quoted as the polling
//! connection is, not that connection itself): PostgreSQL runs the reads in
//! `BEGIN ISOLATION LEVEL REPEATABLE READ, READ ONLY` (one snapshot taken
//! at the first read), MySQL/MariaDB in `START TRANSACTION WITH
//! CONSISTENT SNAPSHOT, READ ONLY` under REPEATABLE READ. Hive's listener
//! bumps `NOTIFICATION_SEQUENCE` in the same transaction as the metadata
//! change it logs, so `NEXT_EVENT_ID - 1` read in the snapshot is exactly
//! the id whose state the other tables show.
//!
//! Tables read: `DBS`, `TBLS`, `SDS`, `PARTITION_KEYS`, `PARTITIONS`,
//! `PARTITION_KEY_VALS`, `TABLE_PARAMS` (transactional flags only) and the
//! sequence; for transactional tables what Hive's `ValidTxnList` and
//! `ValidWriteIdList` are made of (`TxnHandler.getOpenTxns`,
//! `getValidWriteIds`): `TXNS` open (`o`) and aborted (`a`), the highest
//! transaction id (`NEXT_TXN_ID.NTXN_NEXT - 1` on Hive 3, `MAX(TXNS.TXN_ID)`
//! where that table is gone), `NEXT_WRITE_ID` (a table's high watermark is
//! `NWI_NEXT - 1`) and the `TXN_TO_WRITE_ID` rows of open and aborted
//! transactions. A metastore without those tables gives transactional
//! tables no ids ([`TableMeta::acid`] None): the bootstrap reports them.
//! Keys and values are ordered by `INTEGER_IDX`, never by name.
//! Values arrive as text (PostgreSQL's simple query protocol, MySQL's text
//! protocol) and are parsed here, so column widths (int4/int8) do not
//! matter. Every statement is bounded by the server's statement timeout
//! and the client's read timeout.
//!
//! Called by the bootstrap driver once per round.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use super::acid::{AcidIds, ValidTxns, ValidWriteIds};

use crate::source::hive::metastore::{Endpoint, Session, TextRows, Timeouts, PASSWORD_ENV};
use crate::source::hive::model::RowSourceError;

/// A table in the snapshot, with Hive's raw names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableMeta {
    pub db: String,
    pub name: String,
    pub table_type: Option<String>,
    pub location: Option<String>,
    pub partition_keys: Vec<String>,
    /// `transactional`, `transactional_properties` (keys lower-cased).
    pub params: BTreeMap<String, String>,
    pub partitions: Vec<PartitionMeta>,
    /// For a transactional table: its write ids and the transactions at
    /// the snapshot (None when the metastore has no transaction tables).
    pub acid: Option<AcidIds>,
}

impl TableMeta {
    /// `TABLE_PARAMS.transactional` = true, any case (ACID or insert-only).
    pub fn is_transactional(&self) -> bool {
        self.params
            .get("transactional")
            .is_some_and(|v| v.eq_ignore_ascii_case("true"))
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionMeta {
    /// `PART_NAME` (`k1=v1/k2=v2`, escaped).
    pub name: String,
    /// Raw values in key order.
    pub values: Vec<String>,
    pub location: Option<String>,
}

/// Everything one snapshot holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshot {
    /// The event id the snapshot is at.
    pub event_id: i64,
    pub databases: Vec<String>,
    pub tables: Vec<TableMeta>,
}

impl Snapshot {
    pub fn partition_count(&self) -> usize {
        self.tables.iter().map(|t| t.partitions.len()).sum()
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SnapshotError {
    /// Worth retrying (server down, timeout, serialization failure).
    #[error("the metastore is unavailable: {0}")]
    Unavailable(String),
    #[error("{0}")]
    Fatal(String),
}

/// How long connecting and each of a snapshot's statements may take.
const TIMEOUTS: Timeouts = Timeouts {
    connect: Duration::from_secs(10),
    statement: Duration::from_secs(300),
};

/// Reads one snapshot of catalog `catalog` of the metastore at `url`
/// (password as for polling): only the databases whose `DBS.CTLG_NAME` is
/// that catalog, when the schema has catalogs (`CTLGS`); a schema without
/// them (Hive 2) has only `hive`. A catalog the metastore lacks is an error.
pub fn read(url: &str, catalog: &str) -> Result<Snapshot, SnapshotError> {
    let ep = Endpoint::parse(url, std::env::var(PASSWORD_ENV).ok()).map_err(snapshot_error)?;
    let mut session = Session::open(&ep, TIMEOUTS, "stagefs-bootstrap")
        .map_err(|e| snapshot_error(ep.scrub(e)))?;
    let rows = read_rows(&mut session).map_err(|e| snapshot_error(ep.scrub(e)))?;
    assemble(rows, catalog)
}

/// Unavailable stays worth retrying; anything else is fatal.
fn snapshot_error(e: RowSourceError) -> SnapshotError {
    match e {
        RowSourceError::Unavailable(t) => SnapshotError::Unavailable(t),
        RowSourceError::Fatal(t) => SnapshotError::Fatal(t),
        RowSourceError::BadRow {
            location, reason, ..
        } => SnapshotError::Fatal(format!("{location}: {reason}")),
    }
}

/// Every query of a snapshot in one transaction: PostgreSQL's
/// `REPEATABLE READ` takes its snapshot at the first read; MySQL's
/// `WITH CONSISTENT SNAPSHOT` at the start.
fn read_rows(session: &mut Session) -> Result<Rows, RowSourceError> {
    if session.is_postgres() {
        session.execute("BEGIN ISOLATION LEVEL REPEATABLE READ, READ ONLY")?;
    } else {
        session.execute("SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ")?;
        session.execute("START TRANSACTION WITH CONSISTENT SNAPSHOT, READ ONLY")?;
    }
    let present = session.tables()?;
    let optional = Optional::of(|t| session.table(&present, t).is_some());
    let table = |t: &str| session.quote(&session.table(&present, t).unwrap_or_else(|| t.into()));
    let column = |c: &str| session.quote(c);
    let sql: Vec<String> = optional
        .queries()
        .into_iter()
        .map(|q| render(q, &table, &column))
        .collect();
    let mut all = Vec::with_capacity(sql.len());
    for q in &sql {
        all.push(session.query(q)?);
    }
    // Read only: nothing to keep or lose.
    let _ = session.execute("COMMIT");
    let mut rows = Rows::default();
    fill(&mut rows, all, optional);
    Ok(rows)
}

/// The raw rows of one snapshot, every value as text.
#[derive(Debug, Default)]
struct Rows {
    next_event_id: Option<String>,
    max_event_id: Option<String>,
    /// DB_ID, NAME, and CTLG_NAME when the schema has catalogs.
    dbs: TextRows,
    /// `CTLGS.NAME`, when the schema has that table (Hive 3 and later).
    catalogs: Option<TextRows>,
    /// TBL_ID, DB_ID, TBL_NAME, TBL_TYPE, LOCATION
    tbls: TextRows,
    /// TBL_ID, PKEY_NAME, INTEGER_IDX
    keys: TextRows,
    /// PART_ID, TBL_ID, PART_NAME, LOCATION
    parts: TextRows,
    /// PART_ID, PART_KEY_VAL, INTEGER_IDX
    vals: TextRows,
    /// TBL_ID, PARAM_KEY, PARAM_VALUE
    params: TextRows,
    /// Whether `TXNS`, `TXN_TO_WRITE_ID` and `NEXT_WRITE_ID` exist (then
    /// the rows below were read).
    acid: bool,
    /// TXN_ID, TXN_STATE of open and aborted transactions.
    txns: TextRows,
    max_txn_id: Option<String>,
    /// `NEXT_TXN_ID.NTXN_NEXT` (Hive 3 schemas only).
    next_txn_id: Option<String>,
    /// NWI_DATABASE, NWI_TABLE, NWI_NEXT
    next_write_ids: TextRows,
    /// T2W_DATABASE, T2W_TABLE, T2W_WRITEID, TXN_STATE (open or aborted).
    invalid_write_ids: TextRows,
}

/// The queries, with `{T}` for a quoted table name and `{C}` for a quoted
/// column: (table names used, text).
const QUERIES: [&str; 6] = [
    DBS_QUERY,
    "SELECT t.{C:TBL_ID}, t.{C:DB_ID}, t.{C:TBL_NAME}, t.{C:TBL_TYPE}, s.{C:LOCATION} \
     FROM {T:TBLS} t LEFT JOIN {T:SDS} s ON s.{C:SD_ID} = t.{C:SD_ID}",
    "SELECT {C:TBL_ID}, {C:PKEY_NAME}, {C:INTEGER_IDX} FROM {T:PARTITION_KEYS}",
    "SELECT p.{C:PART_ID}, p.{C:TBL_ID}, p.{C:PART_NAME}, s.{C:LOCATION} \
     FROM {T:PARTITIONS} p LEFT JOIN {T:SDS} s ON s.{C:SD_ID} = p.{C:SD_ID}",
    "SELECT {C:PART_ID}, {C:PART_KEY_VAL}, {C:INTEGER_IDX} FROM {T:PARTITION_KEY_VALS}",
    "SELECT {C:TBL_ID}, {C:PARAM_KEY}, {C:PARAM_VALUE} FROM {T:TABLE_PARAMS} \
     WHERE LOWER({C:PARAM_KEY}) IN ('transactional', 'transactional_properties')",
];

const DBS_QUERY: &str = "SELECT {C:DB_ID}, {C:NAME} FROM {T:DBS}";
/// With catalogs (`CTLGS`): each database's catalog, and the catalogs.
const DBS_CATALOG_QUERY: &str = "SELECT {C:DB_ID}, {C:NAME}, {C:CTLG_NAME} FROM {T:DBS}";
const CATALOGS_QUERY: &str = "SELECT {C:NAME} FROM {T:CTLGS}";

/// Read when the transaction tables exist ([`ACID_TABLES`]).
const ACID_QUERIES: [&str; 4] = [
    "SELECT {C:TXN_ID}, {C:TXN_STATE} FROM {T:TXNS} WHERE {C:TXN_STATE} IN ('o', 'a')",
    "SELECT MAX({C:TXN_ID}) FROM {T:TXNS}",
    "SELECT {C:NWI_DATABASE}, {C:NWI_TABLE}, {C:NWI_NEXT} FROM {T:NEXT_WRITE_ID}",
    "SELECT w.{C:T2W_DATABASE}, w.{C:T2W_TABLE}, w.{C:T2W_WRITEID}, t.{C:TXN_STATE} \
     FROM {T:TXN_TO_WRITE_ID} w JOIN {T:TXNS} t ON t.{C:TXN_ID} = w.{C:T2W_TXNID} \
     WHERE t.{C:TXN_STATE} IN ('o', 'a')",
];
/// Hive 3's transaction id sequence (gone in Hive 4).
const NEXT_TXN_QUERY: &str = "SELECT MAX({C:NTXN_NEXT}) FROM {T:NEXT_TXN_ID}";
const ACID_TABLES: [&str; 3] = ["TXNS", "TXN_TO_WRITE_ID", "NEXT_WRITE_ID"];

/// Which optional tables the metastore has (by their upper-case names).
#[derive(Debug, Clone, Copy, Default)]
struct Optional {
    acid: bool,
    next_txn: bool,
    /// `CTLGS` (and `DBS.CTLG_NAME`): Hive 3 and later.
    catalogs: bool,
}

impl Optional {
    fn of(has: impl Fn(&str) -> bool) -> Optional {
        Optional {
            acid: ACID_TABLES.iter().all(|t| has(t)),
            next_txn: has("NEXT_TXN_ID"),
            catalogs: has("CTLGS"),
        }
    }

    /// Every query of a snapshot, in the order [`fill`] takes them.
    fn queries(self) -> Vec<&'static str> {
        let mut out = vec![SEQUENCE_QUERY, MAX_EVENT_QUERY];
        out.extend(QUERIES);
        if self.catalogs {
            out[2] = DBS_CATALOG_QUERY;
            out.push(CATALOGS_QUERY);
        }
        if self.acid {
            out.extend(ACID_QUERIES);
            if self.next_txn {
                out.push(NEXT_TXN_QUERY);
            }
        }
        out
    }
}

const SEQUENCE_QUERY: &str = "SELECT MAX({C:NEXT_EVENT_ID}) FROM {T:NOTIFICATION_SEQUENCE}";
const MAX_EVENT_QUERY: &str = "SELECT MAX({C:EVENT_ID}) FROM {T:NOTIFICATION_LOG}";

/// `query` with its placeholders quoted for a dialect.
fn render(query: &str, table: &dyn Fn(&str) -> String, column: &dyn Fn(&str) -> String) -> String {
    let mut out = String::with_capacity(query.len() + 32);
    let mut rest = query;
    while let Some(at) = rest.find('{') {
        out.push_str(&rest[..at]);
        let Some(end) = rest[at..].find('}') else {
            out.push_str(&rest[at..]);
            return out;
        };
        let inner = &rest[at + 1..at + end];
        match inner.split_once(':') {
            Some(("T", name)) => out.push_str(&table(name)),
            Some(("C", name)) => out.push_str(&column(name)),
            _ => out.push_str(&rest[at..at + end + 1]),
        }
        rest = &rest[at + end + 1..];
    }
    out.push_str(rest);
    out
}

fn int(v: &Option<String>, what: &str) -> Result<i64, SnapshotError> {
    v.as_deref()
        .and_then(|t| t.trim().parse().ok())
        .ok_or_else(|| SnapshotError::Fatal(format!("{what}: {v:?} is not an integer")))
}

fn text(v: &Option<String>, what: &str) -> Result<String, SnapshotError> {
    v.clone()
        .ok_or_else(|| SnapshotError::Fatal(format!("{what} is NULL")))
}

fn cell(row: &[Option<String>], i: usize) -> &Option<String> {
    const NONE: &Option<String> = &None;
    row.get(i).unwrap_or(NONE)
}

/// Joins the rows into databases, tables and partitions.
fn assemble(rows: Rows, catalog: &str) -> Result<Snapshot, SnapshotError> {
    let event_id = match (&rows.next_event_id, &rows.max_event_id) {
        (Some(_), _) => int(&rows.next_event_id, "NOTIFICATION_SEQUENCE.NEXT_EVENT_ID")? - 1,
        (None, Some(_)) => int(&rows.max_event_id, "NOTIFICATION_LOG.EVENT_ID")?,
        (None, None) => 0,
    };
    let catalogs = match &rows.catalogs {
        Some(list) => Some(
            list.iter()
                .map(|r| Ok(text(cell(r, 0), "CTLGS.NAME")?.trim().to_ascii_lowercase()))
                .collect::<Result<Vec<String>, SnapshotError>>()?,
        ),
        None => None,
    };
    crate::source::hive::metastore::catalog_known(catalog, catalogs.as_deref())
        .map_err(snapshot_error)?;
    let mut db_names = BTreeMap::new();
    // Databases of other catalogs, whose tables are skipped.
    let mut elsewhere = std::collections::BTreeSet::new();
    for r in &rows.dbs {
        let id = int(cell(r, 0), "DBS.DB_ID")?;
        if catalogs.is_some() {
            let cat = text(cell(r, 2), "DBS.CTLG_NAME")?;
            if !cat.trim().eq_ignore_ascii_case(catalog) {
                elsewhere.insert(id);
                continue;
            }
        }
        db_names.insert(id, text(cell(r, 1), "DBS.NAME")?);
    }
    let mut keys: BTreeMap<i64, Vec<(i64, String)>> = BTreeMap::new();
    for r in &rows.keys {
        keys.entry(int(cell(r, 0), "PARTITION_KEYS.TBL_ID")?)
            .or_default()
            .push((
                int(cell(r, 2), "PARTITION_KEYS.INTEGER_IDX")?,
                text(cell(r, 1), "PARTITION_KEYS.PKEY_NAME")?,
            ));
    }
    let mut params: BTreeMap<i64, BTreeMap<String, String>> = BTreeMap::new();
    for r in &rows.params {
        params
            .entry(int(cell(r, 0), "TABLE_PARAMS.TBL_ID")?)
            .or_default()
            .insert(
                text(cell(r, 1), "TABLE_PARAMS.PARAM_KEY")?.to_ascii_lowercase(),
                cell(r, 2).clone().unwrap_or_default(),
            );
    }
    let mut vals: BTreeMap<i64, Vec<(i64, String)>> = BTreeMap::new();
    for r in &rows.vals {
        vals.entry(int(cell(r, 0), "PARTITION_KEY_VALS.PART_ID")?)
            .or_default()
            .push((
                int(cell(r, 2), "PARTITION_KEY_VALS.INTEGER_IDX")?,
                cell(r, 1).clone().unwrap_or_default(),
            ));
    }
    let mut parts: BTreeMap<i64, Vec<PartitionMeta>> = BTreeMap::new();
    for r in &rows.parts {
        let part_id = int(cell(r, 0), "PARTITIONS.PART_ID")?;
        let mut values = vals.remove(&part_id).unwrap_or_default();
        values.sort();
        parts
            .entry(int(cell(r, 1), "PARTITIONS.TBL_ID")?)
            .or_default()
            .push(PartitionMeta {
                name: text(cell(r, 2), "PARTITIONS.PART_NAME")?,
                values: values.into_iter().map(|(_, v)| v).collect(),
                location: cell(r, 3).clone(),
            });
    }
    let acid = acid_ids(&rows)?;
    let mut tables = Vec::with_capacity(rows.tbls.len());
    for r in &rows.tbls {
        let tbl_id = int(cell(r, 0), "TBLS.TBL_ID")?;
        let db_id = int(cell(r, 1), "TBLS.DB_ID")?;
        if elsewhere.contains(&db_id) {
            continue;
        }
        let db = db_names.get(&db_id).cloned().ok_or_else(|| {
            SnapshotError::Fatal(format!(
                "TBLS.TBL_ID {tbl_id} names DB_ID {db_id}, which DBS lacks"
            ))
        })?;
        let mut k = keys.remove(&tbl_id).unwrap_or_default();
        k.sort();
        let mut partitions = parts.remove(&tbl_id).unwrap_or_default();
        partitions.sort_by(|a, b| a.name.cmp(&b.name));
        let mut table = TableMeta {
            db,
            name: text(cell(r, 2), "TBLS.TBL_NAME")?,
            table_type: cell(r, 3).clone(),
            location: cell(r, 4).clone(),
            partition_keys: k.into_iter().map(|(_, n)| n).collect(),
            params: params.remove(&tbl_id).unwrap_or_default(),
            partitions,
            acid: None,
        };
        if table.is_transactional() {
            if let Some((txns, write_ids)) = &acid {
                let key = (table.db.to_lowercase(), table.name.to_lowercase());
                table.acid = Some(AcidIds {
                    write_ids: write_ids.get(&key).cloned().unwrap_or_default(),
                    txns: Arc::clone(txns),
                });
            }
        }
        tables.push(table);
    }
    tables.sort_by(|a, b| (&a.db, &a.name).cmp(&(&b.db, &b.name)));
    Ok(Snapshot {
        event_id,
        databases: db_names.into_values().collect(),
        tables,
    })
}

/// Per table (lower-cased db, table): its write ids; and the transactions.
type AcidRows = (Arc<ValidTxns>, BTreeMap<(String, String), ValidWriteIds>);

/// The `ValidTxnList` and every table's `ValidWriteIdList` of the
/// snapshot (None when the metastore has no transaction tables).
fn acid_ids(rows: &Rows) -> Result<Option<AcidRows>, SnapshotError> {
    if !rows.acid {
        return Ok(None);
    }
    let mut txns = ValidTxns::default();
    let max = match &rows.max_txn_id {
        Some(_) => int(&rows.max_txn_id, "TXNS.TXN_ID")?,
        None => 0,
    };
    let next = match &rows.next_txn_id {
        Some(_) => int(&rows.next_txn_id, "NEXT_TXN_ID.NTXN_NEXT")? - 1,
        None => 0,
    };
    txns.high_watermark = max.max(next);
    for r in &rows.txns {
        let id = int(cell(r, 0), "TXNS.TXN_ID")?;
        match cell(r, 1).as_deref().map(str::trim) {
            Some("o") => txns.open.insert(id),
            Some("a") => txns.aborted.insert(id),
            other => {
                return Err(SnapshotError::Fatal(format!(
                    "TXNS.TXN_STATE {other:?} of transaction {id} is not 'o' or 'a'"
                )))
            }
        };
    }
    let key = |r: &[Option<String>], what: &str| -> Result<(String, String), SnapshotError> {
        Ok((
            text(cell(r, 0), &format!("{what}_DATABASE"))?.to_lowercase(),
            text(cell(r, 1), &format!("{what}_TABLE"))?.to_lowercase(),
        ))
    };
    let mut tables: BTreeMap<(String, String), ValidWriteIds> = BTreeMap::new();
    for r in &rows.next_write_ids {
        let next = int(cell(r, 2), "NEXT_WRITE_ID.NWI_NEXT")?;
        tables
            .entry(key(r, "NEXT_WRITE_ID.NWI")?)
            .or_default()
            .high_watermark = next - 1;
    }
    for r in &rows.invalid_write_ids {
        let id = int(cell(r, 2), "TXN_TO_WRITE_ID.T2W_WRITEID")?;
        let ids = tables.entry(key(r, "TXN_TO_WRITE_ID.T2W")?).or_default();
        if id > ids.high_watermark {
            continue;
        }
        if cell(r, 3).as_deref().map(str::trim) == Some("a") {
            ids.aborted.insert(id);
        } else {
            ids.open.insert(id);
        }
    }
    Ok(Some((Arc::new(txns), tables)))
}

/// Puts the results of [`Optional::queries`] in place.
fn fill(rows: &mut Rows, mut all: Vec<TextRows>, optional: Optional) {
    let mut take = || {
        if all.is_empty() {
            Vec::new()
        } else {
            all.remove(0)
        }
    };
    let first = |t: TextRows| {
        t.into_iter()
            .next()
            .and_then(|r| r.into_iter().next())
            .flatten()
    };
    rows.next_event_id = first(take());
    rows.max_event_id = first(take());
    rows.dbs = take();
    rows.tbls = take();
    rows.keys = take();
    rows.parts = take();
    rows.vals = take();
    rows.params = take();
    if optional.catalogs {
        rows.catalogs = Some(take());
    }
    rows.acid = optional.acid;
    if optional.acid {
        rows.txns = take();
        rows.max_txn_id = first(take());
        rows.next_write_ids = take();
        rows.invalid_write_ids = take();
        if optional.next_txn {
            rows.next_txn_id = first(take());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(v: &str) -> Option<String> {
        Some(v.to_owned())
    }

    #[test]
    fn placeholders_are_quoted_per_dialect() {
        let q = render(QUERIES[0], &|t| format!("\"{t}\""), &|c| format!("`{c}`"));
        assert_eq!(q, "SELECT `DB_ID`, `NAME` FROM \"DBS\"");
    }

    #[test]
    fn keys_and_values_follow_integer_idx_not_names_and_the_id_is_next_minus_one() {
        let rows = Rows {
            next_event_id: s("43"),
            max_event_id: s("40"),
            dbs: vec![vec![s("1"), s("sales")]],
            tbls: vec![vec![
                s("7"),
                s("1"),
                s("orders"),
                s("MANAGED_TABLE"),
                s("hdfs://nn/wh/o"),
            ]],
            keys: vec![
                vec![s("7"), s("region"), s("1")],
                vec![s("7"), s("ds"), s("0")],
            ],
            parts: vec![vec![s("9"), s("7"), s("ds=1/region=eu"), s("hdfs://nn/x")]],
            vals: vec![vec![s("9"), s("eu"), s("1")], vec![s("9"), s("1"), s("0")]],
            params: vec![vec![s("7"), s("TRANSACTIONAL"), s("TRUE")]],
            ..Rows::default()
        };
        let snap = assemble(rows, "hive").unwrap();
        assert_eq!(snap.event_id, 42);
        let t = &snap.tables[0];
        assert_eq!((t.db.as_str(), t.name.as_str()), ("sales", "orders"));
        assert_eq!(t.partition_keys, vec!["ds", "region"]);
        assert_eq!(t.partitions[0].values, vec!["1", "eu"]);
        assert!(t.is_transactional());
    }

    #[test]
    fn transactional_tables_get_their_write_ids_and_the_snapshots_transactions() {
        let rows = Rows {
            dbs: vec![vec![s("1"), s("Sales")]],
            tbls: vec![
                vec![s("7"), s("1"), s("Acid"), None, None],
                vec![s("8"), s("1"), s("plain"), None, None],
            ],
            params: vec![
                vec![s("7"), s("transactional"), s("true")],
                vec![s("8"), s("transactional"), s("false")],
            ],
            acid: true,
            txns: vec![vec![s("20"), s("o")], vec![s("21"), s("a")]],
            max_txn_id: s("25"),
            next_txn_id: s("31"),
            next_write_ids: vec![vec![s("sales"), s("acid"), s("6")]],
            invalid_write_ids: vec![
                vec![s("sales"), s("acid"), s("4"), s("o")],
                vec![s("sales"), s("acid"), s("2"), s("a")],
                // Allocated above the watermark read: not part of the list.
                vec![s("sales"), s("acid"), s("9"), s("o")],
            ],
            ..Rows::default()
        };
        let snap = assemble(rows, "hive").unwrap();
        let acid = snap.tables[0].acid.as_ref().expect("ids of the ACID table");
        assert_eq!(acid.write_ids.high_watermark, 5);
        assert_eq!(acid.write_ids.open.iter().copied().collect::<Vec<_>>(), [4]);
        assert_eq!(
            acid.write_ids.aborted.iter().copied().collect::<Vec<_>>(),
            [2]
        );
        assert_eq!(acid.txns.high_watermark, 30);
        assert!(acid.txns.open.contains(&20) && acid.txns.aborted.contains(&21));
        assert!(snap.tables[1].acid.is_none());
    }

    #[test]
    fn only_the_chosen_catalogs_databases_and_tables_are_read() {
        // `sales.t` in catalog `hive` (DB_ID 1) and in `spark` (DB_ID 2).
        let rows = || Rows {
            dbs: vec![
                vec![s("1"), s("sales"), s("hive")],
                vec![s("2"), s("sales"), s("SPARK")],
            ],
            catalogs: Some(vec![vec![s("hive")], vec![s("spark")]]),
            tbls: vec![
                vec![s("7"), s("1"), s("t"), None, s("hdfs://nn/wh/sales.db/t")],
                vec![
                    s("8"),
                    s("2"),
                    s("t"),
                    None,
                    s("hdfs://nn/spark/sales.db/t"),
                ],
            ],
            ..Rows::default()
        };
        for (cat, location) in [
            ("hive", "hdfs://nn/wh/sales.db/t"),
            ("spark", "hdfs://nn/spark/sales.db/t"),
        ] {
            let snap = assemble(rows(), cat).unwrap();
            assert_eq!(snap.databases, vec!["sales"]);
            assert_eq!(snap.tables.len(), 1, "{cat}");
            assert_eq!(snap.tables[0].location.as_deref(), Some(location));
        }
        let Err(SnapshotError::Fatal(e)) = assemble(rows(), "other") else {
            panic!("a catalog the metastore lacks");
        };
        assert!(
            e.contains("no such catalog") && e.contains("hive, spark"),
            "{e}"
        );
        // A database without a catalog where the schema has catalogs: bad input.
        let mut bad = rows();
        bad.dbs[1][2] = None;
        assert!(matches!(
            assemble(bad, "hive"),
            Err(SnapshotError::Fatal(_))
        ));
        // No CTLGS (Hive 2): every database is `hive`'s, no other catalog.
        let mut old = rows();
        old.catalogs = None;
        old.dbs = vec![vec![s("1"), s("sales")]];
        old.tbls.pop();
        assert_eq!(assemble(old, "hive").unwrap().tables.len(), 1);
        let mut old = rows();
        old.catalogs = None;
        assert!(matches!(
            assemble(old, "spark"),
            Err(SnapshotError::Fatal(_))
        ));
    }

    #[test]
    fn a_table_of_a_missing_database_is_an_error() {
        let rows = Rows {
            tbls: vec![vec![s("7"), s("5"), s("t"), None, None]],
            ..Rows::default()
        };
        assert!(matches!(
            assemble(rows, "hive"),
            Err(SnapshotError::Fatal(_))
        ));
    }
}
