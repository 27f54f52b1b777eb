//! Where a file is looked for, in order: a native file at the source root
//! and then under its change-management names; a Hive file at its mapped
//! source path and then at its URI's change-management copy, each beneath
//! the `--source-map` directory it was mapped through, or, for a Hive file
//! no map covers, at its URI on HDFS. Each place is a [`Location`].

use std::path::Path;

use crate::event::{FileRef, Verify};
use crate::source_file::Location;

use super::FetchOutcome;

/// True for an absolute local path with no `.`, `..` or empty component.
pub(super) fn is_valid_mapped_path(s: &str) -> bool {
    s.len() > 1
        && s.starts_with('/')
        && !s.contains('\0')
        && s[1..]
            .split('/')
            .all(|c| !c.is_empty() && c != "." && c != "..")
}

/// The places to look for `file`, in order, with the outcome each stands for
/// (or why a place cannot be used). Native: the source root, then
/// `<cm-root>/<name>_<sha256>`. Hive: the mapped source path, then the URI's
/// change-management copy (only a file with a checksum has one, named after
/// the checksum), each beneath the `--source-map` directory it was mapped
/// through.
pub(super) fn candidate_places(
    file: &FileRef,
    source_root: &Path,
    cm_root: Option<&Path>,
) -> Vec<(Result<Location, String>, FetchOutcome)> {
    let Some((sha, _)) = file.known() else {
        let mut places = vec![(
            mapped_place(file.source_dir.as_deref(), &file.path),
            FetchOutcome::FromSource,
        )];
        if let (Verify::Hdfs { .. }, Some(cm)) = (&file.verify, &file.cm_path) {
            places.push((
                mapped_place(file.cm_dir.as_deref(), cm),
                FetchOutcome::FromChangeManagement,
            ));
        }
        return places;
    };
    let mut places = vec![(
        Ok(Location::local(source_root, &file.path)),
        FetchOutcome::FromSource,
    )];
    if let Some(cm) = cm_root {
        let hex = sha.to_hex();
        let base = file.path.rsplit('/').next().unwrap_or(&file.path);
        places.push((
            Ok(Location::local(cm, format!("{base}_{hex}"))),
            FetchOutcome::FromChangeManagement,
        ));
        // The source names cm copies after the file; `name` can differ from
        // the path's last component, so look under both.
        if file.name != base {
            places.push((
                Ok(Location::local(cm, format!("{}_{hex}", file.name))),
                FetchOutcome::FromChangeManagement,
            ));
        }
    }
    places
}

/// A Hive file's `path` (absolute, from `--source-map`) opened beneath the
/// mapped directory `dir` it lies in: the part below `dir` comes from the
/// source and must not lead out of it, by `..` or by a symlink. A `path`
/// that is a URI on a file system read where it is (HDFS) has no `dir`.
fn mapped_place(dir: Option<&str>, path: &str) -> Result<Location, String> {
    if let Some(remote) = Location::remote(path) {
        return match dir {
            None => remote.map_err(|e| format!("{path}: refused: {e}")),
            Some(dir) => Err(format!(
                "{path}: refused: a URI, yet the event names the local directory {dir}"
            )),
        };
    }
    let Some(dir) = dir else {
        return Err(format!(
            "{path}: refused: the event names no --source-map directory to open it beneath"
        ));
    };
    match Path::new(path).strip_prefix(dir) {
        Ok(rest) if !rest.as_os_str().is_empty() => Ok(Location::local(Path::new(dir), rest)),
        _ => Err(format!(
            "{path}: refused: not below its mapped directory {dir}"
        )),
    }
}
