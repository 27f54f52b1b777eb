//! Polling the Hive metastore database: the [`RowSource`] behind
//! `--hive-metastore postgresql://user@host:port/db` and `mysql://…`.
//!
//! Owns the connection to the metastore's PostgreSQL or MySQL/MariaDB
//! database and the three queries the Hive source needs (HIVE.md "Where the
//! events are"):
//! - `NOTIFICATION_LOG` rows with `EVENT_ID > after ORDER BY EVENT_ID LIMIT n`;
//! - `TXN_WRITE_NOTIFICATION_LOG` rows of one transaction, by `WNL_ID`
//!   (a metastore older than Hive 3.2 / 4.0 has no such table: then
//!   [`RowSource::records_txn_writes`] says so and the adapter never asks);
//! - `NOTIFICATION_SEQUENCE.NEXT_EVENT_ID - 1`, the newest id, for lag.
//!
//! Invariants:
//! - The password never leaves this module: not in an error, a log line,
//!   [`RowSource::describe`] or a `Debug` impl. Error texts from the drivers
//!   are scrubbed of it as well, in case a server ever echoes it.
//! - No call blocks for long: connecting is bounded by
//!   [`Timeouts::connect`], every statement by [`Timeouts::statement`]
//!   (client side, so a hung server or a dead network cannot stall a poll).
//! - Errors are classified for the caller: a server that cannot be reached,
//!   went away, restarts, or times out is [`RowSourceError::Unavailable`]
//!   (retry with backoff; the next call reconnects); a bad URL, wrong
//!   credentials, a missing database, table or privilege is
//!   [`RowSourceError::Fatal`]; a value that cannot be read as its column is
//!   [`RowSourceError::BadRow`] naming the event and the column.
//! - Rows are returned as stored, in `EVENT_ID` order; gaps and repeats are
//!   the adapter's business, not hidden here.
//!
//! Dialects: PostgreSQL identifiers are Hive's quoted upper case
//! (`"NOTIFICATION_LOG"."EVENT_ID"`). MySQL names are backticked and the
//! tables may be lower case (`lower_case_table_names`, or a schema created
//! that way): which spelling exists is looked up at connect time. MySQL
//! columns are usually `latin1`; the session asks for `utf8mb4`, so the
//! server converts what it stored, and the bytes are decoded as UTF-8.
//!
//! Called by the Hive adapter's polling thread through [`connect`]; tests
//! use [`MetastoreSource::open`] to choose short timeouts. The bootstrap's
//! snapshot transaction runs its own statements on a `Session`, opened,
//! quoted and classified the same way.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use super::model::{NotificationRow, RowSource, RowSourceError, TxnWriteRow};
use super::tls::{self, TlsMode, TlsSettings};

/// The environment variable the metastore password is read from.
pub const PASSWORD_ENV: &str = "STAGEFS_METASTORE_PASSWORD";

/// How long connecting and each statement may take before the metastore
/// counts as unavailable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timeouts {
    pub connect: Duration,
    pub statement: Duration,
}

impl Default for Timeouts {
    fn default() -> Self {
        Timeouts {
            connect: Duration::from_secs(5),
            statement: Duration::from_secs(10),
        }
    }
}

/// Opens the metastore named by `url` with default [`Timeouts`].
/// `password` is what the caller read from `STAGEFS_METASTORE_PASSWORD`;
/// a `?password_file=PATH` in the URL takes precedence over it.
pub fn connect(url: &str, password: Option<String>) -> Result<Box<dyn RowSource>, RowSourceError> {
    Ok(Box::new(MetastoreSource::open(
        url,
        password,
        Timeouts::default(),
    )?))
}

/// Where a metastore is and how to log in: the URL parsed and its
/// password read (a `?password_file=` wins over the password given). Used
/// by [`MetastoreSource`] and by `Session`. The password is never in
/// `Debug`, nor in an error that went through [`Endpoint::scrub`].
pub(crate) struct Endpoint {
    target: Target,
    password: Option<Secret>,
}

impl Endpoint {
    /// Parses `url` as [`connect`] does; `password` is what the caller read
    /// from `STAGEFS_METASTORE_PASSWORD`.
    pub(crate) fn parse(url: &str, password: Option<String>) -> Result<Endpoint, RowSourceError> {
        let (target, password_file) = Target::parse(url)?;
        let password = match password_file {
            Some(path) => Some(read_password_file(&path)?),
            None => password.map(Secret),
        };
        Ok(Endpoint { target, password })
    }

    /// `scheme://user@host:port/db`, for errors and status.
    pub(crate) fn describe(&self) -> String {
        self.target.describe()
    }

    /// The URL's TLS settings (`sslmode=verify-full, sslrootcert=…`).
    pub(crate) fn tls(&self) -> &TlsSettings {
        &self.target.tls
    }

    /// Prefixes the source and removes the password from driver texts.
    pub(crate) fn scrub(&self, error: RowSourceError) -> RowSourceError {
        let hide = |text: String| match &self.password {
            Some(Secret(p)) if !p.is_empty() => text.replace(p.as_str(), "<password>"),
            _ => text,
        };
        let clean = |text: String| format!("{}: {}", self.describe(), hide(text));
        match error {
            RowSourceError::Unavailable(reason) => RowSourceError::Unavailable(clean(reason)),
            RowSourceError::Fatal(reason) => RowSourceError::Fatal(clean(reason)),
            RowSourceError::BadRow {
                location,
                reason,
                event_id,
            } => RowSourceError::BadRow {
                location: clean(location),
                reason: hide(reason),
                event_id,
            },
        }
    }

    fn password(&self) -> Option<&str> {
        self.password.as_ref().map(|Secret(p)| p.as_str())
    }
}

impl fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.describe())
    }
}

/// A metastore database polled for notification rows.
///
/// [`MetastoreSource::open`] fails only on what cannot work (a bad URL, an
/// unreadable password file, and, when the server answers, wrong
/// credentials or missing tables). A server that is down at open time gives
/// a source whose calls return `Unavailable` until it is back.
pub struct MetastoreSource {
    endpoint: Endpoint,
    timeouts: Timeouts,
    conn: Option<Connection>,
}

impl MetastoreSource {
    pub fn open(
        url: &str,
        password: Option<String>,
        timeouts: Timeouts,
    ) -> Result<MetastoreSource, RowSourceError> {
        let mut source = MetastoreSource {
            endpoint: Endpoint::parse(url, password)?,
            timeouts,
            conn: None,
        };
        match source
            .connection()
            .map(|_| ())
            .map_err(|e| source.endpoint.scrub(e))
        {
            Ok(()) => {}
            Err(RowSourceError::Unavailable(reason)) => {
                tracing::warn!("will retry: {reason}");
            }
            Err(other) => return Err(other),
        }
        Ok(source)
    }

    /// Whether a connection is open now (it is reopened on the next call when not).
    pub fn is_connected(&self) -> bool {
        self.conn.is_some()
    }

    fn connection(&mut self) -> Result<&mut Connection, RowSourceError> {
        if self.conn.is_none() {
            let opened = Connection::open(&self.endpoint, self.timeouts)?;
            self.conn = Some(opened);
        }
        match self.conn.as_mut() {
            Some(conn) => Ok(conn),
            None => Err(RowSourceError::Unavailable("no connection".into())),
        }
    }

    /// Runs `call` on the connection. A connection that turns out to be
    /// dead (the server restarted since the last call) is replaced once and
    /// the call retried, so a poll right after a restart already succeeds;
    /// a failure on a fresh connection is returned. An unavailable server
    /// drops the connection: the next call opens a new one.
    fn with_connection<T>(
        &mut self,
        mut call: impl FnMut(&mut Connection) -> Result<T, RowSourceError>,
    ) -> Result<T, RowSourceError> {
        let reused = self.conn.is_some();
        let mut result = self.connection().and_then(&mut call);
        if reused && matches!(result, Err(RowSourceError::Unavailable(_))) {
            self.conn = None;
            result = self.connection().and_then(&mut call);
        }
        if let Err(RowSourceError::Unavailable(_)) = &result {
            self.conn = None;
        }
        result.map_err(|e| self.endpoint.scrub(e))
    }
}

impl RowSource for MetastoreSource {
    fn poll(&mut self, after: i64, limit: usize) -> Result<Vec<NotificationRow>, RowSourceError> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        self.with_connection(|conn| conn.poll(after, limit))
    }

    fn txn_writes(&mut self, txn_id: i64) -> Result<Vec<TxnWriteRow>, RowSourceError> {
        self.with_connection(|conn| conn.txn_writes(txn_id))
    }

    fn records_txn_writes(&mut self) -> Result<bool, RowSourceError> {
        self.with_connection(|conn| {
            Ok(match conn {
                Connection::Postgres(c) => c.has_txn_table(),
                Connection::Mysql(c) => c.has_txn_table(),
            })
        })
    }

    fn newest_event_id(&mut self) -> Result<Option<i64>, RowSourceError> {
        self.with_connection(|conn| conn.newest_event_id())
    }

    fn describe(&self) -> String {
        self.endpoint.describe()
    }
}

impl fmt::Debug for MetastoreSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MetastoreSource")
            .field("target", &self.endpoint.describe())
            .field(
                "password",
                &self.endpoint.password.as_ref().map(|_| "<set>"),
            )
            .field("connected", &self.conn.is_some())
            .finish()
    }
}

/// A password; its `Debug` never shows it.
struct Secret(String);

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<password>")
    }
}

fn read_password_file(path: &std::path::Path) -> Result<Secret, RowSourceError> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        RowSourceError::Fatal(format!(
            "cannot read the metastore password file {}: {e}",
            path.display()
        ))
    })?;
    let password = text.strip_suffix('\n').unwrap_or(&text);
    let password = password.strip_suffix('\r').unwrap_or(password);
    Ok(Secret(password.to_string()))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Dialect {
    Postgres,
    Mysql,
}

impl Dialect {
    /// `name` as an identifier of this dialect: `"NAME"` (PostgreSQL keeps
    /// Hive's upper case only when quoted), `` `name` `` (MySQL).
    fn quote(self, name: &str) -> String {
        match self {
            Dialect::Postgres => format!("\"{name}\""),
            Dialect::Mysql => format!("`{name}`"),
        }
    }

    /// [`Dialect::quote`] of each name, comma-separated.
    fn quote_all(self, names: &[&str]) -> String {
        names
            .iter()
            .map(|n| self.quote(n))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// Where the metastore is: the URL without its password file.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Target {
    dialect: Dialect,
    user: String,
    host: String,
    port: u16,
    database: String,
    tls: TlsSettings,
}

impl Target {
    /// `postgresql://user@host:port/db`, `postgres://…`, `mysql://…`, with an
    /// optional `?password_file=PATH` and the TLS parameters of
    /// [`TlsSettings`] (`sslmode`, `sslrootcert`; `ssl-mode`, `ssl-ca`).
    /// Port defaults to 5432 / 3306.
    fn parse(url: &str) -> Result<(Target, Option<PathBuf>), RowSourceError> {
        let bad = |why: &str| {
            RowSourceError::Fatal(format!(
                "bad metastore URL ({why}); expected postgresql://user@host:port/db or mysql://user@host:port/db"
            ))
        };
        let (scheme, rest) = url.split_once("://").ok_or_else(|| bad("no scheme"))?;
        let (dialect, default_port) = match scheme {
            "postgresql" | "postgres" => (Dialect::Postgres, 5432),
            "mysql" => (Dialect::Mysql, 3306),
            _ => return Err(bad(&format!("unknown scheme {scheme:?}"))),
        };
        let (rest, query) = match rest.split_once('?') {
            Some((rest, query)) => (rest, Some(query)),
            None => (rest, None),
        };
        let (authority, path) = rest.split_once('/').ok_or_else(|| bad("no database"))?;
        let database = percent_decode(path).ok_or_else(|| bad("bad %-escape in the database"))?;
        if database.is_empty() || database.contains('/') {
            return Err(bad("no database"));
        }
        let (user, host_port) = authority
            .rsplit_once('@')
            .ok_or_else(|| bad("no user@ before the host"))?;
        if user.contains(':') {
            return Err(RowSourceError::Fatal(
                "bad metastore URL: it carries a password; put the password in \
                 STAGEFS_METASTORE_PASSWORD or a ?password_file= instead"
                    .into(),
            ));
        }
        let user = percent_decode(user).ok_or_else(|| bad("bad %-escape in the user"))?;
        if user.is_empty() {
            return Err(bad("no user"));
        }
        let (host, port) = split_host_port(host_port).ok_or_else(|| bad("bad host:port"))?;
        let port = match port {
            Some(port) => port.parse::<u16>().map_err(|_| bad("bad port"))?,
            None => default_port,
        };
        let mysql = dialect == Dialect::Mysql;
        // The TLS parameters as each database's own client spells them.
        let (mode_keys, root_keys): (&[&str], &[&str]) = if mysql {
            (&["ssl-mode", "ssl_mode"], &["ssl-ca", "ssl_ca"])
        } else {
            (&["sslmode"], &["sslrootcert"])
        };
        let mut password_file = None;
        let mut tls_mode = None;
        let mut tls_root = None;
        for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            let decoded = || {
                percent_decode(value)
                    .filter(|v| !v.is_empty())
                    .ok_or_else(|| bad(&format!("{key} has no value or a bad %-escape")))
            };
            if key == "password_file" {
                password_file = Some(PathBuf::from(decoded()?));
            } else if mode_keys.contains(&key) {
                tls_mode = Some(decoded()?);
            } else if root_keys.contains(&key) {
                tls_root = Some(decoded()?);
            } else {
                return Err(bad(&format!(
                    "unknown parameter {key:?}; understood: password_file, {}, {}",
                    mode_keys[0], root_keys[0]
                )));
            }
        }
        let tls = TlsSettings::from_params(mysql, tls_mode.as_deref(), tls_root.as_deref())
            .map_err(|why| bad(&why))?;
        Ok((
            Target {
                dialect,
                user,
                host,
                port,
                database,
                tls,
            },
            password_file,
        ))
    }

    fn describe(&self) -> String {
        let scheme = match self.dialect {
            Dialect::Postgres => "postgresql",
            Dialect::Mysql => "mysql",
        };
        let host = if self.host.contains(':') {
            format!("[{}]", self.host)
        } else {
            self.host.clone()
        };
        format!(
            "{scheme}://{}@{host}:{}/{}",
            self.user, self.port, self.database
        )
    }
}

/// `host`, `host:port`, `[v6]`, `[v6]:port`.
fn split_host_port(text: &str) -> Option<(String, Option<&str>)> {
    if let Some(inner) = text.strip_prefix('[') {
        let (host, after) = inner.split_once(']')?;
        let port = match after {
            "" => None,
            _ => Some(after.strip_prefix(':')?),
        };
        return (!host.is_empty()).then(|| (host.to_string(), port));
    }
    let (host, port) = match text.split_once(':') {
        Some((host, port)) => (host, Some(port)),
        None => (text, None),
    };
    (!host.is_empty()).then(|| (host.to_string(), port))
}

fn percent_decode(text: &str) -> Option<String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// One column value as the driver returned it, before it is checked
/// against what the column means.
enum Cell {
    Null,
    Int(i64),
    Bytes(Vec<u8>),
    Text(String),
    Unreadable(String),
}

/// One result row, read column by column into a model row. `key` names the
/// row in errors (its `EVENT_ID` or `WNL_ID` once read).
struct Cells {
    table: &'static str,
    columns: &'static [&'static str],
    values: Vec<Cell>,
    key: String,
    /// The row's `EVENT_ID`, once read (a `NOTIFICATION_LOG` row).
    event_id: Option<i64>,
}

impl Cells {
    fn new(
        table: &'static str,
        columns: &'static [&'static str],
        values: Vec<Cell>,
        key: String,
    ) -> Cells {
        Cells {
            table,
            columns,
            values,
            key,
            event_id: None,
        }
    }

    fn bad(&self, column: usize, reason: String) -> RowSourceError {
        RowSourceError::BadRow {
            location: format!(
                "{} {}, column {}",
                self.table,
                self.key,
                self.columns.get(column).copied().unwrap_or("?")
            ),
            reason,
            event_id: self.event_id,
        }
    }

    fn take(&mut self, column: usize) -> Cell {
        match self.values.get_mut(column) {
            Some(cell) => std::mem::replace(cell, Cell::Null),
            None => Cell::Unreadable("the column is missing from the result".into()),
        }
    }

    fn int(&mut self, column: usize) -> Result<Option<i64>, RowSourceError> {
        match self.take(column) {
            Cell::Null => Ok(None),
            Cell::Int(v) => Ok(Some(v)),
            Cell::Text(text) => text
                .trim()
                .parse()
                .map(Some)
                .map_err(|_| self.bad(column, format!("{text:?} is not an integer"))),
            Cell::Bytes(bytes) => std::str::from_utf8(&bytes)
                .ok()
                .and_then(|t| t.trim().parse().ok())
                .map(Some)
                .ok_or_else(|| self.bad(column, "not an integer".into())),
            Cell::Unreadable(reason) => Err(self.bad(column, reason)),
        }
    }

    fn text(&mut self, column: usize) -> Result<Option<String>, RowSourceError> {
        match self.take(column) {
            Cell::Null => Ok(None),
            Cell::Text(text) => Ok(Some(text)),
            Cell::Int(v) => Ok(Some(v.to_string())),
            Cell::Bytes(bytes) => String::from_utf8(bytes).map(Some).map_err(|e| {
                self.bad(
                    column,
                    format!("not valid UTF-8 (at byte {})", e.utf8_error().valid_up_to()),
                )
            }),
            Cell::Unreadable(reason) => Err(self.bad(column, reason)),
        }
    }

    fn required_int(&mut self, column: usize) -> Result<i64, RowSourceError> {
        self.int(column)?
            .ok_or_else(|| self.bad(column, "NULL in a NOT NULL column".into()))
    }

    fn required_text(&mut self, column: usize) -> Result<String, RowSourceError> {
        self.text(column)?
            .ok_or_else(|| self.bad(column, "NULL in a NOT NULL column".into()))
    }
}

const LOG_TABLE: &str = "NOTIFICATION_LOG";
const SEQUENCE_TABLE: &str = "NOTIFICATION_SEQUENCE";
const TXN_TABLE: &str = "TXN_WRITE_NOTIFICATION_LOG";

const LOG_COLUMNS: &[&str] = &[
    "EVENT_ID",
    "NL_ID",
    "EVENT_TIME",
    "EVENT_TYPE",
    "CAT_NAME",
    "DB_NAME",
    "TBL_NAME",
    "MESSAGE",
    "MESSAGE_FORMAT",
];

const TXN_COLUMNS: &[&str] = &[
    "WNL_ID",
    "WNL_TXNID",
    "WNL_WRITEID",
    "WNL_DATABASE",
    "WNL_TABLE",
    "WNL_PARTITION",
    "WNL_TABLE_OBJ",
    "WNL_PARTITION_OBJ",
    "WNL_FILES",
    "WNL_EVENT_TIME",
];

/// `LOG_COLUMNS` in order, read from one result row.
fn notification_row(values: Vec<Cell>, after: i64) -> Result<NotificationRow, RowSourceError> {
    let mut cells = Cells::new(
        LOG_TABLE,
        LOG_COLUMNS,
        values,
        format!("row after EVENT_ID {after}"),
    );
    let event_id = cells.required_int(0)?;
    cells.key = format!("EVENT_ID {event_id}");
    cells.event_id = Some(event_id);
    Ok(NotificationRow {
        event_id,
        nl_id: cells.int(1)?,
        event_time: cells.int(2)?,
        event_type: cells.required_text(3)?,
        cat_name: cells.text(4)?,
        db_name: cells.text(5)?,
        tbl_name: cells.text(6)?,
        message: cells.text(7)?.map(std::sync::Arc::from),
        message_format: cells.text(8)?,
    })
}

/// The rows of a batch up to the first that cannot be read; that one's
/// error only when it is the first (the next poll starts at it), so the
/// good rows before a bad one are replicated and the stop is at it.
fn good_rows_first(
    rows: impl Iterator<Item = Result<NotificationRow, RowSourceError>>,
) -> Result<Vec<NotificationRow>, RowSourceError> {
    let mut good = Vec::new();
    for row in rows {
        match row {
            Ok(row) => good.push(row),
            Err(e) if good.is_empty() => return Err(e),
            Err(_) => break,
        }
    }
    Ok(good)
}

/// `TXN_COLUMNS` in order, read from one result row.
fn txn_write_row(values: Vec<Cell>, txn_id: i64) -> Result<TxnWriteRow, RowSourceError> {
    let mut cells = Cells::new(
        TXN_TABLE,
        TXN_COLUMNS,
        values,
        format!("row of WNL_TXNID {txn_id}"),
    );
    let wnl_id = cells.int(0)?;
    if let Some(id) = wnl_id {
        cells.key = format!("WNL_ID {id} (WNL_TXNID {txn_id})");
    }
    Ok(TxnWriteRow {
        wnl_id,
        txn_id: cells.required_int(1)?,
        write_id: cells.int(2)?,
        database: cells.required_text(3)?,
        table: cells.required_text(4)?,
        partition: cells.text(5)?,
        table_obj: cells.text(6)?,
        partition_obj: cells.text(7)?,
        files: cells.text(8)?,
        event_time: cells.int(9)?,
    })
}

fn missing_txn_table() -> RowSourceError {
    RowSourceError::Fatal(format!(
        "table {TXN_TABLE} does not exist: this metastore's schema is older than \
         Hive 3.2 / 4.0, which keep the files that transactions write into \
         transactional (ACID, insert-only) tables there and nowhere else"
    ))
}

enum Connection {
    Postgres(Box<pg::PgConnection>),
    Mysql(my::MysqlConnection),
}

impl Connection {
    fn open(endpoint: &Endpoint, timeouts: Timeouts) -> Result<Connection, RowSourceError> {
        Ok(match endpoint.target.dialect {
            Dialect::Postgres => {
                Connection::Postgres(Box::new(pg::PgConnection::open(endpoint, timeouts)?))
            }
            Dialect::Mysql => Connection::Mysql(my::MysqlConnection::open(endpoint, timeouts)?),
        })
    }

    fn poll(&mut self, after: i64, limit: i64) -> Result<Vec<NotificationRow>, RowSourceError> {
        match self {
            Connection::Postgres(c) => c.poll(after, limit),
            Connection::Mysql(c) => c.poll(after, limit),
        }
    }

    fn txn_writes(&mut self, txn_id: i64) -> Result<Vec<TxnWriteRow>, RowSourceError> {
        match self {
            Connection::Postgres(c) => c.txn_writes(txn_id),
            Connection::Mysql(c) => c.txn_writes(txn_id),
        }
    }

    fn newest_event_id(&mut self) -> Result<Option<i64>, RowSourceError> {
        match self {
            Connection::Postgres(c) => c.newest_event_id(),
            Connection::Mysql(c) => c.newest_event_id(),
        }
    }
}

/// The catalogs of the metastore at `url` (`CTLGS.NAME`, lower-cased, in
/// name order), or None when its schema has no `CTLGS` (Hive 2: one
/// catalog, `hive`). Read on a connection of its own.
pub fn catalogs(
    url: &str,
    password: Option<String>,
    timeouts: Timeouts,
) -> Result<Option<Vec<String>>, RowSourceError> {
    let ep = Endpoint::parse(url, password)?;
    let read = || -> Result<Option<Vec<String>>, RowSourceError> {
        let mut session = Session::open(&ep, timeouts, "stagefs-catalogs")?;
        let tables = session.tables()?;
        let Some(ctlgs) = session.table(&tables, "CTLGS") else {
            return Ok(None);
        };
        let sql = format!(
            "SELECT {} FROM {}",
            session.quote("NAME"),
            session.quote(&ctlgs)
        );
        let mut names: Vec<String> = session
            .query(&sql)?
            .into_iter()
            .filter_map(|r| r.into_iter().next().flatten())
            .map(|n| n.trim().to_ascii_lowercase())
            .collect();
        names.sort();
        names.dedup();
        Ok(Some(names))
    };
    read().map_err(|e| ep.scrub(e))
}

/// Whether `catalog` is one the metastore's schema has (`catalogs`): an
/// error naming the catalogs there are when it is not. Hive 2 schemas
/// (no `CTLGS`) have only `hive`.
pub fn catalog_known(catalog: &str, catalogs: Option<&[String]>) -> Result<(), RowSourceError> {
    let default = [super::adapter::DEFAULT_CATALOG.to_owned()];
    let (known, why) = match catalogs {
        Some(list) => (list, "its CTLGS table"),
        None => (&default[..], "a schema without CTLGS (Hive 2)"),
    };
    if known.iter().any(|c| c.eq_ignore_ascii_case(catalog)) {
        return Ok(());
    }
    Err(RowSourceError::Fatal(format!(
        "--catalog {catalog}: the metastore has no such catalog (catalogs in {why}: {})",
        if known.is_empty() {
            "none".to_owned()
        } else {
            known.join(", ")
        }
    )))
}

/// At start: the catalog followed exists in the metastore. A metastore
/// that cannot be reached now is not an error here (polling retries it);
/// it is logged, and the rows are filtered by the catalog all the same.
pub fn check_catalog(
    url: &str,
    password: Option<String>,
    catalog: &str,
) -> Result<(), RowSourceError> {
    match catalogs(url, password, Timeouts::default()) {
        Ok(list) => catalog_known(catalog, list.as_deref()),
        Err(RowSourceError::Unavailable(why)) => {
            tracing::warn!(catalog, "cannot check that the catalog exists now: {why}");
            Ok(())
        }
        Err(e) => Err(e),
    }
}

/// A connection opened as the polling one is (same login, timeouts and
/// error classes), for a caller that runs its own statements and reads
/// every value as text: the bootstrap's snapshot transaction
/// (`crate::bootstrap::snapshot`). Its errors are not scrubbed yet: pass
/// them through [`Endpoint::scrub`].
pub(crate) enum Session {
    Postgres(Box<pg::PgSession>),
    Mysql(::mysql::Conn),
}

/// One result: its rows, each value as text (None: NULL).
pub(crate) type TextRows = Vec<Vec<Option<String>>>;

impl Session {
    /// Connects; `application` names the connection on PostgreSQL.
    pub(crate) fn open(
        endpoint: &Endpoint,
        timeouts: Timeouts,
        application: &str,
    ) -> Result<Session, RowSourceError> {
        Ok(match endpoint.target.dialect {
            Dialect::Postgres => Session::Postgres(Box::new(pg::PgSession::open(
                endpoint,
                timeouts,
                application,
            )?)),
            Dialect::Mysql => Session::Mysql(my::open(endpoint, timeouts)?),
        })
    }

    pub(crate) fn is_postgres(&self) -> bool {
        matches!(self, Session::Postgres(_))
    }

    /// `name` quoted as an identifier of this database's dialect.
    pub(crate) fn quote(&self, name: &str) -> String {
        self.dialect().quote(name)
    }

    fn dialect(&self) -> Dialect {
        match self {
            Session::Postgres(_) => Dialect::Postgres,
            Session::Mysql(_) => Dialect::Mysql,
        }
    }

    /// Hive's table `upper` as this database spells it, None when it is
    /// absent: PostgreSQL's quoted upper case; on MySQL upper case, or
    /// lower case where the server folds names (`lower_case_table_names`)
    /// or the schema was made so.
    pub(crate) fn table(&self, tables: &TableNames, upper: &str) -> Option<String> {
        match self {
            Session::Postgres(_) => tables.0.iter().any(|t| t == upper).then(|| upper.into()),
            Session::Mysql(_) => tables.pick(upper),
        }
    }

    /// The tables of the current schema (PostgreSQL) or database (MySQL).
    pub(crate) fn tables(&mut self) -> Result<TableNames, RowSourceError> {
        match self {
            Session::Postgres(s) => {
                let rows = s.simple_query(
                    "listing the tables",
                    "SELECT table_name FROM information_schema.tables \
                     WHERE table_schema = current_schema()",
                )?;
                Ok(TableNames(rows.into_iter().flatten().flatten().collect()))
            }
            Session::Mysql(conn) => my::table_names(conn),
        }
    }

    /// Runs `sql` (no result wanted).
    pub(crate) fn execute(&mut self, sql: &str) -> Result<(), RowSourceError> {
        match self {
            Session::Postgres(s) => s.simple_query(sql, sql).map(|_| ()),
            Session::Mysql(conn) => my::execute(conn, sql),
        }
    }

    /// Runs `sql` through the text protocol; every value as text.
    pub(crate) fn query(&mut self, sql: &str) -> Result<TextRows, RowSourceError> {
        match self {
            Session::Postgres(s) => s.simple_query(sql, sql),
            Session::Mysql(conn) => my::query_text(conn, sql),
        }
    }

    /// The TLS version of this connection as the server sees it
    /// (`TLSv1.3`), None when it is not encrypted.
    pub(crate) fn tls_version(&mut self) -> Result<Option<String>, RowSourceError> {
        let sql = match self {
            Session::Postgres(_) => {
                "SELECT CASE WHEN ssl THEN version END FROM pg_stat_ssl WHERE pid = pg_backend_pid()"
            }
            Session::Mysql(_) => "SHOW SESSION STATUS LIKE 'Ssl_version'",
        };
        let column = match self {
            Session::Postgres(_) => 0,
            Session::Mysql(_) => 1,
        };
        let rows = self.query(sql)?;
        Ok(rows
            .into_iter()
            .next()
            .and_then(|mut row| row.get_mut(column).and_then(Option::take))
            .filter(|v| !v.is_empty()))
    }
}

/// The tables of a database as they are spelled there.
pub(crate) struct TableNames(Vec<String>);

impl TableNames {
    /// The upper-case name when it exists, else the lower-case one.
    fn pick(&self, upper: &str) -> Option<String> {
        let lower = upper.to_ascii_lowercase();
        [upper.to_string(), lower]
            .into_iter()
            .find(|name| self.0.iter().any(|n| n == name))
    }
}

/// `NEXT_EVENT_ID - 1`, or None when the sequence has no row yet.
fn newest_from_next(next: Option<i64>) -> Option<i64> {
    next.map(|n| n.saturating_sub(1))
}

mod pg {
    //! PostgreSQL through tokio-postgres on a private current-thread
    //! runtime: each call is `block_on(timeout(statement, query))`, which
    //! gives a deadline the sync wrapper cannot.

    use std::future::Future;

    use tokio_postgres::config::SslMode;
    use tokio_postgres::error::SqlState;
    use tokio_postgres::types::Type;
    use tokio_postgres::{Client, NoTls, Row, SimpleQueryMessage, Statement};
    use tokio_postgres_rustls::MakeRustlsConnect;

    use super::*;

    /// A connected client on its private runtime.
    pub(crate) struct PgSession {
        runtime: tokio::runtime::Runtime,
        client: Client,
        connection_task: tokio::task::JoinHandle<()>,
        statement_timeout: Duration,
    }

    impl Drop for PgSession {
        fn drop(&mut self) {
            self.connection_task.abort();
        }
    }

    impl PgSession {
        pub(super) fn open(
            endpoint: &Endpoint,
            timeouts: Timeouts,
            application: &str,
        ) -> Result<PgSession, RowSourceError> {
            let target = &endpoint.target;
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| RowSourceError::Fatal(format!("cannot start a runtime: {e}")))?;
            let mut config = tokio_postgres::Config::new();
            config
                .user(&target.user)
                .dbname(&target.database)
                .host(&target.host)
                .port(target.port)
                .connect_timeout(timeouts.connect)
                .keepalives(true)
                .keepalives_idle(Duration::from_secs(30))
                .application_name(application)
                // The server gives up too, instead of finishing a query
                // nobody waits for any more.
                .options(format!(
                    "-c statement_timeout={}",
                    timeouts.statement.as_millis()
                ));
            if let Some(password) = endpoint.password() {
                config.password(password);
            }
            let deadline = timeouts.connect + timeouts.statement;
            let settings = &target.tls;
            let tls_config = settings.client_config().map_err(RowSourceError::Fatal)?;
            config.ssl_mode(match settings.mode {
                TlsMode::Disable => SslMode::Disable,
                TlsMode::Prefer => SslMode::Prefer,
                TlsMode::Require | TlsMode::VerifyCa | TlsMode::VerifyFull => SslMode::Require,
            });
            // A TLS refusal is named as such and is fatal (see super::tls).
            let tls_refusal = |e: tokio_postgres::Error| {
                if let Some(text) = tls::refusal(settings, &target.host, &e) {
                    return RowSourceError::Fatal(format!("connecting: {text}"));
                }
                if chain(&e).contains("server does not support TLS") {
                    return RowSourceError::Fatal(format!(
                        "connecting: {}",
                        tls::not_offered(settings)
                    ));
                }
                classify("connecting", &e)
            };
            let connected = runtime.block_on(async {
                tokio::time::timeout(deadline, async {
                    match tls_config {
                        None => config.connect(NoTls).await.map(|(client, connection)| {
                            (
                                client,
                                tokio::spawn(async move {
                                    // An error here (the server went away)
                                    // shows on the next query as a closed
                                    // connection.
                                    let _ = connection.await;
                                }),
                            )
                        }),
                        Some(tls_config) => config
                            .connect(MakeRustlsConnect::new(tls_config))
                            .await
                            .map(|(client, connection)| {
                                (
                                    client,
                                    tokio::spawn(async move {
                                        let _ = connection.await;
                                    }),
                                )
                            }),
                    }
                })
                .await
            });
            let (client, connection_task) = match connected {
                Ok(Ok(connected)) => connected,
                Ok(Err(e)) => return Err(tls_refusal(e)),
                Err(_) => {
                    return Err(RowSourceError::Unavailable(format!(
                        "connecting: no answer within {} ms",
                        deadline.as_millis()
                    )))
                }
            };
            Ok(PgSession {
                runtime,
                client,
                connection_task,
                statement_timeout: timeouts.statement,
            })
        }

        fn run<T>(
            &self,
            what: &str,
            future: impl Future<Output = Result<T, tokio_postgres::Error>>,
        ) -> Result<T, RowSourceError> {
            block_on(&self.runtime, self.statement_timeout, what, future)
        }

        /// `sql` through the simple query protocol: every value as text.
        pub(super) fn simple_query(
            &self,
            what: &str,
            sql: &str,
        ) -> Result<TextRows, RowSourceError> {
            let messages = self.run(what, self.client.simple_query(sql))?;
            Ok(messages
                .iter()
                .filter_map(|m| match m {
                    SimpleQueryMessage::Row(row) => Some(
                        (0..row.len())
                            .map(|i| row.get(i).map(str::to_owned))
                            .collect(),
                    ),
                    _ => None,
                })
                .collect())
        }
    }

    pub(super) struct PgConnection {
        session: PgSession,
        poll: Statement,
        newest: Statement,
        /// None when the table does not exist.
        txn_writes: Option<Statement>,
    }

    impl PgConnection {
        pub(super) fn open(
            endpoint: &Endpoint,
            timeouts: Timeouts,
        ) -> Result<PgConnection, RowSourceError> {
            let session = PgSession::open(endpoint, timeouts, "stagefs")?;
            let prepare =
                |sql: String| session.run("preparing a query", session.client.prepare(&sql));
            let q = |name: &str| Dialect::Postgres.quote(name);
            let poll = prepare(format!(
                "SELECT {} FROM {} WHERE {id} > $1 ORDER BY {id} LIMIT $2",
                Dialect::Postgres.quote_all(LOG_COLUMNS),
                q(LOG_TABLE),
                id = q("EVENT_ID"),
            ))?;
            let newest = prepare(format!(
                "SELECT MAX({}) FROM {}",
                q("NEXT_EVENT_ID"),
                q(SEQUENCE_TABLE)
            ))?;
            let txn_writes = match prepare(format!(
                "SELECT {} FROM {} WHERE {} = $1 ORDER BY {}",
                Dialect::Postgres.quote_all(TXN_COLUMNS),
                q(TXN_TABLE),
                q("WNL_TXNID"),
                q("WNL_ID"),
            )) {
                Ok(statement) => Some(statement),
                Err(RowSourceError::Fatal(reason)) if reason.contains("does not exist") => {
                    tracing::warn!("{TXN_TABLE} is missing: {reason}");
                    None
                }
                Err(other) => return Err(other),
            };
            let mut conn = PgConnection {
                session,
                poll,
                newest,
                txn_writes,
            };
            // Privileges are checked when a statement runs, not when it is
            // prepared: run each once so that a missing grant is reported now.
            conn.poll(i64::MAX, 0)?;
            conn.newest_event_id()?;
            if conn.txn_writes.is_some() {
                conn.txn_writes(i64::MIN)?;
            }
            Ok(conn)
        }

        fn run<T>(
            &self,
            what: &str,
            future: impl Future<Output = Result<T, tokio_postgres::Error>>,
        ) -> Result<T, RowSourceError> {
            self.session.run(what, future)
        }

        pub(super) fn poll(
            &mut self,
            after: i64,
            limit: i64,
        ) -> Result<Vec<NotificationRow>, RowSourceError> {
            let rows = self.run(
                "reading NOTIFICATION_LOG",
                self.session.client.query(&self.poll, &[&after, &limit]),
            );
            match rows {
                Ok(rows) => {
                    good_rows_first(rows.iter().map(|row| notification_row(cells(row), after)))
                }
                Err(RowSourceError::BadRow {
                    location, reason, ..
                }) if location.is_empty() => {
                    let (good, bad) = self.locate_bad_row(after, limit, reason);
                    // The rows before the bad one are read on their own.
                    if good > 0 {
                        self.poll(after, good)
                    } else {
                        Err(bad)
                    }
                }
                Err(other) => Err(other),
            }
        }

        /// The server could not send a row of the batch (class 22: text
        /// not valid in the client encoding). Its ids are still readable:
        /// fetch the rows one by one to name the first bad one. Returns how
        /// many rows come before it, and the error naming it.
        fn locate_bad_row(
            &mut self,
            after: i64,
            limit: i64,
            reason: String,
        ) -> (i64, RowSourceError) {
            let ids = self.run(
                "reading NOTIFICATION_LOG ids",
                self.session.client.query(
                    &format!(
                        "SELECT {id} FROM {} WHERE {id} > $1 ORDER BY {id} LIMIT $2",
                        Dialect::Postgres.quote(LOG_TABLE),
                        id = Dialect::Postgres.quote("EVENT_ID"),
                    ),
                    &[&after, &limit],
                ),
            );
            let mut location = format!("{LOG_TABLE} a row after EVENT_ID {after}");
            let mut event_id = None;
            let mut good = 0;
            if let Ok(ids) = ids {
                for row in ids {
                    let Ok(id) = row.try_get::<_, i64>(0) else {
                        break;
                    };
                    let one = self.run(
                        "reading NOTIFICATION_LOG",
                        self.session
                            .client
                            .query(&self.poll, &[&(id.saturating_sub(1)), &1i64]),
                    );
                    if let Err(RowSourceError::BadRow { .. }) = one {
                        location = format!("{LOG_TABLE} EVENT_ID {id}");
                        event_id = Some(id);
                        break;
                    }
                    good += 1;
                }
            }
            if event_id.is_none() {
                good = 0;
            }
            let bad = RowSourceError::BadRow {
                location,
                reason,
                event_id,
            };
            (good, bad)
        }

        /// Whether the metastore has `TXN_WRITE_NOTIFICATION_LOG`.
        pub(super) fn has_txn_table(&self) -> bool {
            self.txn_writes.is_some()
        }

        pub(super) fn txn_writes(
            &mut self,
            txn_id: i64,
        ) -> Result<Vec<TxnWriteRow>, RowSourceError> {
            let statement = self.txn_writes.as_ref().ok_or_else(missing_txn_table)?;
            let rows = self
                .run(
                    "reading TXN_WRITE_NOTIFICATION_LOG",
                    self.session.client.query(statement, &[&txn_id]),
                )
                .map_err(|e| match e {
                    RowSourceError::BadRow {
                        location,
                        reason,
                        event_id,
                    } if location.is_empty() => RowSourceError::BadRow {
                        location: format!("{TXN_TABLE} a row of WNL_TXNID {txn_id}"),
                        reason,
                        event_id,
                    },
                    other => other,
                })?;
            rows.iter()
                .map(|row| txn_write_row(cells(row), txn_id))
                .collect()
        }

        pub(super) fn newest_event_id(&mut self) -> Result<Option<i64>, RowSourceError> {
            let rows = self.run(
                "reading NOTIFICATION_SEQUENCE",
                self.session.client.query(&self.newest, &[]),
            )?;
            let next = match rows.first() {
                Some(row) => {
                    let mut cells =
                        Cells::new(SEQUENCE_TABLE, &["NEXT_EVENT_ID"], cells(row), "row".into());
                    cells.int(0)?
                }
                None => None,
            };
            Ok(newest_from_next(next))
        }
    }

    fn block_on<T>(
        runtime: &tokio::runtime::Runtime,
        deadline: Duration,
        what: &str,
        future: impl Future<Output = Result<T, tokio_postgres::Error>>,
    ) -> Result<T, RowSourceError> {
        match runtime.block_on(async { tokio::time::timeout(deadline, future).await }) {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(e)) => Err(classify(what, &e)),
            Err(_) => Err(RowSourceError::Unavailable(format!(
                "{what}: no answer within {} ms",
                deadline.as_millis()
            ))),
        }
    }

    fn cells(row: &Row) -> Vec<Cell> {
        (0..row.len())
            .map(|i| {
                let type_ = row.columns()[i].type_();
                let read = if *type_ == Type::INT8 {
                    row.try_get::<_, Option<i64>>(i).map(|v| v.map(Cell::Int))
                } else if *type_ == Type::INT4 {
                    row.try_get::<_, Option<i32>>(i)
                        .map(|v| v.map(|v| Cell::Int(v.into())))
                } else if *type_ == Type::INT2 {
                    row.try_get::<_, Option<i16>>(i)
                        .map(|v| v.map(|v| Cell::Int(v.into())))
                } else {
                    row.try_get::<_, Option<String>>(i)
                        .map(|v| v.map(Cell::Text))
                };
                match read {
                    Ok(Some(cell)) => cell,
                    Ok(None) => Cell::Null,
                    Err(e) => Cell::Unreadable(format!("{}: {}", e, chain(&e))),
                }
            })
            .collect()
    }

    fn chain(error: &dyn std::error::Error) -> String {
        let mut parts = Vec::new();
        let mut source = error.source();
        while let Some(e) = source {
            parts.push(e.to_string());
            source = e.source();
        }
        parts.join(": ")
    }

    /// Server states that mean "try again later"; everything else the
    /// server reports (authentication, missing database/table/column,
    /// privileges, syntax) cannot fix itself.
    fn transient_state(state: &SqlState) -> bool {
        let code = state.code();
        // 08 connection exception, 40 transaction rollback, 53 insufficient
        // resources, 57 operator intervention (shutdown, statement timeout,
        // starting up), 58 system error, XX internal error.
        ["08", "40", "53", "57", "58", "XX"]
            .iter()
            .any(|class| code.starts_with(class))
    }

    fn classify(what: &str, error: &tokio_postgres::Error) -> RowSourceError {
        if let Some(db) = error.as_db_error() {
            let mut text = format!("{what}: {} ({})", db.message(), db.code().code());
            if let Some(hint) = db.hint() {
                text.push_str(&format!("; {hint}"));
            }
            return if transient_state(db.code()) {
                RowSourceError::Unavailable(text)
            } else if db.code().code().starts_with("22") {
                // A data exception while sending rows: a row the caller
                // locates (the location is filled in there).
                RowSourceError::BadRow {
                    location: String::new(),
                    reason: text,
                    event_id: None,
                }
            } else {
                RowSourceError::Fatal(text)
            };
        }
        let causes = chain(error);
        let text = if causes.is_empty() {
            format!("{what}: {error}")
        } else {
            format!("{what}: {error}: {causes}")
        };
        let mut io = false;
        let mut source: Option<&(dyn std::error::Error + 'static)> =
            std::error::Error::source(error);
        while let Some(e) = source {
            io |= e.is::<std::io::Error>();
            source = e.source();
        }
        let display = error.to_string();
        let transient = io
            || error.is_closed()
            || display.starts_with("timeout")
            || display.starts_with("error communicating")
            || display.starts_with("unexpected message")
            || display.starts_with("error parsing response");
        if transient {
            RowSourceError::Unavailable(text)
        } else {
            RowSourceError::Fatal(text)
        }
    }
}

mod my {
    //! MySQL and MariaDB through the `mysql` crate (TLS through its
    //! rustls support): socket connect, read and write timeouts bound
    //! every call.

    use ::mysql::prelude::Queryable;
    use ::mysql::{Conn, DriverError, OptsBuilder, SslOpts, Value};
    use ::mysql_common::proto::codec::error::PacketCodecError;

    use super::*;

    pub(super) struct MysqlConnection {
        conn: Conn,
        poll_sql: String,
        newest_sql: String,
        /// None when the table does not exist.
        txn_sql: Option<String>,
    }

    /// Connects as the URL says (TCP, even to localhost), with TLS as its
    /// `ssl-mode` says: PREFERRED tries TLS and, on a server that offers
    /// none, connects again without.
    pub(super) fn open(endpoint: &Endpoint, timeouts: Timeouts) -> Result<Conn, RowSourceError> {
        let settings = &endpoint.target.tls;
        let ssl = ssl_opts(settings)?;
        let with_tls = ssl.is_some();
        match connect(endpoint, timeouts, ssl) {
            Err(::mysql::Error::DriverError(DriverError::TlsNotSupported))
                if settings.mode == TlsMode::Prefer =>
            {
                connect(endpoint, timeouts, None).map_err(|e| classify("connecting", &e))
            }
            Err(::mysql::Error::DriverError(DriverError::TlsNotSupported)) => Err(
                RowSourceError::Fatal(format!("connecting: {}", tls::not_offered(settings))),
            ),
            Err(e) if with_tls => {
                // The crate's errors give no source(): its I/O error is
                // where rustls's refusal is.
                let io = match &e {
                    ::mysql::Error::IoError(io)
                    | ::mysql::Error::CodecError(PacketCodecError::Io(io)) => Some(io),
                    _ => None,
                };
                let host = &endpoint.target.host;
                Err(match io.and_then(|io| tls::refusal(settings, host, io)) {
                    Some(text) => RowSourceError::Fatal(format!("connecting: {text}")),
                    None => classify("connecting", &e),
                })
            }
            other => other.map_err(|e| classify("connecting", &e)),
        }
    }

    /// The `mysql` crate's TLS options for `settings` (None: no TLS). The
    /// crate builds its rustls configuration itself: it trusts the CA file
    /// given and the public CAs it ships (webpki-roots), so VERIFY_CA with a
    /// private CA also accepts a certificate a public CA issued;
    /// VERIFY_IDENTITY checks the name as well.
    fn ssl_opts(settings: &TlsSettings) -> Result<Option<SslOpts>, RowSourceError> {
        // The crate's rustls configuration takes the process's crypto
        // provider: ring, the one this build has (an error only says one is
        // installed already).
        let _ = tls::crypto_provider().install_default();
        let root = settings.root_cert_file().map_err(RowSourceError::Fatal)?;
        let opts = SslOpts::default().with_root_cert_path(root);
        Ok(match settings.mode {
            TlsMode::Disable => None,
            TlsMode::Prefer | TlsMode::Require => Some(opts.with_danger_accept_invalid_certs(true)),
            TlsMode::VerifyCa => Some(opts.with_danger_skip_domain_validation(true)),
            TlsMode::VerifyFull => Some(opts),
        })
    }

    fn connect(
        endpoint: &Endpoint,
        timeouts: Timeouts,
        ssl: Option<SslOpts>,
    ) -> Result<Conn, ::mysql::Error> {
        let target = &endpoint.target;
        let opts = OptsBuilder::new()
            .ip_or_hostname(Some(target.host.clone()))
            .tcp_port(target.port)
            .user(Some(target.user.clone()))
            .pass(endpoint.password().map(str::to_string))
            .db_name(Some(target.database.clone()))
            // Do not switch to the server's unix socket behind the URL's back.
            .prefer_socket(false)
            .tcp_connect_timeout(Some(timeouts.connect))
            .read_timeout(Some(timeouts.statement))
            .write_timeout(Some(timeouts.statement))
            .init(vec!["SET NAMES utf8mb4"])
            .ssl_opts(ssl);
        Conn::new(opts)
    }

    pub(super) fn execute(conn: &mut Conn, sql: &str) -> Result<(), RowSourceError> {
        conn.query_drop(sql).map_err(|e| classify(sql, &e))
    }

    /// `sql` through the text protocol: every value as text.
    pub(super) fn query_text(conn: &mut Conn, sql: &str) -> Result<TextRows, RowSourceError> {
        let rows: Vec<::mysql::Row> = conn.query(sql).map_err(|e| classify(sql, &e))?;
        rows.into_iter()
            .map(|row| {
                cells(row)
                    .into_iter()
                    .map(|cell| match cell {
                        Cell::Null => Ok(None),
                        Cell::Int(v) => Ok(Some(v.to_string())),
                        Cell::Text(t) => Ok(Some(t)),
                        Cell::Bytes(b) => Ok(Some(String::from_utf8_lossy(&b).into_owned())),
                        Cell::Unreadable(reason) => {
                            Err(RowSourceError::Fatal(format!("{sql}: {reason}")))
                        }
                    })
                    .collect()
            })
            .collect()
    }

    impl MysqlConnection {
        pub(super) fn open(
            endpoint: &Endpoint,
            timeouts: Timeouts,
        ) -> Result<MysqlConnection, RowSourceError> {
            let target = &endpoint.target;
            let mut conn = open(endpoint, timeouts)?;
            let names = table_names(&mut conn)?;
            let log = names
                .pick(LOG_TABLE)
                .ok_or_else(|| missing(LOG_TABLE, target))?;
            let sequence = names
                .pick(SEQUENCE_TABLE)
                .ok_or_else(|| missing(SEQUENCE_TABLE, target))?;
            let txn = names.pick(TXN_TABLE);
            if txn.is_none() {
                tracing::warn!("{TXN_TABLE} is missing from {}", target.describe());
            }
            let q = |name: &str| Dialect::Mysql.quote(name);
            let mut connection = MysqlConnection {
                conn,
                poll_sql: format!(
                    "SELECT {} FROM {} WHERE {id} > ? ORDER BY {id} LIMIT ?",
                    Dialect::Mysql.quote_all(LOG_COLUMNS),
                    q(&log),
                    id = q("EVENT_ID"),
                ),
                newest_sql: format!("SELECT MAX({}) FROM {}", q("NEXT_EVENT_ID"), q(&sequence)),
                txn_sql: txn.map(|txn| {
                    format!(
                        "SELECT {} FROM {} WHERE {} = ? ORDER BY {}",
                        Dialect::Mysql.quote_all(TXN_COLUMNS),
                        q(&txn),
                        q("WNL_TXNID"),
                        q("WNL_ID"),
                    )
                }),
            };
            // Run each statement once so that a missing column or grant is
            // reported at connect time.
            connection.poll(i64::MAX, 0)?;
            connection.newest_event_id()?;
            if connection.txn_sql.is_some() {
                connection.txn_writes(i64::MIN)?;
            }
            Ok(connection)
        }

        pub(super) fn poll(
            &mut self,
            after: i64,
            limit: i64,
        ) -> Result<Vec<NotificationRow>, RowSourceError> {
            let rows: Vec<::mysql::Row> = self
                .conn
                .exec(self.poll_sql.as_str(), (after, limit))
                .map_err(|e| classify("reading NOTIFICATION_LOG", &e))?;
            good_rows_first(
                rows.into_iter()
                    .map(|row| notification_row(cells(row), after)),
            )
        }

        /// Whether the metastore has `TXN_WRITE_NOTIFICATION_LOG`.
        pub(super) fn has_txn_table(&self) -> bool {
            self.txn_sql.is_some()
        }

        pub(super) fn txn_writes(
            &mut self,
            txn_id: i64,
        ) -> Result<Vec<TxnWriteRow>, RowSourceError> {
            let sql = self.txn_sql.as_deref().ok_or_else(missing_txn_table)?;
            let rows: Vec<::mysql::Row> = self
                .conn
                .exec(sql, (txn_id,))
                .map_err(|e| classify("reading TXN_WRITE_NOTIFICATION_LOG", &e))?;
            rows.into_iter()
                .map(|row| txn_write_row(cells(row), txn_id))
                .collect()
        }

        pub(super) fn newest_event_id(&mut self) -> Result<Option<i64>, RowSourceError> {
            let rows: Vec<::mysql::Row> = self
                .conn
                .exec(self.newest_sql.as_str(), ())
                .map_err(|e| classify("reading NOTIFICATION_SEQUENCE", &e))?;
            let next = match rows.into_iter().next() {
                Some(row) => {
                    let mut cells =
                        Cells::new(SEQUENCE_TABLE, &["NEXT_EVENT_ID"], cells(row), "row".into());
                    cells.int(0)?
                }
                None => None,
            };
            Ok(newest_from_next(next))
        }
    }

    /// The tables of the current database as they are spelled there.
    pub(super) fn table_names(conn: &mut Conn) -> Result<TableNames, RowSourceError> {
        let rows: Vec<::mysql::Row> = conn
            .exec(
                "SELECT TABLE_NAME FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE()",
                (),
            )
            .map_err(|e| classify("listing the tables", &e))?;
        let mut names = Vec::new();
        for row in rows {
            let mut cells = Cells::new(
                "information_schema.TABLES",
                &["TABLE_NAME"],
                cells(row),
                "row".into(),
            );
            if let Some(name) = cells.text(0)? {
                names.push(name);
            }
        }
        Ok(TableNames(names))
    }

    fn missing(table: &str, target: &Target) -> RowSourceError {
        RowSourceError::Fatal(format!(
            "table {table} (or {}) does not exist in database {}",
            table.to_ascii_lowercase(),
            target.database
        ))
    }

    fn cells(row: ::mysql::Row) -> Vec<Cell> {
        row.unwrap()
            .into_iter()
            .map(|value| match value {
                Value::NULL => Cell::Null,
                Value::Int(v) => Cell::Int(v),
                Value::UInt(v) => match i64::try_from(v) {
                    Ok(v) => Cell::Int(v),
                    Err(_) => Cell::Unreadable(format!("{v} is out of range")),
                },
                Value::Bytes(bytes) => Cell::Bytes(bytes),
                other => Cell::Unreadable(format!("unexpected value {other:?}")),
            })
            .collect()
    }

    /// Server error codes that mean "try again later": too many
    /// connections, shutdown in progress, lock wait timeout, deadlock,
    /// connection killed, statement timeouts (MariaDB 1969, MySQL 3024).
    const TRANSIENT_SERVER_ERRORS: &[u16] = &[1040, 1053, 1205, 1213, 1927, 1969, 3024];

    fn classify(what: &str, error: &::mysql::Error) -> RowSourceError {
        use ::mysql::Error;
        match error {
            Error::IoError(_) | Error::CodecError(_) | Error::DriverError(_) => {
                RowSourceError::Unavailable(format!("{what}: {error}"))
            }
            Error::MySqlError(e) if TRANSIENT_SERVER_ERRORS.contains(&e.code) => {
                RowSourceError::Unavailable(format!("{what}: {} ({})", e.message, e.code))
            }
            Error::MySqlError(e) => {
                RowSourceError::Fatal(format!("{what}: {} ({})", e.message, e.code))
            }
            Error::UrlError(_) | Error::FromValueError(_) | Error::FromRowError(_) => {
                RowSourceError::Fatal(format!("{what}: {error}"))
            }
            // A certificate refused or a server without TLS: retrying
            // cannot fix it.
            Error::TlsError(_) => RowSourceError::Fatal(format!("{what}: TLS: {error}")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(url: &str) -> Result<(Target, Option<PathBuf>), RowSourceError> {
        Target::parse(url)
    }

    #[test]
    fn urls_of_both_dialects_parse_with_default_ports() {
        let (t, file) = parse("postgresql://hive@db.example:6543/metastore").unwrap();
        assert_eq!(t.dialect, Dialect::Postgres);
        assert_eq!(
            (
                t.user.as_str(),
                t.host.as_str(),
                t.port,
                t.database.as_str()
            ),
            ("hive", "db.example", 6543, "metastore")
        );
        assert_eq!(file, None);
        let (t, _) = parse("postgres://hive@db/metastore").unwrap();
        assert_eq!((t.dialect, t.port), (Dialect::Postgres, 5432));
        let (t, _) = parse("mysql://hive@db/metastore").unwrap();
        assert_eq!((t.dialect, t.port), (Dialect::Mysql, 3306));
        let (t, _) = parse("mysql://hive@[::1]:3307/metastore").unwrap();
        assert_eq!((t.host.as_str(), t.port), ("::1", 3307));
        assert_eq!(t.describe(), "mysql://hive@[::1]:3307/metastore");
    }

    #[test]
    fn identifiers_are_quoted_per_dialect_and_tables_found_in_either_case() {
        assert_eq!(
            Dialect::Postgres.quote_all(&["EVENT_ID", "NL_ID"]),
            "\"EVENT_ID\", \"NL_ID\""
        );
        assert_eq!(
            Dialect::Mysql.quote("notification_log"),
            "`notification_log`"
        );
        let names = TableNames(vec!["DBS".into(), "dbs".into(), "tbls".into()]);
        assert_eq!(names.pick("DBS").as_deref(), Some("DBS"));
        assert_eq!(names.pick("TBLS").as_deref(), Some("tbls"));
        assert_eq!(names.pick("SDS"), None);
    }

    #[test]
    fn password_file_parameter_is_read_and_percent_decoded() {
        let (t, file) =
            parse("mysql://hive%40corp@db:1/meta?password_file=/run/secret%20s/pw").unwrap();
        assert_eq!(t.user, "hive@corp");
        assert_eq!(file, Some(PathBuf::from("/run/secret s/pw")));
    }

    #[test]
    fn bad_urls_are_fatal_and_never_echo_a_password() {
        for url in [
            "hive@db/meta",
            "oracle://hive@db/meta",
            "mysql://db/meta",
            "mysql://hive@db",
            "mysql://hive@db/",
            "mysql://hive@db:notaport/meta",
            "mysql://hive@db:99999/meta",
            "mysql://hive@:3306/meta",
            "mysql://hive@db/meta?sslmode=require",
            "mysql://hive@db/meta?password_file=",
        ] {
            match parse(url) {
                Err(RowSourceError::Fatal(reason)) => {
                    assert!(reason.contains("bad metastore URL"), "{url}: {reason}")
                }
                other => panic!("{url}: {other:?}"),
            }
        }
        match parse("postgresql://hive:s3cret-pw@db/meta") {
            Err(RowSourceError::Fatal(reason)) => {
                assert!(!reason.contains("s3cret-pw"), "{reason}");
                assert!(reason.contains("STAGEFS_METASTORE_PASSWORD"), "{reason}");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn password_file_loses_one_trailing_newline_only() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("pw");
        std::fs::write(&path, " pa ss \r\n").unwrap();
        assert_eq!(read_password_file(&path).unwrap().0, " pa ss ");
        match read_password_file(&dir.path().join("absent")) {
            Err(RowSourceError::Fatal(reason)) => assert!(reason.contains("password file")),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn unreadable_cells_name_the_event_and_column() {
        let row = notification_row(
            vec![
                Cell::Int(7),
                Cell::Null,
                Cell::Text("1700000000".into()),
                Cell::Bytes(b"INSERT".to_vec()),
                Cell::Null,
                Cell::Null,
                Cell::Null,
                Cell::Bytes(vec![b'{', 0xff]),
                Cell::Null,
            ],
            3,
        );
        match row {
            Err(RowSourceError::BadRow {
                location,
                reason,
                event_id,
            }) => {
                assert_eq!(event_id, Some(7));
                assert_eq!(location, "NOTIFICATION_LOG EVENT_ID 7, column MESSAGE");
                assert!(reason.contains("UTF-8"), "{reason}");
            }
            other => panic!("{other:?}"),
        }
        let row = notification_row(vec![Cell::Null], 3);
        match row {
            Err(RowSourceError::BadRow {
                location, event_id, ..
            }) => {
                assert_eq!(event_id, None);
                assert_eq!(
                    location,
                    "NOTIFICATION_LOG row after EVENT_ID 3, column EVENT_ID"
                )
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn debug_and_describe_never_show_the_password() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("pw");
        std::fs::write(&path, "hunter2-secret\n").unwrap();
        // Port 1 on loopback refuses at once: the source opens disconnected.
        let url = format!(
            "mysql://hive@127.0.0.1:1/meta?password_file={}",
            path.display()
        );
        let source = MetastoreSource::open(
            &url,
            None,
            Timeouts {
                connect: Duration::from_millis(500),
                statement: Duration::from_millis(500),
            },
        )
        .unwrap();
        assert!(!source.is_connected());
        assert_eq!(source.describe(), "mysql://hive@127.0.0.1:1/meta");
        assert!(!format!("{source:?}").contains("hunter2"));
    }
}
