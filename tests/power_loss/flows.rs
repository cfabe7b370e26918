//! The flows the power-loss torture cuts. Each has a setup (built off the
//! mount, durable from the start), a run (under the mount, recording each
//! record it sends, and each claim only while the power is on) and what a
//! run without a cut must claim.
use std::path::{Path, PathBuf};

use turnsafe_host::backend::Backend;
use turnsafe_host::graph::{CheckpointRecord, GraphBatch, WriteRecord};
use turnsafe_host::message::Message;
use turnsafe_host::replay::{ReplayOptions, replay};
use turnsafe_host::store::{SessionId, SessionStore, StoreOptions};

use super::{Batch, Claims, Flow, Key, Power, Sent, batch, graph_sent, home, rebuild_and_install, sid};

/// Every flow, in the order the tests and the long run take them.
pub const ALL: &[Flow] = &[
    NEW_HOME,
    GROUP_COMMIT,
    DIVERT_NEW_FILE,
    DIVERT_EXISTING_FILE,
    REPLAY,
    CAPTURE,
    RECOVER_INSTALL,
    RECOVER_DISMISS,
    MIGRATE_V2_V3,
    LANGGRAPH,
    CLEAR,
];

/// The first append into a home that does not exist yet: the home's
/// folder, `state.db`, its schema, the switch to WAL, three commits.
pub const NEW_HOME: Flow = Flow {
    name: "new_home",
    setup: |_| Claims::default(),
    run: new_home,
    expect: |c| expect(c, 6, 6, 0),
    known: None,
};

/// Four sessions' batches committed together (`append_group`, what
/// `turnsafe append` without `--session` runs), twice, into an existing
/// home (its WAL created again by the first open).
pub const GROUP_COMMIT: Flow = Flow {
    name: "group_commit",
    setup: existing_home,
    run: group_commit,
    expect: |c| expect(c, 2 + 16, 2 + 16, 0),
    known: None,
};

/// Batches diverted (the store is read-only) into `sessions/`, which does
/// not exist yet: a new folder and a new file, then a second new file.
pub const DIVERT_NEW_FILE: Flow = Flow {
    name: "divert_new_file",
    setup: existing_home,
    run: divert_new_file,
    expect: |c| expect(c, 2 + 5, 2, 2),
    known: None,
};

/// Batches diverted and appended to a divert file that holds a receipted
/// batch already.
pub const DIVERT_EXISTING_FILE: Flow = Flow {
    name: "divert_existing_file",
    setup: home_with_diverts,
    run: divert_existing_file,
    expect: |c| expect(c, 2 + 2 + 3 + 5, 2, 3 + 2),
    known: None,
};

/// `replay` of pending divert files (one holds a line that is a duplicate
/// of a stored message): `settling/`, the imports, the ledger,
/// `settled/`; then a new divert and a second replay into the existing
/// ledger and folders.
pub const REPLAY: Flow = Flow {
    name: "replay",
    setup: home_with_diverts,
    run: replay_twice,
    expect: |c| expect(c, 2 + 2 + 3 + 2, 2 + 2 + 3 + 2, 4),
    known: None,
};

/// The capture of a retired generation: a writer commits, both sidecars
/// are deleted under it, and its next batch is diverted while the
/// generation it holds is captured (files, manifest, folders).
pub const CAPTURE: Flow = Flow {
    name: "capture",
    setup: existing_home,
    run: capture,
    expect: |c| {
        expect(c, 2 + 3 + 2, 2, 1)?;
        (c.captures.len() == 1 && c.retired.len() == 3 && c.at_risk.is_empty())
            .then_some(())
            .ok_or_else(|| "one capture holding three retired messages".to_string())
    },
    known: None,
};

/// `turnsafe recover --source CAPTURE --output NEW.db --install --home`:
/// rebuild from a pending capture, carry over what `state.db` has that it
/// lacks, swap it in, write `SETTLED`; then replay what was diverted.
pub const RECOVER_INSTALL: Flow = Flow {
    name: "recover_install",
    setup: home_with_capture,
    run: recover_install,
    expect: |c| {
        expect(c, 2 + 3 + 2 + 2, 2 + 3 + 2 + 2, 1)?;
        (c.settled.len() == 1)
            .then_some(())
            .ok_or_else(|| "the capture claimed settled".to_string())
    },
    known: None,
};

/// `turnsafe recover --source CAPTURE --dismiss` of a capture that holds
/// nothing the database lacks, then replay.
pub const RECOVER_DISMISS: Flow = Flow {
    name: "recover_dismiss",
    setup: home_with_empty_capture,
    run: recover_dismiss,
    expect: |c| {
        expect(c, 2 + 3 + 2, 2 + 3 + 2, 1)?;
        (c.settled.len() == 1)
            .then_some(())
            .ok_or_else(|| "the capture claimed settled".to_string())
    },
    known: None,
};

/// A schema v2 `state.db` (`tests/fixtures/state-v2.db`) migrated to v3
/// by the first open, then a commit.
pub const MIGRATE_V2_V3: Flow = Flow {
    name: "migrate_v2_v3",
    setup: v2_home,
    run: migrate,
    expect: |c| expect(c, 6 + 2, 6 + 2, 0),
    known: None,
};

/// A LangGraph thread's steps: three checkpoints with their writes
/// committed (the first into a new schema's tables), two more steps
/// diverted (the store read-only) into the thread's new file, then replay
/// brings them in.
pub const LANGGRAPH: Flow = Flow {
    name: "langgraph",
    setup: existing_home,
    run: langgraph,
    expect: |c| expect(c, 2 + 3 * 3 + 2 * 3, 2 + 3 * 3 + 2 * 3, 4),
    known: None,
};

/// `turnsafe clear` of a session with stored messages and pending divert
/// lines in its file: two message lines, and a LangGraph checkpoint and
/// its writes of a thread whose safe id is the session's. The clear takes
/// the file, archives the rows and the message lines, writes the graph
/// lines back to the divert file (fsynced), ledgers the message lines
/// `cleared` and moves the file to `settled/`; then replay brings the
/// graph lines in. Every line ends in exactly one place: archived, or
/// stored; a cut between the archive's COMMIT and the settling leaves the
/// archived lines pending too, and replay settles them `cleared`.
pub const CLEAR: Flow = Flow {
    name: "clear",
    setup: home_with_a_session_to_clear,
    run: clear_session,
    expect: |c| {
        expect(c, 2 + 3, 2 + 3, 3)?;
        (c.cleared.len() == 4 && c.clearable.is_empty())
            .then_some(())
            .ok_or_else(|| "the clear returned with its four messages".to_string())
    },
    known: None,
};

/// A run without a cut made at least these claims.
fn expect(c: &Claims, acked: usize, in_db: usize, receipts: usize) -> Result<(), String> {
    if c.acked.len() == acked && c.in_db.len() == in_db && c.receipts.len() == receipts {
        Ok(())
    } else {
        Err(format!(
            "expected {acked} acknowledged, {in_db} in state.db, {receipts} receipts; got {}, {}, {}",
            c.acked.len(),
            c.in_db.len(),
            c.receipts.len()
        ))
    }
}

const LEASE: std::time::Duration = std::time::Duration::from_millis(200);

fn store(home: &Path) -> SessionStore {
    SessionStore::new(home, StoreOptions::default())
}

/// A store that opens `state.db` read-only: every batch is diverted.
fn read_only(home: &Path) -> SessionStore {
    SessionStore::new(
        home,
        StoreOptions {
            read_only: true,
            ..StoreOptions::default()
        },
    )
}

fn keys(b: &Batch) -> Vec<Key> {
    b.sent.iter().map(|(k, _)| k.clone()).collect()
}

/// Append `b` with `store`, and claim its outcome.
fn append(store: &mut SessionStore, b: &Batch, power: &Power<'_>, claims: &mut Claims) -> bool {
    let out = store.append_batch(&b.session, &b.messages);
    claims.outcome(&b.sent, &out, power);
    out.persisted || out.receipt.is_some()
}

/// A home with `state.db` holding two messages of `s0`, closed cleanly.
fn existing_home(root: &Path) -> Claims {
    let home = home(root);
    let mut claims = Claims::default();
    let mut store = SessionStore::create(&home, StoreOptions::default()).expect("create the home");
    let b = batch("s0", "setup", 2);
    let out = store.append_batch(&b.session, &b.messages);
    assert!(out.persisted, "{out:?}");
    claims.outcome(&b.sent, &out, &Power::always());
    drop(store);
    claims
}

/// [`existing_home`], with receipted divert files: `s1` (2 messages),
/// `s2` (3), and `s0` holding a copy of a stored message (replay finds it
/// a duplicate).
fn home_with_diverts(root: &Path) -> Claims {
    let mut claims = existing_home(root);
    let home = home(root);
    let mut ro = read_only(&home);
    for b in [batch("s1", "old1", 2), batch("s2", "old2", 3), batch("s0", "setup", 1)] {
        let out = ro.append_batch(&b.session, &b.messages);
        assert!(out.receipt.is_some(), "{out:?}");
        claims.outcome(&b.sent, &out, &Power::always());
    }
    claims
}

/// A writer commits three messages of `s1`; both sidecars are deleted
/// under it, then its next batch is diverted and the retired generation
/// captured. With `checkpoint`, its commits are checkpointed into the
/// main file first, so the capture holds nothing the database lacks.
fn retire_under_a_writer(home: &Path, power: &Power<'_>, claims: &mut Claims, checkpoint: bool) {
    let s1 = sid("s1");
    // A short turn lease: the writer cannot give it back once its
    // generation is retired, and replay waits for a live one.
    let mut writer = SessionStore::new(
        home,
        StoreOptions {
            lease_ttl: LEASE,
            ..StoreOptions::default()
        },
    );
    let a = batch(s1.as_str(), "a", 3);
    append(&mut writer, &a, power, claims);
    if checkpoint && let Ok(c) = rusqlite::Connection::open(home.join("state.db")) {
        let _ = c.busy_timeout(std::time::Duration::from_secs(5));
        let _ = c.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()));
    }
    // Someone else (a cleanup script) deletes the sidecars under the
    // live writer: the generation it commits to is retired.
    for s in ["state.db-wal", "state.db-shm"] {
        let _ = std::fs::remove_file(home.join(s));
    }
    if !checkpoint {
        claims.retire(&keys(&a));
    }
    append(&mut writer, &batch(s1.as_str(), "b", 2), power, claims);
    drop(writer);
}

/// [`existing_home`] with a pending capture holding three messages of `s1`
/// the database lacks, a diverted batch of `s1`, and two messages of `s2`
/// committed after the capture by a writer that was then killed: they are
/// in the WAL only (the files as the writer left them, copied before its
/// close could checkpoint them into the main file).
fn home_with_capture(root: &Path) -> Claims {
    let mut claims = existing_home(root);
    let home = home(root);
    retire_under_a_writer(&home, &Power::always(), &mut claims, false);
    std::thread::sleep(LEASE * 2);
    let mut next = SessionStore::new(
        &home,
        StoreOptions {
            lease_ttl: LEASE,
            ..StoreOptions::default()
        },
    );
    let b = batch("s2", "after", 2);
    let out = next.append_batch(&b.session, &b.messages);
    assert!(out.persisted, "{out:?}");
    claims.outcome(&b.sent, &out, &Power::always());
    let killed: Vec<(PathBuf, Vec<u8>)> = ["state.db", "state.db-wal"]
        .iter()
        .map(|f| (home.join(f), std::fs::read(home.join(f)).expect("the writer's files")))
        .collect();
    drop(next);
    for (path, data) in killed {
        std::fs::write(path, data).expect("the files as the killed writer left them");
    }
    std::thread::sleep(LEASE * 2);
    assert_eq!(claims.captures.len(), 1, "{claims:?}");
    claims
}

/// [`existing_home`] with a pending capture that holds nothing the
/// database lacks (its commits were checkpointed before it was retired).
fn home_with_empty_capture(root: &Path) -> Claims {
    let mut claims = existing_home(root);
    let home = home(root);
    retire_under_a_writer(&home, &Power::always(), &mut claims, true);
    assert_eq!(claims.captures.len(), 1, "{claims:?}");
    std::thread::sleep(LEASE * 2);
    claims
}

/// A home whose `state.db` is the schema v2 fixture: what it holds (each
/// row's role and content, read with the test's own reader) counts as
/// sent and acknowledged.
fn v2_home(root: &Path) -> Claims {
    const FIXTURE: &[u8] = include_bytes!("../fixtures/state-v2.db");
    let home = home(root);
    std::fs::create_dir_all(&home).expect("home");
    std::fs::write(home.join("state.db"), FIXTURE).expect("fixture");
    let mut claims = Claims::default();
    let stored = super::content::read(&home.join("state.db")).expect("the fixture reads");
    assert!(!stored.rows.is_empty(), "the fixture holds messages");
    for (k, rows) in stored.rows {
        let [super::content::Row::Message { item }] = rows.as_slice() else {
            panic!("{k:?} is one message row of the fixture: {rows:?}");
        };
        let object = serde_json::from_str(item).expect("the fixture's row as an object");
        claims.sent.insert(k.clone(), Sent::Message(object));
        claims.acked.insert(k.clone());
        claims.in_db.insert(k);
    }
    claims
}

fn new_home(root: &Path, power: &Power<'_>, claims: &mut Claims) {
    let Ok(mut store) = SessionStore::create(&home(root), StoreOptions::default()) else {
        return;
    };
    for b in 0..3 {
        append(&mut store, &batch("s1", &format!("new{b}"), 2), power, claims);
    }
}

fn group_commit(root: &Path, power: &Power<'_>, claims: &mut Claims) {
    let mut store = store(&home(root));
    let sessions: Vec<SessionId> = (1..=4).map(|i| sid(&format!("g{i}"))).collect();
    for round in 0..2 {
        let batches: Vec<Batch> = sessions
            .iter()
            .map(|s| batch(s.as_str(), &format!("{}-r{round}", s.as_str()), 2))
            .collect();
        let group: Vec<(&SessionId, &[Message])> = batches.iter().map(|b| (&b.session, &b.messages[..])).collect();
        let outs = store.append_group(&group);
        if outs.len() != batches.len() {
            claims
                .problems
                .push(format!("{} outcomes for a group of {}", outs.len(), batches.len()));
        }
        for (b, out) in batches.iter().zip(&outs) {
            claims.outcome(&b.sent, out, power);
        }
    }
}

fn divert_new_file(root: &Path, power: &Power<'_>, claims: &mut Claims) {
    let mut ro = read_only(&home(root));
    for b in [batch("s1", "d1", 2), batch("s2", "d2", 3)] {
        append(&mut ro, &b, power, claims);
    }
}

fn divert_existing_file(root: &Path, power: &Power<'_>, claims: &mut Claims) {
    let mut ro = read_only(&home(root));
    for b in [batch("s1", "more1", 3), batch("s1", "more2", 2)] {
        append(&mut ro, &b, power, claims);
    }
}

fn replay_twice(root: &Path, power: &Power<'_>, claims: &mut Claims) {
    let home = home(root);
    if let Ok(files) = replay(&home, &ReplayOptions::default()) {
        claims.replayed(&files, power);
    }
    let mut ro = read_only(&home);
    append(&mut ro, &batch("s1", "late", 2), power, claims);
    drop(ro);
    if let Ok(files) = replay(&home, &ReplayOptions::default()) {
        claims.replayed(&files, power);
    }
}

fn capture(root: &Path, power: &Power<'_>, claims: &mut Claims) {
    retire_under_a_writer(&home(root), power, claims, false);
}

fn the_capture(claims: &Claims) -> PathBuf {
    PathBuf::from(&claims.captures.first().expect("the setup's capture").path)
}

fn recover_install(root: &Path, power: &Power<'_>, claims: &mut Claims) {
    let home = home(root);
    let capture = the_capture(claims);
    // Each claim is recorded as its step returns.
    let Ok(installed) = rebuild_and_install(&capture, &home, &root.join("recovered.db")) else {
        return;
    };
    claims.installed(power);
    if turnsafe_host::recover::settle_installed(&capture, &installed).is_ok() {
        claims.settled(&capture, power);
    }
    if let Ok(files) = replay(&home, &ReplayOptions::default()) {
        claims.replayed(&files, power);
    }
}

fn recover_dismiss(root: &Path, power: &Power<'_>, claims: &mut Claims) {
    let home = home(root);
    let capture = the_capture(claims);
    match turnsafe_host::recover::dismiss(&capture, &home) {
        Ok(_) => claims.settled(&capture, power),
        Err(e) => eprintln!("dismiss: {e}"),
    }
    match replay(&home, &ReplayOptions::default()) {
        Ok(files) => claims.replayed(&files, power),
        Err(e) => eprintln!("replay: {e}"),
    }
}

fn migrate(root: &Path, power: &Power<'_>, claims: &mut Claims) {
    let mut store = store(&home(root));
    append(&mut store, &batch("s1", "v3", 2), power, claims);
}

/// Step `k` of `thread`: its checkpoint, and its task's two writes.
fn graph_step(thread: &str, k: usize) -> [GraphBatch; 2] {
    let id = format!("1ef-{k:04}");
    let checkpoint = GraphBatch::Checkpoint(CheckpointRecord {
        thread_id: thread.into(),
        checkpoint_ns: String::new(),
        checkpoint_id: id.clone(),
        parent_checkpoint_id: k.checked_sub(1).map(|p| format!("1ef-{p:04}")),
        kind: Some("msgpack".into()),
        checkpoint: vec![k as u8; 300],
        metadata: serde_json::json!({"step": k, "source": "loop"}),
    });
    let writes = GraphBatch::Writes(
        (0..2)
            .map(|i| WriteRecord {
                thread_id: thread.into(),
                checkpoint_ns: String::new(),
                checkpoint_id: id.clone(),
                task_id: format!("task-{k}"),
                task_path: String::new(),
                idx: i,
                channel: "messages".into(),
                kind: Some("msgpack".into()),
                value: vec![i as u8; 120],
            })
            .collect(),
    );
    [checkpoint, writes]
}

/// Put `g` with `store`, and claim its outcome.
fn put(store: &mut SessionStore, g: &GraphBatch, power: &Power<'_>, claims: &mut Claims) -> bool {
    let out = store.put_graph(g);
    claims.outcome(&graph_sent(g), &out, power);
    out.persisted || out.receipt.is_some()
}

/// The LangGraph flow's thread: not a valid session id, so its lines go
/// to a file named by its safe id.
const THREAD: &str = "graph thread/1";

fn langgraph(root: &Path, power: &Power<'_>, claims: &mut Claims) {
    let home = home(root);
    let mut writer = store(&home);
    for k in 0..3 {
        for g in graph_step(THREAD, k) {
            put(&mut writer, &g, power, claims);
        }
    }
    drop(writer);
    let mut ro = read_only(&home);
    for k in 3..5 {
        for g in graph_step(THREAD, k) {
            put(&mut ro, &g, power, claims);
        }
    }
    drop(ro);
    if let Ok(files) = replay(&home, &ReplayOptions::default()) {
        claims.replayed(&files, power);
    }
}

/// The session the clear flow clears; a LangGraph thread of the same id
/// shares its divert file.
const CLEARED: &str = "c1";

/// [`existing_home`], with two messages of `c1` stored, and pending in
/// `sessions/c1.jsonl` (receipted): two message lines of `c1`, then a
/// checkpoint of the thread `c1` and its two writes.
fn home_with_a_session_to_clear(root: &Path) -> Claims {
    let mut claims = existing_home(root);
    let home = home(root);
    let mut writer = store(&home);
    assert!(append(
        &mut writer,
        &batch(CLEARED, "kept", 2),
        &Power::always(),
        &mut claims
    ));
    drop(writer);
    let mut ro = read_only(&home);
    assert!(append(
        &mut ro,
        &batch(CLEARED, "pend", 2),
        &Power::always(),
        &mut claims
    ));
    for g in graph_step(CLEARED, 0) {
        assert!(put(&mut ro, &g, &Power::always(), &mut claims));
    }
    drop(ro);
    assert_eq!(claims.receipts.len(), 3, "{}", claims.summary());
    claims
}

fn clear_session(root: &Path, power: &Power<'_>, claims: &mut Claims) {
    let home = home(root);
    let mut writer = store(&home);
    claims.clearing(CLEARED, power);
    match turnsafe_host::clear::clear(&mut writer, &home, &sid(CLEARED)) {
        Ok(_) => claims.cleared(power),
        Err(e) => eprintln!("clear: {e}"),
    }
    drop(writer);
    match replay(&home, &ReplayOptions::default()) {
        Ok(files) => claims.replayed(&files, power),
        Err(e) => eprintln!("replay: {e}"),
    }
}
