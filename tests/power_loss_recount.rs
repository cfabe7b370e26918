//! The power-loss recount fails when what is stored is not what was sent.
//! Each test runs a flow of `power_loss::flows` on powerfs, cuts the power,
//! then changes what the cut left (a stored byte, a checkpoint's blob, a
//! divert file's written-back lines) or the receipt the flow recorded,
//! before the recount reads it: the recount must name the record and what
//! differs. A recount that only counted keys would pass every one.
mod power_loss;

use std::path::Path;

use power_loss::{Claims, Cut, Prepared, flows};
use powerfs::{CutMode, PowerFs, SyncKind};

/// One flow at a time (see `tests/power_loss_torture.rs`).
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner())
}

fn prepared(flow: &'static power_loss::Flow) -> Prepared<'static> {
    let (prepared, first) = Prepared::new(flow).expect("the flow runs");
    assert!(first.problems.is_empty(), "{}", first.problems.join("\n"));
    prepared
}

/// Write to the database a cut left, with a connection of the test's own.
fn sql(home: &Path, statement: &str, params: &[&dyn rusqlite::ToSql]) {
    let c = rusqlite::Connection::open(home.join("state.db")).expect("open state.db");
    c.busy_timeout(std::time::Duration::from_secs(5)).expect("busy timeout");
    let n = c.execute(statement, params).expect(statement);
    assert_eq!(n, 1, "{statement}: one row changed");
}

/// The first of the cut's problems that contains every one of `words`.
fn found<'c>(cut: &'c Cut, words: &[&str]) -> &'c str {
    cut.problems
        .iter()
        .find(|p| words.iter().all(|w| p.contains(w)))
        .unwrap_or_else(|| panic!("no problem names {words:?}: {:#?}", cut.problems))
}

/// The cut, its problems printed: what the recount says.
fn show(cut: Cut) -> Cut {
    for p in &cut.problems {
        println!("{p}");
    }
    cut
}

#[test]
fn a_stored_message_with_one_changed_byte_fails_the_recount() {
    turnsafe_tests::require!(PowerFs::available());
    let _one = one_at_a_time();
    let prepared = prepared(&flows::GROUP_COMMIT);
    // One byte of one message's `item`: `ipsum` becomes `iqsum`.
    let tamper = |home: &Path, _: &mut Claims| {
        let c = rusqlite::Connection::open(home.join("state.db")).expect("open state.db");
        let item: String = c
            .query_row(
                "SELECT item FROM messages WHERE session_id = 'g2' AND uid = 'g2-r1-1'",
                [],
                |r| r.get(0),
            )
            .expect("the message is stored");
        let mut bytes = item.into_bytes();
        let at = bytes.windows(5).position(|w| w == b"ipsum").expect("the content") + 1;
        bytes[at] = b'q';
        let changed = String::from_utf8(bytes).expect("ASCII");
        drop(c);
        sql(
            home,
            "UPDATE messages SET item = ?1 WHERE session_id = 'g2' AND uid = 'g2-r1-1'",
            &[&changed],
        );
    };
    let cut = show(prepared.cut_tampered(None, CutMode::DropPending, &tamper));
    found(
        &cut,
        &[
            "after the cut",
            r#"("g2", "g2-r1-1") is in state.db with other bytes than sent"#,
            "iqsum",
        ],
    );
    found(
        &cut,
        &[
            "once settled and replayed",
            r#"acknowledged ("g2", "g2-r1-1") is stored with other bytes"#,
        ],
    );
    assert_eq!((cut.lost, cut.changed, cut.duplicated), (0, 1, 0));
}

#[test]
fn a_checkpoint_stored_with_a_stale_blob_fails_the_recount() {
    turnsafe_tests::require!(PowerFs::available());
    let _one = one_at_a_time();
    let prepared = prepared(&flows::LANGGRAPH);
    // Step 2's checkpoint holds step 1's blob, as a put that kept the row
    // it met would leave it.
    let tamper = |home: &Path, _: &mut Claims| {
        sql(
            home,
            "UPDATE checkpoints SET checkpoint = (SELECT checkpoint FROM checkpoints WHERE checkpoint_id = '1ef-0001')
              WHERE checkpoint_id = '1ef-0002'",
            &[],
        );
    };
    let cut = show(prepared.cut_tampered(None, CutMode::DropPending, &tamper));
    found(
        &cut,
        &[
            "once settled and replayed",
            r#"acknowledged ("graph thread/1", "checkpoint::1ef-0002") is stored with other bytes than sent: blob 300 bytes"#,
        ],
    );
    assert_eq!((cut.lost, cut.changed, cut.duplicated), (0, 1, 0));
}

#[test]
fn a_receipt_whose_range_is_off_by_one_fails_the_recount() {
    turnsafe_tests::require!(PowerFs::available());
    let _one = one_at_a_time();
    let prepared = prepared(&flows::DIVERT_EXISTING_FILE);
    // The receipt of `more1`, appended after a batch already in the file,
    // one byte further on.
    let tamper = |_: &Path, claims: &mut Claims| {
        let (r, _) = claims
            .receipts
            .iter_mut()
            .find(|(_, keys)| keys[0].1 == "more1-0")
            .expect("more1's receipt");
        r.offset += 1;
    };
    let cut = show(prepared.cut_tampered(None, CutMode::DropPending, &tamper));
    found(
        &cut,
        &[
            "after the cut: receipt ",
            "s1.jsonl [",
            "of 3 lines: the bytes [",
            "hash to",
            "the receipt says",
        ],
    );
    assert_eq!((cut.lost, cut.changed, cut.duplicated), (0, 0, 0));
}

/// Once a clear's file is settled, the LangGraph lines it wrote back are
/// their only pending copy: without them (as if the write-back had not
/// been fsynced before the file moved to `settled/`), the recount finds
/// the thread's records lost.
#[test]
fn a_clear_without_its_written_back_lines_fails_the_recount() {
    turnsafe_tests::require!(PowerFs::available());
    let _one = one_at_a_time();
    let prepared = prepared(&flows::CLEAR);
    // The clear's last sync (settling/, after settled/): cut at the next,
    // once every step of the clear is durable and before replay.
    let settled = prepared
        .points
        .iter()
        .find(|p| p.kind == SyncKind::DirSync && p.path == Path::new("home/sessions/settled"))
        .expect("the clear moves its file to settled/")
        .n;
    let last = prepared
        .points
        .iter()
        .find(|p| p.n > settled && p.path == Path::new("home/sessions/settling"))
        .expect("and syncs settling/")
        .n;
    let tamper = |home: &Path, _: &mut Claims| {
        std::fs::write(home.join("sessions/c1.jsonl"), b"").expect("empty the divert file");
    };
    let cut = show(prepared.cut_tampered(Some(last + 1), CutMode::DropPending, &tamper));
    found(
        &cut,
        &[
            "after the cut",
            r#"("c1", "checkpoint::1ef-0000") was acknowledged and is neither pending, nor stored, nor archived"#,
        ],
    );
    found(
        &cut,
        &[
            "once settled and replayed",
            r#"acknowledged ("c1", "write::1ef-0000:task-0:1") is lost"#,
        ],
    );
    assert_eq!((cut.lost, cut.changed, cut.duplicated), (3, 0, 0));
    // Without the change, the same cut finds nothing.
    let clean = prepared.cut(Some(last + 1), CutMode::DropPending);
    assert!(
        clean.problems.is_empty() && clean.known.is_empty(),
        "{:#?}",
        clean.problems
    );
}
