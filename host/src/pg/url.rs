//! `--db URL` / `TURNSAFE_DB`: what turnsafe accepts as a PostgreSQL
//! target, and the only form of it that is ever shown.
//!
//! - Both libpq forms are read: a URL (`postgres://user@host:port/db?k=v`)
//!   and key=value words (`host=... user=...`).
//! - `sslmode` may be `disable` or `require`; absent, it is `require`.
//!   `prefer` (libpq's default) is refused: it falls back to plaintext
//!   without a word when the server offers no TLS. `verify-ca` and
//!   `verify-full` are not offered as words of their own: `require` always
//!   verifies the certificate and the host name (see `docs/POSTGRES.md`).
//! - `sslrootcert=PATH` names the PEM roots `require` verifies against;
//!   without it, the Mozilla roots (webpki-roots) are used.
//! - A password may come from the URL, or from a libpq-style password file
//!   (`PGPASSFILE`, else `~/.pgpass`) when the URL has none.
//! - [`DbUrl::display`] is `postgres://user@host:port/db`: no password, no
//!   parameters. Logs, outcomes and copy use nothing else.

use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;

/// Seconds a connection attempt may take when the URL says nothing.
const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// TLS as turnsafe offers it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TlsMode {
    /// Plaintext: for loopback and sockets the operator trusts.
    Disable,
    /// TLS, with the server certificate and host name verified by rustls.
    Require,
}

/// Why a `--db` value was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum UrlError {
    #[error(
        "sslmode={0} is refused: `prefer` and `allow` fall back to plaintext without a word when the server \
         offers no TLS. Say `sslmode=require` (TLS, certificate verified) or `sslmode=disable` (plaintext, \
         for loopback)"
    )]
    SslModeRefused(String),
    #[error(
        "sslmode={0} is not offered: use `sslmode=require` (it verifies the certificate and host name) or `sslmode=disable`"
    )]
    SslModeUnknown(String),
    #[error("the database URL cannot be read: {0}")]
    Parse(String),
    #[error("the database URL names no host; turnsafe connects over TCP only")]
    NoHost,
    #[error("sslrootcert {path}: {reason}")]
    RootCert { path: PathBuf, reason: String },
}

/// A parsed, checked PostgreSQL target.
#[derive(Clone)]
pub struct DbUrl {
    config: postgres::Config,
    tls: TlsMode,
    root_cert: Option<PathBuf>,
    display: String,
    /// The password was written in the URL itself.
    password_in_url: bool,
}

impl std::fmt::Debug for DbUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the password.
        f.debug_struct("DbUrl")
            .field("target", &self.display)
            .field("tls", &self.tls)
            .finish()
    }
}

impl std::fmt::Display for DbUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.display)
    }
}

/// Split off the parameters turnsafe reads itself (`sslmode`,
/// `sslrootcert`), returning the rest for the client's parser.
fn take_params(raw: &str) -> Result<(String, Option<String>, Option<String>), UrlError> {
    let (mut sslmode, mut rootcert) = (None, None);
    let is_url = raw.starts_with("postgres://") || raw.starts_with("postgresql://");
    if is_url {
        let (base, query) = match raw.split_once('?') {
            Some((b, q)) => (b, q),
            None => (raw, ""),
        };
        let mut kept = Vec::new();
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            match k {
                "sslmode" => sslmode = Some(percent_decode(v)?),
                "sslrootcert" => rootcert = Some(percent_decode(v)?),
                _ => kept.push(pair),
            }
        }
        let rest = if kept.is_empty() {
            base.to_string()
        } else {
            format!("{base}?{}", kept.join("&"))
        };
        return Ok((rest, sslmode, rootcert));
    }
    let mut kept = Vec::new();
    for word in raw.split_whitespace() {
        match word.split_once('=') {
            Some(("sslmode", v)) => sslmode = Some(v.trim_matches('\'').to_string()),
            Some(("sslrootcert", v)) => rootcert = Some(v.trim_matches('\'').to_string()),
            _ => kept.push(word),
        }
    }
    Ok((kept.join(" "), sslmode, rootcert))
}

fn percent_decode(s: &str) -> Result<String, UrlError> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = bytes
                .get(i + 1..i + 3)
                .and_then(|h| std::str::from_utf8(h).ok())
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .ok_or_else(|| UrlError::Parse("a bad %-escape in a parameter".into()))?;
            out.push(hex);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| UrlError::Parse("a parameter is not UTF-8".into()))
}

impl FromStr for DbUrl {
    type Err = UrlError;

    fn from_str(raw: &str) -> Result<DbUrl, UrlError> {
        let raw = raw.trim();
        let (rest, sslmode, rootcert) = take_params(raw)?;
        let tls = match sslmode.as_deref() {
            None | Some("require") => TlsMode::Require,
            Some("disable") => TlsMode::Disable,
            Some(m @ ("prefer" | "allow")) => return Err(UrlError::SslModeRefused(m.to_string())),
            Some(other) => return Err(UrlError::SslModeUnknown(other.to_string())),
        };
        let mut config = postgres::Config::from_str(&rest).map_err(|e| {
            // The client's parse errors name the option, never its value.
            UrlError::Parse(e.to_string())
        })?;
        // turnsafe does the TLS itself; the client only asks for it.
        config.ssl_mode(match tls {
            TlsMode::Disable => postgres::config::SslMode::Disable,
            TlsMode::Require => postgres::config::SslMode::Require,
        });
        if config.get_hosts().is_empty() {
            return Err(UrlError::NoHost);
        }
        if config.get_user().is_none() {
            let user = std::env::var("PGUSER")
                .ok()
                .filter(|u| !u.is_empty())
                .or_else(|| std::env::var("USER").ok().filter(|u| !u.is_empty()))
                .unwrap_or_else(|| "postgres".into());
            config.user(&user);
        }
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(DEFAULT_CONNECT_TIMEOUT);
        }
        let password_in_url = config.get_password().is_some();
        let mut url = DbUrl {
            display: String::new(),
            config,
            tls,
            root_cert: rootcert.map(PathBuf::from),
            password_in_url,
        };
        url.display = url.render();
        if !url.password_in_url
            && let Some(pw) = password_file_entry(&url)
        {
            url.config.password(pw);
        }
        Ok(url)
    }
}

impl DbUrl {
    /// `postgres://user@host:port/db`.
    /// `postgres://user@host:port/db`; with several hosts (a failover
    /// list), every `host:port` in order, as the client tries them.
    fn render(&self) -> String {
        let user = self.config.get_user().unwrap_or_default();
        let ports = self.config.get_ports();
        let hosts: Vec<String> = self
            .config
            .get_hosts()
            .iter()
            .enumerate()
            .map(|(i, h)| {
                let host = match h {
                    postgres::config::Host::Tcp(h) => h.clone(),
                    postgres::config::Host::Unix(p) => p.display().to_string(),
                };
                // One port for every host, or one per host, as the client reads them.
                let port = ports.get(i).or(ports.first()).copied().unwrap_or(5432);
                format!("{host}:{port}")
            })
            .collect();
        format!("postgres://{user}@{}/{}", hosts.join(","), self.dbname())
    }

    /// The first host, as written.
    pub fn host(&self) -> String {
        match self.config.get_hosts().first() {
            Some(postgres::config::Host::Tcp(h)) => h.clone(),
            Some(postgres::config::Host::Unix(p)) => p.display().to_string(),
            None => String::new(),
        }
    }

    pub fn port(&self) -> u16 {
        self.config.get_ports().first().copied().unwrap_or(5432)
    }

    pub fn user(&self) -> &str {
        self.config.get_user().unwrap_or_default()
    }

    pub fn dbname(&self) -> &str {
        self.config.get_dbname().unwrap_or_else(|| self.user())
    }

    /// The only text of the target turnsafe ever shows.
    pub fn display(&self) -> &str {
        &self.display
    }

    /// A password was written in the URL (the command line shows it to
    /// every user of the machine, `ps` included).
    pub fn has_password_in_url(&self) -> bool {
        self.password_in_url
    }

    pub fn tls(&self) -> TlsMode {
        self.tls
    }

    pub fn root_cert(&self) -> Option<&Path> {
        self.root_cert.as_deref()
    }

    pub(crate) fn config(&self) -> &postgres::Config {
        &self.config
    }

    /// Why a writer must not use this target: `target_session_attrs=read-only`
    /// connects only to servers that refuse writes, so every batch would be
    /// refused (`read_only`) and diverted. `None` for a target a writer can use.
    pub fn writer_refusal(&self) -> Option<&'static str> {
        matches!(
            self.config.get_target_session_attrs(),
            postgres::config::TargetSessionAttrs::ReadOnly
        )
        .then_some(
            "target_session_attrs=read-only connects only to servers that refuse writes, so every batch \
             would be diverted; a writer needs `read-write` (or `any`, the default)",
        )
    }
}

/// The password a libpq-style password file gives this target, if any:
/// `PGPASSFILE`, else `~/.pgpass`; lines `host:port:db:user:password`
/// with `*` for any and `\` escaping `:` and `\`. As libpq does, a file
/// that group or others may read is ignored.
fn password_file_entry(url: &DbUrl) -> Option<String> {
    use std::os::unix::fs::PermissionsExt;
    let path = std::env::var_os("PGPASSFILE")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".pgpass")))?;
    let meta = std::fs::metadata(&path).ok()?;
    if !meta.is_file() {
        return None;
    }
    if meta.permissions().mode() & 0o077 != 0 {
        tracing::warn!(
            file = %path.display(),
            "password file ignored: group or others may read it (chmod 0600)"
        );
        return None;
    }
    let text = std::fs::read_to_string(&path).ok()?;
    let want = [
        url.host(),
        url.port().to_string(),
        url.dbname().to_string(),
        url.user().to_string(),
    ];
    text.lines()
        .filter(|l| !l.trim_start().starts_with('#') && !l.trim().is_empty())
        .find_map(|line| {
            let fields = split_pgpass(line);
            if fields.len() != 5 {
                return None;
            }
            let matches = fields[..4]
                .iter()
                .zip(&want)
                .all(|(f, w)| f == "*" || f == w || (w == "localhost" && f == "127.0.0.1"));
            matches.then(|| fields[4].clone())
        })
}

fn split_pgpass(line: &str) -> Vec<String> {
    let mut fields = vec![String::new()];
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => {
                if let Some(n) = chars.next()
                    && let Some(last) = fields.last_mut()
                {
                    last.push(n);
                }
            }
            ':' if fields.len() < 5 => fields.push(String::new()),
            c => {
                if let Some(last) = fields.last_mut() {
                    last.push(c);
                }
            }
        }
    }
    fields
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_read_only_target_is_refused_for_writers_only() {
        let ro: DbUrl = "postgres://w@db:5432/app?target_session_attrs=read-only"
            .parse()
            .unwrap();
        assert!(ro.writer_refusal().is_some_and(|why| why.contains("read-write")));
        for ok in [
            "postgres://w@db:5432/app?target_session_attrs=read-write",
            "postgres://w@db:5432/app?target_session_attrs=any",
            "postgres://w@db:5432/app",
        ] {
            let url: DbUrl = ok.parse().unwrap();
            assert_eq!(url.writer_refusal(), None, "{ok}");
        }
    }

    #[test]
    fn a_failover_list_shows_every_host_and_never_the_password() {
        let u: DbUrl = "postgres://w:secret@10.0.0.1:5433,10.0.0.2:5434/app?target_session_attrs=read-write"
            .parse()
            .unwrap();
        assert_eq!(u.display(), "postgres://w@10.0.0.1:5433,10.0.0.2:5434/app");
        // A host without a port gets the default, as the client reads it.
        let mixed: DbUrl = "postgres://w@a,b:6000/app".parse().unwrap();
        assert_eq!(mixed.display(), "postgres://w@a:5432,b:6000/app");
        let kv: DbUrl = "host=a,b port=7000 user=w dbname=app".parse().unwrap();
        assert_eq!(kv.display(), "postgres://w@a:7000,b:7000/app");
    }

    #[test]
    fn the_display_form_has_no_password_and_no_parameters() {
        let u: DbUrl = "postgres://alice:s3cret@db.example:6543/app?sslmode=disable&application_name=x"
            .parse()
            .unwrap();
        assert_eq!(u.display(), "postgres://alice@db.example:6543/app");
        assert!(u.has_password_in_url());
        assert_eq!(u.tls(), TlsMode::Disable);
        assert!(!format!("{u:?}").contains("s3cret"));
    }

    #[test]
    fn sslmode_defaults_to_require_and_prefer_is_refused() {
        let u: DbUrl = "postgres://a@h/db".parse().unwrap();
        assert_eq!(u.tls(), TlsMode::Require);
        assert_eq!(u.display(), "postgres://a@h:5432/db");
        for m in ["prefer", "allow"] {
            let e = format!("postgres://a@h/db?sslmode={m}").parse::<DbUrl>().unwrap_err();
            assert_eq!(e, UrlError::SslModeRefused(m.into()));
        }
        assert!(matches!(
            "postgres://a@h/db?sslmode=verify-full".parse::<DbUrl>(),
            Err(UrlError::SslModeUnknown(_))
        ));
        let kv: DbUrl = "host=h port=7 user=u dbname=d sslmode=disable".parse().unwrap();
        assert_eq!(kv.display(), "postgres://u@h:7/d");
        assert!(matches!(
            "host=h user=u sslmode=prefer".parse::<DbUrl>(),
            Err(UrlError::SslModeRefused(_))
        ));
    }

    #[test]
    fn sslrootcert_is_taken_out_of_the_url() {
        let u: DbUrl = "postgres://a@h/db?sslmode=require&sslrootcert=%2Ftmp%2Fca.pem"
            .parse()
            .unwrap();
        assert_eq!(u.root_cert(), Some(Path::new("/tmp/ca.pem")));
    }

    #[test]
    fn pgpass_lines_split_with_escapes() {
        assert_eq!(
            split_pgpass(r"h:5432:*:u:p\:w\\d"),
            vec!["h", "5432", "*", "u", r"p:w\d"]
        );
    }
}
