//! Opening a connection: TLS through rustls (ring), verified against
//! `sslrootcert` when given, else the Mozilla roots.

use std::sync::Arc;
use std::time::Duration;

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

/// Why a connection failed its TLS handshake, when it is one of the two
/// reasons the copy names: the server answered `sslmode=require` with no
/// TLS (the client's own "server does not support TLS"), or rustls did not
/// accept its certificate (unknown issuer, wrong host name, expired, ...).
/// Any other handshake failure (a protocol or cipher mismatch, a reset) is
/// `None`, and its copy stays the `disk` one.
pub fn tls_failure(e: &postgres::Error) -> Option<turnsafe_policy::TlsFailure> {
    use std::error::Error;
    use turnsafe_policy::TlsFailure;
    if !e.to_string().starts_with(TLS_HANDSHAKE) {
        return None;
    }
    let mut source = e.source();
    while let Some(s) = source {
        if s.to_string() == "server does not support TLS" {
            return Some(TlsFailure::NotOffered);
        }
        // tokio-rustls hands rustls's error over inside an io::Error, whose
        // `source` skips it: `get_ref` reaches it.
        let rustls_error = s.downcast_ref::<rustls::Error>().or_else(|| {
            s.downcast_ref::<std::io::Error>()
                .and_then(std::io::Error::get_ref)
                .and_then(|inner| inner.downcast_ref::<rustls::Error>())
        });
        if let Some(r) = rustls_error {
            return matches!(r, rustls::Error::InvalidCertificate(_)).then_some(TlsFailure::Certificate);
        }
        source = s.source();
    }
    None
}

/// How the client's error for a failed TLS handshake begins.
pub(crate) const TLS_HANDSHAKE: &str = "error performing TLS handshake";

/// Why a connection could not be made.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    #[error(transparent)]
    Url(#[from] UrlError),
    #[error(transparent)]
    Postgres(#[from] postgres::Error),
    /// The connection was not ready within its time: a server (or a pooler
    /// in front of it) that accepted the TCP connection and then did not
    /// finish TLS, startup or authentication.
    #[error("the server accepted the connection but did not complete the startup within {} ms", .after.as_millis())]
    Stalled { after: Duration },
    /// No thread could be started to bound the connection's time.
    #[error("no thread to connect on: {0}")]
    Thread(std::io::Error),
}

/// One connection to `url`, with TLS as its `sslmode` says, ready within
/// the connect timeout for each of its hosts.
///
/// The client library bounds only the TCP connect by `connect_timeout`;
/// TLS, the startup and authentication have no bound, so a server that
/// accepts and then stalls (a stopped process, a pooler waiting for a
/// server it cannot reach) would hold the writer forever. The connection
/// is therefore made on a thread of its own and given up after the
/// timeout times the number of hosts; a connection that completes later
/// is closed by that thread. A stalled first host of a multi-host URL is
/// not skipped: the attempt fails as a whole and the policy retries it.
///
/// This is the transport alone. A store's handle never uses a connection
/// straight from here: [`super::Postgres::open`] makes every one of its
/// connections, for a write or a read, ready first (`lock_timeout`, the
/// generation, the identity guard, the durability).
pub fn connect(url: &DbUrl) -> Result<postgres::Client, ConnectError> {
    let hosts = url.config().get_hosts().len().max(1) as u32;
    let per_host = url
        .config()
        .get_connect_timeout()
        .copied()
        .unwrap_or(Duration::from_secs(5));
    let limit = per_host.saturating_mul(hosts);
    let config = url.config().clone();
    let tls = match url.tls() {
        TlsMode::Disable => None,
        TlsMode::Require => Some(tokio_postgres_rustls::MakeRustlsConnect::new(tls_config(url)?)),
    };
    let (tx, rx) = std::sync::mpsc::sync_channel(1);
    std::thread::Builder::new()
        .name("turnsafe-pg-connect".into())
        .spawn(move || {
            let made = match tls {
                None => config.connect(postgres::NoTls),
                Some(tls) => config.connect(tls),
            };
            // Nobody listens once the caller gave up: the client is dropped,
            // which closes the connection.
            let _ = tx.send(made);
        })
        .map_err(ConnectError::Thread)?;
    match rx.recv_timeout(limit) {
        Ok(made) => Ok(made?),
        Err(_) => Err(ConnectError::Stalled { after: limit }),
    }
}
