//! Real servers for the remote-source tests: each test starts its own
//! private instance (own data dir, own ports on 127.0.0.1) and the value's
//! `Drop` stops it and removes its files, also when the test panics.
//!
//! - [`MiniHdfs`]: Hadoop's MiniDFSCluster through the launcher in
//!   `tests/java/hdfs-launcher` (built by `scripts/setup-servers.sh`).
//! - [`launcher::Launcher`]: the line protocol both JVM launchers speak.
//! - [`S3Server`]: SeaweedFS's S3 gateway (`weed mini`, installed by
//!   `scripts/setup-servers.sh`), with credentials, signed bucket calls
//!   (create, versioning, list versions).
//! - [`FaultProxy`]: a TCP proxy in front of either that passes, refuses,
//!   resets after N bytes or answers `503 SlowDown`.
//!
//! Nothing here uses a server that happens to run on the machine. Include
//! from a test crate with `mod servers;` (see tests/servers/README.md).
#![allow(dead_code, unused_imports)]

pub mod hdfs;
pub mod hms;
pub mod launcher;
pub mod proxy;
pub mod s3;

pub use hdfs::{HdfsChecksumReply, MiniHdfs, MiniHdfsOptions};
pub use proxy::{FaultMode, FaultProxy};
pub use s3::{ObjectVersion, S3Response, S3Server};

use std::net::TcpListener;
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// The repository's root (where Cargo.toml is).
pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Where `scripts/setup-servers.sh` installs servers
/// (`$STAGEFS_SERVERS_DIR`, default `~/.cache/stagefs-servers`).
pub fn servers_dir() -> PathBuf {
    match std::env::var_os("STAGEFS_SERVERS_DIR") {
        Some(dir) => PathBuf::from(dir),
        None => {
            let home = std::env::var_os("HOME").unwrap_or_else(|| "/root".into());
            PathBuf::from(home).join(".cache/stagefs-servers")
        }
    }
}

/// A port that was free on 127.0.0.1 a moment ago. Servers that take their
/// ports as arguments get these; a clash with another process shows as a
/// failed start, which the callers retry with new ports.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("bind 127.0.0.1:0")
}

/// Polls `ready` every 50 ms until it is true or `timeout` passes.
pub fn wait_until(timeout: Duration, mut ready: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if ready() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The last `max` bytes of a log file, for error messages.
pub fn log_tail(path: &std::path::Path, max: usize) -> String {
    match std::fs::read(path) {
        Ok(bytes) => {
            let start = bytes.len().saturating_sub(max);
            String::from_utf8_lossy(&bytes[start..]).into_owned()
        }
        Err(e) => format!("(no log at {}: {e})", path.display()),
    }
}
