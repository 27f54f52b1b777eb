//! `--source-map PREFIX=DIR`: where the files that Hive names by URI are on
//! this machine (SPEC §2 "Hive metastore source").
//!
//! `hdfs://nn1:8020/warehouse=/srv/warehouse` maps
//! `hdfs://nn1:8020/warehouse/sales.db/t/000000_0` to
//! `/srv/warehouse/sales.db/t/000000_0`. The longest prefix that matches at a
//! path boundary wins. A URI no prefix covers, or whose rest has an empty,
//! `.` or `..` component (it would escape its directory), is bad input.
//! Change-management roots inside URIs are mapped the same way.
//!
//! A URI no prefix covers is read where it is when stagefs has a reader for
//! its file system (`hdfs://`: [`SourceMap::place`] gives its
//! [`Location`]); a map still wins where it covers a URI.
//!
//! Used by the Hive adapter for every file URI; pure.

use std::path::{Path, PathBuf};

use crate::source_file::Location;

/// Where a file URI is read from ([`SourceMap::place`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Place<'a> {
    /// Below a mapped local directory: the directory and the path below it.
    Mapped(&'a Path, PathBuf),
    /// Where the URI names it, on a file system stagefs reads (HDFS).
    Remote(Location),
}

/// The maps given on the command line.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SourceMap {
    /// (prefix without trailing `/`, local directory), longest prefix first.
    entries: Vec<(String, PathBuf)>,
}

impl SourceMap {
    /// Parses `PREFIX=DIR` arguments. DIR must be absolute; the split is at
    /// the first `=/`, so a prefix may itself contain `=`.
    pub fn parse<S: AsRef<str>>(args: &[S]) -> Result<SourceMap, String> {
        let mut entries = Vec::new();
        for arg in args {
            let arg = arg.as_ref();
            let at = arg.find("=/").ok_or_else(|| {
                format!("--source-map `{arg}` must be PREFIX=DIR with an absolute DIR")
            })?;
            let prefix = arg[..at].trim_end_matches('/');
            if prefix.is_empty() {
                return Err(format!("--source-map `{arg}` has an empty PREFIX"));
            }
            entries.push((prefix.to_owned(), PathBuf::from(&arg[at + 1..])));
        }
        entries.sort_by_key(|e| std::cmp::Reverse(e.0.len()));
        Ok(SourceMap { entries })
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The local directories mapped to (checked to exist at startup).
    pub fn dirs(&self) -> impl Iterator<Item = &Path> {
        self.entries.iter().map(|(_, d)| d.as_path())
    }

    /// The local path of `uri`, or why it has none.
    pub fn local(&self, uri: &str) -> Result<PathBuf, String> {
        let (dir, rest) = self.resolve(uri)?;
        Ok(dir.join(rest))
    }

    /// Where `uri` is read from: below the directory a map gives it
    /// ([`SourceMap::resolve`]), else where it is when stagefs reads its
    /// file system, else why neither.
    pub fn place(&self, uri: &str) -> Result<Place<'_>, String> {
        match self.resolve_covered(uri) {
            Some(mapped) => mapped.map(|(dir, rest)| Place::Mapped(dir, rest)),
            None => match Location::remote(uri) {
                Some(remote) => remote.map(Place::Remote),
                None => Err(format!("no --source-map covers `{uri}`")),
            },
        }
    }

    /// The mapped directory that covers `uri` and the path below it
    /// (relative, no `.`/`..`/empty components; empty for the directory
    /// itself). Files are opened beneath that directory, so that neither
    /// the URI nor a symlink in the source can lead out of it.
    pub fn resolve(&self, uri: &str) -> Result<(&Path, PathBuf), String> {
        self.resolve_covered(uri)
            .unwrap_or_else(|| Err(format!("no --source-map covers `{uri}`")))
    }

    /// [`SourceMap::resolve`]; `None` when no map covers `uri`.
    fn resolve_covered(&self, uri: &str) -> Option<Result<(&Path, PathBuf), String>> {
        for (prefix, dir) in &self.entries {
            let Some(rest) = uri.strip_prefix(prefix.as_str()) else {
                continue;
            };
            if !rest.is_empty() && !rest.starts_with('/') {
                continue; // `/warehouse2` is not below `/warehouse`
            }
            let rest = rest.trim_start_matches('/');
            if rest.is_empty() {
                return Some(Ok((dir, PathBuf::new())));
            }
            if rest.contains('\0')
                || rest
                    .split('/')
                    .any(|c| c.is_empty() || c == "." || c == "..")
            {
                return Some(Err(format!(
                    "`{uri}` escapes the directory {prefix} is mapped to"
                )));
            }
            return Some(Ok((dir, PathBuf::from(rest))));
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn longest_prefix_at_a_path_boundary_wins() {
        let m = SourceMap::parse(&[
            "hdfs://nn1:8020/warehouse=/srv/wh",
            "hdfs://nn1:8020/warehouse/big.db/=/mnt/big",
            "hdfs://nn1:8020/user/hive/cmroot=/srv/cm",
        ])
        .unwrap();
        assert_eq!(
            m.local("hdfs://nn1:8020/warehouse/sales.db/t/000000_0")
                .unwrap(),
            PathBuf::from("/srv/wh/sales.db/t/000000_0")
        );
        assert_eq!(
            m.local("hdfs://nn1:8020/warehouse/big.db/t/f").unwrap(),
            PathBuf::from("/mnt/big/t/f")
        );
        assert_eq!(
            m.local("hdfs://nn1:8020/user/hive/cmroot").unwrap(),
            PathBuf::from("/srv/cm")
        );
        let (dir, rest) = m.resolve("hdfs://nn1:8020/warehouse/big.db/t/f").unwrap();
        assert_eq!(
            (dir, rest.as_path()),
            (Path::new("/mnt/big"), Path::new("t/f"))
        );
        let err = m.local("hdfs://nn1:8020/warehouse2/x").unwrap_err();
        assert!(err.contains("no --source-map covers"), "{err}");
    }

    #[test]
    fn uris_escaping_their_directory_are_rejected() {
        let m = SourceMap::parse(&["hdfs://nn/wh=/srv/wh"]).unwrap();
        for uri in [
            "hdfs://nn/wh/../etc/passwd",
            "hdfs://nn/wh/a//b",
            "hdfs://nn/wh/./a",
        ] {
            let err = m.local(uri).unwrap_err();
            assert!(err.contains("escapes"), "{uri}: {err}");
        }
    }

    #[test]
    fn an_unmapped_hdfs_uri_is_read_where_it_is_and_a_map_still_wins() {
        let m = SourceMap::parse(&["hdfs://nn1:8020/warehouse=/srv/wh"]).unwrap();
        assert_eq!(
            m.place("hdfs://nn1:8020/warehouse/t/f").unwrap(),
            Place::Mapped(Path::new("/srv/wh"), PathBuf::from("t/f"))
        );
        assert_eq!(
            m.place("hdfs://ns1/user/hive/cmroot/f_00").unwrap(),
            Place::Remote(Location::Hdfs {
                uri: "hdfs://ns1/user/hive/cmroot/f_00".into()
            })
        );
        // Malformed, a mapped URI escaping its directory, no reader.
        assert!(m.place("hdfs://ns1/wh/../x").is_err());
        assert!(m.place("hdfs://nn1:8020/warehouse/../x").is_err());
        let err = m.place("abfs://c@acct/wh/f").unwrap_err();
        assert!(err.contains("no --source-map covers"), "{err}");
        assert!(SourceMap::default().place("hdfs://nn/wh/f").is_ok());
    }

    #[test]
    fn malformed_maps_are_refused() {
        assert!(SourceMap::parse(&["hdfs://nn/wh"]).is_err());
        assert!(SourceMap::parse(&["hdfs://nn/wh=relative"]).is_err());
        assert!(SourceMap::parse(&["=/srv"]).is_err());
    }
}
