//! Helpers shared by the benchmarks (`bench_mount`, `bench_hive_lag`,
//! `bench_readers`, `bench_bootstrap`): their `--name value` arguments,
//! reading the mount's visible state and percentiles of latency samples.
//! Not an example of its own (no main.rs).

use std::ffi::CString;

/// The value after `name` in `args` (`--name value`), if given.
pub fn arg<'a>(args: &'a [String], name: &str) -> Option<&'a str> {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .map(String::as_str)
}

/// `user.stagefs.visible` of the mount root, or 0 when unreadable.
pub fn visible(mnt: &CString, name: &CString) -> u64 {
    let mut buf = [0u8; 32];
    // SAFETY: valid NUL-terminated strings and a buffer of the given length.
    let n = unsafe {
        libc::getxattr(
            mnt.as_ptr(),
            name.as_ptr(),
            buf.as_mut_ptr().cast(),
            buf.len(),
        )
    };
    if n <= 0 {
        return 0;
    }
    std::str::from_utf8(&buf[..n as usize])
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0)
}

/// The `p`th percentile (nearest rank) of ascending `sorted`; NaN when empty.
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}
