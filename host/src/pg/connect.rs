//! Opening a connection: TLS through rustls (ring), verified against
//! `sslrootcert` when given, else the Mozilla roots.

use std::sync::Arc;

use rustls::RootCertStore;
use rustls_pki_types::CertificateDer;
use rustls_pki_types::pem::PemObject;

use super::url::{DbUrl, TlsMode, UrlError};

/// The rustls client configuration `sslmode=require` uses.
pub fn tls_config(url: &DbUrl) -> Result<rustls::ClientConfig, UrlError> {
    let mut roots = RootCertStore::empty();
    match url.root_cert() {
        Some(path) => {
            let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(path)
                .map_err(|e| UrlError::RootCert {
                    path: path.to_path_buf(),
                    reason: e.to_string(),
                })?
                .collect::<Result<_, _>>()
                .map_err(|e| UrlError::RootCert {
                    path: path.to_path_buf(),
                    reason: e.to_string(),
                })?;
            let (added, _ignored) = roots.add_parsable_certificates(certs);
            if added == 0 {
                return Err(UrlError::RootCert {
                    path: path.to_path_buf(),
                    reason: "no usable certificate in the file".into(),
                });
            }
        }
        None => roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned()),
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| UrlError::Parse(format!("TLS: {e}")))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(config)
}

/// Why a connection could not be made.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    #[error(transparent)]
    Url(#[from] UrlError),
    #[error(transparent)]
    Postgres(#[from] postgres::Error),
}

/// One connection to `url`, with TLS as its `sslmode` says.
pub fn connect(url: &DbUrl) -> Result<postgres::Client, ConnectError> {
    match url.tls() {
        TlsMode::Disable => Ok(url.config().connect(postgres::NoTls)?),
        TlsMode::Require => {
            let tls = tokio_postgres_rustls::MakeRustlsConnect::new(tls_config(url)?);
            Ok(url.config().connect(tls)?)
        }
    }
}
