//! Leases at the URL (SPEC §8 "Retention at URL"): an object
//! `leases/<id>` that asks the publisher to keep one published state
//! until a time, whatever `--retain` says.
//!
//! ```text
//! stagefs-lease 1
//! state 1234                  the leased state-id
//! expires_ms 1712345678901    wall-clock time (ms since the epoch) it ends
//! holder host=a pid=42 pin    who holds it (free text, for operators)
//! ```
//!
//! Anyone who can write to the URL takes leases: a reader host for its
//! pins and `stagefs run` sessions ([`LeaseKeeper`], renewed while the
//! daemon lives, so they expire when its host dies), and `stagefs lease`
//! for a job started by a scheduler (renewed by hand or left to expire).
//! Leases are not signed: a hostile writer can only make the publisher
//! keep more, which it could also do by filling the bucket.
//!
//! Taking a lease races with garbage collection, which is ordered so that
//! the race is safe ([`acquire`], and `gc`): the taker writes its lease,
//! then checks that the state is neither condemned nor gone; the collector
//! writes its condemnation mark, then lists the leases, and deletes the
//! state only when none holds it. Whichever writes first is seen by the
//! other.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures::TryStreamExt;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};
use tracing::{info, warn};

use super::layout;
use super::load::{get_bounded, LoadError};
use super::record::{hex, parse_i64, parse_u64, unhex};
use crate::event::StateId;

/// Larger lease objects are refused unread.
pub const MAX_LEASE_BYTES: u64 = 1024;
/// Longest holder text kept.
const MAX_HOLDER: usize = 200;

/// One lease: `state` is kept at the URL until `expires_ms`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    pub state: StateId,
    pub expires_ms: i64,
    pub holder: String,
}

/// A lease's name: 16 random bytes, as 32 lower-case hex digits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LeaseId(pub [u8; 16]);

impl LeaseId {
    pub fn random() -> std::io::Result<LeaseId> {
        Ok(LeaseId(super::keys::random_bytes()?))
    }

    pub fn parse(s: &str) -> Option<LeaseId> {
        let mut out = [0u8; 16];
        unhex(s, &mut out).then_some(LeaseId(out))
    }
}

impl std::fmt::Display for LeaseId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&hex(&self.0))
    }
}

#[derive(Debug, thiserror::Error)]
pub enum LeaseError {
    #[error(transparent)]
    Load(#[from] LoadError),
    #[error("writing {object}: {source}")]
    Write {
        object: String,
        source: object_store::Error,
    },
    #[error("state {0} is not retained at the URL (no longer, or never published)")]
    NotRetained(StateId),
    #[error("lease {0} is not held (released, or expired and collected)")]
    Gone(LeaseId),
    #[error("lease {0} expired; take a new one")]
    Expired(LeaseId),
    #[error("{0}")]
    Io(String),
}

/// Why a lease object could not be read.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("not a stagefs lease: {0}")]
pub struct LeaseDecodeError(String);

pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

impl Lease {
    pub fn encode(&self) -> Vec<u8> {
        let holder: String = self
            .holder
            .chars()
            .filter(|c| c.is_ascii_graphic() || *c == ' ')
            .take(MAX_HOLDER)
            .collect();
        format!(
            "stagefs-lease 1\nstate {}\nexpires_ms {}\nholder {holder}\n",
            self.state.0, self.expires_ms
        )
        .into_bytes()
    }

    /// Only the exact shape [`Lease::encode`] writes is taken.
    pub fn decode(bytes: &[u8]) -> Result<Lease, LeaseDecodeError> {
        let bad = |m: &str| LeaseDecodeError(m.to_owned());
        if bytes.len() as u64 > MAX_LEASE_BYTES {
            return Err(bad("too large"));
        }
        let text = std::str::from_utf8(bytes).map_err(|_| bad("not UTF-8"))?;
        let body = text
            .strip_suffix('\n')
            .ok_or_else(|| bad("no final newline"))?;
        let lines: Vec<&str> = body.split('\n').collect();
        if lines.len() != 4 {
            return Err(bad("not four lines"));
        }
        let field = |i: usize, name: &str| {
            lines[i]
                .strip_prefix(name)
                .and_then(|r| r.strip_prefix(' '))
                .ok_or_else(|| bad(&format!("line {} is not `{name} …`", i + 1)))
        };
        if field(0, "stagefs-lease")? != "1" {
            return Err(bad("unknown version"));
        }
        let state = parse_u64(field(1, "state")?).ok_or_else(|| bad("bad state"))?;
        let expires_ms = parse_i64(field(2, "expires_ms")?).ok_or_else(|| bad("bad expires_ms"))?;
        let holder = field(3, "holder")?;
        if holder.len() > MAX_HOLDER || !holder.chars().all(|c| c.is_ascii_graphic() || c == ' ') {
            return Err(bad("bad holder"));
        }
        Ok(Lease {
            state: StateId(state),
            expires_ms,
            holder: holder.to_owned(),
        })
    }
}

/// Writes (or renews: overwrites) lease `id`.
pub async fn put_lease(
    store: &dyn ObjectStore,
    id: LeaseId,
    lease: &Lease,
) -> Result<(), LeaseError> {
    let path = layout::lease(&id);
    store
        .put(&path, PutPayload::from(lease.encode()))
        .await
        .map(|_| ())
        .map_err(|source| LeaseError::Write {
            object: path.to_string(),
            source,
        })
}

/// Whether an object exists (errors other than "not found" are errors).
pub async fn exists(store: &dyn ObjectStore, path: &Path) -> Result<bool, LoadError> {
    match store.head(path).await {
        Ok(_) => Ok(true),
        Err(object_store::Error::NotFound { .. }) => Ok(false),
        Err(source) => Err(LoadError::Store {
            object: path.to_string(),
            source,
        }),
    }
}

/// Whether `state` is published and not condemned: read after a lease on
/// it was written, so a collector that condemns it later sees the lease.
async fn still_kept(store: &dyn ObjectStore, state: StateId) -> Result<bool, LoadError> {
    Ok(!exists(store, &layout::condemned(state)).await?
        && exists(store, &layout::state(state)).await?)
}

/// Takes a new lease on `state` for `ttl`: written first, then the state
/// is checked (see the module's ordering); a state that is gone or going
/// is refused and the lease removed.
pub async fn acquire(
    store: &dyn ObjectStore,
    state: StateId,
    ttl: Duration,
    holder: &str,
) -> Result<LeaseId, LeaseError> {
    let id = LeaseId::random().map_err(|e| LeaseError::Io(e.to_string()))?;
    let lease = Lease {
        state,
        expires_ms: now_ms().saturating_add(ttl.as_millis() as i64),
        holder: holder.to_owned(),
    };
    put_lease(store, id, &lease).await?;
    match still_kept(store, state).await {
        Ok(true) => Ok(id),
        Ok(false) => {
            let _ = release(store, id).await;
            Err(LeaseError::NotRetained(state))
        }
        Err(e) => {
            let _ = release(store, id).await;
            Err(e.into())
        }
    }
}

/// Reads lease `id` (None: there is none).
pub async fn read(store: &dyn ObjectStore, id: LeaseId) -> Result<Option<Lease>, LeaseError> {
    let path = layout::lease(&id);
    match get_bounded(store, &path, MAX_LEASE_BYTES).await {
        Ok(bytes) => Lease::decode(&bytes).map(Some).map_err(|e| {
            LeaseError::Load(LoadError::Corrupt {
                object: path.to_string(),
                detail: e.to_string(),
            })
        }),
        Err(LoadError::Missing { .. }) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// Extends lease `id` to `ttl` from now. A lease that expired is not
/// revived (its state may be condemned already): take a new one.
pub async fn renew(
    store: &dyn ObjectStore,
    id: LeaseId,
    ttl: Duration,
) -> Result<Lease, LeaseError> {
    let mut lease = read(store, id).await?.ok_or(LeaseError::Gone(id))?;
    let now = now_ms();
    if lease.expires_ms <= now {
        return Err(LeaseError::Expired(id));
    }
    lease.expires_ms = now.saturating_add(ttl.as_millis() as i64);
    put_lease(store, id, &lease).await?;
    if !still_kept(store, lease.state).await? {
        return Err(LeaseError::NotRetained(lease.state));
    }
    Ok(lease)
}

/// Removes lease `id`; one that is not there is released already.
pub async fn release(store: &dyn ObjectStore, id: LeaseId) -> Result<(), LeaseError> {
    let path = layout::lease(&id);
    match store.delete(&path).await {
        Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
        Err(source) => Err(LeaseError::Write {
            object: path.to_string(),
            source,
        }),
    }
}

/// One object under `leases/` as the collector sees it.
#[derive(Debug, Clone)]
pub struct Listed {
    pub path: Path,
    pub id: Option<LeaseId>,
    /// None: not a lease this stagefs reads (kept, never honoured).
    pub lease: Option<Lease>,
}

/// Every object under `leases/`, read.
pub async fn list(store: &dyn ObjectStore) -> Result<Vec<Listed>, LoadError> {
    let prefix = Path::from(layout::LEASES);
    let metas: Vec<object_store::ObjectMeta> = store
        .list(Some(&prefix))
        .try_collect()
        .await
        .map_err(|source| LoadError::Store {
            object: layout::LEASES.into(),
            source,
        })?;
    let mut out = Vec::with_capacity(metas.len());
    for meta in metas {
        let id = meta.location.filename().and_then(LeaseId::parse);
        let lease = match get_bounded(store, &meta.location, MAX_LEASE_BYTES).await {
            Ok(bytes) => Lease::decode(&bytes).ok(),
            // Released between the list and the read.
            Err(LoadError::Missing { .. }) => continue,
            Err(e) => return Err(e),
        };
        out.push(Listed {
            path: meta.location,
            id,
            lease,
        });
    }
    Ok(out)
}

/// The states a daemon holds (its pins and `stagefs run` sessions).
pub type HeldStatesFn = Arc<dyn Fn() -> Vec<StateId> + Send + Sync>;

/// What a keeper holds now: state → lease (status, tests).
pub type KeeperReport = Arc<Mutex<BTreeMap<StateId, LeaseId>>>;

/// A reader host's leases: one per state its pins and sessions hold,
/// renewed every third of `ttl` while the daemon lives, released when
/// the hold ends or the daemon stops. A daemon killed leaves them to
/// expire.
pub struct LeaseKeeper {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    held: KeeperReport,
}

impl LeaseKeeper {
    pub fn start(
        store: Arc<dyn ObjectStore>,
        states: HeldStatesFn,
        ttl: Duration,
        holder: String,
    ) -> std::io::Result<LeaseKeeper> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let stop = Arc::new(AtomicBool::new(false));
        let held: KeeperReport = Arc::default();
        let thread = {
            let (stop, held) = (Arc::clone(&stop), Arc::clone(&held));
            std::thread::Builder::new()
                .name("stagefs-lease".into())
                .spawn(move || {
                    let mut k = Keeper {
                        store,
                        ttl,
                        holder,
                        leases: BTreeMap::new(),
                        refused: BTreeMap::new(),
                        renewed_ms: 0,
                        held,
                    };
                    while !stop.load(Ordering::Relaxed) {
                        rt.block_on(k.pass(&states()));
                        std::thread::sleep(Duration::from_millis(50));
                    }
                    rt.block_on(k.release_all());
                })?
        };
        Ok(LeaseKeeper {
            stop,
            thread: Some(thread),
            held,
        })
    }

    pub fn held(&self) -> KeeperReport {
        Arc::clone(&self.held)
    }

    /// Releases every lease and stops.
    pub fn stop(mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            if t.join().is_err() {
                warn!("the lease keeper thread panicked");
            }
        }
    }
}

struct Keeper {
    store: Arc<dyn ObjectStore>,
    ttl: Duration,
    holder: String,
    leases: BTreeMap<StateId, LeaseId>,
    /// States a lease could not be taken on, and when: tried again only
    /// after [`RETRY_MS`] (a pin on a state collected at the URL stays a
    /// local pin).
    refused: BTreeMap<StateId, i64>,
    renewed_ms: i64,
    held: KeeperReport,
}

const RETRY_MS: i64 = 10_000;

impl Keeper {
    async fn pass(&mut self, wanted: &[StateId]) {
        let wanted: std::collections::BTreeSet<StateId> =
            wanted.iter().copied().filter(|s| s.0 > 0).collect();
        let gone: Vec<StateId> = self
            .leases
            .keys()
            .filter(|s| !wanted.contains(s))
            .copied()
            .collect();
        for s in gone {
            if let Some(id) = self.leases.remove(&s) {
                match release(&*self.store, id).await {
                    Ok(()) => info!(state = s.0, lease = %id, "lease released"),
                    Err(e) => warn!(state = s.0, "releasing lease {id}: {e}"),
                }
            }
        }
        let now = now_ms();
        self.refused.retain(|s, _| wanted.contains(s));
        for &s in &wanted {
            if self.leases.contains_key(&s)
                || self.refused.get(&s).is_some_and(|t| now - t < RETRY_MS)
            {
                continue;
            }
            match acquire(&*self.store, s, self.ttl, &self.holder).await {
                Ok(id) => {
                    info!(state = s.0, lease = %id, "lease taken");
                    self.refused.remove(&s);
                    self.leases.insert(s, id);
                }
                Err(e) => {
                    if self.refused.insert(s, now).is_none() {
                        warn!(
                            state = s.0,
                            "cannot lease state {s} at the URL (retrying every {RETRY_MS} ms): {e}"
                        );
                    }
                }
            }
        }
        if now - self.renewed_ms >= (self.ttl.as_millis() / 3) as i64 {
            self.renewed_ms = now;
            let expires_ms = now.saturating_add(self.ttl.as_millis() as i64);
            for (&s, &id) in &self.leases {
                let lease = Lease {
                    state: s,
                    expires_ms,
                    holder: self.holder.clone(),
                };
                if let Err(e) = put_lease(&*self.store, id, &lease).await {
                    warn!(state = s.0, "renewing lease {id}: {e}");
                }
            }
        }
        *self.held.lock().unwrap_or_else(|p| p.into_inner()) = self.leases.clone();
    }

    async fn release_all(&mut self) {
        for (s, id) in std::mem::take(&mut self.leases) {
            if let Err(e) = release(&*self.store, id).await {
                warn!(state = s.0, "releasing lease {id}: {e}");
            }
        }
    }
}

/// This host's name and this process, for a lease's holder line.
pub fn holder(what: &str) -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .unwrap_or_default();
    format!("host={host} pid={} {what}", std::process::id())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lease_round_trips_and_only_its_exact_shape_decodes() {
        let l = Lease {
            state: StateId(42),
            expires_ms: 1_700_000_000_000,
            holder: "host=a pid=7 pin".into(),
        };
        assert_eq!(Lease::decode(&l.encode()).unwrap(), l);
        for bad in [
            &b"stagefs-lease 1\nstate 42\nexpires_ms 1\n"[..],
            b"stagefs-lease 2\nstate 42\nexpires_ms 1\nholder x\n",
            b"stagefs-lease 1\nstate 042\nexpires_ms 1\nholder x\n",
            b"stagefs-lease 1\nstate 42\nexpires_ms 1\nholder x\nmore\n",
            b"stagefs-lease 1\nstate 42\nexpires_ms x\nholder x\n",
        ] {
            assert!(
                Lease::decode(bad).is_err(),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
        assert!(Lease::decode(&vec![b'a'; 2000]).is_err());
    }

    #[test]
    fn lease_ids_are_32_lower_hex_digits() {
        let id = LeaseId::random().unwrap();
        assert_eq!(LeaseId::parse(&id.to_string()), Some(id));
        for bad in ["", "../HEAD", &"A".repeat(32), &"0".repeat(31)] {
            assert_eq!(LeaseId::parse(bad), None);
        }
    }
}
