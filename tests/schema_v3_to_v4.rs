//! A `state.db` written by the schema v3 code (`tests/fixtures/state-v3.db`)
//! gains the archive and the lineage (v4) when a store opens it: every row
//! stays exactly as it was, edits then archive, the index keeps its
//! watermark, and the first prune that frees pages converts the file to
//! incremental vacuum once.
mod common;
use common::*;
use turnsafe_host::backend::Backend;
use turnsafe_host::backend::History;
use turnsafe_host::history::{Keep, PruneOptions, Reason, Selector};
use turnsafe_host::transcript::stored_messages;

const FIXTURE: &[u8] = include_bytes!("fixtures/state-v3.db");

fn v3_home() -> Home {
    let home = Home::new();
    std::fs::write(home.db(), FIXTURE).unwrap();
    home
}

fn read(home: &Home, session: &str) -> Vec<(String, i64, serde_json::Value)> {
    let conn = turnsafe_host::store::open_read_only(&home.db()).unwrap();
    stored_messages(&conn, session, None)
        .unwrap()
        .into_iter()
        .map(|m| (m.uid, m.seq, serde_json::Value::Object(m.message)))
        .collect()
}

#[test]
fn opening_migrates_to_v4_and_keeps_every_row() {
    let home = v3_home();
    let version = |h: &Home| -> i64 { h.other().query_row("PRAGMA user_version", [], |r| r.get(0)).unwrap() };
    assert_eq!(version(&home), 3);
    let before = (read(&home, "s1"), read(&home, "s2"));
    assert_eq!(before.0.len(), 5);
    // Readers that never migrate see no archive and no lineage.
    let conn = turnsafe_host::store::open_read_only(&home.db()).unwrap();
    assert!(
        turnsafe_host::store::history::archived(&conn, "s1", None)
            .unwrap()
            .is_empty()
    );
    assert!(turnsafe_host::store::history::lineage(&conn, "s1").unwrap().is_none());
    drop(conn);

    let mut store = home.store();
    assert!(store.is_open());
    // Through version 4 to the current one.
    assert_eq!(version(&home), turnsafe_host::store::SCHEMA_VERSION);
    assert_eq!((read(&home, "s1"), read(&home, "s2")), before);
    let watermark: String = home
        .other()
        .query_row("SELECT value FROM state_meta WHERE key = 'fts_watermark'", [], |r| {
            r.get(0)
        })
        .unwrap();
    assert_eq!(watermark, "5");

    // Edits archive on the migrated file, and restore.
    let popped = store.pop_last(&sid("s1")).unwrap().unwrap();
    assert_eq!(popped.uid, "u5");
    assert_eq!(store.archived("s1", None).unwrap()[0].reason, "pop");
    let r = store
        .restore(
            &sid("s1"),
            &Selector::Reason {
                reason: Reason::Pop,
                since_ms: None,
            },
        )
        .unwrap();
    assert_eq!(r.restored, [("u5".to_string(), 5)]);
    assert_eq!(read(&home, "s1"), before.0);
    assert!(store.fork(&sid("s1"), 2, &sid("s3")).unwrap().is_ok());
    assert_eq!(store.lineage("s3").unwrap().session, "s1");
    // A new batch goes on after the migrated rows.
    assert!(store.append_batch(&sid("s1"), &batch("new", 1)).persisted);
    assert_eq!(read(&home, "s1").last().unwrap().1, 6);

    // auto_vacuum was NONE before version 4: the first prune that frees
    // pages converts the file.
    let auto: i64 = home.other().query_row("PRAGMA auto_vacuum", [], |r| r.get(0)).unwrap();
    assert_eq!(auto, 0);
    let opts = |archived_only| PruneOptions {
        keep: Keep::Last(0),
        archived_only,
        session: Some("s2".into()),
        dry_run: false,
    };
    store.prune(&opts(false)).unwrap();
    let r = store.prune(&opts(true)).unwrap();
    assert!(r.deleted() > 0, "{r:?}");
    assert_eq!(r.space, "reclaimed", "{r:?}");
    let auto: i64 = home.other().query_row("PRAGMA auto_vacuum", [], |r| r.get(0)).unwrap();
    assert_eq!(auto, 2);
}
