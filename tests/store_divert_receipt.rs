//! The divert file's exact lines and the receipt's checksum, for a batch
//! diverted because the database is read-only (a real SQLITE_READONLY).
mod common;
use std::os::unix::fs::PermissionsExt;

use common::*;
use turnsafe_host::backend::Backend;
use turnsafe_host::message::Message;
use turnsafe_host::store::StoreOptions;
use turnsafe_policy::{ActionKind, Cause};

#[test]
fn a_diverted_batch_is_on_disk_exactly_as_the_receipt_says() {
    let home = Home::new();
    // Make a store, then reopen it read-only through SQLite itself.
    drop(home.store());
    let mut store = turnsafe_host::store::SessionStore::new(home.path(), Default::default());
    assert!(store.append_batch(&sid("s1"), &batch("ok", 1)).persisted);
    drop(store);
    let mut store = home.store_with(StoreOptions {
        read_only: true,
        ..StoreOptions::default()
    });

    let mut msgs = batch("ro", 3);
    msgs.push(
        Message::from_value(
            3,
            &serde_json::json!({"role":"tool","content":{"k":[1,2]},"uid":"ro-3","name":"calc"}),
        )
        .unwrap(),
    );
    let out = store.append_batch(&sid("s1"), &msgs);
    assert!(!out.persisted);
    assert_eq!(out.cause, Some(Cause::Disk));
    assert_eq!(out.action, Some(ActionKind::Divert));
    assert_eq!((out.committed, out.diverted, out.handed_back), (0, 4, 0));
    let r = out.receipt.clone().expect("receipt");
    assert_eq!(r.path, home.divert_file("s1").to_string_lossy());
    assert!(std::path::Path::new(&r.path).is_absolute());
    assert_eq!((r.offset, r.count), (0, 4));
    let lines = receipt_lines(&r);
    let seqs: Vec<i64> = lines.iter().map(|l| l["seq"].as_i64().expect("seq known")).collect();
    assert_eq!(
        seqs,
        [2, 3, 4, 5],
        "diverted lines keep their place after the committed message"
    );
    for (i, l) in lines.iter().enumerate() {
        let keys: Vec<&str> = l.as_object().unwrap().keys().map(String::as_str).collect();
        assert_eq!(keys, ["at", "batch", "cause", "message", "seq", "session", "uid", "v"]);
        assert_eq!(l["v"], 2);
        assert_eq!(l["session"], "s1");
        assert_eq!(l["uid"], format!("ro-{i}"));
        assert_eq!(l["cause"], "disk");
        assert_eq!(l["batch"], lines[0]["batch"]);
        assert!(l["message"].get("uid").is_none(), "the uid is beside the message");
    }
    assert_eq!(
        lines[3]["message"],
        serde_json::json!({"role":"tool","content":{"k":[1,2]},"name":"calc"})
    );
    let copy = out.report.copy.expect("copy");
    assert_eq!(copy.code, "disk.diverted");
    assert!(copy.body.contains(&format!("A copy was kept at {}.", r.path)));

    // A second batch appends after the first: offset moves, file grows.
    let out2 = store.append_batch(&sid("s1"), &batch("ro2", 2));
    let r2 = out2.report.receipt.expect("receipt");
    assert_eq!(r2.offset, r.length);
    receipt_lines(&r2);
    assert_eq!(std::fs::metadata(&r.path).unwrap().len(), r.length + r2.length);

    // Modes: file 0600, folder 0700.
    let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&home.divert_file("s1")), 0o600);
    assert_eq!(mode(&home.path().join("sessions")), 0o700);
    assert_eq!(
        home.rows("s1").len(),
        1,
        "nothing of the diverted batches reached the db"
    );
}

#[test]
fn a_torn_last_line_stays_detectable() {
    let home = Home::new();
    std::fs::create_dir(home.path().join("sessions")).unwrap();
    std::fs::write(home.divert_file("s1"), b"{\"v\":1,\"session\":\"s1\",\"uid\":\"x").unwrap();
    let mut store = home.store_with(StoreOptions {
        read_only: true,
        ..StoreOptions::default()
    });
    let out = store.append_batch(&sid("s1"), &batch("b", 1));
    let r = out.report.receipt.expect("receipt");
    let data = std::fs::read(&r.path).unwrap();
    let text = String::from_utf8(data).unwrap();
    let mut lines = text.lines();
    assert!(
        serde_json::from_str::<serde_json::Value>(lines.next().unwrap()).is_err(),
        "torn line kept as is"
    );
    assert_eq!(receipt_lines(&r).len(), 1);
}
