//! How a diverted record settles against what is stored under its key:
//! the decision replay makes for each line, on either engine, from the
//! canonical digests of [`crate::same`] and the times the store keeps.
//!
//! The rule: a line is `duplicate` only when its bytes are stored. A key
//! stored with other bytes is never a duplicate:
//! - a message is immutable under its uid, so other bytes are a
//!   `conflict` (quarantined, both digests in the ledger);
//! - a LangGraph record is settled as the live call would have settled
//!   it, had it been made when the line was diverted: replay orders the
//!   line's put (its `at`) among what the stored row records of its own
//!   history (the put that stored it, `created_ms`, and a delete that
//!   marked it, `deleted_ms`) and plays them in that order with
//!   LangGraph's rules (a checkpoint or a special write replaces; an
//!   ordinary write keeps the first copy; a delete marks; a put brings a
//!   marked row back). If the line changes the outcome it is `applied`;
//!   if not, it is `superseded` (its bytes stay in `settled/`, the ledger
//!   names both digests). When the line cannot be placed in time (no
//!   `at`, or the same millisecond as the stored put or delete) and the
//!   placements disagree, it is a `conflict`.

/// What a stored row says of itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stored {
    /// Digest of its canonical bytes.
    pub digest: String,
    /// When the put that stored these bytes was made (ms).
    pub created_ms: i64,
    /// When a delete marked it, if one did (ms).
    pub deleted_ms: Option<i64>,
}

/// How a line settles.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Nothing is stored under the key: store the line.
    Insert,
    /// The line's bytes are stored.
    Duplicate,
    /// Store the line's bytes over the stored row, put at the line's time,
    /// marked deleted at `deleted_ms` when a later delete had marked the
    /// row (the delete still holds).
    Apply { deleted_ms: Option<i64> },
    /// The stored row holds what the live call would have left: the line
    /// changes nothing.
    Superseded(&'static str),
    /// The line cannot be settled without a person: quarantined.
    Conflict(&'static str),
}

impl Verdict {
    /// The ledger's state for this verdict (`docs/DIVERT.md`).
    pub fn state(&self) -> &'static str {
        match self {
            Verdict::Insert => "replayed",
            Verdict::Duplicate => "duplicate",
            Verdict::Apply { .. } => "applied",
            Verdict::Superseded(_) => "superseded",
            Verdict::Conflict(_) => "conflict",
        }
    }

    /// Why, for the ledger's `reason`.
    pub fn reason(&self) -> Option<&'static str> {
        match self {
            Verdict::Superseded(r) | Verdict::Conflict(r) => Some(r),
            Verdict::Apply { deleted_ms: Some(_) } => Some("stored as it was, then marked by the later delete"),
            Verdict::Apply { deleted_ms: None } => Some("the line is newer than the stored version"),
            _ => None,
        }
    }
}

/// The reason of a message whose uid holds other bytes.
pub const UID_CONFLICT: &str = "uid conflict: the stored message has different content";

/// A diverted message against the message stored under its uid.
pub fn message(line_digest: &str, stored_digest: Option<&str>) -> Verdict {
    match stored_digest {
        None => Verdict::Insert,
        Some(d) if d == line_digest => Verdict::Duplicate,
        Some(_) => Verdict::Conflict(UID_CONFLICT),
    }
}

/// A row's state as a sequence of LangGraph calls leaves it.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Row<'a> {
    Absent,
    Live(&'a str),
    Marked(&'a str, i64),
}

#[derive(Debug, Clone, Copy)]
enum Call<'a> {
    Put(&'a str, i64),
    Delete(i64),
}

fn play<'a>(calls: &[Call<'a>], replaces: bool) -> Row<'a> {
    let mut row = Row::Absent;
    for call in calls {
        row = match (*call, row) {
            (Call::Put(d, _), Row::Absent | Row::Marked(..)) => Row::Live(d),
            (Call::Put(d, _), Row::Live(old)) => Row::Live(if replaces { d } else { old }),
            (Call::Delete(at), Row::Live(d)) => Row::Marked(d, at),
            (Call::Delete(_), other) => other,
        };
    }
    row
}

/// A diverted LangGraph record against the row stored under its key.
/// `replaces`: a checkpoint, or a special write (LangGraph's negative
/// index); `at_ms`: when the line was diverted, if the line says.
pub fn graph(line_digest: &str, replaces: bool, at_ms: Option<i64>, stored: Option<&Stored>) -> Verdict {
    let Some(s) = stored else {
        return Verdict::Insert;
    };
    if s.deleted_ms.is_none() && s.digest == line_digest {
        return Verdict::Duplicate;
    }
    let mut history = vec![Call::Put(&s.digest, s.created_ms)];
    if let Some(d) = s.deleted_ms {
        history.push(Call::Delete(d));
    }
    let now = play(&history, replaces);
    let verdict_at = |place: usize| {
        let mut calls = history.clone();
        calls.insert(place, Call::Put(line_digest, 0));
        let after = play(&calls, replaces);
        if after == now {
            if s.digest == line_digest {
                Verdict::Duplicate
            } else if replaces {
                Verdict::Superseded("the stored version is newer")
            } else if matches!(calls.first(), Some(Call::Put(d, _)) if *d == s.digest) {
                Verdict::Superseded("the stored copy came first (an ordinary write keeps its first copy)")
            } else {
                Verdict::Superseded("the line changes nothing the stored row records")
            }
        } else {
            Verdict::Apply {
                deleted_ms: match after {
                    Row::Marked(_, at) => Some(at),
                    _ => None,
                },
            }
        }
    };
    // Where the line's put may go among the stored calls: each place its
    // time allows (every place when the line has no time).
    let time_of = |c: &Call<'_>| match c {
        Call::Put(_, t) | Call::Delete(t) => *t,
    };
    let places: Vec<usize> = (0..=history.len())
        .filter(|&p| {
            let Some(at) = at_ms else { return true };
            let after_prev = p == 0 || time_of(&history[p - 1]) <= at;
            let before_next = p == history.len() || at <= time_of(&history[p]);
            after_prev && before_next
        })
        .collect();
    let mut verdicts = places.into_iter().map(verdict_at);
    let Some(first) = verdicts.next() else {
        // Stored times out of order (a delete before its put): nothing
        // can be said of the line's place.
        return Verdict::Conflict("the stored row's times are out of order");
    };
    if verdicts.all(|v| v == first) {
        first
    } else {
        Verdict::Conflict("the line and the stored version cannot be ordered in time")
    }
}

/// The session a `settling/` file belongs to.
pub fn session_of_settling(name: &str) -> Option<&str> {
    name.split_once('@').map(|(session, _)| session)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stored(d: &str, created: i64, deleted: Option<i64>) -> Stored {
        Stored {
            digest: d.into(),
            created_ms: created,
            deleted_ms: deleted,
        }
    }

    #[test]
    fn a_message_is_the_same_only_by_its_bytes() {
        assert_eq!(message("a", None), Verdict::Insert);
        assert_eq!(message("a", Some("a")), Verdict::Duplicate);
        assert_eq!(message("a", Some("b")), Verdict::Conflict(UID_CONFLICT));
    }

    #[test]
    fn a_checkpoint_newer_than_the_stored_one_replaces_it() {
        assert_eq!(
            graph("new", true, Some(20), Some(&stored("old", 10, None))),
            Verdict::Apply { deleted_ms: None }
        );
        assert_eq!(
            graph("old", true, Some(5), Some(&stored("new", 10, None))),
            Verdict::Superseded("the stored version is newer")
        );
    }

    #[test]
    fn equal_bytes_live_are_a_duplicate_whatever_the_time() {
        for at in [None, Some(0), Some(10), Some(99)] {
            assert_eq!(graph("x", true, at, Some(&stored("x", 10, None))), Verdict::Duplicate);
            assert_eq!(graph("x", false, at, Some(&stored("x", 10, None))), Verdict::Duplicate);
        }
    }

    #[test]
    fn a_marked_row_comes_back_when_the_put_was_after_the_delete() {
        // Same bytes, deleted before the line's put: the put brings it back.
        assert_eq!(
            graph("x", true, Some(30), Some(&stored("x", 10, Some(20)))),
            Verdict::Apply { deleted_ms: None }
        );
        // Deleted after the line's put: the delete stands, the bytes are stored.
        assert_eq!(
            graph("x", true, Some(15), Some(&stored("x", 10, Some(20)))),
            Verdict::Duplicate
        );
        // Other bytes, put between the stored put and the delete: stored, then marked.
        assert_eq!(
            graph("y", true, Some(15), Some(&stored("x", 10, Some(20)))),
            Verdict::Apply { deleted_ms: Some(20) }
        );
        // An ordinary write after the delete replaces the marked copy.
        assert_eq!(
            graph("y", false, Some(30), Some(&stored("x", 10, Some(20)))),
            Verdict::Apply { deleted_ms: None }
        );
    }

    #[test]
    fn an_ordinary_write_keeps_the_first_copy() {
        assert_eq!(
            graph("late", false, Some(20), Some(&stored("first", 10, None))),
            Verdict::Superseded("the stored copy came first (an ordinary write keeps its first copy)")
        );
        // The line was first: the stored copy would never have been written.
        assert_eq!(
            graph("first", false, Some(5), Some(&stored("late", 10, None))),
            Verdict::Apply { deleted_ms: None }
        );
    }

    #[test]
    fn a_line_that_cannot_be_ordered_is_a_conflict() {
        let c = Verdict::Conflict("the line and the stored version cannot be ordered in time");
        assert_eq!(graph("y", true, None, Some(&stored("x", 10, None))), c);
        assert_eq!(graph("y", true, Some(10), Some(&stored("x", 10, None))), c);
        assert_eq!(graph("y", false, Some(10), Some(&stored("x", 10, None))), c);
        // Without a time, an ordinary write over a marked row: before the
        // stored put it wins, between put and delete it is dropped, after
        // the delete it brings the row back. Three answers, so none.
        assert_eq!(graph("y", false, None, Some(&stored("x", 10, Some(20)))), c);
    }

    #[test]
    fn nothing_stored_is_an_insert() {
        assert_eq!(graph("x", true, None, None), Verdict::Insert);
    }
}
