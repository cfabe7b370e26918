//! The backend seam: the one executor over SQLite and over a real
//! PostgreSQL server, fed the same batches, gives the same outcomes, the
//! same transcript, the same stored uids, the same search hits and a
//! stable identity. Only the receipt paths differ.
mod common;
use common::*;
use serde_json::Value;
use turnsafe_host::backend::Engine;
use turnsafe_host::message::Message;
use turnsafe_host::store::{SessionStore, StoreOptions};

/// The hits for `zebra`: uid, seq, and the reason of an archived one.
fn zebra_hits<B: Engine>(b: &mut B, archived: bool) -> Value {
    let hits = b.search("zebra", None, 10, archived).unwrap().hits;
    serde_json::json!(
        hits.iter()
            .map(|h| (h.uid.clone(), h.seq, h.archived.as_ref().map(|a| a.reason.clone())))
            .collect::<Vec<_>>()
    )
}

/// Everything observable, with paths taken out.
fn exercise<B: Engine>(w: &mut B) -> Vec<Value> {
    let s1 = sid("s1");
    let mut seen = Vec::new();
    let outcome = |o: turnsafe_host::outcome::FlushOutcome| {
        let mut v = o.to_value();
        v["receipt"] = Value::Null;
        v
    };
    seen.push(outcome(w.append_batch(&s1, &batch("a", 3))));
    seen.push(outcome(w.append_batch(&s1, &batch("a", 3))));
    let conflict = vec![
        Message::new("user", "new").with_uid("n-1"),
        Message::new("user", "not what was stored").with_uid("a-1"),
    ];
    seen.push(outcome(w.append_batch(&s1, &conflict)));
    let object = |v: Value| Message::from_item(v.as_object().cloned().unwrap_or_default());
    let json = object(
        serde_json::json!({"role": "assistant", "content": {"tool": "search", "args": [1, 2]}, "name": "tool-call"}),
    )
    .with_uid("j-1");
    // A message of any shape: no role, no content.
    let call = object(serde_json::json!({"type": "function_call", "call_id": "c1", "arguments": "{\"q\": 1}"}))
        .with_uid("c-1");
    seen.push(outcome(w.append_batch(&s1, &[json, call])));
    seen.push(outcome(w.append_batch(&sid("s2"), &batch("zebra", 2))));

    let b = w;
    seen.push(Value::Array(b.transcript("s1").unwrap()));
    let asked: Vec<String> = ["a-0", "n-1", "j-1", "nope"].iter().map(|s| s.to_string()).collect();
    seen.push(serde_json::json!(b.stored_uids("s1", &asked).unwrap()));
    let hits = b.search("zebra message", None, 10, false).unwrap();
    seen.push(serde_json::json!(
        hits.hits
            .iter()
            .map(|h| (h.session.clone(), h.uid.clone(), h.seq, h.snippet.contains("[zebra]")))
            .collect::<Vec<_>>()
    ));
    let scoped = b.search("message", Some("s2"), 1, false).unwrap();
    seen.push(serde_json::json!(
        scoped.hits.iter().map(|h| h.uid.clone()).collect::<Vec<_>>()
    ));
    // What an edit took out is found with `archived` only, marked so.
    let popped = b.pop_last(&sid("s2")).unwrap().expect("a row to pop");
    let active = zebra_hits(b, false);
    let all = zebra_hits(b, true);
    assert!(!active.to_string().contains(&popped.uid), "{active}");
    assert!(all.to_string().contains(&popped.uid), "{all}");
    seen.push(active);
    seen.push(all);
    let id = b.identity().unwrap();
    assert!(!id.generation.is_empty());
    assert_eq!(b.identity().unwrap(), id, "the identity is stable");
    seen
}

#[test]
fn sqlite_and_postgres_perform_the_same_effects() {
    let server = pg_or_skip!();
    let db = server.create_db("seam");

    let sqlite_home = Home::new();
    let mut on_sqlite = SessionStore::new(sqlite_home.path(), StoreOptions::default());
    let pg_home = Home::new();
    let mut on_pg = pg::store(&server.url(&db), pg_home.path());

    let a = exercise(&mut on_sqlite);
    let b = exercise(&mut on_pg);
    for (i, (x, y)) in a.iter().zip(&b).enumerate() {
        assert_eq!(x, y, "step {i} differs:\nsqlite   {x}\npostgres {y}");
    }
    assert_eq!(a[0]["persisted"], true);
    assert_eq!(a[2]["cause"], "uid_conflict");
    assert_eq!(a[5].as_array().unwrap().len(), 5, "{}", a[5]);
    assert_eq!(a[5][4]["message"]["type"], "function_call", "{}", a[5]);
    assert_eq!(a[6], serde_json::json!(["a-0", "j-1"]));
    assert_eq!(a[7].as_array().unwrap().len(), 2, "{}", a[7]);
    assert_eq!(on_sqlite.counters(), on_pg.counters());
}
