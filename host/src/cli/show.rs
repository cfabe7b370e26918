//! `turnsafe show`: a session's stored transcript in `seq` order.

use std::path::PathBuf;

use rusqlite::{Connection, OpenFlags};
use serde_json::Value;

use crate::exit;

/// List a session's stored messages in transcript order.
///
/// With `--json`, one `{"type":"message","data":{uid, seq, role, content, ...}}` per line.
/// With `--db URL` (or `TURNSAFE_DB`) the transcript is read from PostgreSQL.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The turnsafe home holding `state.db` (not needed with `--db`).
    #[arg(long)]
    home: Option<PathBuf>,
    /// Read from PostgreSQL (default: `TURNSAFE_DB`); see `turnsafe append --help`.
    #[arg(long, value_name = "URL")]
    db: Option<String>,
    /// The session id.
    #[arg(long)]
    session: String,
    /// JSON Lines output in the `{"type","data"}` envelope.
    #[arg(long)]
    json: bool,
}

pub fn run(args: Args) -> i32 {
    let db = match crate::backend::DbChoice::resolve(args.db.as_deref(), args.home.as_deref()) {
        Ok(crate::backend::DbChoice::Sqlite(path)) => path,
        Ok(crate::backend::DbChoice::Postgres(url)) => {
            use crate::backend::Backend;
            let mut pg = crate::pg::Postgres::new(*url, crate::pg::PgOptions::default());
            return match pg.transcript(&args.session) {
                Ok(messages) => print(messages, args.json),
                Err(e) => {
                    eprintln!("error: {e}");
                    exit::FAILURE
                }
            };
        }
        Err(e) => {
            eprintln!("error: {e}");
            return exit::USAGE;
        }
    };
    if !db.is_file() {
        eprintln!("error: no turnsafe store at {}", db.display());
        return exit::FAILURE;
    }
    if let Some(code) = super::refuse_newer_schema(&db) {
        return code;
    }
    let conn =
        match Connection::open_with_flags(&db, OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX) {
            Ok(c) => c,
            Err(e) => {
                eprintln!("error: opening {}: {e}", db.display());
                return exit::FAILURE;
            }
        };
    let messages = match crate::store::transcript(&conn, &args.session) {
        Ok(m) => m,
        Err(e) => {
            eprintln!("error: reading {}: {e}", db.display());
            return exit::FAILURE;
        }
    };
    print(messages, args.json)
}

fn print(messages: Vec<Value>, json: bool) -> i32 {
    for m in messages {
        let line = if json {
            super::envelope("message", m)
        } else {
            let content = match &m["content"] {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            };
            format!(
                "{:>6}  {:<10} {}",
                m["seq"],
                m["role"].as_str().unwrap_or_default(),
                content
            )
        };
        if !super::emit(&line) {
            break;
        }
    }
    exit::OK
}
