//! Hive file URIs as stagefs [`FileRef`]s: the local path and
//! change-management copy through `--source-map` (or, for a URI no map
//! covers on a file system stagefs reads, the URIs themselves), the checksum, the
//! subdirectory below the partition or table location, and a reference key
//! unique to the file's place in its event.
//!
//! Pure functions of the message and the map (no tree), so both the
//! adapter's mapping on the ingest thread (`map_file`) and the decoding
//! threads of [`super::ahead`] (`premap_files`, an INSERT's files mapped
//! ahead) call them and get the same references.

use sha2::{Digest, Sha256};

use super::map::{Place, SourceMap};
use super::model::{FileUri, HiveMessage, HivePartition, HiveTable};
use crate::event::{is_valid_file_name, is_valid_source_path, BlobId, FileRef, Verify};
use crate::source_file::Location;

/// Where Hive keeps the files of `table`'s `partition` (the table's own
/// location when unpartitioned), when the message says.
pub(crate) fn files_dir<'a>(
    table: &'a HiveTable,
    partition: Option<&'a HivePartition>,
) -> Option<&'a str> {
    match partition {
        Some(p) => p.location.as_deref(),
        None => table.location.as_deref(),
    }
}

/// A URI split into its scheme and host (lower-cased, the port left out,
/// so `hdfs://nn` and `hdfs://NN:8020` are one file system) and its path
/// (`hdfs://nn:8020/a/b` → `("hdfs://nn", "/a/b")`); a bare path has no
/// file system.
fn split_uri(uri: &str) -> (Option<String>, &str) {
    let Some((scheme, rest)) = uri.split_once("://") else {
        return (None, uri);
    };
    let (authority, path) = rest.find('/').map_or((rest, ""), |i| rest.split_at(i));
    let host = authority.rsplit('@').next().unwrap_or(authority);
    let host = host.split(':').next().unwrap_or(host);
    (
        Some(format!("{scheme}://{host}").to_ascii_lowercase()),
        path,
    )
}

/// The directories between `dir` and the file at `path` (`a/b` for
/// `dir/a/b/name`); None when the file is directly in `dir`, not below it
/// (another file system, another directory, `dir` the root), or the
/// directories between are not a plain relative path.
pub(crate) fn subdir_below(dir: &str, path: &str) -> Option<String> {
    let (dir_fs, dir) = split_uri(dir);
    let (file_fs, file) = split_uri(path);
    if dir_fs.is_some() && file_fs.is_some() && dir_fs != file_fs {
        return None;
    }
    let dir = dir.trim_end_matches('/');
    if dir.is_empty() {
        return None;
    }
    let rest = file.strip_prefix(dir)?.strip_prefix('/')?;
    let (subdir, _name) = rest.rsplit_once('/')?;
    is_valid_source_path(subdir).then(|| subdir.to_owned())
}

/// What the ingest thread's mapping gives for an INSERT's files, computed without the
/// tree (on a decoding thread): each file mapped as the event's file 0, 1,
/// ... in order. None for other messages, whose files are mapped on the
/// ingest thread.
pub(crate) fn premap_files(
    map: &SourceMap,
    event_id: i64,
    message: &HiveMessage,
) -> Option<Vec<Result<FileRef, String>>> {
    let HiveMessage::Insert {
        table,
        partition,
        files,
        ..
    } = message
    else {
        return None;
    };
    let dir = files_dir(table, partition.as_ref());
    Some(
        files
            .iter()
            .enumerate()
            .map(|(i, uri)| map_file(map, event_id, i, uri, dir))
            .collect(),
    )
}

/// A file reference for `uri`, file number `index` of event `event_id`:
/// its local path and cm copy through `--source-map`, its checksum, its
/// subdirectory and a key unique to this place in this event. A pure
/// function of its arguments (no tree), so decoding threads can run it.
///
/// The subdirectory is the URI's own (`#subdir`, what Hive encodes for
/// ACID files) or else where the file lies below `dir`, the location of
/// its partition or table: the `HIVE_UNION_SUBDIR_n` directories of an
/// INSERT … UNION ALL on Tez are named only by the files' paths.
pub(crate) fn map_file(
    map: &SourceMap,
    event_id: i64,
    index: usize,
    uri: &FileUri,
    dir: Option<&str>,
) -> Result<FileRef, String> {
    // A mapped file: its local path, opened beneath the mapped directory.
    // A file read where it is (HDFS): its URI, and no local directory.
    let (path, source_dir) = match map.place(&uri.path)? {
        Place::Mapped(dir, rest) => (
            dir.join(rest).to_string_lossy().into_owned(),
            Some(dir.to_string_lossy().into_owned()),
        ),
        Place::Remote(_) => (uri.path.clone(), None),
    };
    let file_name = uri
        .path
        .rsplit('/')
        .next()
        .filter(|n| is_valid_file_name(n))
        .ok_or_else(|| format!("file URI `{}` does not end in a file name", uri.path))?;
    let below = match uri.subdir.as_deref() {
        None | Some("") => dir.and_then(|d| subdir_below(d, &uri.path)),
        Some(s) => Some(s.to_owned()),
    };
    let subdir = match below.as_deref() {
        None => None,
        Some(s) if is_valid_source_path(s) => Some(s.to_owned()),
        Some(s) => {
            return Err(format!(
                "subdirectory `{s}` of `{}` must be relative, without `..`",
                uri.path
            ))
        }
    };
    let checksum = uri
        .checksum
        .as_deref()
        .filter(|c| !c.is_empty())
        .map(str::to_ascii_lowercase);
    if let Some(c) = &checksum {
        if !c.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(format!("checksum `{c}` of `{}` is not hex", uri.path));
        }
    }
    let (cm_path, cm_dir) = match (&checksum, uri.cm_root.as_deref().filter(|c| !c.is_empty())) {
        (Some(c), Some(root)) => {
            let cm_name = super::uri::cm_file_name(file_name, c);
            match map.place(root)? {
                Place::Mapped(dir, rest) => (
                    Some(dir.join(rest).join(cm_name).to_string_lossy().into_owned()),
                    Some(dir.to_string_lossy().into_owned()),
                ),
                Place::Remote(_) => {
                    let cm = format!("{}/{cm_name}", root.trim_end_matches('/'));
                    if let Some(Err(e)) = Location::remote(&cm) {
                        return Err(e);
                    }
                    (Some(cm), None)
                }
            }
        }
        _ => (None, None),
    };
    let mut h = Sha256::new();
    h.update(b"stagefs hive file\0");
    h.update(event_id.to_le_bytes());
    h.update((index as u64).to_le_bytes());
    h.update(uri.path.as_bytes());
    Ok(FileRef {
        path,
        name: file_name.to_owned(),
        subdir,
        verify: match checksum {
            Some(checksum) => Verify::Hdfs { checksum },
            None => Verify::None,
        },
        key: Some(BlobId(h.finalize().into())),
        source_dir,
        cm_path,
        cm_dir,
        uri: Some(uri.path.clone()),
    })
}
