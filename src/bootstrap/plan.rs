//! The bootstrap state under construction: one list of changes that, applied
//! to an empty tree, builds the whole warehouse at one source state-id.
//!
//! Tables are listed at different times (rounds), while the source keeps
//! committing events. [`Plan`] merges the listings and the events into one
//! state with this rule (docs/HIVE.md "Bootstrap"):
//!
//! - A table listed from the metadata snapshot at id X, whose listing ended
//!   before id F was read, is *watched* through F: an event in (X, F] that
//!   touches it may already be in the files that were listed, so the table
//!   becomes *tainted* (its listed content is not trusted).
//! - Events after F are applied to it: they carry their own files, so the
//!   table is brought forward exactly, id by id.
//! - Metadata (databases, tables, partition keys, which partitions exist)
//!   is always exact: it comes from a consistent snapshot and from the
//!   events after it, whatever happens to file listings. A tainted table
//!   keeps its partitions and loses its files (`TruncateTable`), so the
//!   events that follow still apply; it is listed again from a later
//!   snapshot ([`Plan::rebase`]) and watched again.
//! - A table created by an event is exact from its creation on.
//! - An event that cannot apply because the listing already held one of
//!   its files (a Hive write whose files landed before its event committed)
//!   taints that table too, instead of failing.
//!
//! The state can only be finished when no table is tainted and every watch
//! window has been checked against the events: then every table holds the
//! source's content at the id of the last event applied.
//!
//! Pure (no I/O): the driver in `bootstrap/mod.rs` feeds it snapshots,
//! listings and decoded events. `Tree::apply` checks every change as it is
//! added, so the finished list applies to an empty tree without error.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::catalog::{ApplyError, DirKind, Tree};
use crate::event::{Change, Event, FileRef, Op, StateId};

/// A table by its stagefs names: lower-cased database and table.
pub type TableName = (String, String);

/// One partition (or the unpartitioned table, `spec` None) and its files.
#[derive(Debug, Clone)]
pub struct PartitionFiles {
    pub spec: Option<BTreeMap<String, String>>,
    pub files: Vec<FileRef>,
}

/// What a round found for one table of its snapshot.
#[derive(Debug, Clone)]
pub struct TableBase {
    pub name: TableName,
    pub partition_keys: Vec<String>,
    /// Every partition of the snapshot (one entry with `spec` None for an
    /// unpartitioned table), with the files listed there.
    pub partitions: Vec<PartitionFiles>,
    /// Why the listing cannot be trusted (a file changed while it was
    /// copied, a transactional table, ...); None for a good listing.
    pub untrusted: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    #[error("event {got} follows event {at}: the bootstrap needs every id after its snapshot")]
    NotContiguous { at: i64, got: i64 },
    #[error("the listing of round {round} is for id {listed}, but the bootstrap is at id {at}")]
    WrongSnapshot { round: u32, listed: i64, at: i64 },
    #[error("event {id} does not apply to the bootstrapped warehouse: {reason}")]
    Apply { id: i64, reason: String },
    #[error("the snapshot cannot be built: {0}")]
    Snapshot(String),
}

/// See the module docs.
pub struct Plan {
    changes: Vec<Change>,
    tree: Arc<Tree>,
    /// Ids for `Tree::apply` while building (any increasing sequence).
    step: u64,
    /// The last source id whose effects are in `changes`.
    at: i64,
    tainted: BTreeMap<TableName, String>,
    /// Listed tables and the id their window is checked through.
    watched: BTreeMap<TableName, i64>,
    time_ms: Option<i64>,
}

impl Default for Plan {
    fn default() -> Self {
        Plan::new()
    }
}

impl Plan {
    pub fn new() -> Plan {
        Plan {
            changes: Vec::new(),
            tree: Arc::new(Tree::empty()),
            step: 0,
            at: 0,
            tainted: BTreeMap::new(),
            watched: BTreeMap::new(),
            time_ms: None,
        }
    }

    /// The last source id applied.
    pub fn at(&self) -> i64 {
        self.at
    }

    /// The warehouse so far (for decoding events against it).
    pub fn tree(&self) -> &Arc<Tree> {
        &self.tree
    }

    /// Tables whose content is not trusted, with why.
    pub fn tainted(&self) -> &BTreeMap<TableName, String> {
        &self.tainted
    }

    /// The newest id a watch window still needs events for.
    pub fn watched_through(&self) -> i64 {
        self.watched.values().copied().max().unwrap_or(self.at)
    }

    /// Changes so far (for the record's size).
    pub fn change_count(&self) -> usize {
        self.changes.len()
    }

    fn push(&mut self, changes: Vec<Change>) -> Result<(), ApplyError> {
        if changes.is_empty() {
            return Ok(());
        }
        let event = Event {
            id: StateId(self.step + 1),
            time_ms: None,
            changes,
        };
        let (tree, _) = self.tree.apply(&event)?;
        self.step += 1;
        self.tree = Arc::new(tree);
        self.changes.extend(event.changes);
        Ok(())
    }

    /// The first round: every database and table of the snapshot at `at`,
    /// tables listed and watched through `valid_through`.
    pub fn seed(
        &mut self,
        at: i64,
        databases: &[String],
        tables: Vec<TableBase>,
        valid_through: i64,
    ) -> Result<(), PlanError> {
        if !self.changes.is_empty() || self.step > 0 {
            return Err(PlanError::Snapshot("seed of a plan already seeded".into()));
        }
        let creates = databases
            .iter()
            .map(|db| Change::new(Op::CreateDatabase, db, ""))
            .collect();
        self.push(creates)
            .map_err(|e| PlanError::Snapshot(e.to_string()))?;
        self.at = at;
        for table in tables {
            let mut create = Change::new(Op::CreateTable, &table.name.0, &table.name.1);
            create.partition_keys = table.partition_keys.clone();
            self.push(vec![create])
                .map_err(|e| PlanError::Snapshot(e.to_string()))?;
            self.put_listing(table, valid_through)?;
        }
        Ok(())
    }

    /// A later round: tainted tables listed again from the snapshot at
    /// `at` (which must be where the plan is), watched through
    /// `valid_through`. Tables the plan does not hold as tainted are ignored.
    pub fn rebase(
        &mut self,
        round: u32,
        at: i64,
        tables: Vec<TableBase>,
        valid_through: i64,
    ) -> Result<(), PlanError> {
        if at != self.at {
            return Err(PlanError::WrongSnapshot {
                round,
                listed: at,
                at: self.at,
            });
        }
        for table in tables {
            if !self.tainted.contains_key(&table.name) {
                continue;
            }
            let keys = match self.tree.table(&table.name.0, &table.name.1) {
                Some(t) => match &t.kind {
                    DirKind::Table { partition_keys, .. } => {
                        partition_keys.iter().map(|k| k.to_string()).collect()
                    }
                    _ => Vec::new(),
                },
                None => {
                    return Err(PlanError::Snapshot(format!(
                        "table {}.{} is in the snapshot at {at} but not in the events before it",
                        table.name.0, table.name.1
                    )))
                }
            };
            if keys != table.partition_keys {
                return Err(PlanError::Snapshot(format!(
                    "table {}.{} has partition keys ({}) in the snapshot at {at}, ({}) by the events",
                    table.name.0,
                    table.name.1,
                    table.partition_keys.join(", "),
                    keys.join(", ")
                )));
            }
            self.push(vec![Change::new(
                Op::TruncateTable,
                &table.name.0,
                &table.name.1,
            )])
            .map_err(|e| PlanError::Snapshot(e.to_string()))?;
            self.tainted.remove(&table.name);
            self.put_listing(table, valid_through)?;
        }
        Ok(())
    }

    /// Adds a table's listed files (its partitions exist after this) and
    /// starts watching it, or taints it when the listing is untrusted.
    fn put_listing(&mut self, table: TableBase, valid_through: i64) -> Result<(), PlanError> {
        let (db, t) = table.name.clone();
        let untrusted = table.untrusted.clone();
        let mut changes = Vec::with_capacity(table.partitions.len());
        for p in table.partitions {
            let op = if p.spec.is_some() {
                Op::AddPartition
            } else {
                Op::AddFiles
            };
            let mut c = Change::new(op, &db, &t);
            c.partition = p.spec;
            if untrusted.is_none() {
                c.files = p.files;
            }
            if c.partition.is_some() || !c.files.is_empty() {
                changes.push(c);
            }
        }
        self.push(changes)
            .map_err(|e| PlanError::Snapshot(format!("table {db}.{t}: {e}")))?;
        match untrusted {
            Some(reason) => {
                self.watched.remove(&table.name);
                self.tainted.insert(table.name, reason);
            }
            None if valid_through > self.at => {
                self.watched.insert(table.name, valid_through);
            }
            None => {
                self.watched.remove(&table.name);
            }
        }
        Ok(())
    }

    /// Applies the next source event (its id must follow the last one).
    pub fn apply_event(&mut self, event: &Event) -> Result<(), PlanError> {
        let id = event.id.0 as i64;
        if id != self.at + 1 {
            return Err(PlanError::NotContiguous {
                at: self.at,
                got: id,
            });
        }
        let mut newly_tainted = Vec::new();
        for name in touched(event, &self.tree) {
            match self.watched.get(&name) {
                Some(&through) if id <= through => {
                    self.watched.remove(&name);
                    newly_tainted.push(name);
                }
                Some(_) => {
                    self.watched.remove(&name);
                }
                None => {}
            }
        }
        for name in newly_tainted {
            self.taint(
                name,
                format!("changed by event {id} while it was being listed"),
            )?;
        }
        // One change at a time, so a file that is already there names its
        // table. (A failure other than that ends the bootstrap, so a
        // half-applied event never reaches a record.)
        for c in &event.changes {
            loop {
                match self.push(vec![c.clone()]) {
                    Ok(()) => break,
                    // The listing already held a file this event adds: its
                    // files were in place before it committed. That table's
                    // listing is not of one state: taint it, apply again.
                    Err(ApplyError::DuplicateFile(file, dir)) => {
                        let name = (c.db.clone(), c.table.clone());
                        if self.tainted.contains_key(&name) {
                            return Err(PlanError::Apply {
                                id,
                                reason: format!("file `{file}` already exists in {dir}"),
                            });
                        }
                        self.watched.remove(&name);
                        self.taint(
                            name,
                            format!("its listing already held file `{file}` of event {id}"),
                        )?;
                    }
                    Err(e) => {
                        return Err(PlanError::Apply {
                            id,
                            reason: e.to_string(),
                        })
                    }
                }
            }
        }
        for c in &event.changes {
            self.follow(c);
        }
        if event.time_ms.is_some() {
            self.time_ms = event.time_ms;
        }
        self.at = id;
        Ok(())
    }

    /// Marks a table untrusted and empties its files (partitions stay).
    fn taint(&mut self, name: TableName, reason: String) -> Result<(), PlanError> {
        if self.tree.table(&name.0, &name.1).is_some() {
            self.push(vec![Change::new(Op::TruncateTable, &name.0, &name.1)])
                .map_err(|e| PlanError::Snapshot(e.to_string()))?;
        }
        self.tainted.insert(name, reason);
        Ok(())
    }

    /// Keeps taints and watches on the right names after a change.
    fn follow(&mut self, c: &Change) {
        let name = (c.db.clone(), c.table.clone());
        match c.op {
            Op::DropDatabase => {
                self.tainted.retain(|(db, _), _| *db != c.db);
                self.watched.retain(|(db, _), _| *db != c.db);
            }
            Op::DropTable | Op::CreateTable => {
                self.tainted.remove(&name);
                self.watched.remove(&name);
            }
            Op::RenameTable => {
                let to = (c.new_db.clone(), c.new_table.clone());
                if let Some(reason) = self.tainted.remove(&name) {
                    self.tainted.insert(to.clone(), reason);
                }
                if let Some(through) = self.watched.remove(&name) {
                    self.watched.insert(to, through);
                }
            }
            _ => {}
        }
    }

    /// The finished state: every change at the last id applied. `Err`
    /// names the tables still tainted (or a window not checked yet).
    pub fn finish(self) -> Result<Event, Vec<(TableName, String)>> {
        if !self.tainted.is_empty() {
            return Err(self.tainted.into_iter().collect());
        }
        let open: Vec<(TableName, String)> = self
            .watched
            .iter()
            .filter(|(_, &through)| through > self.at)
            .map(|(n, through)| {
                (
                    n.clone(),
                    format!("its listing is not checked against events up to {through}"),
                )
            })
            .collect();
        if !open.is_empty() {
            return Err(open);
        }
        Ok(Event {
            id: StateId(self.at.max(0) as u64),
            time_ms: self.time_ms,
            changes: self.changes,
        })
    }
}

/// The record of a bootstrap over a state folder that already holds a
/// warehouse (after an id gap): every database of `current` dropped, then
/// `built`'s changes, which build the new warehouse from empty. Applied to
/// `current` it gives exactly what `built` gives applied to an empty tree:
/// tables, partitions and files the new snapshot lacks are gone, the rest
/// is replaced. Deterministic in `current`, so replaying the journal (which
/// rebuilds `current` first) gives the same catalog.
pub fn replacing(current: &Tree, built: Event) -> Event {
    let mut changes: Vec<Change> = current
        .root
        .children
        .iter()
        .map(|(db, _)| Change::new(Op::DropDatabase, db, ""))
        .collect();
    changes.extend(built.changes);
    Event {
        id: built.id,
        time_ms: built.time_ms,
        changes,
    }
}

/// The tables an event's changes touch, by their names before it.
fn touched(event: &Event, tree: &Tree) -> Vec<TableName> {
    let mut names = Vec::new();
    for c in &event.changes {
        match c.op {
            Op::Noop | Op::CreateDatabase => {}
            Op::DropDatabase => {
                if let Some(db) = tree.database(&c.db) {
                    for (t, _) in db.children.iter() {
                        names.push((c.db.clone(), t.to_string()));
                    }
                }
            }
            _ => names.push((c.db.clone(), c.table.clone())),
        }
    }
    names
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::{BlobId, Verify};

    fn file(name: &str) -> FileRef {
        let mut key = [0u8; 32];
        for (i, b) in name.bytes().enumerate().take(32) {
            key[i] = b;
        }
        FileRef {
            path: format!("/wh/{name}"),
            name: name.into(),
            subdir: None,
            verify: Verify::None,
            key: Some(BlobId(key)),
            cm_path: None,
            uri: None,
            source_dir: Some("/wh".into()),
            cm_dir: None,
        }
    }

    fn spec(v: &str) -> Option<BTreeMap<String, String>> {
        Some([("p".to_string(), v.to_string())].into_iter().collect())
    }

    fn base(t: &str, parts: &[(&str, &[&str])]) -> TableBase {
        TableBase {
            name: ("db".into(), t.into()),
            partition_keys: vec!["p".into()],
            partitions: parts
                .iter()
                .map(|(v, files)| PartitionFiles {
                    spec: spec(v),
                    files: files.iter().map(|f| file(f)).collect(),
                })
                .collect(),
            untrusted: None,
        }
    }

    fn add(id: u64, t: &str, v: &str, names: &[&str]) -> Event {
        let mut c = Change::new(Op::AddFiles, "db", t);
        c.partition = spec(v);
        c.files = names.iter().map(|f| file(f)).collect();
        Event {
            id: StateId(id),
            time_ms: None,
            changes: vec![c],
        }
    }

    fn files_of(event: &Event, t: &str) -> Vec<String> {
        let (tree, _) = Tree::empty().apply(event).unwrap();
        tree.table("db", t)
            .map(|d| d.files_below().into_iter().map(|(p, _)| p).collect())
            .unwrap_or_default()
    }

    fn seeded() -> Plan {
        let mut plan = Plan::new();
        plan.seed(
            10,
            &["db".into()],
            vec![base("a", &[("1", &["a1"])]), base("b", &[("1", &["b1"])])],
            12,
        )
        .unwrap();
        plan
    }

    fn noop(id: u64) -> Event {
        Event {
            id: StateId(id),
            time_ms: None,
            changes: vec![],
        }
    }

    #[test]
    fn untouched_listings_and_events_after_the_window_make_one_state() {
        let mut plan = seeded();
        plan.apply_event(&noop(11)).unwrap();
        plan.apply_event(&noop(12)).unwrap();
        // After the window: brought forward with the event's files.
        plan.apply_event(&add(13, "a", "1", &["a2"])).unwrap();
        let event = plan.finish().unwrap();
        assert_eq!(event.id, StateId(13));
        assert_eq!(files_of(&event, "a"), vec!["p=1/a1", "p=1/a2"]);
        assert_eq!(files_of(&event, "b"), vec!["p=1/b1"]);
    }

    #[test]
    fn a_table_touched_inside_its_window_is_tainted_until_listed_again() {
        let mut plan = seeded();
        plan.apply_event(&add(11, "a", "2", &["a9"])).unwrap();
        assert!(plan.tainted().contains_key(&("db".into(), "a".into())));
        plan.apply_event(&add(12, "b", "1", &["b2"])).unwrap();
        assert_eq!(
            plan.tainted().len(),
            2,
            "b was touched at 12, inside its window"
        );
        // Listed again at 12: trusted again, watched through 14.
        plan.rebase(
            1,
            12,
            vec![
                base("a", &[("1", &["a1"]), ("2", &["a9"])]),
                base("b", &[("1", &["b1", "b2"])]),
            ],
            14,
        )
        .unwrap();
        assert!(plan.tainted().is_empty());
        plan.apply_event(&noop(13)).unwrap();
        plan.apply_event(&noop(14)).unwrap();
        let event = plan.finish().unwrap();
        assert_eq!(files_of(&event, "a"), vec!["p=1/a1", "p=2/a9"]);
        assert_eq!(files_of(&event, "b"), vec!["p=1/b1", "p=1/b2"]);
    }

    #[test]
    fn a_table_touched_again_in_every_round_stays_tainted_and_is_named() {
        let mut plan = seeded();
        plan.apply_event(&add(11, "a", "1", &["a2"])).unwrap();
        plan.apply_event(&noop(12)).unwrap();
        plan.rebase(1, 12, vec![base("a", &[("1", &["a1", "a2"])])], 13)
            .unwrap();
        plan.apply_event(&add(13, "a", "1", &["a3"])).unwrap();
        let err = plan.finish().unwrap_err();
        assert_eq!(err.len(), 1);
        assert_eq!(err[0].0, ("db".to_string(), "a".to_string()));
        assert!(err[0].1.contains("event 13"), "{}", err[0].1);
    }

    #[test]
    fn a_listing_that_already_held_an_events_file_taints_instead_of_failing() {
        let mut plan = Plan::new();
        plan.seed(1, &["db".into()], vec![base("a", &[("1", &["a1"])])], 1)
            .unwrap();
        // After the window, yet a1 was in place before event 2 committed.
        plan.apply_event(&add(2, "a", "1", &["a1"])).unwrap();
        let err = plan.finish().unwrap_err();
        assert!(err[0].1.contains("already held file `a1`"), "{}", err[0].1);
    }

    #[test]
    fn finishing_before_a_window_is_checked_is_refused() {
        let plan = seeded();
        let err = plan.finish().unwrap_err();
        assert_eq!(err.len(), 2);
        assert!(err[0].1.contains("not checked against events up to 12"));
    }

    #[test]
    fn renames_carry_taint_and_created_tables_are_exact_from_their_event() {
        let mut plan = seeded();
        plan.apply_event(&add(11, "a", "1", &["a2"])).unwrap();
        let mut rename = Change::new(Op::RenameTable, "db", "a");
        rename.new_db = "db".into();
        rename.new_table = "z".into();
        plan.apply_event(&Event {
            id: StateId(12),
            time_ms: None,
            changes: vec![rename],
        })
        .unwrap();
        assert_eq!(
            plan.tainted().keys().collect::<Vec<_>>(),
            vec![&("db".to_string(), "z".to_string())]
        );
        let mut create = Change::new(Op::CreateTable, "db", "a");
        create.partition_keys = vec!["p".into()];
        plan.apply_event(&Event {
            id: StateId(13),
            time_ms: None,
            changes: vec![create],
        })
        .unwrap();
        plan.apply_event(&add(14, "a", "1", &["n1"])).unwrap();
        let mut drop = Change::new(Op::DropTable, "db", "z");
        drop.partition = None;
        plan.apply_event(&Event {
            id: StateId(15),
            time_ms: None,
            changes: vec![drop],
        })
        .unwrap();
        let event = plan.finish().unwrap();
        assert_eq!(files_of(&event, "a"), vec!["p=1/n1"]);
        assert!(files_of(&event, "z").is_empty());
    }

    #[test]
    fn a_rebootstrap_record_replaces_the_old_warehouse_whatever_it_held() {
        // The old warehouse: db with tables a and b, and a database `old`
        // the new snapshot no longer has.
        let mut old = seeded();
        old.apply_event(&noop(11)).unwrap();
        old.apply_event(&noop(12)).unwrap();
        let mut extra = old.finish().unwrap();
        extra
            .changes
            .push(Change::new(Op::CreateDatabase, "old", ""));
        let (current, _) = Tree::empty().apply(&extra).unwrap();
        // The new one, at 40: only table a, with other files.
        let mut new = Plan::new();
        new.seed(40, &["db".into()], vec![base("a", &[("2", &["n1"])])], 40)
            .unwrap();
        let built = new.finish().unwrap();
        let (from_empty, _) = Tree::empty().apply(&built).unwrap();
        let record = replacing(&current, built.clone());
        assert_eq!(record.id, StateId(40));
        let (replaced, _) = current.apply(&record).unwrap();
        assert!(replaced.database("old").is_none());
        assert!(replaced.table("db", "b").is_none());
        let files = |t: &Tree| -> Vec<String> {
            t.table("db", "a")
                .unwrap()
                .files_below()
                .into_iter()
                .map(|(p, _)| p)
                .collect()
        };
        assert_eq!(files(&replaced), vec!["p=2/n1"]);
        assert_eq!(files(&replaced), files(&from_empty));
        // On an empty tree it is the bootstrap itself.
        assert_eq!(
            replacing(&Tree::empty(), built.clone()).changes.len(),
            built.changes.len()
        );
    }

    #[test]
    fn ids_must_follow_without_a_gap_and_a_rebase_must_be_at_the_plan_id() {
        let mut plan = seeded();
        assert!(matches!(
            plan.apply_event(&add(12, "a", "1", &["q"])),
            Err(PlanError::NotContiguous { at: 10, got: 12 })
        ));
        assert!(matches!(
            plan.rebase(1, 9, vec![], 12),
            Err(PlanError::WrongSnapshot { .. })
        ));
    }
}
