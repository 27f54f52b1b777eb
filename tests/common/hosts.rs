//! Hosts for the many-hosts tests (SPEC §8), shared by `tests/many_hosts.rs`
//! and `tests/spark_hosts.rs`:
//!
//! - [`Proc`]: a child process killed (SIGKILL) and reaped when dropped, its
//!   stderr in a log file;
//! - [`Host`]: a publisher's folder, from which `stagefs replicate
//!   --publish URL` runs;
//! - [`NsHost`]: a reader host in a mount namespace of its own (`unshare
//!   --mount`), so several hosts mount at the same path on one machine,
//!   each with its own cache, as on separate machines. Processes run
//!   inside it with [`NsHost::command`] (`nsenter`).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use stagefs::event::StateId;
use stagefs::workload::Workload;

use super::daemon::BIN;

/// A child process killed (SIGKILL) and reaped when dropped, so a failing
/// test leaves nothing running.
pub struct Proc {
    pub child: Child,
    pub log: PathBuf,
}

impl Proc {
    pub fn kill9(&mut self) {
        // SAFETY: signalling our own child.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGKILL) };
        let _ = self.child.wait();
    }

    pub fn sigterm(&mut self) -> std::process::ExitStatus {
        // SAFETY: as above.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        self.child.wait().unwrap()
    }

    pub fn stderr(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            self.kill9();
        }
    }
}

/// The source a publisher replicates: native events over a source tree.
pub struct Source {
    pub source_root: PathBuf,
    pub events: PathBuf,
    pub cm_root: PathBuf,
}

impl Source {
    pub fn of(w: &Workload) -> Source {
        Source {
            source_root: w.source_root(),
            events: w.events_dir(),
            cm_root: w.cm_root(),
        }
    }
}

/// A publisher's folder (`state/` and one stderr log per run).
pub struct Host {
    pub root: PathBuf,
    pub runs: usize,
    /// More environment (S3 credentials and endpoint).
    pub env: Vec<(String, String)>,
}

impl Host {
    pub fn new(root: &Path) -> Host {
        std::fs::create_dir_all(root).unwrap();
        Host {
            root: root.to_owned(),
            runs: 0,
            env: Vec::new(),
        }
    }

    /// `stagefs replicate` of the workload under `src`, publishing to `url`.
    pub fn replicate(&mut self, src: &Workload, url: &str, extra: &[&str]) -> Proc {
        self.replicate_source(&Source::of(src), url, &["--retain", "3"], extra)
    }

    /// `stagefs replicate` of `src` with `retain` flags (`--retain N`, and
    /// `--gc-grace` if wanted), publishing to `url`.
    pub fn replicate_source(
        &mut self,
        src: &Source,
        url: &str,
        retain: &[&str],
        extra: &[&str],
    ) -> Proc {
        self.runs += 1;
        let log = self.root.join(format!("stderr-{}.log", self.runs));
        let child = Command::new(BIN)
            .arg("replicate")
            .arg("--state")
            .arg(self.root.join("state"))
            .arg("--source-root")
            .arg(&src.source_root)
            .arg("--events")
            .arg(&src.events)
            .arg("--cm-root")
            .arg(&src.cm_root)
            .args(retain)
            .args(["--publish", url])
            .args(extra)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .env("STAGEFS_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        Proc { child, log }
    }
}

/// A reader host in a mount namespace of its own (`unshare --mount`): the
/// same mountpoint path on every host, each with its own cache, as on
/// separate machines. The namespace, and so the mount, ends with the
/// process (killed when dropped), and so do processes started in it that
/// hold nothing of it open (a test kills its own first).
pub struct NsHost {
    pub proc: Proc,
    pub mnt: PathBuf,
}

impl NsHost {
    /// `stagefs mount MNT --from URL --cache ROOT/cache --poll-ms 100` in a
    /// new mount namespace; waits until its status answers.
    pub fn start(root: &Path, mnt: &Path, url: &str) -> NsHost {
        std::fs::create_dir_all(root).unwrap();
        let log = root.join("reader.log");
        let child = Command::new("unshare")
            .args(["--mount", "--propagation", "private", BIN, "mount"])
            .arg(mnt)
            .args(["--from", url, "--cache"])
            .arg(root.join("cache"))
            .args(["--poll-ms", "100"])
            .env("STAGEFS_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        let host = NsHost {
            proc: Proc { child, log },
            mnt: mnt.to_owned(),
        };
        let start = Instant::now();
        while host.status().is_none() {
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "the reader host did not mount\n{}",
                host.proc.stderr()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        host
    }

    /// `prog` run inside this host's mount namespace.
    pub fn command(&self, prog: &str) -> Command {
        let mut c = Command::new("nsenter");
        c.arg(format!("--mount=/proc/{}/ns/mnt", self.proc.child.id()))
            .arg("--")
            .arg(prog);
        c
    }

    /// The mount's `.stagefs/status`, read inside the namespace.
    pub fn status(&self) -> Option<serde_json::Value> {
        let out = self
            .command("cat")
            .arg(self.mnt.join(".stagefs/status"))
            .stderr(Stdio::null())
            .output()
            .ok()?;
        serde_json::from_slice(&out.stdout).ok()
    }

    pub fn wait_visible(&self, state: StateId) {
        let start = Instant::now();
        while self.status().and_then(|s| s["visible"].as_u64()) != Some(state.0) {
            assert!(
                start.elapsed() < Duration::from_secs(60),
                "did not reach {state}: {:?}\n{}",
                self.status(),
                self.proc.stderr()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Pins `table` (`db/table`, relative to the mount) at `state`.
    pub fn pin(&self, table: &str, state: StateId) {
        let out = self
            .command("python3")
            .args([
                "-c",
                "import os, sys; os.setxattr(sys.argv[1], 'user.stagefs.pin', sys.argv[2].encode())",
            ])
            .arg(self.mnt.join(table))
            .arg(state.to_string())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
