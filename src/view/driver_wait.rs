//! A reader's *driver* waiting for its answer: the parent process blocked
//! reading a socket whose other end the reader holds (PySpark's Python
//! driver inside a py4j call to its JVM; any driver that talks to its
//! engine child over TCP).
//!
//! While one such wait lasts, the engine is inside the request its driver
//! made — one query, or one step of it — whether or not any of its
//! threads runs: a JVM asleep on its task scheduler's timers between two
//! waves of reads is inside the query. The view rule
//! ([`super::readers`]) takes a gap throughout which the *same* wait
//! lasted (the same thread, blocked in the same read of the same socket,
//! with no context switch in between) as no pause.
//!
//! Read from `/proc` only when a gap is sampled: the parent's threads'
//! `syscall` (the system call a blocked thread is in and its first
//! argument, the descriptor), the descriptor's socket inode, and — once
//! per socket, cached — whether its TCP peer (`/proc/<ppid>/net/tcp{,6}`)
//! is a socket the reader holds. Reading another process's `syscall`
//! needs the right to trace it (the daemon as root, or the same user
//! without Yama's restriction); where it cannot be read nothing is found
//! and gaps are judged as before.

use std::collections::HashMap;
use std::sync::Mutex;

/// One thread of the parent blocked reading from a socket connected to
/// the reader. Two samples with equal values saw one uninterrupted wait:
/// a thread that returned from the read and blocked again has switched
/// context at least once more.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DriverWait {
    pub tid: u32,
    /// Its voluntary and involuntary context switches, summed.
    pub switches: u64,
    /// The socket's inode.
    pub socket: u64,
}

/// The system calls that block reading one descriptor, their first
/// argument.
const READS: [libc::c_long; 4] = [
    libc::SYS_read,
    libc::SYS_readv,
    libc::SYS_recvfrom,
    libc::SYS_recvmsg,
];

/// Parent threads looked at, at most (a driver has a handful; the bound
/// only keeps a sample cheap for a parent with thousands).
const MAX_THREADS: usize = 64;

/// The wait of a thread of `ppid` blocked reading a TCP socket whose peer
/// `child` holds, if there is one.
pub fn driver_wait(ppid: u32, child: u32) -> Option<DriverWait> {
    let tasks = std::fs::read_dir(format!("/proc/{ppid}/task")).ok()?;
    for task in tasks.flatten().take(MAX_THREADS) {
        let Some(tid) = task.file_name().to_str().and_then(|t| t.parse().ok()) else {
            continue;
        };
        let Ok(syscall) = std::fs::read_to_string(format!("/proc/{ppid}/task/{tid}/syscall"))
        else {
            continue;
        };
        let Some(fd) = blocked_read_fd(&syscall) else {
            continue;
        };
        let Some(socket) = std::fs::read_link(format!("/proc/{ppid}/fd/{fd}"))
            .ok()
            .and_then(|l| socket_inode(l.to_str()?))
        else {
            continue;
        };
        if !peer_held_by(ppid, socket, child) {
            continue;
        }
        let Ok(status) = std::fs::read_to_string(format!("/proc/{ppid}/task/{tid}/status")) else {
            continue;
        };
        let switches = context_switches(&status)?;
        return Some(DriverWait {
            tid,
            switches,
            socket,
        });
    }
    None
}

/// The descriptor a thread is blocked reading, from its
/// `/proc/<pid>/task/<tid>/syscall` ("<nr> <arg0> …", arguments in hex;
/// "running" or "-1 …" when it is not in a system call).
fn blocked_read_fd(syscall: &str) -> Option<i32> {
    let mut f = syscall.split_whitespace();
    let nr: libc::c_long = f.next()?.parse().ok()?;
    if !READS.contains(&nr) {
        return None;
    }
    let arg0 = f.next()?.strip_prefix("0x")?;
    i32::try_from(u64::from_str_radix(arg0, 16).ok()?).ok()
}

/// The inode of a descriptor's link text "socket:[N]".
fn socket_inode(link: &str) -> Option<u64> {
    link.strip_prefix("socket:[")?
        .strip_suffix(']')?
        .parse()
        .ok()
}

/// `voluntary_ctxt_switches` + `nonvoluntary_ctxt_switches` of a
/// `status` file.
fn context_switches(status: &str) -> Option<u64> {
    let field = |name: &str| -> Option<u64> {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))?
            .trim()
            .parse()
            .ok()
    };
    Some(field("voluntary_ctxt_switches:")? + field("nonvoluntary_ctxt_switches:")?)
}

/// Answers of [`peer_held_by`], per (parent, child, socket inode): a
/// socket keeps its peer for its life, and a driver reuses its connection
/// for every call.
static PEERS: Mutex<Option<HashMap<PeerKey, bool>>> = Mutex::new(None);

/// (parent pid, child pid, socket inode).
type PeerKey = (u32, u32, u64);

/// Answers kept at most; past it the cache starts afresh.
const MAX_PEERS: usize = 4096;

/// Whether the TCP peer of `ppid`'s socket `inode` is a socket `child`
/// holds.
fn peer_held_by(ppid: u32, inode: u64, child: u32) -> bool {
    let key = (ppid, child, inode);
    if let Some(known) = PEERS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .as_ref()
        .and_then(|m| m.get(&key).copied())
    {
        return known;
    }
    let held = tcp_peer(ppid, inode).is_some_and(|peer| holds_socket(child, peer));
    let mut peers = PEERS.lock().unwrap_or_else(|e| e.into_inner());
    let map = peers.get_or_insert_with(HashMap::new);
    if map.len() >= MAX_PEERS {
        map.clear();
    }
    map.insert(key, held);
    held
}

/// The rows of `/proc/net/tcp` or `tcp6`: local and remote endpoint
/// ([`endpoint`]), inode.
fn tcp_rows(text: &str) -> impl Iterator<Item = (&str, &str, u64)> {
    text.lines().skip(1).filter_map(|line| {
        let f: Vec<&str> = line.split_whitespace().collect();
        let inode = f.get(9)?.parse().ok()?;
        Some((endpoint(f.get(1)?), endpoint(f.get(2)?), inode))
    })
}

/// An endpoint as the kernel writes it ("ADDR:PORT" in hex), an
/// IPv4-mapped IPv6 address written as its IPv4 one: a client connected
/// over IPv4 to a dual-stack listener (the JVM's py4j server) has its
/// end in `tcp` and the server's in `tcp6`.
fn endpoint(text: &str) -> &str {
    // ::ffff:a.b.c.d as four 32-bit words in the kernel's byte order.
    const MAPPED: &str = "0000000000000000FFFF0000";
    text.strip_prefix(MAPPED)
        .filter(|rest| rest.len() == 8 + 5)
        .unwrap_or(text)
}

/// The inode of the other end of `pid`'s TCP socket `inode`, when that
/// end is on this host (in `pid`'s network namespace).
fn tcp_peer(pid: u32, inode: u64) -> Option<u64> {
    let tables: Vec<String> = ["tcp", "tcp6"]
        .iter()
        .filter_map(|t| std::fs::read_to_string(format!("/proc/{pid}/net/{t}")).ok())
        .collect();
    peer_in(&tables, inode)
}

/// [`tcp_peer`] on the tables' text.
fn peer_in(tables: &[String], inode: u64) -> Option<u64> {
    let rows = || tables.iter().flat_map(|t| tcp_rows(t));
    let (local, remote, _) = rows().find(|r| r.2 == inode)?;
    rows()
        .find(|(l, r, i)| *l == remote && *r == local && *i != 0)
        .map(|r| r.2)
}

/// Whether one of `pid`'s descriptors is the socket `inode`.
fn holds_socket(pid: u32, inode: u64) -> bool {
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return false;
    };
    let want = format!("socket:[{inode}]");
    fds.flatten()
        .any(|fd| std::fs::read_link(fd.path()).is_ok_and(|l| l.as_os_str() == want.as_str()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::net::TcpListener;
    use std::time::{Duration, Instant};

    #[test]
    fn a_blocked_read_names_its_descriptor() {
        let nr = libc::SYS_recvfrom;
        assert_eq!(
            blocked_read_fd(&format!("{nr} 0x3c 0x7f00 0x2000 0x0")),
            Some(60)
        );
        let nanosleep = libc::SYS_clock_nanosleep;
        assert_eq!(blocked_read_fd(&format!("{nanosleep} 0x1 0x0")), None);
        assert_eq!(blocked_read_fd("running"), None);
        assert_eq!(blocked_read_fd("-1 0x7ffd 0x4a"), None);
        assert_eq!(blocked_read_fd(""), None);
        assert_eq!(socket_inode("socket:[2014924]"), Some(2014924));
        assert_eq!(socket_inode("pipe:[2014924]"), None);
        let status =
            "Name:\tpython3\nvoluntary_ctxt_switches:\t181\nnonvoluntary_ctxt_switches:\t7\n";
        assert_eq!(context_switches(status), Some(188));
        assert_eq!(context_switches("Name:\tx\n"), None);
    }

    #[test]
    fn the_peer_of_a_loopback_connection_is_found_in_the_table() {
        let table = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n\
            0: 0100007F:9C40 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 111 1 0 100 0 0 10 0\n\
            1: 0100007F:9C40 0100007F:D431 01 00000000:00000000 00:00000000 00000000     0        0 222 1 0 20 4 30 10 -1\n\
            2: 0100007F:D431 0100007F:9C40 01 00000000:00000000 00:00000000 00000000     0        0 333 1 0 20 4 30 10 -1\n";
        let table = [table.to_string()];
        assert_eq!(peer_in(&table, 333), Some(222));
        assert_eq!(peer_in(&table, 222), Some(333));
        assert_eq!(peer_in(&table, 111), None, "a listener has no peer");
        assert_eq!(peer_in(&table, 999), None);
        // PySpark: Python connected over IPv4 (its end in `tcp`) to the
        // JVM's dual-stack listener (the JVM's end in `tcp6`, mapped).
        let v4 = "  sl  local_address rem_address   st\n\
            2: 0100007F:9F8C 0100007F:AF03 01 00000000:00000000 00:00000000 00000000     0        0 2031891 1 0 21 4 21 18 -1\n";
        let v6 = "  sl  local_address rem_address   st\n\
            2: 0000000000000000FFFF00000100007F:AF03 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 2031888 1 0 100 0 0 10 0\n\
            25: 0000000000000000FFFF00000100007F:AF03 0000000000000000FFFF00000100007F:9F8C 01 00000000:00000000 00:00000000 00000000     0        0 2033315 1 0 20 4 20 18 -1\n";
        let both = [v4.to_string(), v6.to_string()];
        assert_eq!(peer_in(&both, 2031891), Some(2033315));
        assert_eq!(peer_in(&both, 2033315), Some(2031891));
        assert_eq!(
            endpoint("00000000000000000000000001000000:0016"),
            "00000000000000000000000001000000:0016"
        );
    }

    /// The real thing: a child process blocked reading a socket whose
    /// other end this process holds is seen (with the child as the
    /// "parent" and this process as the "child": the roles are only
    /// which pid is asked about), and one uninterrupted wait keeps its
    /// value while it lasts.
    #[test]
    fn a_process_blocked_reading_from_this_one_is_a_driver_waiting() {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().expect("addr").port();
        // A shell that connects, sends a line, then blocks reading the answer.
        let script = format!(
            "exec 3<>/dev/tcp/127.0.0.1/{port}; echo ask >&3; read -r answer <&3; echo \"$answer\""
        );
        let child = std::process::Command::new("bash")
            .arg("-c")
            .arg(&script)
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("bash");
        let (mut conn, _) = listener.accept().expect("accept");
        let mut buf = [0u8; 4];
        conn.read_exact(&mut buf).expect("the question");
        let me = std::process::id();
        let deadline = Instant::now() + Duration::from_secs(10);
        let seen = loop {
            if let Some(w) = driver_wait(child.id(), me) {
                break w;
            }
            assert!(Instant::now() < deadline, "the child's wait was never seen");
            std::thread::sleep(Duration::from_millis(10));
        };
        std::thread::sleep(Duration::from_millis(50));
        assert_eq!(
            driver_wait(child.id(), me),
            Some(seen),
            "one uninterrupted wait"
        );
        // Nobody else holds the other end: a third process is no driver's child.
        assert_eq!(driver_wait(child.id(), 1), None);
        conn.write_all(b"done\n").expect("answer");
        let out = child.wait_with_output().expect("bash");
        assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "done");
    }
}
