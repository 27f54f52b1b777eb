//! [`Launcher`]: a JVM launcher under `tests/java/` (the HDFS mini cluster,
//! the Hive metastore) driven over a line protocol: it prints one JSON
//! ready line, then answers one JSON line per command (words without
//! spaces) read from its stdin, and exits on `quit` or when its stdin
//! closes, so a test process that dies takes it along. `Drop` sends
//! `quit`, waits up to 30 s and kills it if it has not ended.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use serde_json::Value;

use super::log_tail;

pub struct Launcher {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Receiver<String>,
    /// The launcher's stderr (its log), for error messages.
    log: PathBuf,
    /// What the launcher is called in messages ("the HDFS launcher"), and
    /// how much of its log's end they show.
    name: &'static str,
    tail_bytes: usize,
}

/// `$JAVA_HOME/bin/java` when there is one, else `java` on PATH.
pub fn java() -> PathBuf {
    match std::env::var_os("JAVA_HOME") {
        Some(home) if Path::new(&home).join("bin/java").exists() => {
            Path::new(&home).join("bin/java")
        }
        _ => PathBuf::from("java"),
    }
}

/// A [`java()`] command with the launchers' common options: a small
/// heap, quick startup, IPv4, no `hsperfdata` file (`/tmp/hsperfdata_<user>/<pid>`
/// is shared by every JVM of the machine, and one in another pid
/// namespace with the same pid makes the JVM warn), and the JVM's own log
/// on stderr, never on stdout, which carries the line protocol.
pub fn jvm() -> Command {
    let mut cmd = Command::new(java());
    cmd.args([
        "-Xmx768m",
        "-XX:+UseSerialGC",
        "-XX:TieredStopAtLevel=1",
        "-XX:-UsePerfData",
        "-Xlog:all=warning:stderr",
        "-Djava.net.preferIPv4Stack=true",
    ]);
    cmd
}

impl Launcher {
    /// Starts `cmd` (a [`jvm()`] command line) with its stderr in `log`,
    /// and waits up to `start_timeout` for a ready line holding
    /// `"ready": true`, which it returns.
    pub fn start(
        mut cmd: Command,
        log: PathBuf,
        name: &'static str,
        tail_bytes: usize,
        start_timeout: Duration,
    ) -> Result<(Launcher, Value), String> {
        let log_file =
            std::fs::File::create(&log).map_err(|e| format!("creating {}: {e}", log.display()))?;
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(log_file))
            .spawn()
            .map_err(|e| {
                format!(
                    "starting {}: {e} (is Java 17 installed? scripts/setup-servers.sh)",
                    java().display()
                )
            })?;
        let stdin = child.stdin.take();
        let stdout = child.stdout.take().expect("piped stdout");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut launcher = Launcher {
            child,
            stdin,
            lines,
            log,
            name,
            tail_bytes,
        };
        let ready = launcher.next_reply(start_timeout, &format!("{name}'s ready line"))?;
        if ready["ready"] != Value::Bool(true) {
            return Err(format!(
                "{name} did not start: {ready}\n{}",
                launcher.log_tail()
            ));
        }
        Ok((launcher, ready))
    }

    pub fn log_tail(&self) -> String {
        format!(
            "{}'s log ({}):\n{}",
            self.name,
            self.log.display(),
            log_tail(&self.log, self.tail_bytes)
        )
    }

    /// The next protocol line (a JSON object) within `timeout`. Any other
    /// line on stdout (a library that prints there) is passed to stderr
    /// and skipped.
    fn next_reply(&mut self, timeout: Duration, what: &str) -> Result<Value, String> {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) if !line.starts_with('{') => {
                    eprintln!("{} (stdout, not the protocol): {line}", self.name);
                }
                other => return self.reply_of(other, timeout, what),
            }
        }
    }

    fn reply_of(
        &mut self,
        got: Result<String, RecvTimeoutError>,
        timeout: Duration,
        what: &str,
    ) -> Result<Value, String> {
        match got {
            Ok(line) => {
                serde_json::from_str(&line).map_err(|e| format!("{what}: not JSON ({e}): {line:?}"))
            }
            Err(RecvTimeoutError::Timeout) => Err(format!(
                "{what}: no answer in {timeout:?}\n{}",
                self.log_tail()
            )),
            Err(RecvTimeoutError::Disconnected) => {
                let status = self.child.wait().map(|s| s.to_string()).unwrap_or_default();
                Err(format!(
                    "{what}: the launcher exited ({status})\n{}",
                    self.log_tail()
                ))
            }
        }
    }

    /// Sends one command (words without spaces) and returns its reply, or
    /// the launcher's error (`{line}: {error}`).
    pub fn call(&mut self, words: &[&str], timeout: Duration) -> Result<Value, String> {
        if let Some(w) = words
            .iter()
            .find(|w| w.is_empty() || w.contains([' ', '\n', '\r']))
        {
            return Err(format!(
                "launcher arguments hold no spaces or newlines: {w:?}"
            ));
        }
        let line = words.join(" ");
        let stdin = self
            .stdin
            .as_mut()
            .ok_or("the launcher's stdin is closed")?;
        writeln!(stdin, "{line}")
            .and_then(|_| stdin.flush())
            .map_err(|e| format!("sending {line:?}: {e}\n{}", self.log_tail()))?;
        let reply = self.next_reply(timeout, &line)?;
        if reply["ok"] == Value::Bool(true) {
            Ok(reply)
        } else {
            Err(format!(
                "{line}: {}",
                reply["error"].as_str().unwrap_or("no error text")
            ))
        }
    }
}

impl Drop for Launcher {
    fn drop(&mut self) {
        if let Some(mut stdin) = self.stdin.take() {
            let _ = writeln!(stdin, "quit");
            // Dropping stdin closes it: the launcher exits on EOF too.
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            match self.child.try_wait() {
                Ok(Some(_)) => break,
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(50))
                }
                _ => {
                    let _ = self.child.kill();
                    let _ = self.child.wait();
                    break;
                }
            }
        }
    }
}
