//! Signing keys of published heads: `stagefs keygen FILE` writes an
//! ed25519 key pair, the secret to FILE (mode 0600, never overwritten)
//! and the public key to FILE.pub; `--signing-key FILE` signs with the
//! first, `--trusted-key FILE.pub` verifies with the second.
//!
//! Both are one line: `stagefs-ed25519-secret <64 hex>` (the 32-byte seed)
//! or `stagefs-ed25519-public <64 hex>`.

use std::io::{Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use ed25519_dalek::{SigningKey, VerifyingKey};

use super::record::{hex, unhex};

const SECRET: &str = "stagefs-ed25519-secret";
const PUBLIC: &str = "stagefs-ed25519-public";

#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    #[error("{path}: {detail}")]
    Io { path: PathBuf, detail: String },
    #[error("{path} is not a stagefs {what} key (one line `{prefix} <64 hex>`)")]
    Format {
        path: PathBuf,
        what: &'static str,
        prefix: &'static str,
    },
}

fn io_err(path: &Path) -> impl Fn(std::io::Error) -> KeyError + '_ {
    move |e| KeyError::Io {
        path: path.to_owned(),
        detail: e.to_string(),
    }
}

/// 32 bytes from the kernel's random source.
pub(crate) fn random_bytes<const N: usize>() -> std::io::Result<[u8; N]> {
    let mut out = [0u8; N];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut out)?;
    Ok(out)
}

/// The public key's file of the secret key `path`: `path` + `.pub`.
pub fn public_path(path: &Path) -> PathBuf {
    let mut s = path.as_os_str().to_owned();
    s.push(".pub");
    PathBuf::from(s)
}

/// Writes a new key pair to `path` and `path.pub`; refuses to overwrite
/// either. Returns the public key's path.
pub fn keygen(path: &Path) -> Result<PathBuf, KeyError> {
    let public = public_path(path);
    if public.exists() {
        return Err(KeyError::Io {
            path: public,
            detail: "already exists".into(),
        });
    }
    let key = SigningKey::from_bytes(&random_bytes::<32>().map_err(io_err(path))?);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .map_err(io_err(path))?;
    f.write_all(format!("{SECRET} {}\n", hex(&key.to_bytes())).as_bytes())
        .and_then(|_| f.sync_all())
        .map_err(io_err(path))?;
    crate::durable::write_atomic(
        &public,
        format!("{PUBLIC} {}\n", hex(key.verifying_key().as_bytes())).as_bytes(),
    )
    .map_err(io_err(&public))?;
    Ok(public)
}

fn read_line(path: &Path, prefix: &'static str, what: &'static str) -> Result<[u8; 32], KeyError> {
    let text = std::fs::read_to_string(path).map_err(io_err(path))?;
    let format = || KeyError::Format {
        path: path.to_owned(),
        what,
        prefix,
    };
    let hexed = text
        .trim_end()
        .strip_prefix(prefix)
        .and_then(|r| r.strip_prefix(' '))
        .ok_or_else(format)?;
    let mut raw = [0u8; 32];
    if !unhex(hexed, &mut raw) {
        return Err(format());
    }
    Ok(raw)
}

pub fn load_signing(path: &Path) -> Result<SigningKey, KeyError> {
    Ok(SigningKey::from_bytes(&read_line(path, SECRET, "secret")?))
}

pub fn load_trusted(path: &Path) -> Result<VerifyingKey, KeyError> {
    let raw = read_line(path, PUBLIC, "public")?;
    VerifyingKey::from_bytes(&raw).map_err(|_| KeyError::Format {
        path: path.to_owned(),
        what: "public",
        prefix: PUBLIC,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keygen_writes_a_pair_that_loads_and_never_overwrites() {
        let dir = tempfile::tempdir().unwrap();
        let secret = dir.path().join("k");
        let public = keygen(&secret).unwrap();
        assert_eq!(public, dir.path().join("k.pub"));
        let s = load_signing(&secret).unwrap();
        let p = load_trusted(&public).unwrap();
        assert_eq!(s.verifying_key(), p);
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&secret).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        assert!(keygen(&secret).is_err());
        // The public key is not a secret key, and the other way round.
        assert!(load_signing(&public).is_err());
        assert!(load_trusted(&secret).is_err());
    }
}
