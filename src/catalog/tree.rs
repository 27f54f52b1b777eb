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

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use imbl::OrdMap;

use crate::event::{escape_path_name, BlobId, Event, FileRef, Op, StateId};

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
    },
    /// A `key=value` level below a table; `depth` 1 is the first key.
    Partition {
        depth: u16,
    },
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
    pub size: u64,
    pub blob: BlobId,
    /// The source path the file came from (relative to the source root).
    pub source: Box<str>,
}

#[derive(Debug, Clone)]
pub enum Node {
    Dir(Arc<DirNode>),
    File(Arc<FileNode>),
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
        fn walk(prefix: &str, dir: &DirNode, out: &mut Vec<(String, BlobId)>) {
            for (name, child) in dir.children.iter() {
                let path = if prefix.is_empty() {
                    name.to_string()
                } else {
                    format!("{prefix}/{name}")
                };
                match child {
                    Node::Dir(d) => walk(&path, d, out),
                    Node::File(f) => out.push((path, f.blob)),
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
    #[error("partition does not match the table's partition keys ({0})")]
    PartitionMismatch(String),
    #[error("file `{0}` already exists in {1}")]
    DuplicateFile(String, String),
    #[error("id {got} does not increase past {last}")]
    NotIncreasing { last: StateId, got: StateId },
}

/// A file an event added, with where it sits in the new tree, so the
/// commit rule can ask "does state S still reference it?".
#[derive(Debug, Clone)]
pub struct AddedFile {
    pub dir: Vec<Name>,
    pub name: Name,
    pub blob: BlobId,
    pub size: u64,
    pub file: FileRef,
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
        let root = &self.root;
        let new_root = match event.op {
            Op::Noop => Arc::clone(root),
            Op::CreateDatabase => {
                if root.child(&event.db).is_some() {
                    return Err(ApplyError::DatabaseExists(event.db.clone()));
                }
                let db = Node::Dir(Arc::new(DirNode {
                    meta: meta(),
                    kind: DirKind::Database,
                    children: OrdMap::new(),
                }));
                root.with_children(meta(), root.children.update(event.db.as_str().into(), db))
            }
            Op::DropDatabase => {
                if root.child(&event.db).is_none() {
                    return Err(ApplyError::NoDatabase(event.db.clone()));
                }
                root.with_children(meta(), root.children.without(event.db.as_str()))
            }
            Op::CreateTable => {
                let db = root
                    .child_dir(&event.db)
                    .ok_or_else(|| ApplyError::NoDatabase(event.db.clone()))?;
                if db.child(&event.table).is_some() {
                    return Err(ApplyError::TableExists(
                        event.db.clone(),
                        event.table.clone(),
                    ));
                }
                let keys: Arc<[Name]> = event
                    .partition_keys
                    .iter()
                    .map(|k| Name::from(k.as_str()))
                    .collect();
                let table = Node::Dir(Arc::new(DirNode {
                    meta: meta(),
                    kind: DirKind::Table {
                        partition_keys: keys,
                    },
                    children: OrdMap::new(),
                }));
                let db = db.with_children(
                    meta(),
                    db.children.update(event.table.as_str().into(), table),
                );
                root.with_children(
                    meta(),
                    root.children
                        .update(event.db.as_str().into(), Node::Dir(db)),
                )
            }
            Op::DropTable => {
                let db = self.existing_table(event)?.0;
                let db = db.with_children(meta(), db.children.without(event.table.as_str()));
                root.with_children(
                    meta(),
                    root.children
                        .update(event.db.as_str().into(), Node::Dir(db)),
                )
            }
            Op::RenameTable => {
                let (_, table) = self.existing_table(event)?;
                let target_db = root
                    .child_dir(&event.new_db)
                    .ok_or_else(|| ApplyError::NoDatabase(event.new_db.clone()))?;
                if target_db.child(&event.new_table).is_some() {
                    return Err(ApplyError::TableExists(
                        event.new_db.clone(),
                        event.new_table.clone(),
                    ));
                }
                // The table node moves as it is: its content did not change,
                // so it keeps its id, state-id and kernel caches.
                let table = Node::Dir(Arc::clone(table));
                let mut children = root.children.clone();
                let from = children
                    .get(event.db.as_str())
                    .and_then(Node::as_dir)
                    .ok_or_else(|| ApplyError::NoDatabase(event.db.clone()))?;
                let from = from.with_children(meta(), from.children.without(event.table.as_str()));
                children.insert(event.db.as_str().into(), Node::Dir(from));
                let to = children
                    .get(event.new_db.as_str())
                    .and_then(Node::as_dir)
                    .ok_or_else(|| ApplyError::NoDatabase(event.new_db.clone()))?;
                let to = to.with_children(
                    meta(),
                    to.children.update(event.new_table.as_str().into(), table),
                );
                children.insert(event.new_db.as_str().into(), Node::Dir(to));
                root.with_children(meta(), children)
            }
            Op::AddPartition | Op::AddFiles | Op::ReplaceFiles | Op::DropPartition => {
                let (db, table) = self.existing_table(event)?;
                let part_path = partition_path(table, event)?;
                let new_table = if event.op == Op::DropPartition {
                    drop_partition(table, &part_path, event, &meta)?
                } else {
                    let mut dir: Vec<Name> =
                        vec![event.db.as_str().into(), event.table.as_str().into()];
                    dir.extend(part_path.iter().cloned());
                    put_files(table, &part_path, 0, event, &meta, &dir, &mut added)?
                };
                let db = db.with_children(
                    meta(),
                    db.children
                        .update(event.table.as_str().into(), Node::Dir(new_table)),
                );
                root.with_children(
                    meta(),
                    root.children
                        .update(event.db.as_str().into(), Node::Dir(db)),
                )
            }
        };
        let tree = Tree {
            state_id: event.id,
            time_ms: event.time_ms.unwrap_or(UNKNOWN_TIME),
            root: new_root,
        };
        Ok((tree, added))
    }

    fn existing_table(&self, event: &Event) -> Result<(&Arc<DirNode>, &Arc<DirNode>), ApplyError> {
        let db = self
            .database(&event.db)
            .ok_or_else(|| ApplyError::NoDatabase(event.db.clone()))?;
        let table = db
            .child_dir(&event.table)
            .ok_or_else(|| ApplyError::NoTable(event.db.clone(), event.table.clone()))?;
        Ok((db, table))
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

/// The directory names `key=value` of the event's partition, in the table's
/// key order; empty for an unpartitioned table.
fn partition_path(table: &DirNode, event: &Event) -> Result<Vec<Name>, ApplyError> {
    let DirKind::Table { partition_keys } = &table.kind else {
        return Err(ApplyError::NoTable(event.db.clone(), event.table.clone()));
    };
    let spec = event.partition.as_ref();
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
    event: &Event,
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
        let child = put_files(&child, rest, depth + 1, event, meta, full_dir, added)?;
        return Ok(dir.with_children(
            meta(),
            dir.children.update(Name::clone(first), Node::Dir(child)),
        ));
    }
    let mut children = if event.op == Op::ReplaceFiles {
        // INSERT OVERWRITE: files only; nothing else lives in a leaf.
        OrdMap::new()
    } else {
        dir.children.clone()
    };
    let where_ = || {
        if full_dir.len() > 2 {
            full_dir[2..].join("/")
        } else {
            format!("{}.{}", event.db, event.table)
        }
    };
    for file in &event.files {
        let name = Name::from(file.name.as_str());
        if children.contains_key(&*name) {
            return Err(ApplyError::DuplicateFile(file.name.clone(), where_()));
        }
        let node = FileNode {
            meta: meta(),
            size: file.size,
            blob: file.sha256,
            source: file.path.as_str().into(),
        };
        children.insert(Name::clone(&name), Node::File(Arc::new(node)));
        added.push(AddedFile {
            dir: full_dir.to_vec(),
            name,
            blob: file.sha256,
            size: file.size,
            file: file.clone(),
        });
    }
    Ok(dir.with_children(meta(), children))
}

fn drop_partition(
    table: &Arc<DirNode>,
    path: &[Name],
    event: &Event,
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
    go(table, path, meta).ok_or_else(|| {
        ApplyError::NoPartition(format!("{}.{}/{}", event.db, event.table, path.join("/")))
    })
}
