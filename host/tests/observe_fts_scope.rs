//! `fts_scope` is evidence only the host can give, from the statement it
//! ran: a message that names the index adds nothing.
use turnsafe_policy::{Basis, Cause, Evidence, Operation};

fn corrupt(message: &str) -> rusqlite::Error {
    rusqlite::Error::SqliteFailure(
        rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_CORRUPT),
        Some(message.into()),
    )
}

#[test]
fn a_message_naming_the_index_is_no_scope() {
    for text in [
        "fts5: corruption found reading blob 17 from table \"messages_fts\"",
        "database disk image is malformed (messages_fts_data)",
    ] {
        let obs =
            turnsafe_host::observe::observation(Operation::AppendBatch, &corrupt(text), None, Vec::new(), 1, 0, 0);
        assert!(obs.evidence.is_empty(), "{text}: {:?}", obs.evidence);
        let c = turnsafe_policy::classify(&obs);
        assert_eq!((c.cause, c.basis), (Cause::Corrupt, Basis::Code), "{text}");
    }
}

#[test]
fn a_statement_the_host_knows_writes_the_index_is() {
    let obs = turnsafe_host::observe::observation(
        Operation::AppendBatch,
        &corrupt("database disk image is malformed"),
        None,
        vec![Evidence::FtsScope],
        1,
        0,
        0,
    );
    let c = turnsafe_policy::classify(&obs);
    assert_eq!((c.cause, c.basis), (Cause::FtsIndex, Basis::Evidence));
}
