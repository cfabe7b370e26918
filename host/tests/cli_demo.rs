//! `turnsafe demo` runs every unprivileged failure, and its kept home adds
//! up when recounted from disk by this test alone: the rows in `state.db`
//! (opened read-only), the divert files and each receipt's byte range and
//! sha256, against the uids the demo is known to send.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use serde_json::Value;
use sha2::Digest;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Place {
    Committed,
    Diverted,
    HandedBack,
}
use Place::*;

/// The demo's batches, in order: how many messages, and where they must end.
const BATCHES: &[(&str, usize, Place)] = &[
    ("none", 10, Committed),
    ("I/O error at WAL write", 10, Diverted),
    ("I/O error at WAL fsync", 10, Diverted),
    ("ENOSPC at WAL write", 10, Diverted),
    ("SQLITE_FULL", 10, Diverted),
    ("fd exhaustion in a child", 4, HandedBack),
    ("write lock held", 10, Committed),
    ("corrupt FTS5 index", 10, Committed),
    ("I/O error, and the divert blocked", 10, HandedBack),
    ("none", 10, Committed),
];

/// The uid the demo gives message `m` of batch `b` (both from 1).
fn uid(b: usize, m: usize) -> String {
    format!("demo-{b:02}-{m:02}")
}

fn run_demo(keep: &Path) -> String {
    let out = assert_cmd::Command::cargo_bin("turnsafe")
        .unwrap()
        .args(["demo", "--keep"])
        .arg(keep)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    text
}

/// Every (uid, session) row of the kept `state.db`, opened read-only.
fn db_uids(db: &Path) -> Vec<(String, String)> {
    let c = rusqlite::Connection::open_with_flags(db, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
        .unwrap_or_else(|e| panic!("open {} read-only: {e}", db.display()));
    let mut s = c.prepare("SELECT uid, session_id FROM messages ORDER BY seq").unwrap();
    s.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .collect::<rusqlite::Result<_>>()
        .unwrap()
}

#[test]
fn the_kept_demo_home_recounts_from_disk() {
    let dir = tempfile::tempdir().unwrap();
    let keep = dir.path().join("demo-home");
    let text = run_demo(&keep);
    for failure in [
        "WAL write",
        "fsync",
        "SQLITE_FULL",
        "fd exhaustion",
        "lock held",
        "FTS5",
        "divert blocked",
    ] {
        assert!(text.contains(failure), "missing {failure}: {text}");
    }
    let keep = keep.canonicalize().unwrap();
    let sessions = keep.join("sessions");

    // What the demo sends, known here without asking the demo.
    let sent: Vec<(usize, String, Place)> = BATCHES
        .iter()
        .enumerate()
        .flat_map(|(b, &(_, n, place))| (1..=n).map(move |m| (b + 1, uid(b + 1, m), place)))
        .collect();
    let sent_uids: BTreeSet<&str> = sent.iter().map(|(_, u, _)| u.as_str()).collect();
    assert_eq!(sent_uids.len(), 94);

    // The outcomes the demo kept, one per batch, for the same uids in order.
    let outcomes: Vec<Value> = std::fs::read_to_string(keep.join("demo-outcomes.jsonl"))
        .expect("the demo keeps its outcomes")
        .lines()
        .map(|l| serde_json::from_str(l).expect("each outcome is JSON"))
        .collect();
    assert_eq!(outcomes.len(), BATCHES.len());

    let mut places: BTreeMap<String, Vec<Place>> = BTreeMap::new();
    let mut in_receipts: BTreeMap<(String, u64), u64> = BTreeMap::new(); // (file, offset) -> end
    let mut handed_back = BTreeSet::new();
    for (b, (o, &(failure, n, place))) in outcomes.iter().zip(BATCHES).enumerate() {
        let want: Vec<String> = (1..=n).map(|m| uid(b + 1, m)).collect();
        let got: Vec<&str> = o["uids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|u| u.as_str().unwrap())
            .collect();
        assert_eq!(got, want, "batch {} ({failure}) sent other uids", b + 1);
        let counts = (
            o["committed"].as_u64().unwrap(),
            o["diverted"].as_u64().unwrap(),
            o["handed_back"].as_u64().unwrap(),
        );
        let expect = match place {
            Committed => (n as u64, 0, 0),
            Diverted => (0, n as u64, 0),
            HandedBack => (0, 0, n as u64),
        };
        assert_eq!(counts, expect, "batch {} ({failure}): {o}", b + 1);
        let body = o["copy"]["body"].as_str().unwrap_or("");
        let claims_a_copy = body.to_lowercase().contains("a copy was kept");
        match o["receipt"].as_object() {
            Some(r) => {
                // Recount the receipt from the file itself.
                let path = r["path"].as_str().unwrap();
                assert!(
                    Path::new(path).starts_with(&sessions),
                    "receipt outside the home: {path}"
                );
                assert!(claims_a_copy && body.contains(path), "batch {}: {body}", b + 1);
                let (offset, length) = (r["offset"].as_u64().unwrap(), r["length"].as_u64().unwrap());
                let data = std::fs::read(path).unwrap();
                let range = &data[offset as usize..(offset + length) as usize];
                assert_eq!(hex::encode(sha2::Sha256::digest(range)), r["sha256"].as_str().unwrap());
                let lines: Vec<Value> = std::str::from_utf8(range)
                    .unwrap()
                    .lines()
                    .map(|l| serde_json::from_str(l).unwrap())
                    .collect();
                assert_eq!(lines.len() as u64, r["count"].as_u64().unwrap());
                let line_uids: Vec<&str> = lines.iter().map(|l| l["uid"].as_str().unwrap()).collect();
                assert_eq!(line_uids, want, "batch {}: the receipt's lines", b + 1);
                for u in line_uids {
                    places.entry(u.to_string()).or_default().push(Diverted);
                }
                in_receipts.insert((path.to_string(), offset), offset + length);
            }
            None => assert!(
                !claims_a_copy,
                "batch {} claims a copy without a receipt: {body}",
                b + 1
            ),
        }
        if counts.2 > 0 {
            for u in &want {
                places.entry(u.clone()).or_default().push(HandedBack);
                handed_back.insert(u.clone());
            }
        }
    }

    // The database, read-only: only the demo's session, only sent uids.
    for (u, session) in db_uids(&keep.join("state.db")) {
        assert_eq!(session, "demo-session");
        assert!(
            sent_uids.contains(u.as_str()),
            "state.db holds {u}, which was never sent"
        );
        places.entry(u).or_default().push(Committed);
    }

    // Every line of every divert file lies in a receipt's range, or belongs
    // to a batch handed back (what a partial divert may leave behind).
    for entry in std::fs::read_dir(&sessions).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "jsonl") {
            continue;
        }
        let data = std::fs::read(&path).unwrap();
        let mut at = 0u64;
        for line in data.split_inclusive(|&c| c == b'\n') {
            let v: Value = serde_json::from_slice(line).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            let u = v["uid"].as_str().unwrap();
            let covered = in_receipts
                .range(..=(path.to_string_lossy().into_owned(), at))
                .next_back()
                .is_some_and(|((p, start), end)| *p == path.to_string_lossy() && *start <= at && at < *end);
            assert!(
                covered || handed_back.contains(u),
                "{}: line for {u} at byte {at} is in no receipt",
                path.display()
            );
            at += line.len() as u64;
        }
    }

    // Each message sent is in exactly one place, the one its failure calls for.
    for (b, u, place) in &sent {
        let found = places.get(u).cloned().unwrap_or_default();
        assert_eq!(found, vec![*place], "batch {b}: message {u} is in {found:?}");
    }
    assert_eq!(places.len(), sent.len(), "messages found that were never sent");
    // The corrupt index does not fail the turn; search reports it and scans.
    let fts = text.lines().find(|l| l.starts_with("corrupt FTS5 index")).unwrap();
    assert!(fts.split_whitespace().any(|w| w == "10"), "{fts}");
    assert!(
        text.contains("search with the corrupt FTS5 index: index damaged"),
        "{text}"
    );
}
