//! One snapshot per cause of a failed history edit, each the copy a
//! failed `pop` prints: a changed word is a reviewed snapshot change.

use turnsafe_policy::{Cause, explain_edit};

fn text(c: &turnsafe_policy::EditCopy) -> String {
    format!(
        "code: {}\ntitle: {}\nbody: {}\nremediation:\n{}\ndetails:\n{}\n",
        c.code,
        c.title,
        c.body,
        c.remediation.iter().map(|s| format!("  - {s}\n")).collect::<String>(),
        c.details
            .iter()
            .map(|(k, v)| format!("  {k}: {v}\n"))
            .collect::<String>()
    )
}

#[test]
fn one_snapshot_per_cause_of_a_failed_edit() {
    turnsafe_tests::snapshot_settings().bind(|| {
        for cause in Cause::ALL {
            let c = explain_edit("pop", "s-7f3a", cause, 3, false);
            insta::assert_snapshot!(format!("edit__{}", cause.label()), text(&c));
        }
    });
}

/// A pop whose COMMIT failed after its write (the WAL's sync failed), as
/// SQLite gives it: `disk`, or `disk_full` when the sync ran out of space
/// (`ENOSPC`). The copy says it may come back, never that nothing changed.
#[test]
fn one_snapshot_per_edit_whose_commit_failed_after_its_write() {
    turnsafe_tests::snapshot_settings().bind(|| {
        for cause in [Cause::Disk, Cause::DiskFull] {
            let c = explain_edit("pop", "s-7f3a", cause, 1, true);
            insta::assert_snapshot!(format!("edit__{}__possibly_written", cause.label()), text(&c));
        }
    });
}

/// Every edit's name reads in its copy, and only a lost COMMIT leaves
/// open whether the edit happened.
#[test]
fn every_edit_is_named_in_its_copy() {
    for edit in [
        "pop", "clear", "restore", "fork", "replace", "prune", "delete", "import",
    ] {
        let c = explain_edit(edit, "s1", Cause::Locked, 1, false);
        assert!(c.title.contains(edit) && c.body.contains(edit), "{c:?}");
        assert!(c.remediation.last().is_some_and(|s| s.contains(edit)), "{c:?}");
        let c = explain_edit(edit, "s1", Cause::Corrupt, 1, false);
        assert!(!c.remediation.iter().any(|s| s.contains("again")), "{c:?}");
        let c = explain_edit(edit, "s1", Cause::OutcomeUnknown, 1, false);
        assert!(
            c.body.contains("cannot tell") && !c.body.contains("did not happen"),
            "{c:?}"
        );
    }
}
