//! Time per policy decision (classify + decide + copy), native and through
//! the embedded component with one instance reused, plus component sizes.
//!
//! Run: `cargo bench -p turnsafe-host --bench policy`.

use std::io::Write;
use std::time::Instant;

use turnsafe_host::engine::{COMPONENT, COMPONENT_UNSTRIPPED_LEN, PolicyEngine, WasmEngine, wit};
use turnsafe_policy::machine as m;
use turnsafe_policy::{CopyContext, Observation, Operation, Outcome, decide, explain};

fn main() {
    // `cargo test --all-targets` runs bench binaries without `--bench`:
    // build them there, but only measure under `cargo bench`.
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    let n = 200_000u32;
    let mut obs = Observation::new(Operation::AppendBatch);
    obs.code = Some(14);
    obs.errno = Some(24);
    obs.message = "unable to open database file".into();
    let ctx = CopyContext {
        receipt: Some(turnsafe_policy::machine::DivertReceipt {
            path: "/h/sessions/s1.jsonl".into(),
            offset: 0,
            length: 231,
            count: 1,
            sha256: "5f2b".repeat(16),
        }),
        ..CopyContext::default()
    };

    let t = Instant::now();
    let mut sink = 0usize;
    for i in 0..n {
        obs.seed = u64::from(i);
        let d = decide(&obs);
        let c = explain(d.classification.cause, Outcome::Diverted, &ctx).unwrap();
        sink += c.body.len();
    }
    let native = t.elapsed().as_secs_f64() / f64::from(n);

    let mut engine = WasmEngine::new().unwrap();
    let wobs = wit::Observation {
        operation: wit::Operation::AppendBatch,
        engine: wit::DbEngine::Sqlite,
        sqlstate: None,
        code: Some(14),
        extended_code: None,
        message: "unable to open database file".into(),
        errno: Some(24),
        evidence: vec![],
        attempt: 1,
        elapsed_ms: 0,
        seed: 0,
        lease: None,
    };
    let wctx = wit::CopyContext {
        session: None,
        receipt: Some(wit::DivertReceipt {
            path: "/h/sessions/s1.jsonl".into(),
            offset: 0,
            length: 231,
            count: 1,
            sha256: "5f2b".repeat(16),
        }),
        divert_failure: None,
        errno: None,
        capture_receipt: None,
        capture_failure: None,
        divert_residue: None,
        pending_capture: None,
        durability: wit::Durability::Synced,
        lease: None,
    };
    let m = 20_000u32;
    let t = Instant::now();
    for _ in 0..m {
        let d = engine.call(|g, s| g.call_decide(&mut *s, &wobs)).unwrap();
        let c = engine
            .call(|g, s| g.call_explain(&mut *s, d.classification.cause, wit::Outcome::Diverted, &wctx))
            .unwrap()
            .unwrap();
        sink += c.body.len();
    }
    let wasm = t.elapsed().as_secs_f64() / f64::from(m);

    let line = r#"{"operation":"open","code":14,"errno":24,"message":"unable to open database file"}"#;
    let t = Instant::now();
    for _ in 0..m {
        sink += engine.classify_json(line).unwrap().len();
    }
    let wasm_json = t.elapsed().as_secs_f64() / f64::from(m);

    // One whole flush through the machine, no I/O: open, a locked write,
    // a wait, the write again, committed, done with its outcome.
    let flushes = 20_000u32;
    let uids: Vec<String> = (0..10).map(|i| format!("u{i}")).collect();
    let locked = m::Failure {
        code: Some(5),
        extended_code: Some(5),
        message: "database is locked".into(),
        ..m::Failure::default()
    };
    let t = Instant::now();
    for i in 0..flushes {
        let mut h = m::Handle::new();
        h.start(m::FlushStart {
            session: "s1".into(),
            uids: uids.clone(),
            minted_uids: Vec::new(),
            seed: u64::from(i),
            pending_capture: None,
            durability: Default::default(),
        })
        .unwrap();
        let events = [
            m::Event::Opened,
            m::Event::Failed(locked.clone()),
            m::Event::Waited { elapsed_ms: 30 },
            m::Event::Committed,
        ];
        for e in events {
            let _ = h.poll();
            h.handle(e).unwrap();
        }
        if let Some(m::Step::Done(r)) = h.poll() {
            sink += r.to_json().len();
        }
    }
    let native_flush = t.elapsed().as_secs_f64() / f64::from(flushes);

    let start = serde_json::json!({ "session": "s1", "uids": uids, "minted_uids": [], "seed": 7 });
    let events = [
        serde_json::json!({ "type": "opened" }),
        serde_json::json!({ "type": "failed", "code": 5, "extended_code": 5, "message": "database is locked" }),
        serde_json::json!({ "type": "waited", "elapsed_ms": 30 }),
        serde_json::json!({ "type": "committed" }),
    ];
    let mut json_flush = |engine: &mut dyn PolicyEngine, n: u32| {
        let t = Instant::now();
        for _ in 0..n {
            let mut answer = engine
                .flush_step_json(&serde_json::json!({ "state": null, "start": start }).to_string())
                .unwrap();
            for e in &events {
                let state: serde_json::Value =
                    serde_json::from_str::<serde_json::Value>(&answer).unwrap()["state"].clone();
                answer = engine
                    .flush_step_json(&serde_json::json!({ "state": state, "event": e }).to_string())
                    .unwrap();
            }
            sink += answer.len();
        }
        t.elapsed().as_secs_f64() / f64::from(n)
    };
    let native_json_flush = json_flush(&mut turnsafe_host::engine::NativeEngine, flushes);
    let wasm_json_flush = json_flush(&mut engine, flushes / 4);

    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    gz.write_all(COMPONENT).unwrap();
    let gz = gz.finish().unwrap().len();

    println!("policy decision (classify + decide + copy)");
    println!("  native           {:>8.3} us/decision", native * 1e6);
    println!(
        "  wasmtime typed   {:>8.3} us/decision  ({:.1}x native)",
        wasm * 1e6,
        wasm / native
    );
    println!("  wasmtime json    {:>8.3} us/classify-json", wasm_json * 1e6);
    println!("one whole flush through the machine (open, locked, wait, write, committed, done)");
    println!("  native typed     {:>8.3} us/flush", native_flush * 1e6);
    println!(
        "  native json      {:>8.3} us/flush  (flush-step-json, 5 calls)",
        native_json_flush * 1e6
    );
    println!(
        "  wasmtime json    {:>8.3} us/flush  ({:.1}x native json)",
        wasm_json_flush * 1e6,
        wasm_json_flush / native_json_flush
    );
    println!(
        "component (wasm32-unknown-unknown + wit-component, imports: {:?})",
        engine.imports()
    );
    println!("  raw (unstripped) {COMPONENT_UNSTRIPPED_LEN} B");
    println!("  stripped         {} B (embedded)", COMPONENT.len());
    println!("  gzip -9          {gz} B");
    std::hint::black_box(sink);
}
