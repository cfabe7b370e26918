//! Classification edges the vectors do not reach: which operation a
//! constraint code is read for, and when CANTOPEN's text may name a lock.

use turnsafe_policy::{Basis, Cause, Observation, Operation, classify};

fn obs(operation: Operation, code: Option<i64>, extended_code: Option<i64>, message: &str) -> Observation {
    Observation {
        code,
        extended_code,
        message: message.into(),
        ..Observation::new(operation)
    }
}

#[test]
fn constraint_codes_mean_a_missing_session_or_a_uid_conflict_only_for_a_batch() {
    let fk = |op| classify(&obs(op, Some(19), Some(787), "")).cause;
    let unique = |op| classify(&obs(op, Some(19), Some(2067), "")).cause;
    assert_eq!(fk(Operation::AppendBatch), Cause::SessionRowMissing);
    assert_eq!(unique(Operation::AppendBatch), Cause::UidConflict);
    for op in [
        Operation::Open,
        Operation::Checkpoint,
        Operation::Replay,
        Operation::Divert,
    ] {
        assert_eq!(fk(op), Cause::Unknown, "{op:?}");
        assert_eq!(unique(op), Cause::Unknown, "{op:?}");
    }
}

#[test]
fn only_generic_cantopen_may_rest_on_a_lock_in_its_text() {
    let locked_text = "unable to open database file: database is locked";
    for (code, ext) in [(Some(14), None), (Some(14), Some(14)), (None, Some(14))] {
        let c = classify(&obs(Operation::Open, code, ext, locked_text));
        assert_eq!((c.cause, c.basis), (Cause::Locked, Basis::Message), "{code:?}/{ext:?}");
    }
    // CANTOPEN_ISDIR, NOTEMPDIR, FULLPATH: a specific reason, not a lock.
    for ext in [526, 270, 782] {
        let c = classify(&obs(Operation::Open, Some(14), Some(ext), locked_text));
        assert_eq!((c.cause, c.basis), (Cause::Disk, Basis::Code), "{ext}");
    }
    let c = classify(&obs(
        Operation::Open,
        Some(14),
        Some(14),
        "unable to open database file",
    ));
    assert_eq!((c.cause, c.basis), (Cause::Disk, Basis::Code));
}
