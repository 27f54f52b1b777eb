//! A reader host's cache with real processes (SPEC §8): a publisher
//! (`stagefs replicate --publish file://…`) of a warehouse with files
//! larger than a piece, and reader hosts (`stagefs mount --from`):
//!
//! - a large file read in the middle is served before the rest of it is
//!   fetched (the bytes fetched stay below the file's size);
//! - `stagefs warm MNT` fetches everything with a progress line, and a
//!   reader host restarted on the warm cache serves every file without
//!   fetching a byte;
//! - a small `--cache-size`: every file still reads right (older content
//!   is evicted) and the cache stays under its bound.

use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};
use stagefs::testkit::checker::{visible, DaemonProcess};
use stagefs::workload::{Workload, WorkloadConfig};

const BIN: &str = env!("CARGO_BIN_EXE_stagefs");
const MIB: u64 = 1 << 20;

/// The publisher, killed when the test ends (even on panic).
struct Kill(std::process::Child);

impl Drop for Kill {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn reader_host(root: &Path, url: &str, extra: &[&str]) -> DaemonProcess {
    let mnt = root.join("mnt");
    std::fs::create_dir_all(&mnt).unwrap();
    let cache = root.join("cache");
    let mut args: Vec<&std::ffi::OsStr> = vec![
        "--from".as_ref(),
        url.as_ref(),
        "--cache".as_ref(),
        cache.as_os_str(),
        "--poll-ms".as_ref(),
        "100".as_ref(),
    ];
    args.extend(extra.iter().map(|a| std::ffi::OsStr::new(*a)));
    DaemonProcess::start(
        Path::new(BIN),
        &mnt,
        &args,
        &root.join("reader.log"),
        Duration::from_secs(20),
    )
    .expect("the reader host mounts")
}

fn status(mnt: &Path) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(mnt.join(".stagefs/status")).unwrap()).unwrap()
}

fn fetched_bytes(mnt: &Path) -> u64 {
    status(mnt)["cache"]["fetched_bytes"].as_u64().unwrap()
}

/// Every file under `dir` with its size (not under `.stagefs`).
fn files(dir: &Path) -> Vec<(PathBuf, u64)> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let e = e.unwrap();
        if e.file_name() == ".stagefs" {
            continue;
        }
        let m = e.metadata().unwrap();
        if m.is_dir() {
            out.extend(files(&e.path()));
        } else {
            out.push((e.path(), m.len()));
        }
    }
    out.sort();
    out
}

fn sha256_xattr(path: &Path) -> Vec<u8> {
    use std::os::unix::ffi::OsStrExt;
    let p = std::ffi::CString::new(path.as_os_str().as_bytes()).unwrap();
    let mut buf = vec![0u8; 128];
    // SAFETY: NUL-terminated strings and a buffer of `len` writable bytes.
    let n = unsafe {
        libc::getxattr(
            p.as_ptr(),
            c"user.stagefs.sha256".as_ptr(),
            buf.as_mut_ptr().cast(),
            buf.len(),
        )
    };
    assert!(
        n > 0,
        "{}: {}",
        path.display(),
        std::io::Error::last_os_error()
    );
    buf.truncate(n as usize);
    buf
}

/// Reads `path` whole and checks it against its `user.stagefs.sha256`.
fn check_file(path: &Path) {
    let bytes = std::fs::read(path).unwrap();
    let want = sha256_xattr(path);
    let got: String = Sha256::digest(&bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    assert_eq!(got.as_bytes(), &want[..], "{}", path.display());
}

fn wait_visible(mnt: &Path, w: &Workload, reader: &DaemonProcess) {
    let start = Instant::now();
    while visible(mnt).ok() != Some(w.latest()) {
        assert!(
            start.elapsed() < Duration::from_secs(120),
            "not at {}: {}",
            w.latest(),
            reader.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn large_files_read_in_the_middle_warm_and_restart_without_refetching_and_a_small_cache_holds() {
    let dir = tempfile::tempdir().unwrap();
    let mut w = Workload::new(
        &dir.path().join("src"),
        WorkloadConfig {
            seed: 30,
            databases: 1,
            tables_per_db: 2,
            partitions: 2,
            max_files_per_insert: 1,
            min_file_bytes: 9 << 20,
            max_file_bytes: 20 << 20,
            ..WorkloadConfig::default()
        },
    )
    .unwrap();
    while w.latest().0 < 12 {
        w.step().unwrap();
    }
    let url = format!("file://{}", dir.path().join("published").display());
    let state = dir.path().join("publisher");
    let _publisher = Kill(
        Command::new(BIN)
            .arg("replicate")
            .arg("--state")
            .arg(&state)
            .arg("--source-root")
            .arg(w.source_root())
            .arg("--events")
            .arg(w.events_dir())
            .arg("--cm-root")
            .arg(w.cm_root())
            .args(["--publish", &url])
            .env("STAGEFS_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );

    // A large file read past its first piece: served before the rest of
    // it is fetched.
    let host = dir.path().join("host");
    let mnt = host.join("mnt");
    let mut reader = reader_host(&host, &url, &[]);
    wait_visible(&mnt, &w, &reader);
    let all = files(&mnt);
    let (big, size) = all.iter().max_by_key(|(_, s)| *s).unwrap().clone();
    assert!(size > 8 * MIB, "{size}");
    let mut buf = vec![0u8; 4096];
    let f = std::fs::File::open(&big).unwrap();
    // Near its end: only the last piece (nothing follows to read ahead).
    let at = size - 4096;
    f.read_exact_at(&mut buf, at).unwrap();
    let fetched = fetched_bytes(&mnt);
    assert!(
        fetched < size,
        "read {size} B file near its end: {fetched} B fetched"
    );
    drop(f);
    check_file(&big);

    // Warm all of it, with a progress line.
    let out = Command::new(BIN).arg("warm").arg(&mnt).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(err.contains(&format!("warm: {} files", all.len())), "{err}");
    assert!(err.contains("MiB/s"), "{err}");
    let total: u64 = all.iter().map(|(_, s)| s).sum();
    assert!(fetched_bytes(&mnt) >= total - size, "{}", status(&mnt));
    // Not a mount: a usage error.
    let out = Command::new(BIN)
        .arg("warm")
        .arg(dir.path())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));

    // Restarted on the warm cache: nothing is fetched again.
    assert!(reader.terminate(Duration::from_secs(20)).unwrap());
    let reader = reader_host(&host, &url, &[]);
    wait_visible(&mnt, &w, &reader);
    for (p, _) in &all {
        check_file(p);
    }
    assert_eq!(fetched_bytes(&mnt), 0, "{}", status(&mnt));
    drop(reader);

    // A cache smaller than the warehouse: every file reads right, the
    // bound holds.
    let small = dir.path().join("small");
    let limit = 24 * MIB;
    let reader = reader_host(&small, &url, &["--cache-size", &limit.to_string()]);
    let mnt = small.join("mnt");
    wait_visible(&mnt, &w, &reader);
    assert!(total > limit, "the warehouse ({total} B) must not fit");
    for (p, _) in &all {
        check_file(
            &p.strip_prefix(host.join("mnt"))
                .map(|r| mnt.join(r))
                .unwrap(),
        );
        let s = status(&mnt);
        assert!(s["cache"]["bytes"].as_u64().unwrap() <= limit, "{s}");
    }
    let s = status(&mnt);
    assert!(s["cache"]["evicted"].as_u64().unwrap() > 0, "{s}");
}
