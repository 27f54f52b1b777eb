//! File URIs and partition names as Hive writes them.
//!
//! - [`FileUri::parse`]: one encoded file URI `path#checksum#cmroot#subdir`
//!   (`ReplChangeManager.encodeFileUri`). Hive decodes with Java's
//!   `String.split("#")`, which drops trailing empty parts, so `path###`,
//!   `path#ck#cm#` and a bare `path` are all valid; an empty part is None.
//! - [`split_files`]: `WNL_FILES`, encoded URIs joined by `]`.
//! - Partition names `k1=v1/k2=v2` with Hive's path escaping
//!   (`FileUtils.escapePathName`, here [`escape_path_name`] from `event`, and
//!   its inverse [`unescape_path_name`]); `__HIVE_DEFAULT_PARTITION__` is a
//!   value like any other and stays as written.
//!
//! Nothing here maps URIs to local paths (that is the adapter's
//! `--source-map`) or does I/O. Called by `message` and the adapter.

use super::model::FileUri;
pub use crate::event::escape_path_name;

/// The value Hive writes for a NULL or empty partition value.
pub const DEFAULT_PARTITION_NAME: &str = "__HIVE_DEFAULT_PARTITION__";

/// What is wrong with a file URI or a partition name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UriError {
    #[error("empty file URI")]
    EmptyUri,
    #[error("file URI {uri:?} has no path before '#'")]
    NoPath { uri: String },
    #[error(
        "file URI {uri:?} has {parts} '#'-separated parts; at most 4 (path#checksum#cmroot#subdir)"
    )]
    TooManyParts { uri: String, parts: usize },
    #[error("file URI {uri:?}: checksum {checksum:?} is not hex")]
    BadChecksum { uri: String, checksum: String },
    #[error("partition name {name:?}: {reason}")]
    BadPartitionName { name: String, reason: String },
}

impl FileUri {
    /// Splits one encoded URI. The checksum is validated as hex and
    /// lower-cased (Hive writes it lower-case; its length is checked where
    /// it is used, by `checksum`).
    pub fn parse(encoded: &str) -> Result<FileUri, UriError> {
        if encoded.is_empty() {
            return Err(UriError::EmptyUri);
        }
        let mut parts: Vec<&str> = encoded.split('#').collect();
        // As Java's split: trailing empty strings are removed.
        while parts.len() > 1 && parts.last() == Some(&"") {
            parts.pop();
        }
        if parts.len() > 4 {
            return Err(UriError::TooManyParts {
                uri: encoded.to_string(),
                parts: parts.len(),
            });
        }
        let path = parts[0];
        if path.is_empty() {
            return Err(UriError::NoPath {
                uri: encoded.to_string(),
            });
        }
        let part = |i: usize| {
            parts
                .get(i)
                .filter(|p| !p.is_empty())
                .map(|p| p.to_string())
        };
        let checksum = match part(1) {
            Some(c) if c.bytes().all(|b| b.is_ascii_hexdigit()) => Some(c.to_ascii_lowercase()),
            Some(c) => {
                return Err(UriError::BadChecksum {
                    uri: encoded.to_string(),
                    checksum: c,
                })
            }
            None => None,
        };
        Ok(FileUri {
            path: path.to_string(),
            checksum,
            cm_root: part(2),
            subdir: part(3),
        })
    }

    /// The last path component of [`FileUri::path`] (the file's name).
    pub fn file_name(&self) -> &str {
        let p = self.path.trim_end_matches('/');
        p.rsplit('/').next().unwrap_or(p)
    }

    /// Where change management keeps this file: `<cmroot>/<name>_<checksum>`
    /// ([`cm_file_name`]), when the URI carries both.
    pub fn cm_path(&self) -> Option<String> {
        match (&self.cm_root, &self.checksum) {
            (Some(root), Some(ck)) => Some(format!(
                "{}/{}",
                root.trim_end_matches('/'),
                cm_file_name(self.file_name(), ck)
            )),
            _ => None,
        }
    }
}

/// HDFS's default limit on a path component (`dfs.namenode.fs-limits.max-component-length`).
const HDFS_MAX_COMPONENT_LENGTH: usize = 255;

/// The name change management gives a copy of file `name` with `checksum`
/// (`ReplChangeManager.getCMPath`): `<name>_<checksum>`, cut to 254
/// characters (UTF-16 units, as Java counts) when it is longer than HDFS's
/// 255-character limit on a path component.
pub fn cm_file_name(name: &str, checksum: &str) -> String {
    let full = format!("{name}_{checksum}");
    if full.encode_utf16().count() <= HDFS_MAX_COMPONENT_LENGTH {
        return full;
    }
    let mut units = 0;
    full.chars()
        .take_while(|c| {
            units += c.len_utf16();
            units < HDFS_MAX_COMPONENT_LENGTH
        })
        .collect()
}

/// `WNL_FILES`: encoded URIs joined by `]` (empty pieces are skipped).
pub fn split_files(joined: &str) -> Result<Vec<FileUri>, UriError> {
    joined
        .split(']')
        .filter(|s| !s.is_empty())
        .map(FileUri::parse)
        .collect()
}

/// Inverse of [`escape_path_name`], as Hive's `FileUtils.unescapePathName`:
/// `%XX` (either case of hex) becomes the character with that code
/// (0–255); a `%` not followed by two hex digits stays as is.
pub fn unescape_path_name(escaped: &str) -> String {
    let bytes = escaped.as_bytes();
    let mut out = String::with_capacity(escaped.len());
    let mut rest = escaped;
    let mut i = 0;
    while let Some(off) = rest.find('%') {
        out.push_str(&rest[..off]);
        i += off;
        let hex = bytes.get(i + 1..i + 3);
        match hex.and_then(|h| std::str::from_utf8(h).ok()) {
            Some(h) if h.bytes().all(|b| b.is_ascii_hexdigit()) => {
                // Two hex digits always fit in a u8.
                let code = u8::from_str_radix(h, 16).unwrap_or(b'%');
                out.push(char::from(code));
                i += 3;
            }
            _ => {
                out.push('%');
                i += 1;
            }
        }
        rest = &escaped[i..];
    }
    out.push_str(rest);
    out
}

/// Splits a partition name `k1=v1/k2=v2` into `(key, raw value)` pairs in
/// order, unescaping both. Keys are returned as written (Hive writes them
/// lower-case).
pub fn parse_partition_name(name: &str) -> Result<Vec<(String, String)>, UriError> {
    let bad = |reason: String| UriError::BadPartitionName {
        name: name.to_string(),
        reason,
    };
    if name.is_empty() {
        return Err(bad("empty".into()));
    }
    name.split('/')
        .map(|component| {
            let Some((k, v)) = component.split_once('=') else {
                return Err(bad(format!("component {component:?} has no '='")));
            };
            if k.is_empty() {
                return Err(bad(format!("component {component:?} has an empty key")));
            }
            if v.is_empty() {
                return Err(bad(format!("component {component:?} has an empty value")));
            }
            Ok((unescape_path_name(k), unescape_path_name(v)))
        })
        .collect()
}

/// The raw values of a partition name in the order of `keys` (matched
/// exactly, then ignoring ASCII case).
pub fn partition_values_in_key_order(name: &str, keys: &[String]) -> Result<Vec<String>, UriError> {
    let pairs = parse_partition_name(name)?;
    order_by_keys(keys, pairs.into_iter()).map_err(|reason| UriError::BadPartitionName {
        name: name.to_string(),
        reason,
    })
}

/// Puts `(key, value)` pairs in the order of `keys`: every key exactly once
/// (exact match first, then ignoring ASCII case), nothing else.
pub fn order_by_keys(
    keys: &[String],
    pairs: impl Iterator<Item = (String, String)>,
) -> Result<Vec<String>, String> {
    // The search below is quadratic: only for the few keys a table may have.
    let max = crate::event::MAX_PARTITION_KEYS;
    if keys.len() > max {
        return Err(format!("the table has more than {max} partition keys"));
    }
    let mut pairs: Vec<Option<(String, String)>> = pairs.map(Some).collect();
    if pairs.len() > max {
        return Err(format!("names more than {max} partition keys"));
    }
    let mut values = Vec::with_capacity(keys.len());
    for key in keys {
        let pos = pairs
            .iter()
            .position(|p| p.as_ref().is_some_and(|(k, _)| k == key))
            .or_else(|| {
                pairs
                    .iter()
                    .position(|p| p.as_ref().is_some_and(|(k, _)| k.eq_ignore_ascii_case(key)))
            });
        match pos.and_then(|i| pairs[i].take()) {
            Some((_, v)) => values.push(v),
            None => return Err(format!("no value for partition key {key:?}")),
        }
    }
    if let Some((k, _)) = pairs.into_iter().flatten().next() {
        return Err(format!(
            "{k:?} is not a partition key of the table ({keys:?})"
        ));
    }
    Ok(values)
}

/// Hive's `makePartName`: `k1=v1/k2=v2`, keys lower-cased, both escaped,
/// an empty value written as [`DEFAULT_PARTITION_NAME`].
pub fn make_partition_name(keys: &[String], values: &[String]) -> String {
    keys.iter()
        .zip(values)
        .map(|(k, v)| {
            let v = if v.is_empty() {
                DEFAULT_PARTITION_NAME.to_string()
            } else {
                escape_path_name(v)
            };
            format!("{}={}", escape_path_name(&k.to_lowercase()), v)
        })
        .collect::<Vec<_>>()
        .join("/")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn uri(path: &str, ck: Option<&str>, cm: Option<&str>, sub: Option<&str>) -> FileUri {
        FileUri {
            path: path.into(),
            checksum: ck.map(Into::into),
            cm_root: cm.map(Into::into),
            subdir: sub.map(Into::into),
        }
    }

    #[test]
    fn encoded_uri_forms_split_like_hive() {
        assert_eq!(
            FileUri::parse("hdfs://nn/t/f#00AB#hdfs://nn/cm#delta_1_1").unwrap(),
            uri(
                "hdfs://nn/t/f",
                Some("00ab"),
                Some("hdfs://nn/cm"),
                Some("delta_1_1")
            )
        );
        assert_eq!(
            FileUri::parse("hdfs://nn/t/f###").unwrap(),
            uri("hdfs://nn/t/f", None, None, None)
        );
        assert_eq!(
            FileUri::parse("hdfs://nn/t/f").unwrap(),
            uri("hdfs://nn/t/f", None, None, None)
        );
        assert_eq!(
            FileUri::parse("hdfs://nn/t/f#ab#hdfs://nn/cm#").unwrap(),
            uri("hdfs://nn/t/f", Some("ab"), Some("hdfs://nn/cm"), None)
        );
        assert_eq!(
            FileUri::parse("hdfs://nn/t/f###base_5").unwrap(),
            uri("hdfs://nn/t/f", None, None, Some("base_5"))
        );
    }

    #[test]
    fn malformed_uris_are_rejected() {
        assert_eq!(FileUri::parse(""), Err(UriError::EmptyUri));
        assert!(matches!(
            FileUri::parse("#ab#cm#"),
            Err(UriError::NoPath { .. })
        ));
        assert!(matches!(
            FileUri::parse("p#a#b#c#d"),
            Err(UriError::TooManyParts { parts: 5, .. })
        ));
        assert!(matches!(
            FileUri::parse("p#xyz#cm#"),
            Err(UriError::BadChecksum { .. })
        ));
    }

    #[test]
    fn cm_path_is_flat_name_underscore_checksum() {
        let u = FileUri::parse("hdfs://nn/t/ds=1/000000_0#abcd#hdfs://nn/cmroot/#").unwrap();
        assert_eq!(u.file_name(), "000000_0");
        assert_eq!(
            u.cm_path().as_deref(),
            Some("hdfs://nn/cmroot/000000_0_abcd")
        );
        assert_eq!(FileUri::parse("hdfs://nn/t/f###").unwrap().cm_path(), None);
    }

    #[test]
    fn wnl_files_split_on_bracket() {
        let files = split_files("hdfs://a/1#ab#hdfs://cm#d_1]hdfs://a/2###d_1").unwrap();
        assert_eq!(files.len(), 2);
        assert_eq!(files[1], uri("hdfs://a/2", None, None, Some("d_1")));
        assert_eq!(split_files("").unwrap(), vec![]);
    }

    #[test]
    fn unescape_inverts_escape() {
        for v in [
            "a/b=c",
            "100%",
            "x:y?z",
            "\u{1}\u{7f}",
            "#'*^{[]}\"\\",
            "plain",
            "é/ü",
        ] {
            assert_eq!(unescape_path_name(&escape_path_name(v)), v);
        }
        assert_eq!(unescape_path_name("a%2fb"), "a/b");
        assert_eq!(unescape_path_name("100%"), "100%");
        assert_eq!(unescape_path_name("%zz%4"), "%zz%4");
        assert_eq!(unescape_path_name("%C3"), "\u{c3}");
    }

    #[test]
    fn partition_names_parse_into_raw_pairs() {
        assert_eq!(
            parse_partition_name("ds=2024-01-01/city=S%C3o%2FPaulo").unwrap(),
            vec![
                ("ds".into(), "2024-01-01".into()),
                ("city".into(), "S\u{c3}o/Paulo".into())
            ]
        );
        assert_eq!(
            parse_partition_name("ds=__HIVE_DEFAULT_PARTITION__").unwrap(),
            vec![("ds".into(), DEFAULT_PARTITION_NAME.into())]
        );
        assert!(parse_partition_name("").is_err());
        assert!(parse_partition_name("ds").is_err());
        assert!(parse_partition_name("=1").is_err());
        assert!(parse_partition_name("ds=").is_err());
    }

    #[test]
    fn partition_values_follow_key_order() {
        let keys = vec!["a".to_string(), "b".to_string()];
        assert_eq!(
            partition_values_in_key_order("b=2/a=1", &keys).unwrap(),
            vec!["1", "2"]
        );
        assert_eq!(
            partition_values_in_key_order("A=1/b=2", &keys).unwrap(),
            vec!["1", "2"]
        );
        assert!(partition_values_in_key_order("a=1", &keys).is_err());
        assert!(partition_values_in_key_order("a=1/b=2/c=3", &keys).is_err());
    }

    #[test]
    fn make_partition_name_escapes_and_defaults() {
        let keys = vec!["DS".to_string(), "p".to_string()];
        assert_eq!(
            make_partition_name(&keys, &["a/b".into(), "".into()]),
            "ds=a%2Fb/p=__HIVE_DEFAULT_PARTITION__"
        );
    }

    #[test]
    fn cm_names_longer_than_an_hdfs_component_are_cut_like_hive() {
        let ck = "0000020000000000000000005d41402abc4b2a76b9719d911017c592";
        assert_eq!(cm_file_name("000000_0", ck), format!("000000_0_{ck}"));
        // 198 + 1 + 56 = 255: the limit itself is kept whole.
        let name = "p".repeat(198);
        assert_eq!(cm_file_name(&name, ck).len(), 255);
        // 200 + 1 + 56 = 257 > 255: cut to 254 (getCMPath's maxLength - 1).
        let name = "p".repeat(200);
        let full = format!("{name}_{ck}");
        assert_eq!(cm_file_name(&name, ck), full[..254]);
        let u = FileUri::parse(&format!("hdfs://nn/wh/t/{name}#{ck}#hdfs://nn/cm#")).unwrap();
        assert_eq!(
            u.cm_path().unwrap(),
            format!("hdfs://nn/cm/{}", &full[..254])
        );
        // Java counts UTF-16 units: 'é' is one, '𝄞' two.
        let name = "é".repeat(200);
        assert_eq!(cm_file_name(&name, ck).chars().count(), 254);
        let name = "𝄞".repeat(100);
        let cut = cm_file_name(&name, ck);
        assert_eq!(cut.encode_utf16().count(), 254);
    }
}
