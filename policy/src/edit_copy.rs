//! The copy of a history edit that did not happen (`pop`, `clear`,
//! `restore`, `fork`, `replace`, `prune`, `delete`, `import`): what failed,
//! and that nothing changed, which an edit can promise because it runs in
//! one transaction that either commits whole or not at all.
//!
//! The one exception is a lost COMMIT (`outcome_unknown`, PostgreSQL):
//! nobody can tell whether the transaction committed, so that copy says
//! so and tells how to look, never that nothing changed.

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
pub fn explain_edit(edit: &str, session: &str, cause: Cause, attempts: u32) -> EditCopy {
    let why = match cause {
        // The flush's words are about a turn taken over midway; an edit
        // meets a turn another process holds.
        Cause::TurnLease => String::from("Another process holds this session's turn"),
        _ => crate::copy::reason_capitalised(cause),
    };
    let (title, body) = if cause == Cause::OutcomeUnknown {
        (
            cat(&["The ", edit, " may or may not have happened"]),
            cat(&[
                &why,
                ", so turnsafe cannot tell whether the ",
                edit,
                " of session ",
                session,
                " was committed. It happened whole or not at all: `turnsafe show` (with `--archived`) tells which.",
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
        Cause::TurnLease => alloc::vec![String::from(
            "Let the process that holds it finish its turn, or its lease expire."
        )],
        Cause::OutcomeUnknown => alloc::vec![
            String::from("Check that the database server is reachable (`turnsafe doctor --db URL`)."),
            cat(&[
                "Look at the session with `turnsafe show --session ",
                session,
                "` and `--archived` before you run the ",
                edit,
                " again.",
            ]),
        ],
        _ => crate::copy::cause_remediation(cause),
    };
    if passes(cause) {
        remediation.push(cat(&["Then run the ", edit, " again."]));
    }
    EditCopy {
        code: cat(&["edit.", cause.label()]),
        cause,
        title,
        body,
        remediation,
        details: alloc::vec![
            (String::from("edit"), String::from(edit)),
            (String::from("session"), String::from(session)),
            (String::from("attempts"), crate::text::unsigned(u64::from(attempts))),
        ],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_lost_commit_does_not_say_nothing_changed() {
        for cause in Cause::ALL {
            let c = explain_edit("pop", "s1", cause, 2);
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
}
