//! [`FaultProxy`]: a TCP proxy on 127.0.0.1 in front of a test server,
//! for the fault tests. Its [`FaultMode`] can change while clients use it:
//!
//! - `Pass`: bytes flow both ways.
//! - `Refuse`: the listening socket is closed, so a connect is refused
//!   (an unreachable endpoint); open connections are reset.
//! - `ResetAfter`: the next connections pass `bytes` bytes from the server
//!   and are then reset (RST) both ways: a connection cut mid-file.
//! - `SlowDown`: the next requests are answered `503 SlowDown` with S3's
//!   XML error, without reaching the server (S3 throttling).
//! - `GarbageVersions`: every ListObjectVersions request (`GET
//!   /bucket?versions…`) is answered `200` with a body that is no listing;
//!   everything else passes. A connection whose first request lists
//!   versions gets the garbage for all its requests (stagefs sends those
//!   through a client of their own, apart from the GETs of objects).
//!
//! A change of mode closes idle connections (FIN), so a client's pooled
//! connection cannot bypass the new mode. `Drop` stops the proxy and resets
//! whatever is still open.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

/// Every connection or request from now on (for the counted modes).
pub const ALWAYS: u32 = u32::MAX;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultMode {
    Pass,
    Refuse,
    /// The next `connections` connections (or [`ALWAYS`]) are reset after
    /// `bytes` bytes from the server; then `Pass`.
    ResetAfter {
        bytes: u64,
        connections: u32,
    },
    /// The next `requests` requests (or [`ALWAYS`]) get `503 SlowDown`;
    /// then `Pass`.
    SlowDown {
        requests: u32,
    },
    /// ListObjectVersions answered `200` with `body`; the rest passes.
    GarbageVersions {
        body: &'static str,
    },
}

/// What the proxy did so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FaultStats {
    pub accepted: u64,
    pub passed: u64,
    pub reset: u64,
    pub slowed: u64,
    /// ListObjectVersions requests answered with garbage.
    pub garbled: u64,
}

struct Shared {
    upstream: SocketAddr,
    addr: SocketAddr,
    mode: Mutex<FaultMode>,
    listener: Mutex<Option<TcpListener>>,
    /// Open client connections (clones), to cut them on a mode change.
    conns: Mutex<Vec<(u64, TcpStream)>>,
    next_conn: AtomicU64,
    stop: AtomicBool,
    accepted: AtomicU64,
    passed: AtomicU64,
    reset: AtomicU64,
    slowed: AtomicU64,
    garbled: AtomicU64,
}

pub struct FaultProxy {
    shared: Arc<Shared>,
    accept: Option<JoinHandle<()>>,
}

const SLOW_DOWN_BODY: &str = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>SlowDown</Code><Message>Please reduce your request rate.</Message><RequestId>stagefs-fault-proxy</RequestId></Error>";

/// Aborts a TCP connection with RST, whoever else holds its descriptor:
/// on Linux `connect(AF_UNSPEC)` on a connected TCP socket disconnects it
/// (tcp_disconnect), which sends a reset.
fn reset(stream: &TcpStream) {
    use std::os::fd::AsRawFd;
    let addr = libc::sockaddr {
        sa_family: libc::AF_UNSPEC as libc::sa_family_t,
        sa_data: [0; 14],
    };
    unsafe {
        libc::connect(
            stream.as_raw_fd(),
            &addr,
            std::mem::size_of::<libc::sockaddr>() as libc::socklen_t,
        );
    }
}

impl FaultProxy {
    /// A proxy on a free port of 127.0.0.1 forwarding to `upstream`.
    pub fn start(upstream: SocketAddr) -> Result<FaultProxy, String> {
        let listener =
            TcpListener::bind("127.0.0.1:0").map_err(|e| format!("binding the proxy: {e}"))?;
        listener.set_nonblocking(true).map_err(|e| e.to_string())?;
        let addr = listener.local_addr().map_err(|e| e.to_string())?;
        let shared = Arc::new(Shared {
            upstream,
            addr,
            mode: Mutex::new(FaultMode::Pass),
            listener: Mutex::new(Some(listener)),
            conns: Mutex::new(Vec::new()),
            next_conn: AtomicU64::new(0),
            stop: AtomicBool::new(false),
            accepted: AtomicU64::new(0),
            passed: AtomicU64::new(0),
            reset: AtomicU64::new(0),
            slowed: AtomicU64::new(0),
            garbled: AtomicU64::new(0),
        });
        let accept = {
            let shared = Arc::clone(&shared);
            std::thread::spawn(move || accept_loop(shared))
        };
        Ok(FaultProxy {
            shared,
            accept: Some(accept),
        })
    }

    pub fn addr(&self) -> SocketAddr {
        self.shared.addr
    }

    /// `http://127.0.0.1:PORT` of the proxy.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.shared.addr)
    }

    pub fn mode(&self) -> FaultMode {
        *self.shared.mode.lock().unwrap()
    }

    pub fn stats(&self) -> FaultStats {
        let s = &self.shared;
        FaultStats {
            accepted: s.accepted.load(Ordering::SeqCst),
            passed: s.passed.load(Ordering::SeqCst),
            reset: s.reset.load(Ordering::SeqCst),
            slowed: s.slowed.load(Ordering::SeqCst),
            garbled: s.garbled.load(Ordering::SeqCst),
        }
    }

    /// Switches mode; takes effect for every connection made after it
    /// returns (open ones are closed: reset for `Refuse`, FIN otherwise).
    pub fn set_mode(&self, mode: FaultMode) -> Result<(), String> {
        let s = &self.shared;
        let mut listener = s.listener.lock().unwrap();
        *s.mode.lock().unwrap() = mode;
        match (mode, listener.is_some()) {
            (FaultMode::Refuse, true) => *listener = None,
            (FaultMode::Refuse, false) => {}
            (_, true) => {}
            (_, false) => {
                // The same port again; SO_REUSEADDR (std's default on Unix)
                // lets it bind while old connections linger in TIME_WAIT.
                let mut bound = None;
                for _ in 0..100 {
                    match TcpListener::bind(s.addr) {
                        Ok(l) => {
                            bound = Some(l);
                            break;
                        }
                        Err(_) => std::thread::sleep(Duration::from_millis(20)),
                    }
                }
                let l = bound.ok_or_else(|| format!("rebinding the proxy on {}", s.addr))?;
                l.set_nonblocking(true).map_err(|e| e.to_string())?;
                *listener = Some(l);
            }
        }
        let conns = std::mem::take(&mut *s.conns.lock().unwrap());
        for (_, c) in conns {
            if mode == FaultMode::Refuse {
                reset(&c);
            } else {
                let _ = c.shutdown(Shutdown::Both);
            }
        }
        Ok(())
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.accept.take() {
            let _ = t.join();
        }
        *self.shared.listener.lock().unwrap() = None;
        for (_, c) in std::mem::take(&mut *self.shared.conns.lock().unwrap()) {
            reset(&c);
        }
    }
}

fn accept_loop(shared: Arc<Shared>) {
    while !shared.stop.load(Ordering::SeqCst) {
        let accepted = {
            let listener = shared.listener.lock().unwrap();
            match listener.as_ref() {
                Some(l) => l.accept().ok(),
                None => None,
            }
        };
        let Some((client, _)) = accepted else {
            std::thread::sleep(Duration::from_millis(5));
            continue;
        };
        shared.accepted.fetch_add(1, Ordering::SeqCst);
        let _ = client.set_nonblocking(false);
        let _ = client.set_nodelay(true);
        // This connection's fault, taken from the mode (and counted down).
        let fault = {
            let mut mode = shared.mode.lock().unwrap();
            let now = *mode;
            match &mut *mode {
                FaultMode::ResetAfter { connections: n, .. }
                | FaultMode::SlowDown { requests: n } => {
                    if *n != ALWAYS {
                        *n -= 1;
                        if *n == 0 {
                            *mode = FaultMode::Pass;
                        }
                    }
                }
                FaultMode::Pass | FaultMode::Refuse | FaultMode::GarbageVersions { .. } => {}
            }
            now
        };
        let id = shared.next_conn.fetch_add(1, Ordering::SeqCst);
        if let Ok(clone) = client.try_clone() {
            shared.conns.lock().unwrap().push((id, clone));
        }
        let shared = Arc::clone(&shared);
        std::thread::spawn(move || {
            match fault {
                FaultMode::SlowDown { .. } => {
                    shared.slowed.fetch_add(1, Ordering::SeqCst);
                    answer_slow_down(client);
                }
                FaultMode::ResetAfter { bytes, .. } => {
                    forward(&shared, client, Some(bytes), &[]);
                }
                FaultMode::GarbageVersions { body } => garble_versions(&shared, client, body),
                // Refuse: accepted just before the listener closed.
                FaultMode::Refuse => reset(&client),
                FaultMode::Pass => {
                    shared.passed.fetch_add(1, Ordering::SeqCst);
                    forward(&shared, client, None, &[]);
                }
            }
            shared.conns.lock().unwrap().retain(|(i, _)| *i != id);
        });
    }
}

/// Reads one request's head into `buf` (which may hold bytes already
/// read); returns where the head ends and its Content-Length, or None at
/// the end of the connection.
fn read_head(client: &mut TcpStream, buf: &mut Vec<u8>) -> Option<(usize, usize)> {
    let mut chunk = [0u8; 8192];
    let head_end = loop {
        if let Some(p) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break p + 4;
        }
        match client.read(&mut chunk) {
            Ok(0) | Err(_) => return None,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).to_ascii_lowercase();
    let length: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    Some((head_end, length))
}

/// Answers ListObjectVersions with `body` on a connection that starts
/// with one (every request on it, until the client closes); forwards any
/// other connection untouched.
fn garble_versions(shared: &Shared, mut client: TcpStream, body: &str) {
    let _ = client.set_read_timeout(Some(Duration::from_secs(30)));
    let mut buf = Vec::new();
    let Some((head_end, _)) = read_head(&mut client, &mut buf) else {
        return;
    };
    let line = String::from_utf8_lossy(&buf[..head_end]);
    let request_line = line.lines().next().unwrap_or("");
    if !request_line.contains("?versions") {
        shared.passed.fetch_add(1, Ordering::SeqCst);
        forward(shared, client, None, &buf);
        return;
    }
    loop {
        let Some((head_end, length)) = read_head(&mut client, &mut buf) else {
            return;
        };
        // A GET has no body; drop what belongs to this request.
        buf.drain(..(head_end + length).min(buf.len()));
        shared.garbled.fetch_add(1, Ordering::SeqCst);
        let answer = format!(
            "HTTP/1.1 200 OK\r\ncontent-type: application/xml\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        );
        if client.write_all(answer.as_bytes()).is_err() {
            return;
        }
    }
}

/// Reads one request (head and Content-Length body) and answers 503.
fn answer_slow_down(mut client: TcpStream) {
    let _ = client.set_read_timeout(Some(Duration::from_secs(10)));
    let mut buf = Vec::new();
    let mut chunk = [0u8; 8192];
    let Some((head_end, length)) = read_head(&mut client, &mut buf) else {
        return;
    };
    // Read the whole body: closing with unread bytes would send a reset.
    let mut have = buf.len() - head_end;
    while have < length {
        match client.read(&mut chunk) {
            Ok(0) | Err(_) => break,
            Ok(n) => have += n,
        }
    }
    let answer = format!(
        "HTTP/1.1 503 Slow Down\r\ncontent-type: application/xml\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{SLOW_DOWN_BODY}",
        SLOW_DOWN_BODY.len()
    );
    let _ = client.write_all(answer.as_bytes());
    let _ = client.shutdown(Shutdown::Write);
    // Wait for the client to close, so our close sends no reset.
    let _ = client.read(&mut chunk);
}

/// Copies both ways (`first`: bytes the client sent that were already
/// read); with `reset_after`, resets both connections once that many
/// bytes went from the server to the client.
fn forward(shared: &Shared, client: TcpStream, reset_after: Option<u64>, first: &[u8]) {
    let mut upstream = match TcpStream::connect_timeout(&shared.upstream, Duration::from_secs(5)) {
        Ok(u) => u,
        Err(_) => {
            reset(&client);
            return;
        }
    };
    let _ = client.set_read_timeout(None);
    if !first.is_empty() && upstream.write_all(first).is_err() {
        reset(&client);
        return;
    }
    let _ = upstream.set_nodelay(true);
    let (Ok(client_r), Ok(upstream_w)) = (client.try_clone(), upstream.try_clone()) else {
        reset(&client);
        return;
    };
    // Client → server in its own thread.
    let up = std::thread::spawn(move || {
        let mut from = client_r;
        let mut to = upstream_w;
        let _ = std::io::copy(&mut from, &mut to);
        let _ = to.shutdown(Shutdown::Write);
    });
    // Server → client here, counting.
    let mut from = upstream;
    let mut to = client;
    let mut sent: u64 = 0;
    let mut buf = [0u8; 16 * 1024];
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        let allowed = match reset_after {
            Some(limit) => (limit.saturating_sub(sent)).min(n as u64) as usize,
            None => n,
        };
        if to.write_all(&buf[..allowed]).is_err() {
            break;
        }
        sent += allowed as u64;
        if let Some(limit) = reset_after {
            if sent >= limit {
                shared.reset.fetch_add(1, Ordering::SeqCst);
                reset(&to);
                reset(&from);
                let _ = up.join();
                return;
            }
        }
    }
    let _ = to.shutdown(Shutdown::Write);
    let _ = up.join();
}
