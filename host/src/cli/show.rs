//! `turnsafe show`: a session's stored transcript in `seq` order.

use std::path::PathBuf;

use rusqlite::{Connection, OpenFlags};
use serde_json::Value;

use crate::exit;

/// List a session's stored messages in transcript order.
///
/// With `--json`, one `{"type":"message","data":{"uid", "seq", "message"}}`
/// per line: `message` is the object exactly as it was written (any shape:
/// a tool call or a reasoning item has no `role`), its uid and seq beside it;
/// the last line is `{"type":"end","data":{"complete", "pending_captures"}}`.
///
/// While an unsettled capture (`state.db.retired-*/`) holds rows of the
/// session that the database lacks, the transcript is not complete: the
/// rows are still printed, the end line says `"complete": false` and names
/// each capture (`path`, `cause`, `rows`), stderr says so, and the exit
/// code is 7. Settle the capture (`turnsafe recover`) to make it whole.
/// Without, one line per message: seq, role (or `type`), and the text of
/// its content (or the object).
/// With `--db URL` (or `TURNSAFE_DB`) the transcript is read from PostgreSQL.
///
/// A fork's lineage is printed: in the end line as `"forked_from":
/// {"session", "seq"}` (null otherwise), and without `--json` as a first
/// line. With `--archived`, the session's archived rows instead, newest
/// archived first: `{"type":"archived","data":{"uid", "seq", "message",
/// "archived_at", "reason"}}` per row, then `{"type":"end","data":{"archived"}}`.
///
/// With `--thread ID` instead of `--session`, a LangGraph thread's
/// checkpoints (every namespace), newest first, with LangGraph's field
/// names: `{"type":"checkpoint","data":{"thread_id", "checkpoint_ns",
/// "checkpoint_id", "parent_checkpoint_id", "type", "checkpoint",
/// "metadata", "created_ms", "pending_writes"}}` per checkpoint (blobs as
/// base64; each pending write `{"task_id", "task_path", "idx", "channel",
/// "type", "value"}`), then `{"type":"end","data":{"thread_id",
/// "checkpoints"}}`. Without `--json`, one line per checkpoint.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The turnsafe home holding `state.db` (not needed with `--db`).
    #[arg(long)]
    home: Option<PathBuf>,
    /// Read from PostgreSQL (default: `TURNSAFE_DB`); see `turnsafe append --help`.
    #[arg(long, value_name = "URL")]
    db: Option<String>,
    /// The session id.
    #[arg(long, required_unless_present = "thread", conflicts_with = "thread")]
    session: Option<String>,
    /// A LangGraph thread id (as given to the graph): list its checkpoints.
    #[arg(long, value_name = "ID", conflicts_with = "archived")]
    thread: Option<String>,
    /// JSON Lines output in the `{"type","data"}` envelope.
    #[arg(long)]
    json: bool,
    /// List the archived rows (what pop, clear, compaction, rewind and
    /// prune took out), newest archived first.
    #[arg(long)]
    archived: bool,
}

pub fn run(args: Args) -> i32 {
    if let Some(thread) = args.thread.clone() {
        return show_thread(&args, &thread);
    }
    // An id no session can have is a mistake to name, not an empty transcript.
    if let Some(s) = &args.session
        && let Err(e) = crate::ids::SessionId::new(s)
    {
        eprintln!("error: invalid --session: {e}");
        return exit::USAGE;
    }
    let session = args.session.clone().unwrap_or_default();
    let args = Args {
        session: Some(session),
        ..args
    };
    let db = match crate::target::DbChoice::resolve(args.db.as_deref(), args.home.as_deref()) {
        Ok(crate::target::DbChoice::Sqlite(path)) => path,
        Ok(crate::target::DbChoice::Postgres(url)) => {
            let mut pg = crate::pg::Postgres::new(*url, crate::pg::PgOptions::default());
            if args.archived {
                return match pg.archived(args.session.as_deref().unwrap_or_default(), None) {
                    Ok(rows) => print_archived(&rows, args.json),
                    Err(e) => {
                        eprintln!("error: {e}");
                        exit::FAILURE
                    }
                };
            }
            let lineage = pg.lineage(args.session.as_deref().unwrap_or_default());
            return match pg.transcript(args.session.as_deref().unwrap_or_default()) {
                Ok(messages) => print(
                    messages,
                    &[],
                    args.session.as_deref().unwrap_or_default(),
                    lineage.as_ref(),
                    args.json,
                ),
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
        return exit::USAGE;
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
    if args.archived {
        return match crate::store::history::archived(&conn, args.session.as_deref().unwrap_or_default(), None) {
            Ok(rows) => print_archived(&rows, args.json),
            Err(e) => {
                eprintln!("error: reading {}: {e}", db.display());
                exit::FAILURE
            }
        };
    }
    let lineage = crate::store::history::lineage(&conn, args.session.as_deref().unwrap_or_default())
        .ok()
        .flatten();
    let messages = match crate::store::transcript(&conn, args.session.as_deref().unwrap_or_default()) {
        Ok(m) => m,
        Err(e) => {
            eprintln!("error: reading {}: {e}", db.display());
            return exit::FAILURE;
        }
    };
    let holds = match super::holds_for(
        db.parent().unwrap_or(std::path::Path::new(".")),
        Some(args.session.as_deref().unwrap_or_default()),
    ) {
        Ok(h) => h,
        Err(code) => return code,
    };
    print(
        messages,
        &holds,
        args.session.as_deref().unwrap_or_default(),
        lineage.as_ref(),
        args.json,
    )
}

/// A LangGraph thread's checkpoints, newest first.
fn show_thread(args: &Args, thread: &str) -> i32 {
    let query = crate::graph::GraphQuery {
        thread_id: Some(thread.to_string()),
        ..Default::default()
    };
    let read = match crate::target::DbChoice::resolve(args.db.as_deref(), args.home.as_deref()) {
        Ok(crate::target::DbChoice::Postgres(url)) => {
            let mut pg = crate::pg::Postgres::new(*url, crate::pg::PgOptions::default());
            pg.graph_read(&query).map_err(|e| e.to_string())
        }
        Ok(crate::target::DbChoice::Sqlite(db)) => {
            if !db.is_file() {
                eprintln!("error: no turnsafe store at {}", db.display());
                return exit::USAGE;
            }
            if let Some(code) = super::refuse_newer_schema(&db) {
                return code;
            }
            Connection::open_with_flags(&db, OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX)
                .and_then(|conn| {
                    // A database before version 6 holds no checkpoint.
                    let has: bool = conn.query_row(
                        "SELECT EXISTS (SELECT 1 FROM sqlite_master WHERE name = 'checkpoints')",
                        [],
                        |r| r.get(0),
                    )?;
                    if has {
                        crate::store::graph::read(&conn, &query)
                    } else {
                        Ok(Vec::new())
                    }
                })
                .map_err(|e| format!("reading {}: {e}", db.display()))
        }
        Err(e) => {
            eprintln!("error: {e}");
            return exit::USAGE;
        }
    };
    let checkpoints = match read {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: {e}");
            return exit::FAILURE;
        }
    };
    for c in &checkpoints {
        if args.json {
            super::emit(&super::envelope("checkpoint", c.to_value()));
        } else {
            let r = &c.record;
            let meta = |k: &str| r.metadata.get(k).map_or_else(|| "-".to_string(), |v| v.to_string());
            println!(
                "{}  ns={:?}  step={}  source={}  parent={}  writes={}  {}",
                r.checkpoint_id,
                r.checkpoint_ns,
                meta("step"),
                meta("source"),
                r.parent_checkpoint_id.as_deref().unwrap_or("-"),
                c.writes.len(),
                crate::history::rfc3339(c.created_ms),
            );
        }
    }
    if args.json {
        super::emit(&super::envelope(
            "end",
            serde_json::json!({ "thread_id": thread, "checkpoints": checkpoints.len() }),
        ));
    }
    exit::OK
}

/// Archived rows, newest archived first, then how many.
fn print_archived(rows: &[crate::history::Archived], json: bool) -> i32 {
    for a in rows {
        let line = if json {
            super::envelope("archived", a.to_value())
        } else {
            let text = a
                .message
                .get("content")
                .and_then(crate::message::text_of)
                .unwrap_or_else(|| Value::Object(a.message.clone()).to_string());
            format!(
                "{:>6}  {:<10} {}  {}  {}",
                a.seq,
                a.reason,
                crate::history::rfc3339(a.archived_ms),
                a.uid,
                text
            )
        };
        if !super::emit(&line) {
            return exit::OK;
        }
    }
    if json {
        super::emit(&super::envelope("end", serde_json::json!({ "archived": rows.len() })));
    }
    exit::OK
}

/// Each message is `{"uid", "seq", "message"}` (see [`crate::transcript`]),
/// then the end of the transcript: complete, or which captures hold rows
/// it lacks.
fn print(
    messages: Vec<Value>,
    holds: &[crate::captures::Hold],
    session: &str,
    lineage: Option<&crate::history::Lineage>,
    json: bool,
) -> i32 {
    if let (Some(l), false) = (lineage, json)
        && !super::emit(&format!("(forked from {} at seq {})", l.session, l.seq))
    {
        return exit::OK;
    }
    for m in messages {
        let line = if json {
            super::envelope("message", m)
        } else {
            let message = &m["message"];
            let kind = message["role"]
                .as_str()
                .or_else(|| message["type"].as_str())
                .unwrap_or("-");
            let text = message
                .get("content")
                .and_then(crate::message::text_of)
                .unwrap_or_else(|| message.to_string());
            format!("{:>6}  {:<10} {}", m["seq"], kind, text)
        };
        if !super::emit(&line) {
            return exit::OK;
        }
    }
    if json {
        let pending: Vec<Value> = holds.iter().map(|h| h.to_value(Some(session))).collect();
        let forked_from = lineage.map_or(Value::Null, crate::history::Lineage::to_value);
        let end = serde_json::json!({
            "complete": holds.is_empty(),
            "pending_captures": pending,
            "forked_from": forked_from,
        });
        if !super::emit(&super::envelope("end", end)) {
            return exit::OK;
        }
    }
    super::incomplete(holds, Some(session))
}
