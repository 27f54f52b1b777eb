//! The head and state objects: one published state as a few lines of
//! text, optionally signed (ed25519).
//!
//! ```text
//! stagefs-head 1              (or: stagefs-state 1)
//! state 1234                  the state-id
//! root <64 hex>               its root catalog object (catalogs/<root>)
//! time_ms 1712345678901       source time of the state (i64::MIN: unknown)
//! publisher <32 hex>          the publisher that wrote it
//! published_ms 1712345679000  when it was published (the head's age)
//! sig <128 hex>               optional: signs every byte before this line
//! ```
//!
//! Every byte comes from storage, which is not trusted: [`decode`] takes
//! only this exact shape (field order, decimal and hex forms, a size
//! limit), so one state has one encoding and a signature covers it all.

use ed25519_dalek::{Signature, Signer, SigningKey, VerifyingKey};

use crate::event::{BlobId, StateId};

/// Larger head or state objects are refused unread.
pub const MAX_RECORD_BYTES: usize = 4096;

const VERSION: u32 = 1;

/// Which object a record is: the head, or `states/<id>`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecordKind {
    Head,
    State,
}

impl RecordKind {
    fn magic(self) -> &'static str {
        match self {
            RecordKind::Head => "stagefs-head",
            RecordKind::State => "stagefs-state",
        }
    }
}

/// A publisher's identity: 16 random bytes chosen when it first publishes,
/// kept in its state folder.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PublisherId(pub [u8; 16]);

impl PublisherId {
    pub fn to_hex(&self) -> String {
        hex(&self.0)
    }

    pub fn from_hex(s: &str) -> Option<PublisherId> {
        let mut out = [0u8; 16];
        unhex(s, &mut out).then_some(PublisherId(out))
    }
}

impl std::fmt::Display for PublisherId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.to_hex())
    }
}

/// One published state, as the head or a state object names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Published {
    pub state_id: StateId,
    /// The content id of the state's root catalog object.
    pub root: BlobId,
    pub time_ms: i64,
    pub publisher: PublisherId,
    pub published_ms: i64,
}

/// A decoded record and whether a trusted key verified it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decoded {
    pub published: Published,
    pub signed: bool,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RecordError {
    #[error("the object is {0} bytes, more than the {MAX_RECORD_BYTES} a head or state may have")]
    TooLarge(usize),
    #[error("not a stagefs {0} object: {1}")]
    Malformed(&'static str, String),
    #[error("written by a newer stagefs (format version {0}; this one reads {VERSION})")]
    Version(String),
    #[error("not signed, and a trusted key is required")]
    Unsigned,
    #[error("the signature does not verify with the trusted key")]
    BadSignature,
}

/// The bytes of `p` as a `kind` object, signed with `key` when given.
pub fn encode(kind: RecordKind, p: &Published, key: Option<&SigningKey>) -> Vec<u8> {
    let mut text = format!(
        "{} {VERSION}\nstate {}\nroot {}\ntime_ms {}\npublisher {}\npublished_ms {}\n",
        kind.magic(),
        p.state_id.0,
        p.root.to_hex(),
        p.time_ms,
        p.publisher.to_hex(),
        p.published_ms,
    );
    if let Some(key) = key {
        let sig = key.sign(text.as_bytes());
        text.push_str(&format!("sig {}\n", hex(&sig.to_bytes())));
    }
    text.into_bytes()
}

/// Decodes a `kind` object. With `trusted`, only a record whose signature
/// verifies with that key is accepted; without, a signature is ignored
/// (`signed` is then false).
pub fn decode(
    kind: RecordKind,
    bytes: &[u8],
    trusted: Option<&VerifyingKey>,
) -> Result<Decoded, RecordError> {
    let what = match kind {
        RecordKind::Head => "head",
        RecordKind::State => "state",
    };
    let bad = |m: &str| RecordError::Malformed(what, m.to_owned());
    if bytes.len() > MAX_RECORD_BYTES {
        return Err(RecordError::TooLarge(bytes.len()));
    }
    let text = std::str::from_utf8(bytes).map_err(|_| bad("not UTF-8"))?;
    if !text.ends_with('\n') {
        return Err(bad("no final newline"));
    }
    let lines: Vec<&str> = text[..text.len() - 1].split('\n').collect();
    let field = |i: usize, name: &str| -> Result<&str, RecordError> {
        let line = lines
            .get(i)
            .ok_or_else(|| bad(&format!("no `{name}` line")))?;
        line.strip_prefix(name)
            .and_then(|r| r.strip_prefix(' '))
            .ok_or_else(|| bad(&format!("line {} is not `{name} …`", i + 1)))
    };
    let version = field(0, kind.magic())?;
    if version != "1" {
        return match parse_u64(version) {
            Some(_) => Err(RecordError::Version(version.to_owned())),
            None => Err(bad("bad version")),
        };
    }
    let state_id = parse_u64(field(1, "state")?).ok_or_else(|| bad("bad state"))?;
    let root = BlobId::from_hex(field(2, "root")?)
        .filter(|_| field(2, "root").map(is_lower_hex).unwrap_or(false))
        .ok_or_else(|| bad("bad root"))?;
    let time_ms = parse_i64(field(3, "time_ms")?).ok_or_else(|| bad("bad time_ms"))?;
    let publisher = field(4, "publisher")?;
    let publisher = PublisherId::from_hex(publisher)
        .filter(|_| is_lower_hex(publisher))
        .ok_or_else(|| bad("bad publisher"))?;
    let published_ms =
        parse_i64(field(5, "published_ms")?).ok_or_else(|| bad("bad published_ms"))?;
    let signature = match lines.len() {
        6 => None,
        7 => {
            let s = field(6, "sig")?;
            let mut raw = [0u8; 64];
            if !unhex(s, &mut raw) {
                return Err(bad("bad sig"));
            }
            Some(Signature::from_bytes(&raw))
        }
        _ => return Err(bad("unexpected lines after the fields")),
    };
    let published = Published {
        state_id: StateId(state_id),
        root,
        time_ms,
        publisher,
        published_ms,
    };
    let signed = match (trusted, signature) {
        (None, _) => false,
        (Some(_), None) => return Err(RecordError::Unsigned),
        (Some(key), Some(sig)) => {
            // Everything before the `sig` line, as written.
            let signed_len: usize = lines[..6].iter().map(|l| l.len() + 1).sum();
            key.verify_strict(&bytes[..signed_len], &sig)
                .map_err(|_| RecordError::BadSignature)?;
            true
        }
    };
    Ok(Decoded { published, signed })
}

/// Decimal without sign or leading zeros (one spelling per number).
pub(crate) fn parse_u64(s: &str) -> Option<u64> {
    let canonical =
        !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) && (s == "0" || !s.starts_with('0'));
    canonical.then(|| s.parse().ok()).flatten()
}

pub(crate) fn parse_i64(s: &str) -> Option<i64> {
    match s.strip_prefix('-') {
        Some(rest) if rest != "0" => {
            let magnitude = parse_u64(rest)?;
            0i64.checked_sub_unsigned(magnitude)
        }
        Some(_) => None,
        None => parse_u64(s).and_then(|v| i64::try_from(v).ok()),
    }
}

fn is_lower_hex(s: &str) -> bool {
    s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Lower-case hex of exactly `out.len()` bytes into `out`.
pub(crate) fn unhex(s: &str, out: &mut [u8]) -> bool {
    if s.len() != out.len() * 2 || !is_lower_hex(s) {
        return false;
    }
    for (i, o) in out.iter_mut().enumerate() {
        match u8::from_str_radix(&s[2 * i..2 * i + 2], 16) {
            Ok(v) => *o = v,
            Err(_) => return false,
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Published {
        Published {
            state_id: StateId(42),
            root: BlobId([7; 32]),
            time_ms: i64::MIN,
            publisher: PublisherId([9; 16]),
            published_ms: 1_700_000_000_000,
        }
    }

    fn key(seed: u8) -> SigningKey {
        SigningKey::from_bytes(&[seed; 32])
    }

    #[test]
    fn head_and_state_round_trip_signed_and_unsigned() {
        for kind in [RecordKind::Head, RecordKind::State] {
            let bytes = encode(kind, &sample(), None);
            let d = decode(kind, &bytes, None).unwrap();
            assert_eq!((d.published, d.signed), (sample(), false));
            let k = key(1);
            let bytes = encode(kind, &sample(), Some(&k));
            let d = decode(kind, &bytes, Some(&k.verifying_key())).unwrap();
            assert_eq!((d.published, d.signed), (sample(), true));
            // A signature is ignored without a trusted key.
            assert!(!decode(kind, &bytes, None).unwrap().signed);
        }
    }

    #[test]
    fn a_trusted_key_refuses_unsigned_forged_and_altered_heads() {
        let k = key(1);
        let trusted = k.verifying_key();
        let unsigned = encode(RecordKind::Head, &sample(), None);
        assert_eq!(
            decode(RecordKind::Head, &unsigned, Some(&trusted)),
            Err(RecordError::Unsigned)
        );
        let forged = encode(RecordKind::Head, &sample(), Some(&key(2)));
        assert_eq!(
            decode(RecordKind::Head, &forged, Some(&trusted)),
            Err(RecordError::BadSignature)
        );
        let signed = encode(RecordKind::Head, &sample(), Some(&k));
        let altered = String::from_utf8(signed)
            .unwrap()
            .replace("state 42", "state 43");
        assert_eq!(
            decode(RecordKind::Head, altered.as_bytes(), Some(&trusted)),
            Err(RecordError::BadSignature)
        );
    }

    #[test]
    fn a_state_object_is_not_a_head() {
        let bytes = encode(RecordKind::State, &sample(), None);
        assert!(matches!(
            decode(RecordKind::Head, &bytes, None),
            Err(RecordError::Malformed(..))
        ));
    }

    #[test]
    fn hostile_records_are_refused_with_a_reason() {
        let good = String::from_utf8(encode(RecordKind::Head, &sample(), None)).unwrap();
        for bad in [
            good.replace("state 42", "state 042"),
            good.replace("state 42", "state -42"),
            good.replace("state 42", "state 99999999999999999999999"),
            good.replace("stagefs-head 1", "stagefs-head 01"),
            good.replace("root 07", "root 0G"),
            good.replace("root 07", "root 7"),
            good.replace("publisher 09", "publisher 0A"),
            good.replace("time_ms -9223372036854775808", "time_ms -0"),
            good.trim_end().to_owned(),
            format!("{good}extra\n"),
            good.replace('\n', "\r\n"),
            String::new(),
        ] {
            assert!(
                matches!(
                    decode(RecordKind::Head, bad.as_bytes(), None),
                    Err(RecordError::Malformed(..))
                ),
                "accepted {bad:?}"
            );
        }
        let newer = good.replace("stagefs-head 1", "stagefs-head 2");
        assert_eq!(
            decode(RecordKind::Head, newer.as_bytes(), None),
            Err(RecordError::Version("2".into()))
        );
        let huge = vec![b'a'; MAX_RECORD_BYTES + 1];
        assert_eq!(
            decode(RecordKind::Head, &huge, None),
            Err(RecordError::TooLarge(MAX_RECORD_BYTES + 1))
        );
    }

    #[test]
    fn extreme_times_round_trip() {
        for t in [i64::MIN, -1, 0, i64::MAX] {
            let p = Published {
                time_ms: t,
                published_ms: t,
                ..sample()
            };
            let bytes = encode(RecordKind::State, &p, None);
            assert_eq!(
                decode(RecordKind::State, &bytes, None).unwrap().published,
                p
            );
        }
    }
}
