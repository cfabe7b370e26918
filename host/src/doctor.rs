//! `doctor`: what is wrong with a turnsafe home, and what to do about it.

use std::path::{Path, PathBuf};

use rusqlite::{Connection, OpenFlags};
use serde_json::{Value, json};
use turnsafe_policy::Cause;

use crate::captures::{self, Status};
use crate::holders;

/// One finding, with the policy's remediation for its cause.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Finding {
    pub kind: &'static str,
    /// `ok`, `warning` or `error`.
    pub severity: &'static str,
    pub message: String,
    pub cause: Option<&'static str>,
    pub remediation: Vec<String>,
}

fn finding(kind: &'static str, severity: &'static str, message: String, cause: Option<Cause>) -> Finding {
    // The policy's own words for the cause.
    let remediation = cause.map(turnsafe_policy::cause_remediation).unwrap_or_default();
    Finding {
        kind,
        severity,
        message,
        cause: cause.map(|c| c.label()),
        remediation,
    }
}

/// The findings and facts about `home` in one object, as `turnsafe doctor
/// --json` prints them record by record: `ok` (no finding is an error),
/// `findings` and `facts`.
pub fn report(home: &Path) -> Value {
    let (findings, facts) = examine(home, false);
    let ok = !findings.iter().any(|f| f.severity == "error");
    json!({ "ok": ok, "findings": findings, "facts": facts })
}

/// The same for a PostgreSQL store, and the divert folder under `home`.
pub fn report_postgres(url: &crate::pg::DbUrl, home: Option<&Path>) -> Value {
    let (findings, facts) = examine_postgres(url, home);
    let ok = !findings.iter().any(|f| f.severity == "error");
    json!({ "ok": ok, "findings": findings, "facts": facts })
}

/// Examine `home`. With `repair_fts`, rebuild a degraded index when no
/// other process holds the database.
pub fn examine(home: &Path, repair_fts: bool) -> (Vec<Finding>, Value) {
    let db = home.join("state.db");
    let mut out = Vec::new();
    let mut facts = serde_json::Map::new();

    // A state.db that is a symbolic link is written through: say where.
    if let Ok(target) = std::fs::read_link(&db) {
        out.push(finding(
            "state_db_link",
            "warning",
            format!(
                "{} is a symbolic link to {}: turnsafe writes the file it points to, and its -wal and -shm \
                 beside that file; a writer keeps writing the file it opened even when the link is pointed \
                 elsewhere, so point it only while no process holds the database",
                db.display(),
                target.display()
            ),
            None,
        ));
    }
    let files = holders::db_files(&db);
    let held = holders::scan(&files, true).unwrap_or_default();
    facts.insert("holders".into(), json!(held.by_pid));
    if held.is_empty() {
        out.push(finding(
            "holders",
            "ok",
            "no process holds state.db or its sidecars".into(),
            None,
        ));
    } else {
        let deleted: Vec<u32> = held
            .by_pid
            .iter()
            .filter(|(_, f)| f.iter().any(|p| p.ends_with(" (deleted)")))
            .map(|(p, _)| *p)
            .collect();
        out.push(finding(
            "holders",
            "ok",
            format!("held open by pid(s) {:?}", held.pids()),
            None,
        ));
        if !deleted.is_empty() {
            let mut f = finding(
                "holders",
                "error",
                format!(
                    "pid(s) {deleted:?} still write to a deleted state.db file or sidecar: their commits will be lost"
                ),
                Some(Cause::DeletedWal),
            );
            // The retired frames live only in those descriptors: copy them
            // out before anything stops those processes.
            f.remediation.clear();
            for pid in &deleted {
                let fds: Vec<&String> = held.by_pid.get(pid).map(|v| v.iter().collect()).unwrap_or_default();
                f.remediation.push(format!(
                    "Before stopping pid {pid} (it holds {}), copy the generation it holds: \
                     `turnsafe capture --pid {pid} --home {}`.",
                    fds.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(", "),
                    home.display()
                ));
            }
            f.remediation
                .push("Then stop those processes; the next writer opens the database at the path.".into());
            out.push(f);
        }
    }
    if !held.unreadable.is_empty() {
        out.push(finding(
            "holders",
            "warning",
            format!("cannot read the descriptors of pid(s) {:?}", held.unreadable),
            None,
        ));
    }

    captures(home, &mut out, &mut facts);
    diverts(home, &mut out, &mut facts);

    // fd limit and free space.
    let lim = rustix::process::getrlimit(rustix::process::Resource::Nofile);
    let in_use = std::fs::read_dir("/proc/self/fd").map(|d| d.count()).unwrap_or(0);
    facts.insert(
        "fd_limit".into(),
        json!({ "soft": lim.current, "hard": lim.maximum, "in_use": in_use }),
    );
    if lim.current.is_some_and(|c| c < 256) {
        out.push(finding(
            "fd_limit",
            "warning",
            format!("open-file limit is only {:?}", lim.current),
            Some(Cause::Disk),
        ));
    }
    if let Ok(st) = rustix::fs::statvfs(home) {
        let free = st.f_bavail * st.f_frsize;
        facts.insert("free_bytes".into(), free.into());
        if free < 64 * 1024 * 1024 {
            out.push(finding(
                "free_space",
                "error",
                format!("only {free} bytes free"),
                Some(Cause::DiskFull),
            ));
        }
    }

    // Integrity: on a copy when someone holds the db, in place (read-only) otherwise.
    if db.is_file() {
        let check = if held.is_empty() {
            quick_check(&db).map_err(|e| e.to_string())
        } else {
            quick_check_copy(&db)
        };
        match check {
            Ok(result) if result == ["ok"] => out.push(finding("integrity", "ok", "quick_check: ok".into(), None)),
            Ok(result) => out.push(finding(
                "integrity",
                "error",
                format!("quick_check: {}", result.join("; ")),
                Some(Cause::Corrupt),
            )),
            Err(e) => out.push(finding(
                "integrity",
                "error",
                format!("cannot check: {e}"),
                Some(Cause::Corrupt),
            )),
        }
        if let Ok(c) = Connection::open_with_flags(&db, OpenFlags::SQLITE_OPEN_READ_ONLY)
            && let Ok(sizes) = session_sizes(&c)
        {
            facts.insert("archived_share".into(), sizes.1.into());
            facts.insert("session_sizes".into(), sizes.0);
        }
        // LangGraph's state, live and marked deleted (a database before
        // version 6 has none).
        if let Ok(c) = Connection::open_with_flags(&db, OpenFlags::SQLITE_OPEN_READ_ONLY)
            && let Ok((checkpoints, writes, deleted_checkpoints, deleted_writes)) = crate::store::graph::counts(&c)
        {
            facts.insert(
                "langgraph".into(),
                json!({
                    "checkpoints": checkpoints,
                    "writes": writes,
                    "deleted_checkpoints": deleted_checkpoints,
                    "deleted_writes": deleted_writes,
                }),
            );
        }
        let degraded = Connection::open_with_flags(&db, OpenFlags::SQLITE_OPEN_READ_ONLY)
            .and_then(|c| crate::store::schema::fts_enabled(&c))
            .is_ok_and(|on| !on);
        if degraded {
            if repair_fts && held.is_empty() {
                match rebuild_fts(&db) {
                    Ok(()) => out.push(finding("fts", "ok", "search index rebuilt".into(), None)),
                    Err(e) => out.push(finding(
                        "fts",
                        "error",
                        format!("rebuild failed: {e}"),
                        Some(Cause::FtsIndex),
                    )),
                }
            } else if repair_fts {
                out.push(finding(
                    "fts",
                    "warning",
                    "search index degraded; not rebuilt while a writer holds the db".into(),
                    Some(Cause::FtsIndex),
                ));
            } else {
                out.push(finding(
                    "fts",
                    "warning",
                    "search index degraded (messages are intact)".into(),
                    Some(Cause::FtsIndex),
                ));
            }
        }
    } else {
        out.push(finding(
            "integrity",
            "warning",
            format!("no database at {}", db.display()),
            None,
        ));
    }
    (out, Value::Object(facts))
}

/// Examine a PostgreSQL store, and the home's diverts and captures when a
/// home is given. The store is named only as `postgres://user@host:port/db`.
pub fn examine_postgres(url: &crate::pg::DbUrl, home: Option<&Path>) -> (Vec<Finding>, Value) {
    let mut out = Vec::new();
    let mut facts = serde_json::Map::new();
    facts.insert("db".into(), json!(url.display()));
    match crate::pg::inspect(url) {
        Ok(state) => {
            out.push(finding(
                "postgres",
                "ok",
                format!(
                    "{} is reachable; schema version {}; {} message(s) in {} session(s)",
                    url.display(),
                    state.schema_version,
                    state.messages,
                    state.sessions
                ),
                None,
            ));
            if state.schema_version > crate::pg::schema::VERSION {
                out.push(finding(
                    "postgres",
                    "error",
                    format!(
                        "schema version {} is newer than this turnsafe knows ({})",
                        state.schema_version,
                        crate::pg::schema::VERSION
                    ),
                    None,
                ));
            }
            if state.read_only {
                out.push(finding(
                    "postgres",
                    "error",
                    format!(
                        "{} accepts no writes (read-only transactions, a standby): batches wait for a \
                         primary within the policy's patience, then are diverted",
                        url.display()
                    ),
                    Some(Cause::ReadOnly),
                ));
            }
            if !state.read_only && !state.synchronous_replication() {
                out.push(finding(
                    "replication",
                    "warning",
                    format!(
                        "synchronous replication is off (synchronous_standby_names '{}', synchronous_commit {}, \
                         {} standby(s) in sync): an acknowledged batch is on this server only, so the promise \
                         that nothing acknowledged is lost rests on one server",
                        state.synchronous_standby_names, state.synchronous_commit, state.sync_standbys
                    ),
                    None,
                ));
            }
            if state.unindexed > 0 {
                out.push(finding(
                    "search_index",
                    "ok",
                    format!(
                        "{} message(s) not in the search index yet; `turnsafe search` indexes them first",
                        state.unindexed
                    ),
                    None,
                ));
            }
            facts.insert("schema_version".into(), state.schema_version.into());
            facts.insert("messages".into(), state.messages.into());
            facts.insert("sessions".into(), state.sessions.into());
            facts.insert("live_leases".into(), state.live_leases.into());
            facts.insert("unindexed".into(), state.unindexed.into());
            facts.insert("read_only".into(), state.read_only.into());
            facts.insert("synchronous_replication".into(), state.synchronous_replication().into());
            if let Some((checkpoints, writes, deleted_checkpoints, deleted_writes)) = state.langgraph {
                facts.insert(
                    "langgraph".into(),
                    json!({
                        "checkpoints": checkpoints,
                        "writes": writes,
                        "deleted_checkpoints": deleted_checkpoints,
                        "deleted_writes": deleted_writes,
                    }),
                );
            }
        }
        Err(e) => out.push(match &e {
            // The server and the URL disagree on TLS: configuration, not a
            // server away; the policy's words for it, as the copy has them.
            crate::pg::connect::ConnectError::Postgres(pe) if let Some(tls) = crate::pg::connect::tls_failure(pe) => {
                Finding {
                    kind: "tls",
                    severity: "error",
                    message: format!(
                        "cannot use {}: the TLS handshake failed: {} ({})",
                        url.display(),
                        tls.text(),
                        crate::pg::translate::chain_text(pe)
                    ),
                    cause: Some(Cause::Disk.label()),
                    remediation: vec![turnsafe_policy::TLS_REMEDIATION.to_string()],
                }
            }
            _ => finding(
                "postgres",
                "error",
                format!("cannot use {}: {e}", url.display()),
                Some(Cause::Unavailable),
            ),
        }),
    }
    if let Some(home) = home {
        captures(home, &mut out, &mut facts);
        diverts(home, &mut out, &mut facts);
    }
    (out, Value::Object(facts))
}

/// Capture folders: a pending one is an error (its rows may be in no
/// database, and replay waits on it); a settled one is reported as such.
fn captures(home: &Path, out: &mut Vec<Finding>, facts: &mut serde_json::Map<String, Value>) {
    let found = match captures::list(home) {
        Ok(found) => found,
        Err(e) => {
            out.push(finding(
                "captures",
                "error",
                format!("cannot list capture folders in {}: {e}", home.display()),
                None,
            ));
            return;
        }
    };
    let (mut pending, mut settled) = (Vec::new(), Vec::new());
    for c in &found {
        match &c.status {
            Status::Settled(m) => {
                let mut message = format!("{} is settled: {} at {}", c.name, m.how.label(), m.settled_at);
                if m.how == captures::How::Installed {
                    message.push_str(&format!(", {} row(s) carried over", m.carried_over));
                }
                out.push(finding("captures", "ok", message, None));
                settled.push(json!({ "name": c.name, "how": m.how, "settled_at": m.settled_at,
                                     "carried_over": m.carried_over }));
            }
            Status::Pending | Status::Unreadable(_) => {
                let why = match &c.status {
                    Status::Unreadable(why) => format!(" ({why})"),
                    _ => String::new(),
                };
                // The cause is the one its manifest records, never assumed.
                let manifest = c.manifest();
                let cause = manifest.as_ref().map(|m| m.cause()).unwrap_or(Cause::Unknown);
                let made_by = match &manifest {
                    Ok(_) => format!("captured for cause {}", cause.label()),
                    Err(e) => format!("its manifest cannot be read ({e})"),
                };
                let holds = match manifest.as_ref().map(|m| m.missing_rows.as_ref()) {
                    Ok(Some(by)) if by.values().all(|n| *n == 0) => {
                        "it holds no row the database lacks, so it stops no session's history".to_string()
                    }
                    Ok(Some(by)) => {
                        let list: Vec<String> = by
                            .iter()
                            .filter(|(_, n)| **n > 0)
                            .map(|(s, n)| format!("{s} ({n} row(s))"))
                            .collect();
                        format!(
                            "it holds rows the database lacks of session(s) {}: their batches are diverted and \
                             their history reads as incomplete until it is settled",
                            list.join(", ")
                        )
                    }
                    _ => "what it holds is not known, so it stops every session's history until it is settled"
                        .to_string(),
                };
                let mut f = finding(
                    "captures",
                    "error",
                    format!(
                        "{} is not settled{why}: {made_by}; {holds}; replay refuses until it is settled",
                        c.name
                    ),
                    Some(cause),
                );
                // What settles a capture, not what the cause asked of the
                // writer when it happened.
                f.remediation.clear();
                let path = c.path.display();
                f.remediation.push(format!(
                    "See what it holds: `turnsafe recover --source {path} --inspect-only`."
                ));
                f.remediation.push(format!(
                    "Install a database rebuilt from it (rows the current state.db has and it lacks are carried over): \
                     `turnsafe recover --source {path} --output <new.db> --install --home {}`.",
                    home.display()
                ));
                f.remediation.push(format!(
                    "Or, if its frames do not matter: `turnsafe recover --source {path} --dismiss`."
                ));
                out.push(f);
                pending.push(c.name.clone());
            }
        }
    }
    let names: Vec<&str> = found.iter().map(|c| c.name.as_str()).collect();
    facts.insert("captures".into(), json!(names));
    facts.insert("pending_captures".into(), json!(pending));
    facts.insert("settled_captures".into(), json!(settled));
}

/// How many ledger lines each settlement state has. A line that is not
/// JSON (or not UTF-8) counts under no state, and hides no other line.
fn ledger_states(path: &Path) -> std::collections::BTreeMap<String, u64> {
    let mut out = std::collections::BTreeMap::new();
    // Line by line, with a bound: memory stays flat whatever the file
    // holds, and a FIFO in its place is not waited on.
    let _ = crate::lines::each_line_of(path, crate::lines::MAX_DIVERT_LINE, |line, fits| {
        if fits == crate::lines::Line::Whole
            && let Ok(v) = crate::json_in::value_bytes(line)
            && let Some(state) = v.get("state").and_then(Value::as_str)
        {
            *out.entry(state.to_string()).or_insert(0) += 1;
        }
    });
    out
}

/// Pending diverts (turnsafe's files in `sessions/` and `settling/`),
/// quarantined lines, and the files in `sessions/` that are not turnsafe's.
fn diverts(home: &Path, out: &mut Vec<Finding>, facts: &mut serde_json::Map<String, Value>) {
    let sessions = home.join("sessions");
    let listing = match crate::divert_files::list(&sessions, None) {
        Ok(l) => l,
        Err(e) => {
            out.push(finding(
                "pending_diverts",
                "error",
                format!("cannot list {}: {e}", sessions.display()),
                None,
            ));
            Default::default()
        }
    };
    let mut pending: Vec<PathBuf> = listing.divert.into_iter().map(|(_, p)| p).collect();
    if let Ok(rd) = std::fs::read_dir(sessions.join("settling")) {
        pending.extend(
            rd.flatten()
                .map(|e| e.path())
                .filter(|p| p.extension().is_some_and(|x| x == "jsonl")),
        );
    }
    let files_n = pending.len() as u64;
    let bytes: u64 = pending
        .iter()
        .map(|p| std::fs::metadata(p).map(|m| m.len()).unwrap_or(0))
        .sum();
    let states = ledger_states(&sessions.join(crate::divert_files::LEDGER));
    let state = |s: &str| states.get(s).copied().unwrap_or(0);
    let (conflict, superseded) = (state("conflict"), state("superseded"));
    // Every line set aside for a person: unreadable ones and conflicts.
    let quarantined = state("quarantined") + conflict;
    // Pending lines by kind: messages, and LangGraph checkpoints and writes.
    let (mut messages, mut checkpoints, mut writes) = (0u64, 0u64, 0u64);
    for p in &pending {
        // Bytes, line by line: one line that is not UTF-8 hides no other,
        // one past the bound is read past, and only a regular file is read.
        let _ = crate::lines::each_line_of(p, crate::lines::MAX_DIVERT_LINE, |line, fits| {
            if fits == crate::lines::Line::Whole
                && let Ok(v) = crate::json_in::value_bytes(line)
            {
                match v.get("kind").and_then(Value::as_str) {
                    Some("checkpoint") => checkpoints += 1,
                    Some("write") => writes += 1,
                    _ if v.get("message").is_some() => messages += 1,
                    _ => {}
                }
            }
        });
    }
    facts.insert(
        "pending_divert_lines".into(),
        json!({"message": messages, "checkpoint": checkpoints, "write": writes}),
    );
    facts.insert("pending_divert_files".into(), files_n.into());
    facts.insert("pending_divert_bytes".into(), bytes.into());
    facts.insert("quarantined_lines".into(), quarantined.into());
    facts.insert("conflict_lines".into(), conflict.into());
    facts.insert("superseded_lines".into(), superseded.into());
    facts.insert("foreign_files".into(), json!(listing.foreign));
    if files_n > 0 {
        out.push(finding(
            "pending_diverts",
            "warning",
            format!(
                "{files_n} diverted file(s), {bytes} bytes ({messages} message(s), {checkpoints} LangGraph \
                 checkpoint(s), {writes} write(s)), wait for `turnsafe replay`"
            ),
            Some(Cause::Disk),
        ));
    }
    if quarantined > 0 {
        out.push(finding(
            "quarantine",
            "warning",
            format!(
                "{quarantined} diverted line(s) quarantined ({conflict} conflict(s): a key stored with other \
                 bytes); see sessions/ledger.jsonl"
            ),
            None,
        ));
    }
    if superseded > 0 {
        out.push(finding(
            "superseded",
            "ok",
            format!(
                "{superseded} diverted LangGraph line(s) superseded by a newer stored version; their bytes stay in \
                 sessions/settled/"
            ),
            None,
        ));
    }
    if !listing.other_owner.is_empty() {
        let named: Vec<String> = listing
            .other_owner
            .iter()
            .map(|(name, uid)| format!("{name} (uid {uid})"))
            .collect();
        out.push(finding(
            "other_owner",
            "warning",
            format!(
                "{} file(s) in sessions/ belong to another user and are never replayed or appended to: {}",
                named.len(),
                named.join(", ")
            ),
            None,
        ));
    }
    if !listing.foreign.is_empty() {
        out.push(finding(
            "foreign_files",
            "ok",
            format!(
                "{} file(s) in sessions/ are not turnsafe's and are left alone: {}",
                listing.foreign.len(),
                listing.foreign.join(", ")
            ),
            None,
        ));
    }
}

fn quick_check(db: &Path) -> rusqlite::Result<Vec<String>> {
    let c = Connection::open_with_flags(db, OpenFlags::SQLITE_OPEN_READ_ONLY)?;
    let mut s = c.prepare("PRAGMA quick_check")?;
    s.query_map([], |r| r.get(0))?.collect()
}

fn quick_check_copy(db: &Path) -> Result<Vec<String>, String> {
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    crate::db_copy::copy_source(db, dir.path()).map_err(|e| e.to_string())?;
    quick_check(&dir.path().join("state.db")).map_err(|e| e.to_string())
}

fn rebuild_fts(db: &Path) -> rusqlite::Result<()> {
    let c = Connection::open(db)?;
    c.busy_timeout(std::time::Duration::from_secs(5))?;
    crate::store::schema::rebuild_fts(&c)
}

/// Per session: bytes and rows stored and archived (the messages' JSON
/// text), and the archived share of all bytes (0 when nothing is stored).
fn session_sizes(c: &Connection) -> rusqlite::Result<(Value, f64)> {
    let has_archive: bool = c.query_row(
        "SELECT EXISTS (SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'archive')",
        [],
        |r| r.get(0),
    )?;
    let archive = if has_archive {
        "SELECT session_id, 0, 0, COALESCE(SUM(length(item)), 0), count(*) FROM archive GROUP BY session_id"
    } else {
        "SELECT NULL, 0, 0, 0, 0 WHERE 0"
    };
    let sql = format!(
        "SELECT s, SUM(b), SUM(n), SUM(ab), SUM(an) FROM ( \
           SELECT session_id AS s, COALESCE(SUM(length(item)), 0) AS b, count(*) AS n, 0 AS ab, 0 AS an \
           FROM messages GROUP BY session_id UNION ALL {archive}) GROUP BY s ORDER BY SUM(b) + SUM(ab) DESC"
    );
    let mut stmt = c.prepare(&sql)?;
    let mut total = (0i64, 0i64);
    let rows: Vec<Value> = stmt
        .query_map([], |r| {
            Ok((
                r.get::<_, String>(0)?,
                r.get::<_, i64>(1)?,
                r.get::<_, i64>(2)?,
                r.get::<_, i64>(3)?,
                r.get::<_, i64>(4)?,
            ))
        })?
        .filter_map(Result::ok)
        .map(|(s, b, n, ab, an)| {
            total.0 += b;
            total.1 += ab;
            json!({"session": s, "bytes": b, "messages": n, "archived_bytes": ab, "archived_messages": an})
        })
        .collect();
    let share = if total.0 + total.1 > 0 {
        total.1 as f64 / (total.0 + total.1) as f64
    } else {
        0.0
    };
    Ok((Value::Array(rows), share))
}
