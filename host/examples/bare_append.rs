//! The floor for `turnsafe append`: the same rows into the same tables with
//! the same pragmas (WAL, `synchronous=FULL`), one `BEGIN IMMEDIATE`
//! transaction per batch, and nothing else (no guard, no lease, no seq
//! lookup, no failure handling). Same protocol as `turnsafe append`: one
//! JSON array of messages per stdin line, one JSON line per batch out.
//! Used by `benches/append-vs-sqlitesession`.
//!
//! `bare_append HOME SESSION`

use std::io::{BufRead, Write};

use rusqlite::{Connection, params};
use turnsafe_host::message::Message;
use turnsafe_host::store::schema;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let (Some(home), Some(session)) = (args.next(), args.next()) else {
        return Err("usage: bare_append HOME SESSION".into());
    };
    std::fs::create_dir_all(&home)?;
    let conn = Connection::open(std::path::Path::new(&home).join("state.db"))?;
    conn.busy_timeout(std::time::Duration::from_millis(10))?;
    conn.pragma_update(None, "foreign_keys", "ON")?;
    schema::migrate(&conn, 1)?;
    conn.query_row("PRAGMA journal_mode = WAL", [], |r| r.get::<_, String>(0))?;
    conn.pragma_update(None, "synchronous", "FULL")?;
    let now = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as i64)
    };
    conn.execute(
        "INSERT OR IGNORE INTO sessions(id, created_ms) VALUES (?1, ?2)",
        params![session, now()],
    )?;
    let mut seq: i64 = conn.query_row(
        "SELECT COALESCE(MAX(seq), 0) FROM messages WHERE session_id = ?1",
        [&session],
        |r| r.get(0),
    )?;
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    for line in std::io::stdin().lock().lines() {
        let line = line?;
        if line.trim().is_empty() {
            continue;
        }
        let batch = Message::batch_from_json(&line)?;
        conn.execute_batch("BEGIN IMMEDIATE")?;
        {
            let mut insert = conn.prepare_cached(
                "INSERT INTO messages(session_id, uid, seq, role, content, item, created_ms) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
            )?;
            let created = now();
            for m in &batch {
                seq += 1;
                let uid = m.uid.clone().unwrap_or_else(turnsafe_host::ids::mint);
                insert.execute(params![
                    session,
                    uid,
                    seq,
                    m.role(),
                    m.content_text(),
                    m.item_text(),
                    created
                ])?;
            }
        }
        conn.execute_batch("COMMIT")?;
        writeln!(out, "{{\"persisted\":true,\"committed\":{}}}", batch.len())?;
        out.flush()?;
    }
    Ok(())
}
