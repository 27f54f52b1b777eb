//! What a copy is checked with: its size and sha256 (the blob's name, and
//! for a native file the expected content), and the checksum a source's
//! files carry beyond that ([`StreamCheck`], made by the source's
//! [`SourceChecks`]: the Hive source's HDFS file checksum), fed the same
//! bytes in the same pass. The copy engines (`copy_verified`) hash with
//! [`Hashing`] and compare what the file asks for.

use std::time::Duration;

use sha2::{Digest, Sha256};

use crate::event::{BlobId, Verify};
use crate::source_file::SourceFile;

/// A checksum other than sha256 that a file is checked with, fed the same
/// bytes in the same pass (Hive's HDFS file checksum).
pub trait StreamCheck: Send {
    fn update(&mut self, bytes: &[u8]);
    /// `Ok` when the bytes fed match; else what was found, and maybe
    /// another check to feed the same bytes before giving up.
    fn verify(self: Box<Self>) -> Result<(), CheckFailed>;
}

/// A [`StreamCheck`] that did not match.
pub struct CheckFailed {
    /// What was found (the whole story when `again` is `None`).
    pub problem: String,
    /// A further check of the same bytes that may still match (the HDFS
    /// checksum's other CRC type, needed only for old clusters): the stager
    /// feeds it the stored copy, never the source, which may have changed.
    pub again: Option<Box<dyn StreamCheck>>,
}

/// Makes the check a file's [`Verify`] asks for beyond size and sha256
/// (which the store checks itself), for the source that knows what it
/// means: the Hive source's HDFS file checksum
/// (`source::hive::checksum::HdfsChecks`). Handed to the store with
/// [`BlobStore::with_checks`](super::BlobStore::with_checks) by whoever
/// wires the pipeline.
pub trait SourceChecks: Send + Sync + std::fmt::Debug {
    /// The check for `verify`, ready to be fed; `Ok(None)` when there is
    /// none beyond sha256; `Err` when the expected value cannot be a
    /// checksum of its kind (or this source knows no such kind).
    fn stream_check(&self, verify: &Verify) -> Result<Option<Box<dyn StreamCheck>>, String>;
}

/// The store's [`SourceChecks`] until it is given others: none.
#[derive(Debug)]
pub(super) struct NoSourceChecks;

impl SourceChecks for NoSourceChecks {
    fn stream_check(&self, verify: &Verify) -> Result<Option<Box<dyn StreamCheck>>, String> {
        Err(format!(
            "no check for {} checksums is configured",
            verify.label()
        ))
    }
}

/// The checksum `verify` asks for beyond sha256, ready to be fed; `Err`
/// when the expected value cannot be a checksum of that kind.
pub(super) fn stream_check(
    checks: &dyn SourceChecks,
    verify: &Verify,
) -> Result<Option<Box<dyn StreamCheck>>, String> {
    match verify {
        Verify::Sha256 { .. }
        | Verify::S3Etag { .. }
        | Verify::NotNewerThanEvent { .. }
        | Verify::None => Ok(None),
        Verify::Unproven { reason } => Err(reason.clone()),
        Verify::Hdfs { .. } => checks.stream_check(verify),
    }
}

/// How much later than its event a file without a checksum may have been
/// modified and still count as "not newer than its event" (SPEC §2,
/// `--event-time-margin`): Hive records `EVENT_TIME` in whole seconds,
/// truncated, after the files are written, and the metastore's clock is
/// not the file system's. [`EventTimeMargin::DEFAULT`] unless given; never
/// above [`EventTimeMargin::MAX`] (a wider margin would let a rewrite made
/// just after the event pass for the file the event names).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EventTimeMargin(Duration);

impl EventTimeMargin {
    pub const DEFAULT: EventTimeMargin = EventTimeMargin(Duration::from_secs(1));
    pub const MAX: EventTimeMargin = EventTimeMargin(Duration::from_secs(5));

    /// `margin`, refused above [`EventTimeMargin::MAX`].
    pub fn new(margin: Duration) -> Result<EventTimeMargin, String> {
        if margin > EventTimeMargin::MAX.0 {
            return Err(format!(
                "an event-time margin of {} is above the limit of {}",
                EventTimeMargin(margin),
                EventTimeMargin::MAX
            ));
        }
        Ok(EventTimeMargin(margin))
    }

    /// `--event-time-margin`: `1s`, `2500ms`, `1.5s`, `0s` (a unit is
    /// required; at most millisecond precision); negative, garbage or
    /// above [`EventTimeMargin::MAX`] is refused with the reason.
    pub fn parse(text: &str) -> Result<EventTimeMargin, String> {
        let s = text.trim();
        let bad = || {
            format!(
                "{text:?} is not an event-time margin (a duration such as 1s, 2500ms or 1.5s, from 0 to {})",
                EventTimeMargin::MAX
            )
        };
        if s.starts_with('-') {
            return Err(format!(
                "{text:?}: an event-time margin cannot be negative (0 to {})",
                EventTimeMargin::MAX
            ));
        }
        let (number, unit_ms) = if let Some(n) = s.strip_suffix("ms") {
            (n, 1u64)
        } else if let Some(n) = s.strip_suffix('s') {
            (n, 1_000)
        } else {
            return Err(bad());
        };
        let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
        let digits = |d: &str| d.bytes().all(|b| b.is_ascii_digit());
        if whole.is_empty() || !digits(whole) || !digits(fraction) || number.ends_with('.') {
            return Err(bad());
        }
        // Past the limit in any unit: refused without overflowing.
        let whole: u64 = whole.parse().unwrap_or(u64::MAX);
        let mut ms = whole.saturating_mul(unit_ms);
        if !fraction.is_empty() {
            // Fractions of a second down to the millisecond.
            if unit_ms != 1_000 || fraction.len() > 3 {
                return Err(bad());
            }
            let padded = format!("{fraction:0<3}");
            ms = ms.saturating_add(padded.parse::<u64>().map_err(|_| bad())?);
        }
        EventTimeMargin::new(Duration::from_millis(ms))
    }

    pub fn as_millis(self) -> i64 {
        self.0.as_millis() as i64
    }

    pub fn as_duration(self) -> Duration {
        self.0
    }
}

impl Default for EventTimeMargin {
    fn default() -> EventTimeMargin {
        EventTimeMargin::DEFAULT
    }
}

/// `1s`, `2500ms`: as `--event-time-margin` takes it.
impl std::fmt::Display for EventTimeMargin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ms = self.0.as_millis();
        if ms % 1_000 == 0 {
            write!(f, "{}s", ms / 1_000)
        } else {
            write!(f, "{ms}ms")
        }
    }
}

/// Why "not newer than its event" cannot vouch for the version opened:
/// the file carries no checksum and was modified after its event's time
/// plus the margin (a later version), or its event has no time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Newer {
    /// Modified after the limit: an older version may still be the one
    /// the event named (in a bucket that keeps versions).
    Than { limit_ms: i64, problem: String },
    /// Some other reason, final.
    Other(String),
}

/// The checks of what the source says about the version opened, made
/// before a byte is copied (the version is pinned for the whole read):
/// the S3 ETag a file's URI records, or "not newer than its event" (with
/// `margin`) for a file without a checksum read where it is. `Err` says
/// why this copy cannot stand for the file.
pub(super) fn check_version(
    verify: &Verify,
    src: &dyn SourceFile,
    margin: EventTimeMargin,
) -> Result<(), Newer> {
    match verify {
        Verify::S3Etag { checksum } => {
            let recorded = etag_of_checksum(checksum).map_err(Newer::Other)?;
            match src.etag() {
                Some(etag) if etag == recorded => Ok(()),
                Some(etag) => Err(Newer::Other(format!(
                    "ETag {etag}, but its event records {recorded}: another version"
                ))),
                None => Err(Newer::Other(format!(
                    "an S3 ETag checksum ({recorded}) is checked against the object read from S3; this copy has no ETag"
                ))),
            }
        }
        Verify::NotNewerThanEvent { time_ms } => {
            let Some(time_ms) = *time_ms else {
                return Err(Newer::Other(
                    "no checksum, and its event has no time to check the file against".into(),
                ));
            };
            let modified_ms = src.identity().mtime_ns.div_euclid(1_000_000);
            let limit_ms = time_ms.saturating_add(margin.as_millis());
            if modified_ms <= limit_ms {
                Ok(())
            } else {
                Err(Newer::Than {
                    limit_ms,
                    problem: format!(
                        "no checksum, and modified at {modified_ms} ms since the epoch, {} ms after its event (at {time_ms}; {} ms allowed by --event-time-margin {margin}): a later version",
                        modified_ms - time_ms,
                        margin.as_millis()
                    ),
                })
            }
        }
        Verify::Unproven { reason } => Err(Newer::Other(reason.clone())),
        Verify::Sha256 { .. } | Verify::Hdfs { .. } | Verify::None => Ok(()),
    }
}

/// The ETag (without quotes) an S3 ETag checksum stands for: the
/// checksum is the hex of the ETag's text, with quotes (Hadoop 3.4) or
/// without (3.3).
pub fn etag_of_checksum(checksum: &str) -> Result<String, String> {
    let bad = || format!("S3 ETag checksum {checksum:?} is not the hex of an ETag");
    if checksum.len() % 2 != 0 || checksum.is_empty() {
        return Err(bad());
    }
    let bytes: Vec<u8> = (0..checksum.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(checksum.get(i..i + 2).unwrap_or("zz"), 16))
        .collect::<Result<_, _>>()
        .map_err(|_| bad())?;
    let text = String::from_utf8(bytes).map_err(|_| bad())?;
    let etag = crate::source_file::s3::bare_etag(&text);
    if etag.is_empty() || etag.chars().any(|c| c.is_control() || c == '"') {
        return Err(bad());
    }
    Ok(etag.to_owned())
}

/// The hashes computed while copying: sha256 always (the blob's name),
/// and the file's own checksum when it has one.
pub(super) struct Hashing {
    pub(super) sha: Sha256,
    pub(super) check: Option<Box<dyn StreamCheck>>,
}

impl Hashing {
    pub(super) fn update(&mut self, bytes: &[u8]) {
        self.sha.update(bytes);
        if let Some(check) = self.check.as_mut() {
            check.update(bytes);
        }
    }

    pub(super) fn finish(self) -> Digests {
        (BlobId(self.sha.finalize().into()), self.check)
    }
}

/// The sha256 of the bytes copied, and the checksum still to be compared.
pub(super) type Digests = (BlobId, Option<Box<dyn StreamCheck>>);

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::stage::testing::*;
    use crate::stage::StageError;

    #[test]
    fn a_check_the_store_was_not_given_makes_the_copy_unusable_with_the_reason() {
        let fx = fixture();
        put(&fx.src, "t/000000_0", b"hive bytes");
        let f = hive_ref(
            &fx.src,
            "t/000000_0",
            Verify::Hdfs {
                checksum: "00".into(),
            },
        );
        let err = store(&fx).fetch(&f, Path::new(""), None).unwrap_err();
        let StageError::Unavailable { detail, .. } = &err else {
            panic!("{err:?}")
        };
        assert!(
            detail.contains("no check for hdfs-md5md5crc32c checksums is configured"),
            "{detail}"
        );
        assert_eq!(temp_count(&fx.state), 0);
    }

    #[test]
    fn s3_etag_checksums_decode_quoted_or_not_and_garbage_is_named() {
        let hex = |s: &str| s.bytes().map(|b| format!("{b:02x}")).collect::<String>();
        let etag = "9b2cf535f27731c974343645a3985328";
        assert_eq!(
            etag_of_checksum(&hex(&format!("\"{etag}\""))).unwrap(),
            etag
        );
        assert_eq!(etag_of_checksum(&hex(etag)).unwrap(), etag);
        assert_eq!(etag_of_checksum(&hex("\"abc-12\"")).unwrap(), "abc-12");
        for bad in ["", "0", "zz", "ff", &hex("\"\""), &hex("a\nb")] {
            let err = etag_of_checksum(bad).unwrap_err();
            assert!(err.contains("not the hex of an ETag"), "{bad}: {err}");
        }
    }

    #[test]
    fn a_file_without_checksum_read_where_it_is_must_not_be_newer_than_its_event() {
        let fx = fixture();
        put(&fx.src, "t/000000_0", b"written now");
        let now_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as i64;
        let at = |time_ms| hive_ref(&fx.src, "t/000000_0", Verify::NotNewerThanEvent { time_ms });
        // An event after the write (and one within the margin before it).
        for time_ms in [
            now_ms + 60_000,
            now_ms - EventTimeMargin::DEFAULT.as_millis() / 2,
        ] {
            let fetched = store(&fx).fetch_unsynced(&at(Some(time_ms)), Path::new(""), None);
            assert!(fetched.is_ok(), "{time_ms}: {:?}", fetched.err());
        }
        // An event an hour before the write: a later version, refused.
        let err = store(&fx)
            .fetch_unsynced(&at(Some(now_ms - 3_600_000)), Path::new(""), None)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("after its event") && err.contains("000000_0"),
            "{err}"
        );
        // No event time: never accepted this way.
        let err = store(&fx)
            .fetch_unsynced(&at(None), Path::new(""), None)
            .unwrap_err()
            .to_string();
        assert!(err.contains("its event has no time"), "{err}");
        assert_eq!(temp_count(&fx.state), 0);
    }

    #[test]
    fn the_event_time_margin_parses_durations_up_to_five_seconds_and_refuses_the_rest() {
        let ms = |s: &str| EventTimeMargin::parse(s).map(|m| m.as_millis());
        assert_eq!(ms("1s"), Ok(1_000));
        assert_eq!(ms("2500ms"), Ok(2_500));
        assert_eq!(ms("2.5s"), Ok(2_500));
        assert_eq!(ms("0.25s"), Ok(250));
        assert_eq!(ms("0s"), Ok(0));
        assert_eq!(ms("0ms"), Ok(0));
        assert_eq!(ms("5s"), Ok(5_000));
        assert_eq!(ms("5000ms"), Ok(5_000));
        assert_eq!(ms(" 3s "), Ok(3_000));
        assert_eq!(EventTimeMargin::default(), EventTimeMargin::DEFAULT);
        assert_eq!(EventTimeMargin::DEFAULT.as_millis(), 1_000);
        for above in [
            "5001ms",
            "6s",
            "5.001s",
            "99999999999999999999s",
            "18446744073709551615ms",
        ] {
            let err = EventTimeMargin::parse(above).unwrap_err();
            assert!(err.contains("above the limit of 5s"), "{above}: {err}");
        }
        let err = EventTimeMargin::parse("-1s").unwrap_err();
        assert!(
            err.contains("cannot be negative") && err.contains("5s"),
            "{err}"
        );
        for garbage in [
            "", "s", "1", "1.s", ".5s", "1.2345s", "1.5ms", "1m", "1 s", "x1s", "1e3ms", "+1s",
        ] {
            let err = EventTimeMargin::parse(garbage).unwrap_err();
            assert!(
                err.contains("is not an event-time margin") && err.contains("5s"),
                "{garbage:?}: {err}"
            );
        }
        assert_eq!(
            EventTimeMargin::parse("2500ms").unwrap().to_string(),
            "2500ms"
        );
        assert_eq!(EventTimeMargin::parse("3s").unwrap().to_string(), "3s");
        assert!(EventTimeMargin::new(Duration::from_millis(5_001)).is_err());
    }

    #[test]
    fn a_wider_margin_accepts_a_file_modified_just_after_its_event() {
        let fx = fixture();
        put(&fx.src, "t/000000_0", b"written now");
        let now_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as i64;
        // The event 2.5 s before the write: too late for 1 s, fine for 3 s.
        let f = hive_ref(
            &fx.src,
            "t/000000_0",
            Verify::NotNewerThanEvent {
                time_ms: Some(now_ms - 2_500),
            },
        );
        let err = store(&fx)
            .fetch_unsynced(&f, Path::new(""), None)
            .unwrap_err()
            .to_string();
        assert!(err.contains("--event-time-margin 1s"), "{err}");
        let wide = store(&fx).with_event_time_margin(EventTimeMargin::parse("3s").unwrap());
        let fetched = wide.fetch_unsynced(&f, Path::new(""), None);
        assert!(fetched.is_ok(), "{:?}", fetched.err());
    }

    #[test]
    fn an_s3_etag_checksum_cannot_be_met_by_a_copy_without_an_etag() {
        let fx = fixture();
        put(&fx.src, "t/000000_0", b"mapped copy");
        let checksum = "226162632d3122".to_owned(); // "\"abc-1\""
        let f = hive_ref(&fx.src, "t/000000_0", Verify::S3Etag { checksum });
        let err = store(&fx)
            .fetch(&f, Path::new(""), None)
            .unwrap_err()
            .to_string();
        assert!(err.contains("this copy has no ETag"), "{err}");
    }
}
