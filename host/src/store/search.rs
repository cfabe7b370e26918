//! Full-text search over the committed messages, never missing one.
//!
//! A search first brings the index up to date ([`crate::store::index`]):
//! every committed row past the watermark is indexed. Then, in one read
//! transaction, the rows at or below the watermark are searched through
//! the index and the rows above it (those the catch-up could not index: a
//! read-only home, a lock held past the policy's patience, a full disk)
//! are scanned with `LIKE`. [`SearchReport::unindexed`] counts the rows
//! scanned that way. A damaged index is marked for rebuild and every row
//! is scanned.
//!
//! A plain query is a list of words, each matched as a quoted FTS5 token
//! (and, in the scan, as a case-insensitive substring: the scan can only
//! find more). A raw FTS5 query (`fts5`) is matched against the scanned
//! rows through a temporary in-memory FTS5 table, as `LIKE` cannot read
//! its syntax.

use std::path::{Path, PathBuf};
use std::time::Duration;

use rusqlite::{Connection, OpenFlags, params};
use turnsafe_policy::{Cause, Operation};

pub use crate::backend::hits::{ArchivedHit, Hit};
use crate::store::index::{self, CatchUp, IndexError};
use crate::store::{StoreOptions, configure, schema};

/// How to search.
#[derive(Debug, Clone)]
pub struct SearchOptions {
    /// Only this session's messages.
    pub session: Option<String>,
    /// At most this many hits.
    pub limit: usize,
    /// The query is raw FTS5 syntax, not plain words.
    pub fts5: bool,
    /// Open the database read-only: nothing is indexed, everything past the
    /// watermark is scanned.
    pub read_only: bool,
    /// Search the archive too (what edits took out), after the transcripts
    /// and within `limit`; archived rows are scanned, never indexed.
    pub archived: bool,
}

impl Default for SearchOptions {
    fn default() -> Self {
        SearchOptions {
            session: None,
            limit: 20,
            fts5: false,
            read_only: false,
            archived: false,
        }
    }
}

/// Where the index stood when the search ran.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IndexHealth {
    /// Every committed row was searched through the index.
    Current,
    /// The index could not be brought up to date; the cause says why.
    Behind(Option<Cause>),
    /// The index is damaged or marked for rebuild: every row was scanned.
    Damaged,
}

/// What a search found, and how.
#[derive(Debug)]
pub struct SearchReport {
    pub hits: Vec<Hit>,
    /// Committed rows (in the searched scope) scanned without the index.
    pub unindexed: u64,
    pub index: IndexHealth,
    /// The catch-up's result: rows indexed, or why it stopped.
    pub catch_up: Result<CatchUp, IndexError>,
}

#[derive(Debug, thiserror::Error)]
pub enum SearchError {
    #[error("no turnsafe store at {0}")]
    NoDatabase(PathBuf),
    #[error(transparent)]
    NewerSchema(#[from] schema::NewerSchema),
    #[error("the query has no words to search for")]
    EmptyQuery,
    /// The raw FTS5 query was refused by SQLite; the reason is SQLite's.
    #[error("invalid FTS5 query: {0}")]
    Syntax(String),
    #[error("state.db: {0}")]
    Sqlite(#[from] rusqlite::Error),
}

/// Search the store in `home`.
pub fn search(home: &Path, query: &str, opts: &SearchOptions) -> Result<SearchReport, SearchError> {
    let db = home.join("state.db");
    if !db.is_file() {
        return Err(SearchError::NoDatabase(db));
    }
    schema::check_not_newer(&db)?;
    let (conn, not_writable) = open(&db, opts.read_only)?;
    search_with(&conn, not_writable, query, opts)
}

/// Open for search: read-write (which migrates an older schema) when
/// allowed and possible, read-only otherwise, with the reason the index
/// cannot be written.
fn open(db: &Path, read_only: bool) -> Result<(Connection, Option<IndexError>), SearchError> {
    let why = if read_only {
        IndexError::Unavailable
    } else {
        match open_for_writing(db) {
            Ok(conn) => return Ok((conn, None)),
            Err(e) => e,
        }
    };
    let flags = OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let conn = Connection::open_with_flags(db, flags)?;
    conn.busy_timeout(Duration::from_secs(5))?;
    match conn.query_row("SELECT count(*) FROM sqlite_schema", [], |r| r.get::<_, i64>(0)) {
        Ok(_) => Ok((conn, Some(why))),
        // A WAL database in a folder where SQLite cannot create the `-shm`
        // (an immutable home) cannot be opened the usual way. With no WAL
        // content the main file holds every commit: read it as immutable.
        Err(e) if !wal_has_frames(db) => {
            tracing::info!(error = %e, "search: reading state.db as immutable");
            let conn = Connection::open_with_flags(immutable_uri(db), flags | OpenFlags::SQLITE_OPEN_URI)?;
            Ok((conn, Some(why)))
        }
        Err(e) => Err(e.into()),
    }
}

/// A read-write connection, configured as every writer's is, or why the
/// index cannot be written (the policy's cause for the failure).
fn open_for_writing(db: &Path) -> Result<Connection, IndexError> {
    let flags = OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let opts = StoreOptions {
        busy_timeout: Duration::from_millis(10),
        ..StoreOptions::default()
    };
    let failed = |e: rusqlite::Error, errno: Option<i64>| {
        tracing::info!(error = %e, "search: cannot write the index; reading only");
        let obs = crate::observe::observation(Operation::Open, &e, errno, Vec::new(), 1, 0, 0);
        IndexError::CannotWrite {
            cause: turnsafe_policy::classify(&obs).cause,
            source: e,
            observation: Box::new(obs),
        }
    };
    let conn = Connection::open_with_flags(db, flags).map_err(|e| failed(e, None))?;
    if let Err(e) = configure(&conn, &opts) {
        return Err(failed(e, crate::observe::system_errno(&conn)));
    }
    // SQLite opens a file it may not write read-only, without an error.
    if conn.is_readonly("main").unwrap_or(true) {
        let e = rusqlite::Error::SqliteFailure(
            rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_READONLY),
            Some("attempt to write a readonly database".into()),
        );
        return Err(failed(e, None));
    }
    Ok(conn)
}

fn wal_has_frames(db: &Path) -> bool {
    std::fs::metadata(crate::guard::path_of(db, crate::guard::Part::Wal)).is_ok_and(|m| m.len() > 32)
}

/// `file:<path>?immutable=1`, the path percent-encoded.
fn immutable_uri(db: &Path) -> String {
    use std::os::unix::ffi::OsStrExt;
    let mut uri = String::from("file:");
    for &b in db.as_os_str().as_bytes() {
        if b.is_ascii_alphanumeric() || b"/-_.~".contains(&b) {
            uri.push(b as char);
        } else {
            uri.push_str(&format!("%{b:02X}"));
        }
    }
    uri.push_str("?immutable=1");
    uri
}

/// Search through an open connection. `writable`: whether the catch-up
/// may try to write.
pub fn search_in(
    conn: &Connection,
    writable: bool,
    query: &str,
    opts: &SearchOptions,
) -> Result<SearchReport, SearchError> {
    search_with(conn, (!writable).then_some(IndexError::Unavailable), query, opts)
}

fn search_with(
    conn: &Connection,
    not_writable: Option<IndexError>,
    query: &str,
    opts: &SearchOptions,
) -> Result<SearchReport, SearchError> {
    let writable = not_writable.is_none();
    let words: Vec<&str> = query.split_whitespace().collect();
    if words.is_empty() {
        return Err(SearchError::EmptyQuery);
    }
    let match_expr = if opts.fts5 {
        query.to_string()
    } else {
        words
            .iter()
            .map(|w| format!("\"{}\"", w.replace('"', "\"\"")))
            .collect::<Vec<_>>()
            .join(" ")
    };
    let mut catch_up = match not_writable {
        None => index::catch_up(conn, None, None),
        Some(why) => Err(why),
    };

    // One snapshot for the watermark, the index and the scan.
    conn.execute_batch("BEGIN")?;
    let result = (|| {
        let st = index::state(conn)?;
        let session = opts.session.as_deref();
        let limit = opts.limit.max(1);
        let mut index_ok = st.enabled;
        let mut hits = Vec::new();
        if index_ok {
            match indexed_hits(conn, &match_expr, st.watermark, session, limit) {
                Ok(h) => hits = h,
                Err(e) => match classify_query_error(e, opts.fts5)? {
                    // A damaged index: scan everything.
                    QueryFailure::Damaged(e, observation) => {
                        index_ok = false;
                        if catch_up.is_ok() {
                            catch_up = Err(IndexError::Damaged {
                                source: e,
                                observation,
                                marked: false,
                            });
                        }
                    }
                },
            }
        }
        let from = if index_ok { st.watermark } else { 0 };
        let unindexed = index::pending(conn, from, session)?;
        if unindexed > 0 && hits.len() < limit {
            let more = if opts.fts5 {
                scan_fts5(conn, &match_expr, from, session, limit - hits.len()).map_err(|e| syntax_or(e, true))?
            } else {
                scan_like(conn, &words, from, session, limit - hits.len())?
            };
            hits.extend(more);
        }
        if opts.archived && hits.len() < limit && has_archive(conn)? {
            let more = if opts.fts5 {
                scan_archive_fts5(conn, &match_expr, session, limit - hits.len()).map_err(|e| syntax_or(e, true))?
            } else {
                scan_archive_like(conn, &words, session, limit - hits.len())?
            };
            hits.extend(more);
        }
        Ok::<_, SearchError>((hits, unindexed, index_ok))
    })();
    if !conn.is_autocommit() {
        let _ = conn.execute_batch("COMMIT");
    }
    let (hits, unindexed, index_ok) = result?;
    // Damage found by the query: mark it, outside the read transaction.
    if let Err(IndexError::Damaged { marked, .. }) = &mut catch_up
        && !*marked
        && writable
    {
        *marked = index::mark_for_rebuild(conn).is_ok();
    }
    let index = if !index_ok {
        IndexHealth::Damaged
    } else if unindexed > 0 {
        IndexHealth::Behind(catch_up.as_ref().err().and_then(IndexError::cause))
    } else {
        IndexHealth::Current
    };
    Ok(SearchReport {
        hits,
        unindexed,
        index,
        catch_up,
    })
}

enum QueryFailure {
    Damaged(rusqlite::Error, Box<turnsafe_policy::Observation>),
}

/// A failed index query: a refused raw query is the user's (exit 2); the
/// policy decides whether anything else is index damage.
fn classify_query_error(e: rusqlite::Error, raw: bool) -> Result<QueryFailure, SearchError> {
    let obs = crate::observe::observation(
        turnsafe_policy::Operation::AppendBatch,
        &e,
        None,
        vec![turnsafe_policy::Evidence::FtsScope],
        1,
        0,
        0,
    );
    let cause = turnsafe_policy::classify(&obs).cause;
    if cause == Cause::FtsIndex {
        return Ok(QueryFailure::Damaged(e, Box::new(obs)));
    }
    Err(syntax_or(e, raw))
}

/// SQLite's plain `SQLITE_ERROR` on a raw query is the query's fault.
fn syntax_or(e: rusqlite::Error, raw: bool) -> SearchError {
    match &e {
        rusqlite::Error::SqliteFailure(f, msg) if raw && f.extended_code == rusqlite::ffi::SQLITE_ERROR => {
            SearchError::Syntax(msg.clone().unwrap_or_else(|| f.to_string()))
        }
        _ => SearchError::Sqlite(e),
    }
}

fn indexed_hits(
    conn: &Connection,
    expr: &str,
    watermark: i64,
    session: Option<&str>,
    limit: usize,
) -> rusqlite::Result<Vec<Hit>> {
    let mut stmt = conn.prepare_cached(
        "SELECT m.session_id, m.uid, m.seq, m.role, snippet(messages_fts, 0, '[', ']', '…', 12) \
         FROM messages_fts JOIN messages m ON m.id = messages_fts.rowid \
         WHERE messages_fts MATCH ?1 AND messages_fts.rowid <= ?2 AND (?3 IS NULL OR m.session_id = ?3) \
         ORDER BY rank LIMIT ?4",
    )?;
    let rows = stmt.query_map(params![expr, watermark, session, limit as i64], hit_from_row)?;
    rows.collect()
}

fn hit_from_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<Hit> {
    Ok(Hit {
        session: r.get(0)?,
        uid: r.get(1)?,
        seq: r.get(2)?,
        role: r.get(3)?,
        snippet: r.get(4)?,
        archived: None,
    })
}

/// Rows past `from` holding every word (case-insensitive for ASCII), oldest first.
fn scan_like(
    conn: &Connection,
    words: &[&str],
    from: i64,
    session: Option<&str>,
    limit: usize,
) -> rusqlite::Result<Vec<Hit>> {
    let patterns: Vec<String> = words.iter().map(|w| like_escape(w)).collect();
    let patterns = serde_json::Value::from(patterns).to_string();
    let mut stmt = conn.prepare_cached(
        "SELECT m.session_id, m.uid, m.seq, m.role, m.content FROM messages m \
         WHERE m.id > ?1 AND (?2 IS NULL OR m.session_id = ?2) AND m.content IS NOT NULL \
           AND NOT EXISTS (SELECT 1 FROM json_each(?3) w \
                           WHERE m.content NOT LIKE '%' || w.value || '%' ESCAPE '\\') \
         ORDER BY m.id LIMIT ?4",
    )?;
    let rows = stmt.query_map(params![from, session, patterns, limit as i64], |r| {
        let content: String = r.get(4)?;
        Ok(Hit {
            session: r.get(0)?,
            uid: r.get(1)?,
            seq: r.get(2)?,
            role: r.get(3)?,
            snippet: like_snippet(&content, words),
            archived: None,
        })
    })?;
    rows.collect()
}

/// A raw FTS5 query over rows past `from`, through a temporary index.
fn scan_fts5(
    conn: &Connection,
    expr: &str,
    from: i64,
    session: Option<&str>,
    limit: usize,
) -> rusqlite::Result<Vec<Hit>> {
    conn.execute_batch("DROP TABLE IF EXISTS temp.scan_fts; CREATE VIRTUAL TABLE temp.scan_fts USING fts5(content);")?;
    let result = (|| {
        conn.execute(
            "INSERT INTO temp.scan_fts(rowid, content) SELECT id, content FROM messages \
             WHERE id > ?1 AND (?2 IS NULL OR session_id = ?2)",
            params![from, session],
        )?;
        let mut stmt = conn.prepare(
            "SELECT m.session_id, m.uid, m.seq, m.role, snippet(scan_fts, 0, '[', ']', '…', 12) \
             FROM temp.scan_fts JOIN messages m ON m.id = scan_fts.rowid \
             WHERE scan_fts MATCH ?1 ORDER BY m.id LIMIT ?2",
        )?;
        let rows = stmt.query_map(params![expr, limit as i64], hit_from_row)?;
        rows.collect()
    })();
    let _ = conn.execute_batch("DROP TABLE IF EXISTS temp.scan_fts");
    result
}

/// Whether the schema has the archive (version 4 and later; a read-only
/// search of an older database does not migrate it).
fn has_archive(conn: &Connection) -> rusqlite::Result<bool> {
    conn.query_row(
        "SELECT EXISTS (SELECT 1 FROM sqlite_schema WHERE type = 'table' AND name = 'archive')",
        [],
        |r| r.get(0),
    )
}

fn archived_hit(r: &rusqlite::Row<'_>, snippet: String) -> rusqlite::Result<Hit> {
    Ok(Hit {
        session: r.get(0)?,
        uid: r.get(1)?,
        seq: r.get(2)?,
        role: r.get(3)?,
        snippet,
        archived: Some(ArchivedHit::new(r.get(5)?, r.get(6)?)),
    })
}

/// Archived rows holding every word, most recently archived first.
fn scan_archive_like(
    conn: &Connection,
    words: &[&str],
    session: Option<&str>,
    limit: usize,
) -> rusqlite::Result<Vec<Hit>> {
    let patterns: Vec<String> = words.iter().map(|w| like_escape(w)).collect();
    let patterns = serde_json::Value::from(patterns).to_string();
    let mut stmt = conn.prepare_cached(
        "SELECT a.session_id, a.uid, a.seq, a.role, a.content, a.archived_ms, a.reason FROM archive a \
         WHERE (?1 IS NULL OR a.session_id = ?1) AND a.content IS NOT NULL \
           AND NOT EXISTS (SELECT 1 FROM json_each(?2) w \
                           WHERE a.content NOT LIKE '%' || w.value || '%' ESCAPE '\\') \
         ORDER BY a.archived_ms DESC, a.id DESC LIMIT ?3",
    )?;
    let rows = stmt.query_map(params![session, patterns, limit as i64], |r| {
        let content: String = r.get(4)?;
        archived_hit(r, like_snippet(&content, words))
    })?;
    rows.collect()
}

/// A raw FTS5 query over the archive, through a temporary index.
fn scan_archive_fts5(conn: &Connection, expr: &str, session: Option<&str>, limit: usize) -> rusqlite::Result<Vec<Hit>> {
    conn.execute_batch(
        "DROP TABLE IF EXISTS temp.scan_archive; CREATE VIRTUAL TABLE temp.scan_archive USING fts5(content);",
    )?;
    let result = (|| {
        conn.execute(
            "INSERT INTO temp.scan_archive(rowid, content) SELECT id, content FROM archive \
             WHERE ?1 IS NULL OR session_id = ?1",
            params![session],
        )?;
        let mut stmt = conn.prepare(
            "SELECT a.session_id, a.uid, a.seq, a.role, snippet(scan_archive, 0, '[', ']', '…', 12), \
                    a.archived_ms, a.reason \
             FROM temp.scan_archive JOIN archive a ON a.id = scan_archive.rowid \
             WHERE scan_archive MATCH ?1 ORDER BY a.archived_ms DESC, a.id DESC LIMIT ?2",
        )?;
        let rows = stmt.query_map(params![expr, limit as i64], |r| {
            let snippet: String = r.get(4)?;
            archived_hit(r, snippet)
        })?;
        rows.collect()
    })();
    let _ = conn.execute_batch("DROP TABLE IF EXISTS temp.scan_archive");
    result
}

/// `word` as a `LIKE` operand with `\` escaping its wildcards.
fn like_escape(word: &str) -> String {
    let mut out = String::with_capacity(word.len());
    for c in word.chars() {
        if matches!(c, '\\' | '%' | '_') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// A short window of `content` around the first word found, the match in
/// `[` `]`, as the index's snippets are.
fn like_snippet(content: &str, words: &[&str]) -> String {
    const BEFORE: usize = 40;
    const AFTER: usize = 60;
    let lower = content.to_ascii_lowercase();
    let found = words.iter().find_map(|w| {
        let w = w.to_ascii_lowercase();
        lower.find(&w).map(|at| (at, w.len()))
    });
    let Some((at, len)) = found else {
        return content.chars().take(BEFORE + AFTER).collect();
    };
    let floor = |mut i: usize| {
        while !content.is_char_boundary(i) {
            i -= 1;
        }
        i
    };
    let start = floor(at.saturating_sub(BEFORE));
    let end = floor((at + len + AFTER).min(content.len()));
    let (at, stop) = (floor(at), floor(at + len));
    format!(
        "{}{}[{}]{}{}",
        if start > 0 { "…" } else { "" },
        &content[start..at],
        &content[at..stop],
        &content[stop..end],
        if end < content.len() { "…" } else { "" }
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn like_operands_escape_their_wildcards() {
        assert_eq!(like_escape(r"50%_off\"), r"50\%\_off\\");
    }

    #[test]
    fn scan_snippets_mark_the_match_and_respect_char_boundaries() {
        let s = like_snippet("ééé the Glacier melts", &["glacier"]);
        assert_eq!(s, "ééé the [Glacier] melts");
        let long = format!("{}needle{}", "a".repeat(100), "b".repeat(100));
        let s = like_snippet(&long, &["needle"]);
        assert!(s.starts_with('…') && s.ends_with('…') && s.contains("[needle]"), "{s}");
    }
}
