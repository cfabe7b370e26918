//! The copy of a history edit that did not happen (`pop`, `clear`,
//! `restore`, `fork`, `replace`, `prune`, `delete`, `import`): what failed,
//! and that nothing changed, which an edit can promise because it runs in
//! one transaction that either commits whole or not at all.
//!
//! Two exceptions, where the transaction may have committed after all, and
//! the copy says what is known and how to look, never that nothing
//! changed:
//! - a lost COMMIT (`outcome_unknown`, PostgreSQL): nobody can tell
//!   whether the transaction committed;
//! - a COMMIT that failed after its write (SQLite, see
//!   [`crate::possibly_written`]): the edit is not in effect now, but its
//!   frames are in the WAL, and the next open of the database may bring it
//!   back (whole: the WAL keeps a transaction whole or not at all).

use crate::model::Cause;
#[allow(unused_imports)]
use crate::prelude::*;
use crate::text::cat;

/// The copy of a failed edit. `code` is `edit.<cause>`, stable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EditCopy {
    pub code: String,
    pub cause: Cause,
    pub title: String,
    pub body: String,
    pub remediation: Vec<String>,
    /// Ordered key/value details: the edit, the session, the attempts.
    pub details: Vec<(String, String)>,
}

/// Whether the cause can pass: once it has, the same edit may be run
/// again as it was.
fn passes(cause: Cause) -> bool {
    matches!(
        cause,
        Cause::Locked
            | Cause::Compression
            | Cause::Disk
            | Cause::DiskFull
            | Cause::TurnLease
            | Cause::Unavailable
            | Cause::ReadOnly
    )
}

/// Build the copy for `edit` (the edit's name, a noun: `pop`, `clear`, ...)
/// of `session` that stopped with `cause` after `attempts` attempts.
/// `possibly_written` says an attempt failed at or after its COMMIT's
/// write ([`crate::machine::EditMachine::possibly_written`]).
pub fn explain_edit(edit: &str, session: &str, cause: Cause, attempts: u32, possibly_written: bool) -> EditCopy {
    let unknown = cause == Cause::OutcomeUnknown;
    let why = match cause {
        // The flush's words are about a turn taken over midway; an edit
        // meets a turn another process holds.
        Cause::TurnLease => String::from("Another process holds this session's turn"),
        _ => crate::copy::reason_capitalised(cause),
    };
    let maybe = cat(&["The ", edit, " may or may not have happened"]);
    let look = cat(&[
        "Look at the session with `turnsafe show --session ",
        session,
        "` and `--archived` before you run the ",
        edit,
        " again.",
    ]);
    let (title, body) = if unknown {
        (
            maybe,
            cat(&[
                &why,
                ", so turnsafe cannot tell whether the ",
                edit,
                " of session ",
                session,
                " was committed. It happened whole or not at all: `turnsafe show` (with `--archived`) tells which.",
            ]),
        )
    } else if possibly_written {
        (
            maybe,
            cat(&[
                &why,
                ", and COMMIT failed after writing the ",
                edit,
                " of session ",
                session,
                ": the session reads as it did before, but the next open of the database may bring the ",
                edit,
                " back, whole. `turnsafe show` (with `--archived`) then tells which.",
            ]),
        )
    } else {
        (
            cat(&["The ", edit, " did not happen; nothing changed"]),
            cat(&[
                &why,
                ", so the ",
                edit,
                " of session ",
                session,
                " did not happen. Nothing was removed, archived or added: the session reads as it did before.",
            ]),
        )
    };
    let mut remediation: Vec<String> = match cause {
        Cause::OutcomeUnknown => alloc::vec![
            String::from("Check that the database server is reachable (`turnsafe doctor --db URL`)."),
            look,
        ],
        _ if possibly_written => {
            let mut steps = crate::copy::cause_remediation(cause);
            steps.push(look);
            steps
        }
        Cause::TurnLease => alloc::vec![String::from(
            "The session's turn lease ends when its holder exits or stops renewing it."
        )],
        _ => crate::copy::cause_remediation(cause),
    };
    // Run again blindly, an edit that may come back could happen twice.
    if passes(cause) && !possibly_written {
        remediation.push(cat(&["Then run the ", edit, " again."]));
    }
    let mut details = alloc::vec![
        (String::from("edit"), String::from(edit)),
        (String::from("session"), String::from(session)),
        (String::from("attempts"), crate::text::unsigned(u64::from(attempts))),
    ];
    if possibly_written && !unknown {
        details.push((String::from("commit"), String::from("possibly written")));
    }
    EditCopy {
        code: cat(&["edit.", cause.label()]),
        cause,
        title,
        body,
        remediation,
        details,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_lost_commit_does_not_say_nothing_changed() {
        for cause in Cause::ALL {
            let c = explain_edit("pop", "s1", cause, 2, false);
            assert_eq!(c.code, cat(&["edit.", cause.label()]));
            assert!(c.body.contains("session s1"), "{c:?}");
            assert_eq!(
                c.body.contains("Nothing was removed"),
                cause != Cause::OutcomeUnknown,
                "{c:?}"
            );
            assert_eq!(
                c.title.contains("may or may not"),
                cause == Cause::OutcomeUnknown,
                "{c:?}"
            );
            assert!(!c.remediation.is_empty(), "{c:?}");
            assert_eq!(c.details[2], (String::from("attempts"), String::from("2")));
        }
    }

    /// A COMMIT that failed after its write: never "nothing changed", never
    /// "run it again" without looking first, whatever the cause.
    #[test]
    fn a_commit_that_failed_after_its_write_says_it_may_come_back() {
        for cause in Cause::ALL {
            let c = explain_edit("pop", "s1", cause, 1, true);
            assert!(c.title.contains("may or may not"), "{c:?}");
            assert!(!c.body.contains("Nothing was removed"), "{c:?}");
            assert!(!c.body.contains("did not happen"), "{c:?}");
            assert!(
                !c.remediation.iter().any(|s| s.starts_with("Then run the pop again")),
                "{c:?}"
            );
            assert!(
                c.remediation.iter().any(|s| s.contains("before you run the pop again")),
                "{c:?}"
            );
            if cause != Cause::OutcomeUnknown {
                assert!(c.body.contains("COMMIT failed after writing the pop"), "{c:?}");
                assert!(c.body.contains("reads as it did before"), "{c:?}");
                assert_eq!(
                    c.details.last(),
                    Some(&(String::from("commit"), String::from("possibly written")))
                );
            }
        }
    }
}
