//! Immutable catalog trees: one [`Tree`] per source state.
//!
//! A tree is root → database → table → partition directories (nested in the
//! order of the table's partition keys) → files. Every node is immutable
//! once built and carries a [`NodeId`] assigned at creation; applying an
//! event path-copies only the nodes on the way to what changed, so unchanged
//! subtrees (and their ids) are shared with the previous tree. Children live
//! in persistent ordered maps (`imbl::OrdMap`), so even a partition with a
//! million files is updated in O(log n).
//!
//! Invariant relied on by the view: a node id always denotes the same
//! content. A directory id lists the same entries forever; a file id has the
//! same bytes forever.
//!
//! [`Tree::apply`] is the single definition of what an event does; ingest
//! uses it to reject events that cannot apply, the stager to build versions.
//! An event's changes apply in order to one new tree with one state-id, or
//! not at all.
//!
//! A file's content is either known when its event is applied (native
//! events name size and sha256) or resolved later ([`Resolution`]): a Hive
//! file's sha256 and size are learnt when the stager reads it. The stager
//! resolves every file of a state before committing it, so every file of a
//! committed tree has its content; the cell is written once and never
//! changes afterwards, so the invariant below holds.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use imbl::OrdMap;

use crate::event::{escape_path_name, BlobId, Change, Event, FileRef, Op, StateId};

/// A name inside a directory.
pub type Name = Arc<str>;

/// Identity of an immutable node; the view uses it as the inode number.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct NodeId(pub u64);

/// Node ids below this are reserved for the view's own inodes
/// (mount root, `.stagefs`, live database directories, ...).
pub const FIRST_NODE_ID: u64 = 1 << 32;

static NEXT_NODE_ID: AtomicU64 = AtomicU64::new(FIRST_NODE_ID);

fn next_node_id() -> NodeId {
    NodeId(NEXT_NODE_ID.fetch_add(1, Ordering::Relaxed))
}

/// `time_ms` value meaning "the source did not say".
pub const UNKNOWN_TIME: i64 = i64::MIN;

/// What every node carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Meta {
    pub id: NodeId,
    /// The state-id at which this node's content last changed.
    pub state_id: StateId,
    /// Source commit time of that event, or [`UNKNOWN_TIME`].
    pub time_ms: i64,
}

impl Meta {
    /// Meta of a node rebuilt from a checkpoint: a fresh id (ids are not
    /// persisted; see `crate::checkpoint`) and the recorded state and time.
    pub fn restored(state_id: StateId, time_ms: i64) -> Meta {
        Meta {
            id: next_node_id(),
            state_id,
            time_ms,
        }
    }

    fn new(state_id: StateId, time_ms: Option<i64>) -> Meta {
        Meta {
            id: next_node_id(),
            state_id,
            time_ms: time_ms.unwrap_or(UNKNOWN_TIME),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DirKind {
    Root,
    Database,
    Table {
        partition_keys: Arc<[Name]>,
        /// Why the source's log does not carry this table's data (a Hive
        /// external table), or None; listed in status `not_in_log`.
        not_in_log: Option<Arc<str>>,
    },
    /// A `key=value` level below a table; `depth` 1 is the first key.
    Partition {
        depth: u16,
    },
    /// A directory the source keeps files in below a partition or an
    /// unpartitioned table (Hive's `delta_…`/`base_…`).
    Subdir,
}

#[derive(Debug)]
pub struct DirNode {
    pub meta: Meta,
    pub kind: DirKind,
    pub children: OrdMap<Name, Node>,
}

#[derive(Debug)]
pub struct FileNode {
    pub meta: Meta,
    content: FileContent,
    /// Where the file came from: the path relative to the source root, or
    /// the source URI (Hive).
    pub source: Box<str>,
    /// How the content was verified (`user.stagefs.verified`).
    pub verified: &'static str,
}

#[derive(Debug)]
enum FileContent {
    Known { blob: BlobId, size: u64 },
    Resolved(Arc<Resolution>),
}

/// The content of a file that is known only once it is staged: written once
/// by the stager (after the blob and the resolution record are durable),
/// before any tree referencing it is committed.
#[derive(Debug)]
pub struct Resolution {
    /// The reference's identity ([`FileRef::key`]).
    pub key: BlobId,
    content: OnceLock<(BlobId, u64)>,
}

impl Resolution {
    pub fn new(key: BlobId) -> Resolution {
        Resolution {
            key,
            content: OnceLock::new(),
        }
    }

    /// The blob and size, once resolved.
    pub fn get(&self) -> Option<(BlobId, u64)> {
        self.content.get().copied()
    }

    /// Records the content; a second call keeps the first value (the
    /// content of a reference never changes once known) and returns false
    /// when it differed.
    pub fn set(&self, blob: BlobId, size: u64) -> bool {
        match self.content.set((blob, size)) {
            Ok(()) => true,
            Err(v) => self.content.get() == Some(&v),
        }
    }
}

impl FileNode {
    /// A resolved file node rebuilt from a checkpoint. `key` is the
    /// reference key of a file that was not known by content when accepted
    /// (it keeps that identity for the commit rule), `None` for a native one.
    pub fn restored(
        meta: Meta,
        blob: BlobId,
        size: u64,
        key: Option<BlobId>,
        source: Box<str>,
        verified: &'static str,
    ) -> FileNode {
        let content = match key {
            None => FileContent::Known { blob, size },
            Some(key) => {
                let cell = Resolution::new(key);
                cell.set(blob, size);
                FileContent::Resolved(Arc::new(cell))
            }
        };
        FileNode {
            meta,
            content,
            source,
            verified,
        }
    }

    /// The reference key of a file resolved after acceptance (Hive), `None`
    /// for a file known by content from its event.
    pub fn resolved_key(&self) -> Option<BlobId> {
        match &self.content {
            FileContent::Known { .. } => None,
            FileContent::Resolved(r) => Some(r.key),
        }
    }

    /// The node for `file` created at `meta`.
    fn new(meta: Meta, file: &FileRef) -> (FileNode, Option<Arc<Resolution>>) {
        let (content, cell) = match file.known() {
            Some((blob, size)) => (FileContent::Known { blob, size }, None),
            None => {
                let cell = Arc::new(Resolution::new(file.key()));
                (FileContent::Resolved(Arc::clone(&cell)), Some(cell))
            }
        };
        let node = FileNode {
            meta,
            content,
            source: file.source_label().into(),
            verified: file.verify.label(),
        };
        (node, cell)
    }

    /// The staged content's id (sha256). For a file not resolved yet (only
    /// in trees that are not committed) its reference key.
    pub fn blob(&self) -> BlobId {
        match &self.content {
            FileContent::Known { blob, .. } => *blob,
            FileContent::Resolved(r) => r.get().map_or(r.key, |(b, _)| b),
        }
    }

    /// Exact size in bytes (0 while not resolved).
    pub fn size(&self) -> u64 {
        match &self.content {
            FileContent::Known { size, .. } => *size,
            FileContent::Resolved(r) => r.get().map_or(0, |(_, s)| s),
        }
    }

    /// What the commit rule tracks this file by: the sha256 when it was
    /// known from the event, else the reference key.
    pub fn key(&self) -> BlobId {
        match &self.content {
            FileContent::Known { blob, .. } => *blob,
            FileContent::Resolved(r) => r.key,
        }
    }

    /// False only for a file whose content the stager has not learnt yet.
    pub fn is_resolved(&self) -> bool {
        match &self.content {
            FileContent::Known { .. } => true,
            FileContent::Resolved(r) => r.get().is_some(),
        }
    }
}

#[derive(Debug, Clone)]
pub enum Node {
    Dir(Arc<DirNode>),
    File(Arc<FileNode>),
}

/// Two nodes are equal when they are the same node (one `Arc`). Nodes are
/// immutable, so this is what "unchanged from one version to the next"
/// means, and it lets `OrdMap::diff` skip what two versions share.
impl PartialEq for Node {
    fn eq(&self, other: &Node) -> bool {
        match (self, other) {
            (Node::Dir(a), Node::Dir(b)) => Arc::ptr_eq(a, b),
            (Node::File(a), Node::File(b)) => Arc::ptr_eq(a, b),
            _ => false,
        }
    }
}

impl Node {
    pub fn meta(&self) -> &Meta {
        match self {
            Node::Dir(d) => &d.meta,
            Node::File(f) => &f.meta,
        }
    }

    pub fn id(&self) -> NodeId {
        self.meta().id
    }

    pub fn as_dir(&self) -> Option<&Arc<DirNode>> {
        match self {
            Node::Dir(d) => Some(d),
            Node::File(_) => None,
        }
    }
}

impl DirNode {
    pub fn child(&self, name: &str) -> Option<&Node> {
        self.children.get(name)
    }

    fn child_dir(&self, name: &str) -> Option<&Arc<DirNode>> {
        self.children.get(name).and_then(Node::as_dir)
    }

    /// Every file below this directory as (path relative to it, blob), in
    /// path order: how tests and checkers compare a table with an oracle.
    pub fn files_below(&self) -> Vec<(String, BlobId)> {
        self.file_nodes_below()
            .into_iter()
            .map(|(path, f)| (path, f.blob()))
            .collect()
    }

    /// Every file node below this directory with its path relative to it,
    /// in path order.
    pub fn file_nodes_below(&self) -> Vec<(String, &FileNode)> {
        fn walk<'a>(prefix: &str, dir: &'a DirNode, out: &mut Vec<(String, &'a FileNode)>) {
            for (name, child) in dir.children.iter() {
                let path = if prefix.is_empty() {
                    name.to_string()
                } else {
                    format!("{prefix}/{name}")
                };
                match child {
                    Node::Dir(d) => walk(&path, d, out),
                    Node::File(f) => out.push((path, f)),
                }
            }
        }
        let mut out = Vec::new();
        walk("", self, &mut out);
        out
    }

    fn with_children(&self, meta: Meta, children: OrdMap<Name, Node>) -> Arc<DirNode> {
        Arc::new(DirNode {
            meta,
            kind: self.kind.clone(),
            children,
        })
    }
}

/// The source warehouse at one state-id.
#[derive(Debug, Clone)]
pub struct Tree {
    pub state_id: StateId,
    /// Source time of the event that made this state, or [`UNKNOWN_TIME`].
    pub time_ms: i64,
    pub root: Arc<DirNode>,
}

/// Why an event cannot apply to the tree before it (SPEC §2).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ApplyError {
    #[error("database `{0}` already exists")]
    DatabaseExists(String),
    #[error("database `{0}` does not exist")]
    NoDatabase(String),
    #[error("table `{0}.{1}` already exists")]
    TableExists(String, String),
    #[error("table `{0}.{1}` does not exist")]
    NoTable(String, String),
    #[error("partition {0} does not exist")]
    NoPartition(String),
    #[error("partition {0} already exists")]
    PartitionExists(String),
    #[error("partition does not match the table's partition keys ({0})")]
    PartitionMismatch(String),
    #[error("file `{0}` already exists in {1}")]
    DuplicateFile(String, String),
    #[error("id {got} does not increase past {last}")]
    NotIncreasing { last: StateId, got: StateId },
    #[error("{0} is not a directory in {1}")]
    NotADirectory(String, String),
}

/// A file an event added, with where it sits in the new tree, so the
/// commit rule can ask "does state S still reference it?".
#[derive(Debug, Clone)]
pub struct AddedFile {
    pub dir: Vec<Name>,
    pub name: Name,
    /// What the commit rule waits for: [`FileRef::key`].
    pub blob: BlobId,
    pub file: FileRef,
    /// Where the stager records the content of a file not known by
    /// content (None for native files).
    pub resolution: Option<Arc<Resolution>>,
}

impl AddedFile {
    /// The staged blob when it is known (native, or resolved).
    pub fn content(&self) -> Option<(BlobId, u64)> {
        match &self.resolution {
            None => self.file.known(),
            Some(r) => r.get(),
        }
    }
}

impl Tree {
    /// The empty warehouse before any event.
    pub fn empty() -> Tree {
        Tree {
            state_id: StateId(0),
            time_ms: UNKNOWN_TIME,
            root: Arc::new(DirNode {
                meta: Meta::new(StateId(0), None),
                kind: DirKind::Root,
                children: OrdMap::new(),
            }),
        }
    }

    pub fn database(&self, db: &str) -> Option<&Arc<DirNode>> {
        self.root.child_dir(db)
    }

    pub fn table(&self, db: &str, table: &str) -> Option<&Arc<DirNode>> {
        self.database(db)?.child_dir(table)
    }

    /// `(db.table, reason)` of every table whose data the source's log
    /// does not carry (Hive external tables), in name order.
    pub fn not_in_log(&self) -> Vec<(String, String)> {
        let mut out = Vec::new();
        for (db, d) in self.root.children.iter() {
            let Node::Dir(d) = d else { continue };
            for (t, table) in d.children.iter() {
                if let Node::Dir(table) = table {
                    if let DirKind::Table {
                        not_in_log: Some(reason),
                        ..
                    } = &table.kind
                    {
                        out.push((format!("{db}.{t}"), reason.to_string()));
                    }
                }
            }
        }
        out
    }

    /// Follows `dir` then `name` from the root.
    pub fn lookup(&self, dir: &[Name], name: &str) -> Option<&Node> {
        let mut cur = &self.root;
        for part in dir {
            cur = cur.child_dir(part)?;
        }
        cur.child(name)
    }

    /// The tree after `event`, and the files it added; `Err` leaves `self`
    /// untouched (events are never half-applied).
    pub fn apply(&self, event: &Event) -> Result<(Tree, Vec<AddedFile>), ApplyError> {
        if event.id <= self.state_id {
            return Err(ApplyError::NotIncreasing {
                last: self.state_id,
                got: event.id,
            });
        }
        let mut added = Vec::new();
        let meta = || Meta::new(event.id, event.time_ms);
        let mut root = Arc::clone(&self.root);
        for change in &event.changes {
            root = apply_change(&root, change, &meta, &mut added)?;
        }
        let tree = Tree {
            state_id: event.id,
            time_ms: event.time_ms.unwrap_or(UNKNOWN_TIME),
            root,
        };
        Ok((tree, added))
    }

    /// Every file in the tree, visiting each shared directory once per call.
    pub fn for_each_file(&self, f: &mut dyn FnMut(&FileNode)) {
        fn walk(dir: &DirNode, f: &mut dyn FnMut(&FileNode)) {
            for (_, child) in dir.children.iter() {
                match child {
                    Node::Dir(d) => walk(d, f),
                    Node::File(file) => f(file),
                }
            }
        }
        walk(&self.root, f)
    }
}

fn existing_table<'a>(
    root: &'a DirNode,
    c: &Change,
) -> Result<(&'a Arc<DirNode>, &'a Arc<DirNode>), ApplyError> {
    let db = root
        .child_dir(&c.db)
        .ok_or_else(|| ApplyError::NoDatabase(c.db.clone()))?;
    let table = db
        .child_dir(&c.table)
        .ok_or_else(|| ApplyError::NoTable(c.db.clone(), c.table.clone()))?;
    Ok((db, table))
}

/// `root` after one change; every node it creates carries `meta()`.
fn apply_change(
    root: &Arc<DirNode>,
    c: &Change,
    meta: &dyn Fn() -> Meta,
    added: &mut Vec<AddedFile>,
) -> Result<Arc<DirNode>, ApplyError> {
    let with_db = |db: Arc<DirNode>| {
        root.with_children(
            meta(),
            root.children.update(c.db.as_str().into(), Node::Dir(db)),
        )
    };
    // The database holding `table` under the change's table name.
    let with_table = |db: &Arc<DirNode>, table: Arc<DirNode>| {
        with_db(
            db.with_children(
                meta(),
                db.children
                    .update(c.table.as_str().into(), Node::Dir(table)),
            ),
        )
    };
    Ok(match c.op {
        Op::Noop => Arc::clone(root),
        Op::CreateDatabase => {
            if root.child(&c.db).is_some() {
                return Err(ApplyError::DatabaseExists(c.db.clone()));
            }
            with_db(Arc::new(DirNode {
                meta: meta(),
                kind: DirKind::Database,
                children: OrdMap::new(),
            }))
        }
        Op::DropDatabase => {
            if root.child(&c.db).is_none() {
                return Err(ApplyError::NoDatabase(c.db.clone()));
            }
            root.with_children(meta(), root.children.without(c.db.as_str()))
        }
        Op::CreateTable => {
            let db = root
                .child_dir(&c.db)
                .ok_or_else(|| ApplyError::NoDatabase(c.db.clone()))?;
            if db.child(&c.table).is_some() {
                return Err(ApplyError::TableExists(c.db.clone(), c.table.clone()));
            }
            let keys: Arc<[Name]> = c
                .partition_keys
                .iter()
                .map(|k| Name::from(k.as_str()))
                .collect();
            let table = Node::Dir(Arc::new(DirNode {
                meta: meta(),
                kind: DirKind::Table {
                    partition_keys: keys,
                    not_in_log: c.not_in_log.as_deref().map(Arc::from),
                },
                children: OrdMap::new(),
            }));
            with_db(db.with_children(meta(), db.children.update(c.table.as_str().into(), table)))
        }
        Op::DropTable => {
            let db = existing_table(root, c)?.0;
            with_db(db.with_children(meta(), db.children.without(c.table.as_str())))
        }
        Op::RenameTable => {
            let (_, table) = existing_table(root, c)?;
            let target_db = root
                .child_dir(&c.new_db)
                .ok_or_else(|| ApplyError::NoDatabase(c.new_db.clone()))?;
            if target_db.child(&c.new_table).is_some() {
                return Err(ApplyError::TableExists(
                    c.new_db.clone(),
                    c.new_table.clone(),
                ));
            }
            // The table node moves as it is: its content did not change,
            // so it keeps its id, state-id and kernel caches.
            let table = Node::Dir(Arc::clone(table));
            let mut children = root.children.clone();
            let from = children
                .get(c.db.as_str())
                .and_then(Node::as_dir)
                .ok_or_else(|| ApplyError::NoDatabase(c.db.clone()))?;
            let from = from.with_children(meta(), from.children.without(c.table.as_str()));
            children.insert(c.db.as_str().into(), Node::Dir(from));
            let to = children
                .get(c.new_db.as_str())
                .and_then(Node::as_dir)
                .ok_or_else(|| ApplyError::NoDatabase(c.new_db.clone()))?;
            let to = to.with_children(
                meta(),
                to.children.update(c.new_table.as_str().into(), table),
            );
            children.insert(c.new_db.as_str().into(), Node::Dir(to));
            root.with_children(meta(), children)
        }
        Op::TruncateTable => {
            let (db, table) = existing_table(root, c)?;
            let DirKind::Table { partition_keys, .. } = &table.kind else {
                return Err(ApplyError::NoTable(c.db.clone(), c.table.clone()));
            };
            let table = empty_leaves(table, partition_keys.len(), meta);
            with_table(db, table)
        }
        Op::MarkTable => {
            let (db, table) = existing_table(root, c)?;
            let DirKind::Table { partition_keys, .. } = &table.kind else {
                return Err(ApplyError::NoTable(c.db.clone(), c.table.clone()));
            };
            let table = Arc::new(DirNode {
                meta: meta(),
                kind: DirKind::Table {
                    partition_keys: Arc::clone(partition_keys),
                    not_in_log: c.not_in_log.as_deref().map(Arc::from),
                },
                children: table.children.clone(),
            });
            with_table(db, table)
        }
        Op::RenamePartition => {
            let (db, table) = existing_table(root, c)?;
            let table = rename_partition(table, c, meta)?;
            with_table(db, table)
        }
        Op::AddPartition | Op::AddFiles | Op::ReplaceFiles | Op::DropPartition => {
            let (db, table) = existing_table(root, c)?;
            let part_path = partition_path(table, c)?;
            let new_table = if c.op == Op::DropPartition {
                drop_partition(table, &part_path, c, meta)?
            } else {
                let mut dir: Vec<Name> = vec![c.db.as_str().into(), c.table.as_str().into()];
                dir.extend(part_path.iter().cloned());
                put_files(table, &part_path, 0, c, meta, &dir, added)?
            };
            with_table(db, new_table)
        }
    })
}

/// `dir` with every directory `depth` levels below it emptied (a
/// partitioned table's partitions), or `dir` itself emptied at depth 0.
fn empty_leaves(dir: &Arc<DirNode>, depth: usize, meta: &dyn Fn() -> Meta) -> Arc<DirNode> {
    if depth == 0 {
        return dir.with_children(meta(), OrdMap::new());
    }
    let mut children = dir.children.clone();
    for (name, child) in dir.children.iter() {
        if let Node::Dir(d) = child {
            children.insert(
                Name::clone(name),
                Node::Dir(empty_leaves(d, depth - 1, meta)),
            );
        }
    }
    dir.with_children(meta(), children)
}

/// The directory names `key=value` of the change's partition, in the table's
/// key order; empty for an unpartitioned table.
fn partition_path(table: &DirNode, c: &Change) -> Result<Vec<Name>, ApplyError> {
    partition_path_of(table, c, c.partition.as_ref())
}

/// The directory names `key=value` of the partition `spec` of `table`, in
/// its key order; None when `spec` does not match the keys.
pub(crate) fn partition_names(
    table: &DirNode,
    spec: &BTreeMap<String, String>,
) -> Option<Vec<Name>> {
    let DirKind::Table { partition_keys, .. } = &table.kind else {
        return None;
    };
    if spec.len() != partition_keys.len() {
        return None;
    }
    partition_keys
        .iter()
        .map(|key| {
            let value = spec.get(&**key)?;
            Some(Name::from(format!(
                "{}={}",
                escape_path_name(key),
                escape_path_name(value)
            )))
        })
        .collect()
}

/// [`partition_path`] of the partition `spec` of the change's table.
fn partition_path_of(
    table: &DirNode,
    c: &Change,
    spec: Option<&BTreeMap<String, String>>,
) -> Result<Vec<Name>, ApplyError> {
    let DirKind::Table { partition_keys, .. } = &table.kind else {
        return Err(ApplyError::NoTable(c.db.clone(), c.table.clone()));
    };
    let given = spec.map_or(0, |p| p.len());
    let mismatch = || {
        let keys: Vec<&str> = partition_keys.iter().map(|k| &**k).collect();
        ApplyError::PartitionMismatch(if keys.is_empty() {
            "the table is not partitioned".into()
        } else {
            format!("expected {}", keys.join(", "))
        })
    };
    if given != partition_keys.len() {
        return Err(mismatch());
    }
    partition_keys
        .iter()
        .map(|key| {
            let value = spec.and_then(|p| p.get(&**key)).ok_or_else(mismatch)?;
            Ok(Name::from(format!(
                "{}={}",
                escape_path_name(key),
                escape_path_name(value)
            )))
        })
        .collect()
}

fn put_files(
    dir: &Arc<DirNode>,
    path: &[Name],
    depth: u16,
    c: &Change,
    meta: &dyn Fn() -> Meta,
    full_dir: &[Name],
    added: &mut Vec<AddedFile>,
) -> Result<Arc<DirNode>, ApplyError> {
    if let Some((first, rest)) = path.split_first() {
        let child = match dir.child_dir(first) {
            Some(c) => Arc::clone(c),
            None => Arc::new(DirNode {
                meta: meta(),
                kind: DirKind::Partition { depth: depth + 1 },
                children: OrdMap::new(),
            }),
        };
        let child = put_files(&child, rest, depth + 1, c, meta, full_dir, added)?;
        return Ok(dir.with_children(
            meta(),
            dir.children.update(Name::clone(first), Node::Dir(child)),
        ));
    }
    let mut children = if c.op == Op::ReplaceFiles {
        // INSERT OVERWRITE: the partition's content (files and the
        // subdirectories holding files) becomes exactly `files`.
        OrdMap::new()
    } else {
        dir.children.clone()
    };
    let where_ = || {
        if full_dir.len() > 2 {
            full_dir[2..].join("/")
        } else {
            format!("{}.{}", c.db, c.table)
        }
    };
    for file in &c.files {
        let Some(subdir) = file.subdir.as_deref() else {
            let name = Name::from(file.name.as_str());
            let node = new_file(file, Name::clone(&name), full_dir.to_vec(), meta, added);
            // One search: `children` is this call's own copy, dropped on
            // the error.
            if children.insert(name, node).is_some() {
                return Err(ApplyError::DuplicateFile(file.name.clone(), where_()));
            }
            continue;
        };
        let sub: Vec<Name> = subdir.split('/').map(Name::from).collect();
        let mut file_dir = full_dir.to_vec();
        file_dir.extend(sub.iter().cloned());
        let child = subdir_node(children.get(&*sub[0]), &sub[0], meta, &where_)?;
        let child = put_file(&child, &sub[1..], file, meta, &file_dir, &where_, added)?;
        children.insert(Name::clone(&sub[0]), Node::Dir(child));
    }
    Ok(dir.with_children(meta(), children))
}

/// The file node for `file`, recorded in `added`.
fn new_file(
    file: &FileRef,
    name: Name,
    dir: Vec<Name>,
    meta: &dyn Fn() -> Meta,
    added: &mut Vec<AddedFile>,
) -> Node {
    let (node, resolution) = FileNode::new(meta(), file);
    added.push(AddedFile {
        dir,
        name,
        blob: file.key(),
        file: file.clone(),
        resolution,
    });
    Node::File(Arc::new(node))
}

/// The existing subdirectory `name` (`existing`), or a new empty one.
fn subdir_node(
    existing: Option<&Node>,
    name: &str,
    meta: &dyn Fn() -> Meta,
    where_: &dyn Fn() -> String,
) -> Result<Arc<DirNode>, ApplyError> {
    match existing {
        Some(Node::Dir(d)) => Ok(Arc::clone(d)),
        Some(Node::File(_)) => Err(ApplyError::NotADirectory(name.to_owned(), where_())),
        None => Ok(Arc::new(DirNode {
            meta: meta(),
            kind: DirKind::Subdir,
            children: OrdMap::new(),
        })),
    }
}

/// `dir` with `file` added `sub` levels below it (creating subdirectories).
fn put_file(
    dir: &Arc<DirNode>,
    sub: &[Name],
    file: &FileRef,
    meta: &dyn Fn() -> Meta,
    file_dir: &[Name],
    where_: &dyn Fn() -> String,
    added: &mut Vec<AddedFile>,
) -> Result<Arc<DirNode>, ApplyError> {
    if let Some((first, rest)) = sub.split_first() {
        let child = subdir_node(dir.child(first), first, meta, where_)?;
        let child = put_file(&child, rest, file, meta, file_dir, where_, added)?;
        return Ok(dir.with_children(
            meta(),
            dir.children.update(Name::clone(first), Node::Dir(child)),
        ));
    }
    let name = Name::from(file.name.as_str());
    if dir.children.contains_key(&*name) {
        return Err(ApplyError::DuplicateFile(file.name.clone(), where_()));
    }
    let node = new_file(file, Name::clone(&name), file_dir.to_vec(), meta, added);
    Ok(dir.with_children(meta(), dir.children.update(name, node)))
}

/// `table` with the partition `c.partition` moved, files and all, to
/// `c.new_partition` (Hive's `ALTER TABLE … PARTITION … RENAME TO`): the
/// partition's node keeps its identity, as a renamed table does.
fn rename_partition(
    table: &Arc<DirNode>,
    c: &Change,
    meta: &dyn Fn() -> Meta,
) -> Result<Arc<DirNode>, ApplyError> {
    fn put(
        dir: &Arc<DirNode>,
        path: &[Name],
        depth: u16,
        leaf: &Arc<DirNode>,
        meta: &dyn Fn() -> Meta,
    ) -> Arc<DirNode> {
        let Some((first, rest)) = path.split_first() else {
            return Arc::clone(leaf);
        };
        let child = if rest.is_empty() {
            Arc::clone(leaf)
        } else {
            let existing = dir.child_dir(first).cloned().unwrap_or_else(|| {
                Arc::new(DirNode {
                    meta: meta(),
                    kind: DirKind::Partition { depth: depth + 1 },
                    children: OrdMap::new(),
                })
            });
            put(&existing, rest, depth + 1, leaf, meta)
        };
        dir.with_children(
            meta(),
            dir.children.update(Name::clone(first), Node::Dir(child)),
        )
    }
    let from = partition_path(table, c)?;
    let Some(new) = c.new_partition.as_ref() else {
        return Err(ApplyError::PartitionMismatch(
            "a partition rename needs the new partition".into(),
        ));
    };
    let to = partition_path_of(table, c, Some(new))?;
    let shown = |path: &[Name]| format!("{}.{}/{}", c.db, c.table, path.join("/"));
    let mut leaf = Some(table);
    for name in &from {
        leaf = leaf.and_then(|d| d.child_dir(name));
    }
    let leaf = Arc::clone(leaf.ok_or_else(|| ApplyError::NoPartition(shown(&from)))?);
    let mut at = Some(table);
    for name in &to {
        at = at.and_then(|d| d.child_dir(name));
    }
    if at.is_some() {
        return Err(ApplyError::PartitionExists(shown(&to)));
    }
    let without = drop_partition(table, &from, c, meta)?;
    Ok(put(&without, &to, 0, &leaf, meta))
}

fn drop_partition(
    table: &Arc<DirNode>,
    path: &[Name],
    c: &Change,
    meta: &dyn Fn() -> Meta,
) -> Result<Arc<DirNode>, ApplyError> {
    fn go(dir: &Arc<DirNode>, path: &[Name], meta: &dyn Fn() -> Meta) -> Option<Arc<DirNode>> {
        let (first, rest) = path.split_first()?;
        let child = dir.child_dir(first)?;
        let children = if rest.is_empty() {
            dir.children.without(&**first)
        } else {
            let child = go(child, rest, meta)?;
            if child.children.is_empty() {
                // An intermediate `key=value` level exists only for the
                // partitions below it.
                dir.children.without(&**first)
            } else {
                dir.children.update(Name::clone(first), Node::Dir(child))
            }
        };
        Some(dir.with_children(meta(), children))
    }
    if path.is_empty() {
        return Err(ApplyError::PartitionMismatch(
            "the table is not partitioned".into(),
        ));
    }
    go(table, path, meta)
        .ok_or_else(|| ApplyError::NoPartition(format!("{}.{}/{}", c.db, c.table, path.join("/"))))
}
