//! Event-sequence vectors of the flush machine (`tests/vectors/flush_sequences.json`):
//! a start, the events a host feeds back, and the steps the machine must
//! ask for, down to the final outcome. Native Rust and the embedded
//! component (through `flush-step-json`) must both give exactly the
//! expected steps, and the same bytes; Python and Node run the same file.
//!
//! Every runtime drives a case the same way:
//!
//! ```text
//! state = null
//! for turn in case.turns:
//!     answer = flush_step_json({state, start: turn.start})
//!     steps = [answer.step]
//!     for event in turn.events:
//!         answer = flush_step_json({state: answer.state, event})
//!         steps.append(answer.step)
//!     assert steps == the turn's expected steps
//! ```
//!
//! The cases are written below; `TURNSAFE_WRITE_SEQUENCES=1 cargo test
//! --test flush_sequences` writes the file from them after a reviewed
//! change to the machine. Without it, the file is only read and checked.

use serde_json::{Value, json};
use turnsafe_host::engine::{NativeEngine, PolicyEngine, WasmEngine};

const PATIENCE_MS: u64 = turnsafe_policy::RetryPlan::PATIENCE_MS;

fn file() -> std::path::PathBuf {
    turnsafe_tests::root().join("tests/vectors/flush_sequences.json")
}

fn start(batch: &str, n: usize, seed: u64) -> Value {
    let uids: Vec<String> = (0..n).map(|i| format!("{batch}-{i}")).collect();
    json!({ "session": "s1", "uids": uids, "minted_uids": [], "seed": seed })
}

/// A failure that classifies as `cause`.
fn failed(cause: &str, elapsed_ms: u64) -> Value {
    let (code, ext, evidence, message, errno): (Value, Value, Vec<&str>, &str, Value) = match cause {
        "locked" => (json!(5), json!(5), vec![], "database is locked", json!(null)),
        "disk" => (json!(14), json!(14), vec![], "unable to open database file", json!(24)),
        "disk_full" => (json!(13), json!(13), vec![], "database or disk is full", json!(28)),
        "replaced" => (
            json!(null),
            json!(null),
            vec!["db_replaced"],
            "turnsafe guard: replaced",
            json!(null),
        ),
        "deleted_wal" => (
            json!(null),
            json!(null),
            vec!["deleted_wal_generation"],
            "turnsafe guard: the WAL was deleted",
            json!(null),
        ),
        "corrupt" => (json!(26), json!(26), vec![], "file is not a database", json!(null)),
        "fts_index" => (
            json!(11),
            json!(267),
            vec!["fts_scope"],
            "fts5: corrupt index",
            json!(null),
        ),
        "turn_lease" => (
            json!(null),
            json!(null),
            vec!["turn_lease_lost"],
            "lease lost",
            json!(null),
        ),
        "compression" => (
            json!(null),
            json!(null),
            vec!["compression_in_progress"],
            "compacting",
            json!(null),
        ),
        "compression_closed" => (
            json!(null),
            json!(null),
            vec!["compression_closed"],
            "closed",
            json!(null),
        ),
        "session_row_missing" => (
            json!(19),
            json!(787),
            vec![],
            "FOREIGN KEY constraint failed",
            json!(null),
        ),
        "uid_conflict" => (json!(19), json!(2067), vec![], "UNIQUE constraint failed", json!(null)),
        "unknown" => (json!(null), json!(null), vec![], "", json!(null)),
        // PostgreSQL's: the SQLSTATE decides, and `commit_sent` makes a lost
        // connection an unknown outcome.
        "unavailable" | "read_only" | "outcome_unknown" => {
            let (sqlstate, evidence) = match cause {
                "unavailable" => ("08006", vec![]),
                "read_only" => ("25006", vec![]),
                _ => ("08006", vec!["commit_sent"]),
            };
            return json!({ "type": "failed", "code": 10, "extended_code": null,
                "message": format!("postgres SQLSTATE {sqlstate}: connection lost"), "errno": null,
                "evidence": evidence, "elapsed_ms": elapsed_ms, "engine": "postgres", "sqlstate": sqlstate });
        }
        other => panic!("no representative for {other}"),
    };
    json!({ "type": "failed", "code": code, "extended_code": ext, "message": message, "errno": errno,
            "evidence": evidence, "elapsed_ms": elapsed_ms })
}

/// A PostgreSQL connection that failed its TLS handshake, as the host
/// reports it: no SQLSTATE, `SQLITE_IOERR` (so `disk`), the reason named
/// in the message before the client's own text.
fn failed_tls(reason: turnsafe_policy::TlsFailure, client_text: &str) -> Value {
    json!({ "type": "failed", "code": 10, "extended_code": null,
            "message": format!("postgres SQLSTATE none: {}: {client_text}", reason.text()), "errno": null,
            "evidence": [], "elapsed_ms": 3, "engine": "postgres" })
}

/// SQLite's COMMIT whose WAL sync failed after its frames were written
/// (`SQLITE_IOERR_FSYNC`, the host's `commit_sent`): `disk`, possibly written.
fn failed_at_commit() -> Value {
    json!({ "type": "failed", "code": 10, "extended_code": 1034, "message": "disk I/O error", "errno": 5,
            "evidence": ["commit_sent"], "elapsed_ms": 2 })
}

fn opened() -> Value {
    json!({ "type": "opened" })
}
fn committed() -> Value {
    json!({ "type": "committed" })
}
fn waited(elapsed_ms: u64) -> Value {
    json!({ "type": "waited", "elapsed_ms": elapsed_ms })
}
fn resolved(all_stored: bool) -> Value {
    json!({ "type": "resolved", "all_stored": all_stored })
}
fn diverted(n: u64, offset: u64) -> Value {
    json!({ "type": "diverted", "receipt": { "path": "/home/agent/.turnsafe/sessions/s1.jsonl",
            "offset": offset, "length": 230 * n, "count": n, "sha256": "ab".repeat(32) } })
}
fn divert_failed(residue: bool) -> Value {
    let residue = residue.then(|| json!({ "path": "/home/agent/.turnsafe/sessions/s1.jsonl", "offset": 460 }));
    json!({ "type": "divert_failed", "operation": if residue.is_some() { "fsync" } else { "open" },
            "errno": if residue.is_some() { 5 } else { 24 }, "message": "io", "residue": residue })
}
fn captured() -> Value {
    json!({ "type": "captured", "receipt": {
        "path": "/home/agent/.turnsafe/state.db.retired-20261130T120000Z-42",
        "files": [{ "name": "state.db", "size": 8192 }, { "name": "state.db-wal", "size": 41232 }],
        "manifest_sha256": "cd".repeat(32) } })
}
fn capture_failed() -> Value {
    json!({ "type": "capture_failed", "operation": "mkdir", "errno": 2,
            "error": "capture of the retired generation failed at mkdir: No such file or directory (os error 2)" })
}

const CAUSES: [&str; 16] = [
    "locked",
    "disk",
    "disk_full",
    "replaced",
    "deleted_wal",
    "corrupt",
    "fts_index",
    "turn_lease",
    "compression",
    "compression_closed",
    "session_row_missing",
    "uid_conflict",
    "unavailable",
    "read_only",
    "outcome_unknown",
    "unknown",
];

/// The events that end a turn whose machine asks for `step`, taking the
/// happy branch of everything that follows.
fn finish(step: &Value, events: &mut Vec<Value>) -> bool {
    let next = match step["type"].as_str() {
        Some("open") => opened(),
        Some("write") => committed(),
        Some("wait") => waited(300),
        Some("capture") => captured(),
        Some("divert") => diverted(2, 0),
        Some("resolve") => resolved(true),
        _ => return false,
    };
    events.push(next);
    true
}

/// One turn: a start and the events fed back.
type Turn = (Value, Vec<Value>);

/// The cases: (name, turns). A turn's events may be completed by `finish`
/// (marked by a trailing `null`).
fn cases() -> Vec<(String, Vec<Turn>)> {
    let mut out = Vec::new();
    for cause in CAUSES {
        // At open: past the patience, so a retryable cause ends too.
        out.push((
            format!("open_{cause}"),
            vec![(start("a", 2, 1), vec![failed(cause, PATIENCE_MS + 1), Value::Null])],
        ));
        // At the write of an open store, early: remedies and retries run.
        out.push((
            format!("write_{cause}"),
            vec![(start("a", 2, 2), vec![opened(), failed(cause, 10), Value::Null])],
        ));
    }
    out.push((
        "first_try_commit".into(),
        vec![(start("a", 3, 3), vec![opened(), committed()])],
    ));
    out.push((
        "locked_outlasted_at_open".into(),
        vec![(
            start("a", 2, 4),
            vec![
                failed("locked", 0),
                waited(40),
                failed("locked", 60),
                waited(120),
                opened(),
                committed(),
            ],
        )],
    ));
    out.push((
        "locked_past_patience_diverts".into(),
        vec![(
            start("a", 2, 5),
            vec![
                opened(),
                failed("locked", 10),
                waited(100),
                failed("locked", 2000),
                waited(2300),
                failed("locked", PATIENCE_MS),
                diverted(2, 0),
            ],
        )],
    ));
    out.push((
        "fts_degraded_once_then_diverted".into(),
        vec![(
            start("a", 2, 6),
            vec![opened(), failed("fts_index", 5), failed("fts_index", 9), diverted(2, 0)],
        )],
    ));
    out.push((
        "capture_failed_then_diverted".into(),
        vec![(
            start("a", 2, 7),
            vec![opened(), failed("deleted_wal", 5), capture_failed(), diverted(2, 0)],
        )],
    ));
    out.push((
        "divert_failed_no_residue".into(),
        vec![(start("a", 2, 8), vec![failed("disk", 0), divert_failed(false)])],
    ));
    out.push((
        "divert_failed_with_residue".into(),
        vec![(
            start("a", 2, 9),
            vec![opened(), failed("disk_full", 3), divert_failed(true)],
        )],
    ));
    out.push((
        "capture_then_divert_failed".into(),
        vec![(
            start("a", 2, 10),
            vec![opened(), failed("replaced", 3), captured(), divert_failed(false)],
        )],
    ));
    out.push((
        "sticky_corrupt_across_two_batches".into(),
        vec![
            (start("a", 2, 11), vec![opened(), failed("corrupt", 3), diverted(2, 0)]),
            (start("b", 3, 12), vec![diverted(3, 460)]),
        ],
    ));
    out.push((
        "sticky_deleted_wal_names_its_capture_later".into(),
        vec![
            (
                start("a", 2, 13),
                vec![opened(), failed("deleted_wal", 3), captured(), diverted(2, 0)],
            ),
            (start("b", 1, 14), vec![divert_failed(false)]),
        ],
    ));
    out.push((
        "corrupt_at_open_is_never_opened_again".into(),
        vec![
            (start("a", 1, 15), vec![failed("corrupt", 0), diverted(1, 0)]),
            (start("b", 1, 16), vec![diverted(1, 230)]),
        ],
    ));
    // An unsettled capture holds rows of this session: the batch goes to
    // the divert file with the capture's cause, the database untouched and
    // the handle not sticky: the next batch, of a session the capture does
    // not hold, opens and commits.
    let held = |batch: &str, n: usize, seed: u64, cause: &str| {
        let mut s = start(batch, n, seed);
        s["pending_capture"] =
            json!({"path": "/home/agent/.turnsafe/state.db.retired-20261201T000000Z-7", "cause": cause});
        s
    };
    out.push((
        "pending_capture_diverts_its_sessions_only".into(),
        vec![
            (held("a", 2, 40, "deleted_wal"), vec![diverted(2, 0)]),
            (start("b", 1, 41), vec![opened(), committed()]),
            (held("c", 1, 42, "corrupt"), vec![divert_failed(false)]),
        ],
    ));
    // A host that commits without a sync (SQLite `synchronous=NORMAL`)
    // says so at the start: a commit is then `durable: false`, a commit
    // after a retry is told as written, not saved; a receipt stays durable.
    let unsynced = |batch: &str, n: usize, seed: u64| {
        let mut s = start(batch, n, seed);
        s["durability"] = json!("unsynced");
        s
    };
    out.push((
        "unsynced_commits_are_not_durable".into(),
        vec![
            (unsynced("a", 2, 50), vec![opened(), committed()]),
            (
                unsynced("b", 2, 51),
                vec![failed("locked", 10), waited(40), committed()],
            ),
            (unsynced("c", 1, 52), vec![failed("disk", 0), diverted(1, 0)]),
        ],
    ));
    out.push((
        "disk_at_open_opens_again_next_batch".into(),
        vec![
            (start("a", 1, 17), vec![failed("disk", 0), diverted(1, 0)]),
            (start("b", 1, 18), vec![opened(), committed()]),
        ],
    ));
    // PostgreSQL: a lost COMMIT looked up on a new connection.
    out.push((
        "lost_commit_found_stored".into(),
        vec![(
            start("a", 2, 19),
            vec![opened(), failed("outcome_unknown", 10), opened(), resolved(true)],
        )],
    ));
    out.push((
        "lost_commit_not_stored_is_written_again".into(),
        vec![(
            start("a", 2, 20),
            vec![
                opened(),
                failed("outcome_unknown", 10),
                opened(),
                resolved(false),
                committed(),
            ],
        )],
    ));
    out.push((
        "lost_commit_server_gone_diverts_as_unknown".into(),
        vec![(
            start("a", 2, 21),
            vec![
                opened(),
                failed("outcome_unknown", 10),
                failed("unavailable", 20),
                waited(150),
                failed("unavailable", PATIENCE_MS + 1),
                diverted(2, 0),
            ],
        )],
    ));
    out.push((
        "lost_commit_lookup_fails_then_succeeds".into(),
        vec![(
            start("a", 2, 22),
            vec![
                opened(),
                failed("outcome_unknown", 10),
                opened(),
                failed("unavailable", 30),
                waited(200),
                opened(),
                resolved(true),
            ],
        )],
    ));
    out.push((
        "failover_read_only_then_new_primary".into(),
        vec![
            (
                start("a", 1, 23),
                vec![
                    opened(),
                    failed("read_only", 10),
                    waited(90),
                    failed("unavailable", 120),
                    waited(400),
                    opened(),
                    committed(),
                ],
            ),
            (start("b", 1, 24), vec![committed()]),
        ],
    ));
    // PostgreSQL: a server and a URL that disagree on TLS. `disk`, as any
    // configuration the next batch meets again, with the reason in the copy;
    // the next batch connects again.
    out.push((
        "postgres_tls_not_offered_names_its_reason".into(),
        vec![
            (
                start("a", 1, 25),
                vec![
                    failed_tls(
                        turnsafe_policy::TlsFailure::NotOffered,
                        "error performing TLS handshake: server does not support TLS",
                    ),
                    diverted(1, 0),
                ],
            ),
            (start("b", 1, 26), vec![opened(), committed()]),
        ],
    ));
    // SQLite: a COMMIT that failed after its write. The batch is diverted
    // (or handed back) as any `disk` failure, and its copy says possibly
    // written; the handle stays open and the next batch commits.
    out.push((
        "sqlite_commit_failed_after_its_write_says_possibly_written".into(),
        vec![
            (start("a", 2, 28), vec![opened(), failed_at_commit(), diverted(2, 0)]),
            (start("b", 1, 29), vec![committed()]),
        ],
    ));
    out.push((
        "sqlite_commit_failed_after_its_write_and_the_divert_failed".into(),
        vec![(
            start("a", 2, 30),
            vec![opened(), failed_at_commit(), divert_failed(false)],
        )],
    ));
    out.push((
        "postgres_tls_certificate_names_its_reason".into(),
        vec![(
            start("a", 1, 27),
            vec![
                failed_tls(
                    turnsafe_policy::TlsFailure::Certificate,
                    "error performing TLS handshake: invalid peer certificate: UnknownIssuer",
                ),
                divert_failed(false),
            ],
        )],
    ));
    out
}

fn step(engine: &mut dyn PolicyEngine, request: Value) -> (String, Value) {
    let answer = engine
        .flush_step_json(&request.to_string())
        .expect("the engine answers");
    let v: Value = serde_json::from_str(&answer).expect("the answer is JSON");
    assert!(v.get("error").is_none(), "refused: {v}\nrequest: {request}");
    (answer, v)
}

/// Drive one case; returns each turn's steps and the raw answers.
fn drive(engine: &mut dyn PolicyEngine, turns: &[Turn]) -> (Vec<Vec<Value>>, Vec<String>) {
    let mut state = Value::Null;
    let mut all_steps = Vec::new();
    let mut answers = Vec::new();
    for (start, events) in turns {
        let (raw, v) = step(engine, json!({ "state": state, "start": start }));
        answers.push(raw);
        let mut steps = vec![v["step"].clone()];
        state = v["state"].clone();
        for e in events {
            let (raw, v) = step(engine, json!({ "state": state, "event": e }));
            answers.push(raw);
            steps.push(v["step"].clone());
            state = v["state"].clone();
        }
        all_steps.push(steps);
    }
    (all_steps, answers)
}

/// Complete the `null`-marked turns with `finish`, natively.
fn resolved_cases() -> Vec<Value> {
    let mut native = NativeEngine;
    cases()
        .into_iter()
        .map(|(name, turns)| {
            let mut done = Vec::new();
            for (start, events) in turns {
                let open_ended = events.last().is_some_and(Value::is_null);
                let mut events: Vec<Value> = events.into_iter().filter(|e| !e.is_null()).collect();
                if open_ended {
                    loop {
                        let mut so_far = done.clone();
                        so_far.push((start.clone(), events.clone()));
                        let (steps, _) = drive(&mut native, &so_far);
                        let last = steps.last().and_then(|s| s.last()).cloned().unwrap_or(Value::Null);
                        if !finish(&last, &mut events) {
                            break;
                        }
                    }
                }
                done.push((start, events));
            }
            let (steps, _) = drive(&mut native, &done);
            json!({
                "name": name,
                "turns": done.iter().zip(steps).map(|((start, events), steps)| json!({
                    "start": start, "events": events, "steps": steps,
                })).collect::<Vec<_>>(),
            })
        })
        .collect()
}

#[test]
fn the_file_holds_the_cases() {
    let cases = resolved_cases();
    if std::env::var("TURNSAFE_WRITE_SEQUENCES").as_deref() == Ok("1") {
        // Writing the expected steps from the machine under test is a
        // reviewed act on a developer's machine; CI only checks them.
        assert!(
            !turnsafe_tests::in_ci(),
            "TURNSAFE_WRITE_SEQUENCES=1 is refused under CI=true: CI checks the recorded steps, never writes them"
        );
        let text = serde_json::to_string_pretty(&cases).expect("serialises") + "\n";
        std::fs::write(file(), text).expect("writes the vectors");
    }
    let text = std::fs::read_to_string(file()).expect("tests/vectors/flush_sequences.json exists");
    let stored: Vec<Value> = serde_json::from_str(&text).expect("the vectors are JSON");
    assert_eq!(
        stored, cases,
        "the machine's steps differ from the reviewed vectors: rerun with TURNSAFE_WRITE_SEQUENCES=1 \
         after reviewing the change, and commit the file"
    );
}

#[test]
fn native_and_wasm_give_the_expected_steps_byte_for_byte() {
    let text = std::fs::read_to_string(file()).expect("vectors exist");
    let cases: Vec<Value> = serde_json::from_str(&text).expect("JSON");
    let mut causes_at = std::collections::BTreeSet::new();
    let mut native = NativeEngine;
    let mut wasm = WasmEngine::new().expect("component loads");
    for case in &cases {
        let turns: Vec<Turn> = case["turns"]
            .as_array()
            .expect("turns")
            .iter()
            .map(|t| (t["start"].clone(), t["events"].as_array().expect("events").clone()))
            .collect();
        let (n_steps, n_raw) = drive(&mut native, &turns);
        let (_, w_raw) = drive(&mut wasm, &turns);
        assert_eq!(n_raw, w_raw, "{}: native and wasm answers differ", case["name"]);
        for (i, t) in case["turns"].as_array().expect("turns").iter().enumerate() {
            assert_eq!(
                &Value::Array(n_steps[i].clone()),
                &t["steps"],
                "{}: turn {i} steps differ from the vector",
                case["name"]
            );
            let done = n_steps[i].last().expect("a turn ends");
            assert_eq!(done["type"], "done", "{}: turn {i} does not end done", case["name"]);
            let o = &done["outcome"];
            let n = t["start"]["uids"].as_array().expect("uids").len() as u64;
            let placed =
                o["committed"].as_u64().unwrap() + o["diverted"].as_u64().unwrap() + o["handed_back"].as_u64().unwrap();
            assert_eq!(placed, n, "{}: messages unaccounted for", case["name"]);
            for s in &n_steps[i] {
                if let Some(c) = s["outcome"]["cause"].as_str() {
                    causes_at.insert(c.to_string());
                }
            }
        }
    }
    assert!(cases.len() >= 35, "only {} cases", cases.len());
    for cause in CAUSES {
        assert!(causes_at.contains(cause), "no case ends with cause {cause}");
    }
}

#[test]
fn a_malformed_state_is_refused_with_a_clear_error() {
    let mut native = NativeEngine;
    for bad in [
        json!({ "v": 99, "open": false }),
        json!({ "open": false }),
        json!("opaque"),
        json!({ "v": 1, "open": true, "sticky": "not-a-cause" }),
        json!({ "v": 1, "open": true, "flush": { "start": {}, "events": [{ "type": "bogus" }] } }),
    ] {
        let answer = native
            .flush_step_json(&json!({ "state": bad, "event": opened() }).to_string())
            .unwrap();
        let v: Value = serde_json::from_str(&answer).unwrap();
        let e = v["error"].as_str().unwrap_or_else(|| panic!("accepted {bad}: {v}"));
        assert!(e.contains("the state is not one this policy wrote"), "{e}");
    }
    let answer = native
        .flush_step_json(&json!({ "state": null, "event": opened() }).to_string())
        .unwrap();
    assert!(answer.contains("error"), "an event with no flush: {answer}");
}
