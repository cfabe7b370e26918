//! Helpers shared by the store scenarios: a fresh home, batches, a second
//! connection for inducing failures, and readers that recount from disk.
//! PostgreSQL servers and their failures: `pg` (one server, base backups,
//! standbys), `pg_proxy` (a connection cut around COMMIT), `pg_limits`
//! (connection slots, a full tablespace), `pg_cluster` (a synchronous
//! primary and standby).
#![allow(dead_code)]

#[macro_use]
pub mod privileged;
pub mod canonical;
pub mod graph;
pub mod pg;
pub mod pg_cluster;
pub mod pg_limits;
pub mod pg_proxy;

use std::path::{Path, PathBuf};

use rusqlite::Connection;
use serde_json::Value;
use turnsafe_host::divert::Receipt;
use turnsafe_host::message::Message;
use turnsafe_host::store::{SessionId, SessionStore, StoreOptions};

pub struct Home {
    pub dir: tempfile::TempDir,
}

impl Home {
    pub fn new() -> Home {
        Home {
            dir: tempfile::tempdir().expect("tempdir"),
        }
    }
    pub fn path(&self) -> &Path {
        self.dir.path()
    }
    pub fn db(&self) -> PathBuf {
        self.path().join("state.db")
    }
    pub fn divert_file(&self, session: &str) -> PathBuf {
        self.path().join("sessions").join(format!("{session}.jsonl"))
    }
    pub fn store(&self) -> SessionStore {
        SessionStore::new(self.path(), StoreOptions::default())
    }
    pub fn store_with(&self, opts: StoreOptions) -> SessionStore {
        SessionStore::new(self.path(), opts)
    }
    /// A second, independent connection (the "other process").
    pub fn other(&self) -> Connection {
        let c = Connection::open(self.db()).expect("second connection");
        c.busy_timeout(std::time::Duration::from_secs(5)).unwrap();
        c
    }
    pub fn rows(&self, session: &str) -> Vec<(String, i64, String)> {
        let c = self.other();
        let mut s = c
            .prepare("SELECT uid, seq, COALESCE(content, item) FROM messages WHERE session_id = ?1 ORDER BY seq, id")
            .unwrap();
        s.query_map([session], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
            .unwrap()
            .map(Result::unwrap)
            .collect()
    }
}

pub fn sid(s: &str) -> SessionId {
    SessionId::new(s).expect("valid session id")
}

/// `n` messages of about 200 bytes with uids `<tag>-<i>`.
pub fn batch(tag: &str, n: usize) -> Vec<Message> {
    (0..n)
        .map(|i| {
            let role = if i % 2 == 0 { "user" } else { "assistant" };
            Message::new(role, &format!("{tag} message {i}: {}", "lorem ipsum ".repeat(16)))
                .with_uid(&format!("{tag}-{i}"))
        })
        .collect()
}

/// The lines inside a receipt's byte range, parsed, after checking its sha256.
pub fn receipt_lines(r: &Receipt) -> Vec<Value> {
    use sha2::Digest;
    let data = std::fs::read(&r.path).expect("receipt path exists");
    let range = &data[r.offset as usize..(r.offset + r.length) as usize];
    assert_eq!(hex::encode(sha2::Sha256::digest(range)), r.sha256, "receipt checksum");
    let lines: Vec<Value> = std::str::from_utf8(range)
        .expect("utf-8")
        .lines()
        .map(|l| turnsafe_host::json_in::value(l).expect("each diverted line is JSON"))
        .collect();
    assert_eq!(lines.len() as u64, r.count);
    lines
}

/// Write garbage over the b-tree root page of `table` in the main file,
/// after a checkpoint moved every page there, then commit an unrelated
/// change so live connections drop their page caches.
pub fn corrupt_table_page(home: &Home, table: &str) {
    use std::io::{Seek, SeekFrom, Write};
    let other = home.other();
    let _: (i64, i64, i64) = other
        .query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?))
        })
        .unwrap();
    let root: i64 = other
        .query_row("SELECT rootpage FROM sqlite_schema WHERE name = ?1", [table], |r| {
            r.get(0)
        })
        .unwrap();
    let page_size: i64 = other.query_row("PRAGMA page_size", [], |r| r.get(0)).unwrap();
    let mut f = std::fs::OpenOptions::new().write(true).open(home.db()).unwrap();
    f.seek(SeekFrom::Start(((root - 1) * page_size) as u64)).unwrap();
    f.write_all(&vec![0xA5u8; page_size as usize]).unwrap();
    f.sync_all().unwrap();
    other
        .execute("UPDATE state_meta SET value = value WHERE key = 'schema_version'", [])
        .unwrap();
}

/// Hold the write lock (`BEGIN IMMEDIATE`) from another connection for
/// `hold`, on a thread. Returns once the lock is held.
pub fn hold_write_lock(home: &Home, hold: std::time::Duration) -> std::thread::JoinHandle<()> {
    let db = home.db();
    let (tx, rx) = std::sync::mpsc::channel();
    let t = std::thread::spawn(move || {
        let c = Connection::open(db).unwrap();
        c.execute_batch("BEGIN IMMEDIATE").unwrap();
        tx.send(()).unwrap();
        std::thread::sleep(hold);
        c.execute_batch("COMMIT").unwrap();
    });
    rx.recv().expect("lock taken");
    t
}

/// Every open and close of `home`'s `state.db` (and its WAL) by any
/// connection of this process, seen from below: the counting VFS made
/// SQLite's default, so no open by any path or VFS name escapes it. The
/// store's own counters and handle identity are not consulted.
pub fn watch_opens(home: &Home) -> turnsafe_host::faultvfs::Counter {
    turnsafe_host::faultvfs::make_default().expect("the counting VFS as SQLite's default");
    turnsafe_host::faultvfs::count(&home.db().to_string_lossy()).expect("a counter on the home's files")
}
