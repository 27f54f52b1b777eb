//! What the crash tests (crash_replicate.rs, power_loss.rs,
//! checkpoints.rs) share: the replication config they restart with, and
//! the check of a recovered state against the workload's oracle.

use std::path::Path;
use std::time::Duration;

use crate::catalog::Tree;
use crate::replicate::ReplicaConfig;
use crate::stage::BlobStore;
use crate::workload::Workload;
use sha2::{Digest, Sha256};

/// Replication of the workload under `src` into `state`: change management
/// on, GC every 50 ms, 3 versions retained (so GC has work).
pub fn crash_config(state: &Path, src: &Path) -> ReplicaConfig {
    let mut cfg = ReplicaConfig::new(state, &src.join("source"), &src.join("events"));
    cfg.cm_root = Some(src.join("cm"));
    cfg.gc_interval = Duration::from_millis(50);
    cfg.retain = 3;
    cfg
}

/// Asserts that `tree` is the source at its state-id: the same tables with
/// the same files, every blob present and hashing to its name. `when`
/// prefixes every failure (which crash, which round).
pub fn check_tree(tree: &Tree, w: &Workload, blobs: &BlobStore, when: &str) {
    let expected = w.expected(tree.state_id).unwrap();
    let mut tables = 0;
    for (db, dnode) in tree.root.children.iter() {
        for (t, tnode) in dnode.as_dir().unwrap().children.iter() {
            tables += 1;
            let want = expected
                .get(&format!("{db}.{t}"))
                .unwrap_or_else(|| panic!("{when}: {db}.{t} does not exist at {}", tree.state_id));
            let got = tnode.as_dir().unwrap().files_below();
            let want: Vec<_> = want.iter().map(|(p, b)| (p.clone(), *b)).collect();
            assert_eq!(got, want, "{when}: {db}.{t} at {}", tree.state_id);
            for (path, b) in &got {
                let bytes = std::fs::read(blobs.path(b)).unwrap_or_else(|e| {
                    panic!(
                        "{when}: committed state {} misses the blob of {db}.{t}/{path}: {e}",
                        tree.state_id
                    )
                });
                assert_eq!(
                    Sha256::digest(&bytes).as_slice(),
                    b.0,
                    "{when}: wrong blob for {db}.{t}/{path} at {}",
                    tree.state_id
                );
            }
        }
    }
    assert_eq!(
        tables,
        expected.len(),
        "{when}: table count at {}",
        tree.state_id
    );
}
