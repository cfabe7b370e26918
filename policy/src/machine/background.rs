//! Work outside a flush that has nothing to divert: an edit of a stored
//! transcript (`pop`, `clear`), the search index's catch-up. After each
//! failed attempt the host asks [`after_failure`] what to do next and only
//! does it; the decision table decides, as for every other write.

use crate::model::{ActionKind, Cause, Observation};

/// The next move after a failed attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    /// Wait this long, then try again.
    Wait { ms: u64 },
    /// Write around the full-text index (mark it for rebuild), then try
    /// again: offered once per piece of work.
    DegradeFts,
    /// Stop: the work fails with this cause; `action` is the one the
    /// decision table named (`fail_closed`, or what there was no way to do).
    Stop { cause: Cause, action: ActionKind },
}

/// Decide the next move for `obs`. `degraded` says whether the work
/// already wrote around the index once: a second index failure stops it.
pub fn after_failure(obs: &Observation, degraded: bool) -> Next {
    let d = crate::decide::decide(obs);
    let cause = d.classification.cause;
    match d.action {
        ActionKind::Retry => Next::Wait {
            ms: d.delay_ms.unwrap_or(1),
        },
        ActionKind::DegradeFts if !degraded => Next::DegradeFts,
        action => Next::Stop { cause, action },
    }
}

/// The next move of the search index's catch-up after a failed chunk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IndexNext {
    /// Wait this long, then try the chunk again.
    Wait { ms: u64 },
    /// The index itself is damaged (`fts_index`): mark it for rebuild, in
    /// a transaction of its own, and stop. Search stops trusting it and
    /// scans the committed rows without it.
    MarkForRebuild,
    /// Stop with this cause: the rows past the watermark stay committed
    /// and unindexed, and search scans them. `action` is the one the
    /// decision table named.
    Stop { cause: Cause, action: ActionKind },
}

/// Decide the catch-up's next move for `obs`. The catch-up writes the
/// index and nothing else, so there is nothing to write around: where other
/// work would degrade the index once, the catch-up marks it for rebuild.
pub fn after_index_failure(obs: &Observation) -> IndexNext {
    match after_failure(obs, true) {
        Next::Wait { ms } => IndexNext::Wait { ms },
        Next::DegradeFts
        | Next::Stop {
            cause: Cause::FtsIndex, ..
        } => IndexNext::MarkForRebuild,
        Next::Stop { cause, action } => IndexNext::Stop { cause, action },
    }
}

/// The move for work a sticky handle is asked to do: it never touches the
/// database again, so it stops at once, failing closed with the sticky cause.
pub fn refused(sticky: Cause) -> Next {
    Next::Stop {
        cause: sticky,
        action: ActionKind::FailClosed,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codes;
    use crate::model::{Engine, Evidence, Operation};

    fn obs(code: i64, evidence: Vec<Evidence>) -> Observation {
        Observation {
            code: Some(code),
            evidence,
            engine: Engine::Sqlite,
            attempt: 1,
            ..Observation::new(Operation::Replay)
        }
    }

    #[test]
    fn a_lock_waits_the_plans_delay() {
        assert!(matches!(after_failure(&obs(codes::BUSY, vec![]), false), Next::Wait { ms } if ms > 0));
    }

    #[test]
    fn an_index_failure_is_written_around_once_then_stops() {
        let o = obs(codes::CORRUPT, vec![Evidence::FtsScope]);
        assert_eq!(after_failure(&o, false), Next::DegradeFts);
        assert!(matches!(
            after_failure(&o, true),
            Next::Stop {
                cause: Cause::FtsIndex,
                ..
            }
        ));
    }

    #[test]
    fn a_damaged_index_is_marked_for_rebuild_at_any_attempt() {
        let mut o = obs(codes::CORRUPT, vec![Evidence::FtsScope]);
        assert_eq!(after_index_failure(&o), IndexNext::MarkForRebuild);
        o.attempt = 3;
        assert_eq!(after_index_failure(&o), IndexNext::MarkForRebuild);
        assert!(matches!(
            after_index_failure(&obs(codes::BUSY, vec![Evidence::FtsScope])),
            IndexNext::Wait { .. }
        ));
        assert!(matches!(
            after_index_failure(&obs(codes::FULL, vec![Evidence::FtsScope])),
            IndexNext::Stop {
                cause: Cause::DiskFull,
                ..
            }
        ));
    }

    #[test]
    fn anything_else_stops_with_its_cause() {
        assert!(matches!(
            after_failure(&obs(codes::READONLY, vec![]), false),
            Next::Stop { cause: Cause::Disk, .. }
        ));
        assert_eq!(
            refused(Cause::Corrupt),
            Next::Stop {
                cause: Cause::Corrupt,
                action: ActionKind::FailClosed
            }
        );
    }
}
