//! Whether a failed write may still be in the store: only a failure at or
//! after COMMIT's write can leave one there.
//!
//! SQLite writes a transaction's frames to the WAL at COMMIT, the commit
//! frame last, then syncs it. When the sync fails, SQLite does not add the
//! frames to the WAL index, so nothing reads them now; but they are in the
//! WAL file, with a valid commit frame, and the WAL recovery of the next
//! process to open the database brings them back. Such a batch is not
//! visible now and possibly written. A failure before COMMIT (an open, a
//! statement, a lock COMMIT never got) wrote nothing that can come back,
//! and neither did a failed write of the frames (`SQLITE_IOERR_WRITE`,
//! `SQLITE_FULL`): the commit frame never reached the file whole, and
//! recovery stops at the first frame whose checksum fails.
//!
//! The host says which step failed: the evidence `commit_sent` on a
//! failure of COMMIT itself. PostgreSQL's failures at COMMIT are told
//! apart by classification instead: a lost connection is
//! `outcome_unknown`, and a server that answered with an error rolled the
//! transaction back.

use crate::codes::FULL;
use crate::model::{Cause, Engine, Evidence, Observation};

/// `SQLITE_IOERR_WRITE`: a write of the file failed.
const IOERR_WRITE: i64 = 778;

/// Whether the write that failed with `obs`, which classification gave
/// `cause`, may have reached the store: a SQLite COMMIT (`commit_sent`)
/// that failed after its frames were written, that is, other than for a
/// lock it did not get (`locked`: BUSY, LOCKED, ...) or in the write of
/// its frames (`SQLITE_IOERR_WRITE`, `SQLITE_FULL`).
pub fn possibly_written(obs: &Observation, cause: Cause) -> bool {
    let code = obs.extended_code.or(obs.code);
    let write_failed = code == Some(IOERR_WRITE) || code.map(crate::codes::primary_of) == Some(FULL);
    obs.engine == Engine::Sqlite && obs.has(Evidence::CommitSent) && cause != Cause::Locked && !write_failed
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codes;
    use crate::model::Operation;

    fn at_commit(engine: Engine, code: i64, evidence: &[Evidence]) -> bool {
        let obs = Observation {
            engine,
            extended_code: Some(code),
            evidence: evidence.to_vec(),
            ..Observation::new(Operation::AppendBatch)
        };
        possibly_written(&obs, crate::classify::classify(&obs).cause)
    }

    #[test]
    fn only_a_sqlite_commit_that_failed_past_its_lock_is_possibly_written() {
        let sent = [Evidence::CommitSent];
        // The WAL's sync failed (SQLITE_IOERR_FSYNC), after the frames were
        // written; or the WAL index could not take them (SQLITE_IOERR_SHMMAP).
        assert!(at_commit(Engine::Sqlite, 1034, &sent));
        assert!(at_commit(Engine::Sqlite, 5386, &sent));
        // A frame's write failed: the commit frame never reached the file.
        assert!(!at_commit(Engine::Sqlite, 778, &sent));
        assert!(!at_commit(Engine::Sqlite, codes::FULL, &sent));
        // COMMIT never got its lock.
        assert!(!at_commit(Engine::Sqlite, codes::BUSY, &sent));
        assert!(!at_commit(Engine::Sqlite, 517, &sent));
        assert!(!at_commit(Engine::Sqlite, codes::LOCKED, &sent));
        // Any failure before COMMIT.
        assert!(!at_commit(Engine::Sqlite, 1034, &[]));
        // PostgreSQL: classification tells (`outcome_unknown`).
        assert!(!at_commit(Engine::Postgres, 10, &sent));
    }
}
