//! TLS to the metastore database, with rustls (no system TLS library).
//!
//! Owns what the metastore URL says about TLS and how each driver is set
//! up from it. The URL carries it in the words those databases' own
//! clients use:
//! - PostgreSQL (libpq): `sslmode=disable|prefer|require|verify-ca|verify-full`
//!   and `sslrootcert=FILE` (PEM; or `system`, the machine's CA bundle);
//! - MySQL / MariaDB (the `mysql` client's options):
//!   `ssl-mode=DISABLED|PREFERRED|REQUIRED|VERIFY_CA|VERIFY_IDENTITY` and
//!   `ssl-ca=FILE` (`ssl_mode`, `ssl_ca` too, as in `my.cnf`).
//!
//! Invariants (those of the clients, so a URL means what its users expect):
//! - No parameter: `prefer` / `PREFERRED`, the clients' default: TLS when
//!   the server offers it, the certificate not checked.
//! - `require`: TLS or no connection; the certificate is not checked,
//!   except that PostgreSQL's `require` with an `sslrootcert` checks the
//!   chain as `verify-ca` does (libpq's rule).
//! - `verify-ca` checks the chain up to the given CA, `verify-full` also
//!   that the certificate names the URL's host (a DNS name or an IP
//!   address); both need a CA (`sslrootcert` / `ssl-ca`), refused at parse
//!   time without one, as the clients refuse.
//! - A refused certificate or a server without TLS where TLS is required
//!   is fatal (retrying cannot fix it), with a message that says which and
//!   what to change: [`refusal`].
//!
//! Called by `metastore` (the URL parser and the two drivers' connect).

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::crypto::CryptoProvider;
use rustls::{
    CertificateError, ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme,
};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, ServerName, UnixTime};

/// How much TLS a connection insists on (libpq's names; MySQL's map 1:1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TlsMode {
    Disable,
    Prefer,
    Require,
    VerifyCa,
    VerifyFull,
}

/// Where the CA certificates a verifying mode trusts come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RootCerts {
    /// A PEM file of one or more CA certificates.
    File(PathBuf),
    /// The machine's CA bundle (PostgreSQL's `sslrootcert=system`).
    System,
}

/// The TLS settings of one metastore URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsSettings {
    pub mode: TlsMode,
    pub root_certs: Option<RootCerts>,
    /// Which words the URL used (`sslmode` or `ssl-mode`), for messages.
    pub mysql: bool,
}

/// Where Debian, Fedora/RHEL, openSUSE and Alpine keep the CA bundle.
const SYSTEM_BUNDLES: &[&str] = &[
    "/etc/ssl/certs/ca-certificates.crt",
    "/etc/pki/tls/certs/ca-bundle.crt",
    "/etc/ssl/ca-bundle.pem",
    "/etc/ssl/cert.pem",
];

impl TlsSettings {
    /// The default: what `psql` and `mysql` do without a TLS option.
    pub fn default_for(mysql: bool) -> TlsSettings {
        TlsSettings {
            mode: TlsMode::Prefer,
            root_certs: None,
            mysql,
        }
    }

    /// Reads the URL's TLS parameters: `mode` is the value of `sslmode`
    /// (PostgreSQL) or `ssl-mode` (MySQL), `root` that of `sslrootcert` or
    /// `ssl-ca`. Errors say what is wrong in the URL's own words.
    pub fn from_params(
        mysql: bool,
        mode: Option<&str>,
        root: Option<&str>,
    ) -> Result<TlsSettings, String> {
        let mode = match mode {
            None => TlsMode::Prefer,
            Some(value) if mysql => match value.to_ascii_uppercase().replace('-', "_").as_str() {
                "DISABLED" => TlsMode::Disable,
                "PREFERRED" => TlsMode::Prefer,
                "REQUIRED" => TlsMode::Require,
                "VERIFY_CA" => TlsMode::VerifyCa,
                "VERIFY_IDENTITY" => TlsMode::VerifyFull,
                _ => {
                    return Err(format!(
                        "ssl-mode={value:?} is none of DISABLED, PREFERRED, REQUIRED, VERIFY_CA, VERIFY_IDENTITY"
                    ))
                }
            },
            Some(value) => match value {
                "disable" => TlsMode::Disable,
                "prefer" => TlsMode::Prefer,
                "require" => TlsMode::Require,
                "verify-ca" => TlsMode::VerifyCa,
                "verify-full" => TlsMode::VerifyFull,
                "allow" => {
                    return Err(
                        "sslmode=allow (plain first, TLS only if the server insists) is not \
                         supported; use prefer"
                            .into(),
                    )
                }
                _ => {
                    return Err(format!(
                        "sslmode={value:?} is none of disable, prefer, require, verify-ca, verify-full"
                    ))
                }
            },
        };
        let root_certs = match root {
            None => None,
            Some("system") if !mysql => Some(RootCerts::System),
            Some(path) => Some(RootCerts::File(PathBuf::from(path))),
        };
        let mut settings = TlsSettings {
            mode,
            root_certs,
            mysql,
        };
        // libpq: `require` with a root certificate checks the chain.
        if settings.mode == TlsMode::Require && settings.root_certs.is_some() && !mysql {
            settings.mode = TlsMode::VerifyCa;
        }
        if matches!(settings.mode, TlsMode::VerifyCa | TlsMode::VerifyFull)
            && settings.root_certs.is_none()
        {
            return Err(if mysql {
                format!(
                    "ssl-mode={} needs ssl-ca=FILE, the CA certificate (PEM) that signed the server's",
                    settings.mode_word()
                )
            } else {
                format!(
                    "sslmode={} needs sslrootcert=FILE, the CA certificate (PEM) that signed the \
                     server's (or sslrootcert=system for the machine's CA bundle)",
                    settings.mode_word()
                )
            });
        }
        Ok(settings)
    }

    /// The mode as the URL spells it (`verify-full`, `VERIFY_IDENTITY`).
    pub fn mode_word(&self) -> &'static str {
        match (self.mysql, self.mode) {
            (false, TlsMode::Disable) => "disable",
            (false, TlsMode::Prefer) => "prefer",
            (false, TlsMode::Require) => "require",
            (false, TlsMode::VerifyCa) => "verify-ca",
            (false, TlsMode::VerifyFull) => "verify-full",
            (true, TlsMode::Disable) => "DISABLED",
            (true, TlsMode::Prefer) => "PREFERRED",
            (true, TlsMode::Require) => "REQUIRED",
            (true, TlsMode::VerifyCa) => "VERIFY_CA",
            (true, TlsMode::VerifyFull) => "VERIFY_IDENTITY",
        }
    }

    /// `sslmode=verify-full` / `ssl-mode=VERIFY_IDENTITY`.
    pub fn mode_param(&self) -> String {
        let key = if self.mysql { "ssl-mode" } else { "sslmode" };
        format!("{key}={}", self.mode_word())
    }

    fn root_param(&self) -> String {
        let key = if self.mysql { "ssl-ca" } else { "sslrootcert" };
        match &self.root_certs {
            Some(RootCerts::File(path)) => format!("{key}={}", path.display()),
            Some(RootCerts::System) => format!("{key}=system"),
            None => format!("{key} (none given)"),
        }
    }

    /// The CA file for the `mysql` crate (which reads it itself).
    pub fn root_cert_file(&self) -> Result<Option<PathBuf>, String> {
        match &self.root_certs {
            None => Ok(None),
            Some(RootCerts::File(path)) => {
                // Read here so that a missing file is named as such, not
                // as an I/O error in the middle of a handshake.
                load_roots(path)?;
                Ok(Some(path.clone()))
            }
            Some(RootCerts::System) => system_bundle().map(Some),
        }
    }

    /// A rustls client configuration for this mode (None: no TLS).
    pub fn client_config(&self) -> Result<Option<ClientConfig>, String> {
        let provider = Arc::new(crypto_provider());
        let verifier: Arc<dyn ServerCertVerifier> = match self.mode {
            TlsMode::Disable => return Ok(None),
            TlsMode::Prefer | TlsMode::Require => Arc::new(AnyCertificate(provider.clone())),
            TlsMode::VerifyCa | TlsMode::VerifyFull => {
                let roots = match &self.root_certs {
                    Some(RootCerts::File(path)) => load_roots(path)?,
                    Some(RootCerts::System) => load_roots(&system_bundle()?)?,
                    None => return Err(format!("{} without a CA", self.mode_param())),
                };
                let webpki =
                    WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider.clone())
                        .build()
                        .map_err(|e| format!("{}: {e}", self.root_param()))?;
                if self.mode == TlsMode::VerifyCa {
                    Arc::new(ChainOnly(webpki))
                } else {
                    webpki
                }
            }
        };
        let config = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| format!("TLS set-up: {e}"))?
            .dangerous()
            .with_custom_certificate_verifier(verifier)
            .with_no_client_auth();
        Ok(Some(config))
    }
}

impl fmt::Display for TlsSettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (&self.mode, &self.root_certs) {
            (TlsMode::VerifyCa | TlsMode::VerifyFull, Some(_)) => {
                write!(f, "{}, {}", self.mode_param(), self.root_param())
            }
            _ => f.write_str(&self.mode_param()),
        }
    }
}

/// The cryptography of every metastore connection: *ring*, pure Rust and
/// assembly with no C toolchain or system library to build against (rustls
/// 0.23.48 deprecates it for lacking post-quantum key exchange, which
/// neither PostgreSQL nor MySQL servers offer today).
#[allow(deprecated)]
pub fn crypto_provider() -> CryptoProvider {
    rustls::crypto::ring::default_provider()
}

fn system_bundle() -> Result<PathBuf, String> {
    SYSTEM_BUNDLES
        .iter()
        .map(PathBuf::from)
        .find(|p| p.is_file())
        .ok_or_else(|| {
            format!(
                "sslrootcert=system: no CA bundle found (looked at {})",
                SYSTEM_BUNDLES.join(", ")
            )
        })
}

/// The CA certificates of a PEM file; an error names the file.
fn load_roots(path: &Path) -> Result<RootCertStore, String> {
    let what = |e: &dyn fmt::Display| format!("CA file {}: {e}", path.display());
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(path)
        .map_err(|e| what(&e))?
        .collect::<Result<_, _>>()
        .map_err(|e| what(&e))?;
    if certs.is_empty() {
        return Err(what(&"no PEM certificate in it"));
    }
    let mut roots = RootCertStore::empty();
    for cert in certs {
        roots.add(cert).map_err(|e| what(&e))?;
    }
    Ok(roots)
}

/// `verify-ca`: the chain must lead to a trusted CA; the name is not
/// checked.
#[derive(Debug)]
struct ChainOnly(Arc<WebPkiServerVerifier>);

impl ServerCertVerifier for ChainOnly {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        match self
            .0
            .verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now)
        {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}

/// `prefer` and `require`: encrypted, the certificate taken as it is
/// (libpq's and MySQL's meaning); the handshake's signatures are still
/// checked, so the peer holds the certificate's key.
#[derive(Debug)]
struct AnyCertificate(Arc<CryptoProvider>);

impl ServerCertVerifier for AnyCertificate {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// When `error` (or one of its causes) is a TLS refusal, the message to
/// give instead of the driver's: what was refused, and what to change.
/// `host` is the URL's host. None for other errors.
pub fn refusal(
    settings: &TlsSettings,
    host: &str,
    error: &(dyn std::error::Error + 'static),
) -> Option<String> {
    let mut next: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(e) = next {
        // io::Error hides its inner error from source(): look inside.
        let inner = e
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
            .map(|inner| inner as &(dyn std::error::Error + 'static));
        for candidate in [Some(e), inner].into_iter().flatten() {
            if let Some(tls) = candidate.downcast_ref::<rustls::Error>() {
                return Some(describe_refusal(settings, host, tls));
            }
        }
        next = inner.and_then(|i| i.source()).or_else(|| e.source());
    }
    None
}

/// The message for a server that did not offer TLS where it is required.
pub fn not_offered(settings: &TlsSettings) -> String {
    format!(
        "TLS: the server does not offer TLS, and {} requires it (enable TLS on the \
         server, or lower {} if the network is trusted)",
        settings.mode_param(),
        if settings.mysql {
            "ssl-mode"
        } else {
            "sslmode"
        }
    )
}

fn describe_refusal(settings: &TlsSettings, host: &str, error: &rustls::Error) -> String {
    let hint = match error {
        rustls::Error::InvalidCertificate(
            CertificateError::UnknownIssuer | CertificateError::BadSignature,
        ) => format!(
            "the server's certificate is not signed by a CA in {}",
            settings.root_param()
        ),
        rustls::Error::InvalidCertificate(
            CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
        ) => format!(
            "the server's certificate is not issued for {host:?}, the host the URL names \
             ({} checks the name; name the host as the certificate does)",
            settings.mode_param()
        ),
        rustls::Error::InvalidCertificate(CertificateError::Expired)
        | rustls::Error::InvalidCertificate(CertificateError::ExpiredContext { .. }) => {
            "the server's certificate has expired".to_string()
        }
        _ => "the TLS handshake failed".to_string(),
    };
    format!(
        "TLS ({}): certificate refused: {hint} ({error})",
        settings.mode_param()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_parse_in_each_clients_words() {
        let pg = |m: &str, r: Option<&str>| TlsSettings::from_params(false, Some(m), r);
        let my = |m: &str, r: Option<&str>| TlsSettings::from_params(true, Some(m), r);
        assert_eq!(pg("disable", None).unwrap().mode, TlsMode::Disable);
        assert_eq!(pg("prefer", None).unwrap().mode, TlsMode::Prefer);
        assert_eq!(pg("require", None).unwrap().mode, TlsMode::Require);
        assert_eq!(pg("require", Some("/ca")).unwrap().mode, TlsMode::VerifyCa);
        assert_eq!(
            pg("verify-full", Some("system")).unwrap().root_certs,
            Some(RootCerts::System)
        );
        assert_eq!(my("disabled", None).unwrap().mode, TlsMode::Disable);
        assert_eq!(my("REQUIRED", Some("/ca")).unwrap().mode, TlsMode::Require);
        assert_eq!(
            my("verify-ca", Some("/ca")).unwrap().mode,
            TlsMode::VerifyCa
        );
        let full = my("VERIFY_IDENTITY", Some("/ca")).unwrap();
        assert_eq!(full.mode, TlsMode::VerifyFull);
        assert_eq!(full.to_string(), "ssl-mode=VERIFY_IDENTITY, ssl-ca=/ca");
        assert_eq!(
            TlsSettings::from_params(false, None, None).unwrap(),
            TlsSettings::default_for(false)
        );
    }

    #[test]
    fn verifying_modes_need_a_ca_and_bad_modes_are_named() {
        let err = TlsSettings::from_params(false, Some("verify-full"), None).unwrap_err();
        assert!(err.contains("sslrootcert=FILE"), "{err}");
        let err = TlsSettings::from_params(true, Some("VERIFY_CA"), None).unwrap_err();
        assert!(err.contains("ssl-ca=FILE"), "{err}");
        let err = TlsSettings::from_params(false, Some("verify_full"), None).unwrap_err();
        assert!(err.contains("verify_full"), "{err}");
        let err = TlsSettings::from_params(false, Some("allow"), None).unwrap_err();
        assert!(err.contains("prefer"), "{err}");
    }

    #[test]
    fn a_missing_or_empty_ca_file_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let empty = dir.path().join("empty.pem");
        std::fs::write(&empty, "").unwrap();
        for path in [dir.path().join("absent.pem"), empty] {
            let settings =
                TlsSettings::from_params(false, Some("verify-full"), Some(path.to_str().unwrap()))
                    .unwrap();
            let err = settings.client_config().unwrap_err();
            assert!(err.contains(&path.display().to_string()), "{err}");
        }
    }
}
