//! What a capture holds that the current database lacks: the sessions
//! whose rows are in the captured generation and not in `state.db` at the
//! path, and how many. Recorded in the capture's manifest when it is made,
//! so the rule "a pending capture stops the history of the sessions it
//! holds" rests on what the two databases hold, not on a guess.
//!
//! Both sides are read from copies (the capture's own files, and a copy of
//! the current database checked to be unchanged while copied): nothing is
//! opened in place. When either side cannot be read, the answer is
//! "unknown", and a pending capture with an unknown answer holds every
//! session: nothing is presented as complete that might not be.

use std::collections::{BTreeMap, HashSet};
use std::path::Path;

use rusqlite::{Connection, OpenFlags};

/// How many times the current database is copied again when a writer
/// changed it during the copy.
const COPY_TRIES: u32 = 5;

/// The rows of the captured generation that the current database lacks,
/// by session; `Err` says why that could not be known.
pub type Missing = Result<BTreeMap<String, u64>, String>;

/// Compare the capture in `capture_dir` (its `state.db` and `-wal`) with
/// the database at `current_db`.
pub fn missing_rows(capture_dir: &Path, current_db: &Path) -> Missing {
    let captured = rows_of_copy(capture_dir).map_err(|e| format!("the captured generation cannot be read: {e}"))?;
    let current = if current_db.is_file() {
        current_rows(current_db)?
    } else {
        // No database at the path (deleted with its sidecars): every
        // captured row is missing from it.
        HashSet::new()
    };
    let mut missing = BTreeMap::new();
    for row in captured {
        if !current.contains(&row) {
            *missing.entry(row.0).or_insert(0) += 1;
        }
    }
    Ok(missing)
}

/// The (session, uid) rows of a copy of the database at `source` (a db
/// file or a folder holding `state.db`).
fn rows_of_copy(source: &Path) -> Result<HashSet<(String, String)>, String> {
    let work = tempfile::tempdir().map_err(|e| format!("work folder: {e}"))?;
    // The shm is left behind: the copy rebuilds its index from the WAL.
    for name in ["state.db", "state.db-wal"] {
        let from = if source.is_dir() {
            source.join(name)
        } else {
            let mut p = source.as_os_str().to_owned();
            p.push(&name["state.db".len()..]);
            p.into()
        };
        match std::fs::copy(&from, work.path().join(name)) {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && name != "state.db" => {}
            Err(e) => return Err(format!("copy {}: {e}", from.display())),
        }
    }
    read_rows(&work.path().join("state.db"))
}

/// The current database's rows, from a copy that no writer changed while
/// it was taken.
fn current_rows(db: &Path) -> Result<HashSet<(String, String)>, String> {
    let mut last = String::new();
    for _ in 0..COPY_TRIES {
        let work = tempfile::tempdir().map_err(|e| format!("work folder: {e}"))?;
        match crate::db_copy::copy_source(db, work.path()) {
            Ok(_) => {
                return read_rows(&work.path().join("state.db"))
                    .map_err(|e| format!("the current state.db cannot be read: {e}"));
            }
            Err(e) => last = e.to_string(),
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    Err(format!("the current state.db could not be copied unchanged: {last}"))
}

fn read_rows(db: &Path) -> Result<HashSet<(String, String)>, String> {
    let conn = Connection::open_with_flags(db, OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX)
        .map_err(|e| e.to_string())?;
    let tables: i64 = conn
        .query_row(
            "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'messages'",
            [],
            |r| r.get(0),
        )
        .map_err(|e| e.to_string())?;
    // A database whose schema was never created holds no rows.
    if tables == 0 {
        return Ok(HashSet::new());
    }
    let mut stmt = conn
        .prepare("SELECT session_id, uid FROM messages")
        .map_err(|e| e.to_string())?;
    let rows = stmt
        .query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?)))
        .map_err(|e| e.to_string())?;
    rows.collect::<rusqlite::Result<HashSet<_>>>()
        .map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn db_with(path: &Path, rows: &[(&str, &str)]) {
        let c = Connection::open(path).unwrap();
        c.execute_batch("CREATE TABLE messages(session_id TEXT, uid TEXT)")
            .unwrap();
        for (s, u) in rows {
            c.execute("INSERT INTO messages VALUES (?1, ?2)", [s, u]).unwrap();
        }
    }

    #[test]
    fn counts_per_session_what_the_current_database_lacks() {
        let dir = tempfile::tempdir().unwrap();
        let cap = dir.path().join("cap");
        std::fs::create_dir(&cap).unwrap();
        db_with(
            &cap.join("state.db"),
            &[("s1", "a"), ("s1", "b"), ("s2", "c"), ("s3", "d")],
        );
        let current = dir.path().join("state.db");
        db_with(&current, &[("s1", "a"), ("s3", "d"), ("s4", "e")]);
        let missing = missing_rows(&cap, &current).unwrap();
        assert_eq!(missing, BTreeMap::from([("s1".to_string(), 1), ("s2".to_string(), 1)]));
    }

    #[test]
    fn no_current_database_lacks_every_row_and_an_unreadable_capture_is_unknown() {
        let dir = tempfile::tempdir().unwrap();
        let cap = dir.path().join("cap");
        std::fs::create_dir(&cap).unwrap();
        db_with(&cap.join("state.db"), &[("s1", "a"), ("s1", "b")]);
        let missing = missing_rows(&cap, &dir.path().join("absent.db")).unwrap();
        assert_eq!(missing, BTreeMap::from([("s1".to_string(), 2)]));

        std::fs::write(cap.join("state.db"), vec![0xFFu8; 4096]).unwrap();
        let err = missing_rows(&cap, &dir.path().join("absent.db")).unwrap_err();
        assert!(err.contains("captured generation cannot be read"), "{err}");
    }
}
