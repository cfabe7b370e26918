//! Which store a command uses: `--db URL`, else `TURNSAFE_DB`, else the
//! SQLite store under `--home`.

use std::path::{Path, PathBuf};

use crate::pg::url::{DbUrl, UrlError};

/// The environment variable that names a PostgreSQL target.
pub const ENV: &str = "TURNSAFE_DB";

/// The store a command was pointed at.
#[derive(Debug, Clone)]
pub enum DbChoice {
    /// `<home>/state.db`.
    Sqlite(PathBuf),
    Postgres(Box<DbUrl>),
}

#[derive(Debug, thiserror::Error)]
pub enum TargetError {
    #[error("--db: {0}")]
    Flag(UrlError),
    #[error("{ENV}: {0}")]
    Env(UrlError),
    #[error("no store given: pass --home DIR (SQLite), or --db URL or {ENV} (PostgreSQL)")]
    Nothing,
}

impl DbChoice {
    /// Resolve `--db` / `TURNSAFE_DB` / `--home`. A password written in
    /// `--db` draws a warning: the command line is visible to every user
    /// of the machine.
    pub fn resolve(flag: Option<&str>, home: Option<&Path>) -> Result<DbChoice, TargetError> {
        if let Some(raw) = flag.filter(|s| !s.trim().is_empty()) {
            let url: DbUrl = raw.parse().map_err(TargetError::Flag)?;
            if url.has_password_in_url() {
                eprintln!(
                    "warning: --db carries a password, which other users of this machine can read (ps, shell \
                     history). Put the URL in {ENV} instead, or keep the password in a libpq-style password \
                     file (~/.pgpass or PGPASSFILE, mode 0600: host:port:database:user:password)."
                );
                tracing::warn!(target_db = url.display(), "password given on the command line");
            }
            return Ok(DbChoice::Postgres(Box::new(url)));
        }
        if let Some(raw) = std::env::var(ENV).ok().filter(|s| !s.trim().is_empty()) {
            return raw
                .parse()
                .map(|u| DbChoice::Postgres(Box::new(u)))
                .map_err(TargetError::Env);
        }
        match home {
            Some(h) => Ok(DbChoice::Sqlite(h.join("state.db"))),
            None => Err(TargetError::Nothing),
        }
    }
}
