//! `turnsafe append` without `--session`: each line names its session, and
//! the lines already waiting on stdin are committed together.
//!
//! A reader thread takes lines off stdin as they come, so whatever arrived
//! while a group was committing is waiting, whole, when the next group is
//! formed. Answers are printed in input order, each only after its batch
//! settled.
//!
//! On PostgreSQL the batches go through a [`SharedStore`] with pipelined
//! groups ([`stream_shared`]): while one group's COMMIT waits for the
//! server, the next is written on another connection, and a printer thread
//! still answers in input order.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, mpsc};

use serde_json::Value;

use super::Store;
use crate::backend::SharedStore;
use crate::exit;
use crate::ids::SessionId;
use crate::message::{Message, MessageError};
use crate::outcome::FlushOutcome;
use crate::store::{GROUP_MAX_BATCHES, GROUP_MAX_BYTES};

/// Why a line is not a batch of this mode.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub(crate) enum LineError {
    #[error(
        "without --session each line must be {{\"session\": ID, \"messages\": [...]}} \
         or {{\"session\": ID, \"items\": [...], \"uids\": [...]}}"
    )]
    NotASessionBatch,
    #[error("invalid session: {0}")]
    Session(String),
    #[error(transparent)]
    Batch(#[from] MessageError),
}

/// Parse one line: `{"session", "messages"}` or `{"session", "items", "uids"}`.
pub(crate) fn parse_line(text: &str) -> Result<(SessionId, Vec<Message>), LineError> {
    let Ok(Value::Object(mut obj)) = crate::json_in::value(text) else {
        return Err(LineError::NotASessionBatch);
    };
    let session = match obj.remove("session") {
        Some(Value::String(s)) => SessionId::new(&s).map_err(LineError::Session)?,
        _ => return Err(LineError::NotASessionBatch),
    };
    let batch = match obj.remove("messages") {
        Some(messages @ Value::Array(_)) if obj.is_empty() => Message::batch_from_value(messages)?,
        Some(_) => return Err(LineError::NotASessionBatch),
        // The items form: what is left is `{"items", "uids"}`.
        None if obj.contains_key("items") => Message::batch_from_value(Value::Object(obj))?,
        None => return Err(LineError::NotASessionBatch),
    };
    Ok((session, batch))
}

/// One input line, as read: its text, or why it cannot be read.
struct Line {
    number: u64,
    text: Result<String, String>,
}

/// What a line became.
enum Parsed {
    Batch(SessionId, Vec<Message>),
    Bad(String),
}

/// The outcome's JSON with `"session"` first.
fn with_session(session: &SessionId, outcome: &FlushOutcome) -> String {
    let report = outcome.report.to_json();
    let rest = report.strip_prefix('{').unwrap_or(&report);
    let id = Value::String(session.as_str().to_string());
    if rest.starts_with('}') {
        format!("{{\"session\":{id}{rest}")
    } else {
        format!("{{\"session\":{id},{rest}")
    }
}

/// Answer every line; `after(n)` runs after the n-th batch.
pub(super) fn stream(mut store: Store, after: impl Fn(u64)) -> i32 {
    let (tx, rx) = mpsc::channel::<std::io::Result<Line>>();
    // The reader ends with stdin; if the writer stops first (stdout gone),
    // its sends fail and it ends too.
    std::thread::spawn(move || {
        let read = crate::cli::for_each_exact_line(|number, text| {
            tx.send(Ok(Line {
                number,
                text: text.map(str::to_string),
            }))
            .is_ok()
        });
        if let Err(e) = read {
            let _ = tx.send(Err(e));
        }
    });
    let (mut all_persisted, mut batches) = (true, 0u64);
    'input: while let Ok(first) = rx.recv() {
        // The first line, and every line already waiting, within the bounds.
        let mut lines = Vec::new();
        let mut bytes = 0usize;
        let mut next = Some(first);
        while let Some(line) = next.take() {
            match line {
                Ok(line) => {
                    bytes += line.text.as_ref().map_or(0, String::len);
                    lines.push(line);
                }
                Err(e) => {
                    eprintln!("turnsafe append: reading stdin: {e}");
                    all_persisted = false;
                    break;
                }
            }
            if lines.len() < GROUP_MAX_BATCHES && bytes < GROUP_MAX_BYTES {
                next = rx.try_recv().ok();
            }
        }
        let parsed: Vec<Parsed> = lines
            .iter()
            .map(|line| {
                let read = match &line.text {
                    Ok(text) => parse_line(text).map_err(|e| e.to_string()),
                    Err(not_utf8) => Err(not_utf8.clone()),
                };
                match read {
                    Ok((session, batch)) => Parsed::Batch(session, batch),
                    Err(e) => Parsed::Bad(serde_json::json!({ "error": e, "line": line.number }).to_string()),
                }
            })
            .collect();
        let group: Vec<(&SessionId, &[Message])> = parsed
            .iter()
            .filter_map(|p| match p {
                Parsed::Batch(session, batch) => Some((session, batch.as_slice())),
                Parsed::Bad(_) => None,
            })
            .collect();
        let mut outcomes = crate::backend::group::append_group(store.as_mut(), &group).into_iter();
        for p in &parsed {
            let answer = match p {
                Parsed::Bad(answer) => {
                    all_persisted = false;
                    answer.clone()
                }
                Parsed::Batch(session, _) => {
                    let Some(outcome) = outcomes.next() else {
                        // append_group answers every batch; never print a guess.
                        all_persisted = false;
                        break;
                    };
                    all_persisted &= outcome.persisted;
                    batches += 1;
                    after(batches);
                    crate::failpoint::hit("append.before_print");
                    with_session(session, &outcome)
                }
            };
            if !crate::cli::emit(&answer) {
                break 'input;
            }
        }
    }
    store.release_all_leases();
    if all_persisted { exit::OK } else { exit::NOT_PERSISTED }
}

/// A line's answer, for the printer.
enum Answer {
    Bad(String),
    Settled(SessionId, Box<FlushOutcome>),
}

/// [`stream`] through a shared store, whose lanes pipeline the groups: a
/// batch is handed over as soon as its line is read (at most
/// `in_flight` of them unanswered), and a printer thread prints each
/// answer in input order once its batch settled.
pub(super) fn stream_shared(store: SharedStore) -> i32 {
    let in_flight = GROUP_MAX_BATCHES * store.lanes() * 2;
    let (lines_tx, lines) = mpsc::channel::<std::io::Result<Line>>();
    std::thread::spawn(move || {
        let read = crate::cli::for_each_exact_line(|number, text| {
            lines_tx
                .send(Ok(Line {
                    number,
                    text: text.map(str::to_string),
                }))
                .is_ok()
        });
        if let Err(e) = read {
            let _ = lines_tx.send(Err(e));
        }
    });
    // Tokens for the answers not yet printed: a send blocks when
    // `in_flight` are out, so a fast writer cannot queue without bound.
    let (tokens, taken) = mpsc::sync_channel::<()>(in_flight);
    let (answers_tx, answers) = mpsc::channel::<(u64, Answer)>();
    let broken = Arc::new(AtomicBool::new(false));
    let printer = {
        let broken = Arc::clone(&broken);
        std::thread::spawn(move || print_in_order(&answers, &taken, &broken))
    };
    let mut read_ok = true;
    let mut index = 0u64;
    while let Ok(line) = lines.recv() {
        if broken.load(Ordering::Acquire) {
            break;
        }
        let line = match line {
            Ok(line) => line,
            Err(e) => {
                eprintln!("turnsafe append: reading stdin: {e}");
                read_ok = false;
                break;
            }
        };
        if tokens.send(()).is_err() {
            break;
        }
        let parsed = match &line.text {
            Ok(text) => parse_line(text).map_err(|e| e.to_string()),
            Err(not_utf8) => Err(not_utf8.clone()),
        };
        let this = index;
        index += 1;
        match parsed {
            Err(e) => {
                let answer = serde_json::json!({ "error": e, "line": line.number }).to_string();
                let _ = answers_tx.send((this, Answer::Bad(answer)));
            }
            Ok((session, batch)) => {
                let tx = answers_tx.clone();
                let answered = session.clone();
                store.append_batch_then(&session, batch, move |outcome| {
                    let _ = tx.send((this, Answer::Settled(answered, Box::new(outcome))));
                });
            }
        }
    }
    store.settle();
    drop(answers_tx);
    drop(tokens);
    let all_persisted = printer.join().unwrap_or(false) && read_ok;
    // Dropping the last handle gives every lease back.
    drop(store);
    if all_persisted { exit::OK } else { exit::NOT_PERSISTED }
}

/// Print each answer in input order as it comes; false when any batch was
/// not persisted, a line was bad, or stdout went away.
fn print_in_order(answers: &mpsc::Receiver<(u64, Answer)>, taken: &mpsc::Receiver<()>, broken: &AtomicBool) -> bool {
    let mut all_persisted = true;
    let mut next = 0u64;
    let mut early: BTreeMap<u64, Answer> = BTreeMap::new();
    while let Ok((index, answer)) = answers.recv() {
        early.insert(index, answer);
        while let Some(answer) = early.remove(&next) {
            next += 1;
            let _ = taken.try_recv();
            if broken.load(Ordering::Acquire) {
                continue;
            }
            let text = match answer {
                Answer::Bad(text) => {
                    all_persisted = false;
                    text
                }
                Answer::Settled(session, outcome) => {
                    all_persisted &= outcome.persisted;
                    crate::failpoint::hit("append.before_print");
                    with_session(&session, &outcome)
                }
            };
            if !crate::cli::emit(&text) {
                broken.store(true, Ordering::Release);
                all_persisted = false;
            }
        }
    }
    all_persisted && early.is_empty()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_names_its_session_and_a_bare_array_is_refused() {
        let (s, b) =
            parse_line(r#"{"session": "a", "messages": [{"role": "user", "content": "x", "uid": "u"}]}"#).unwrap();
        assert_eq!((s.as_str(), b.len(), b[0].uid.as_deref()), ("a", 1, Some("u")));
        let (s, b) = parse_line(r#"{"session": "b", "items": [{"uid": "inside"}], "uids": ["u1"]}"#).unwrap();
        assert_eq!((s.as_str(), b[0].uid.as_deref()), ("b", Some("u1")));
        for bad in [
            r#"[{"role": "user", "content": "x"}]"#,
            r#"{"messages": []}"#,
            r#"{"session": 5, "messages": []}"#,
            r#"{"session": "a", "messages": [], "extra": 1}"#,
            r#"{"session": "a"}"#,
            r#"{"session": "a", "messages": {}}"#,
        ] {
            assert_eq!(parse_line(bad).err(), Some(LineError::NotASessionBatch), "{bad}");
        }
        assert!(matches!(
            parse_line(r#"{"session": "../x", "messages": []}"#),
            Err(LineError::Session(_))
        ));
        assert!(matches!(
            parse_line(r#"{"session": "a", "messages": [1]}"#),
            Err(LineError::Batch(MessageError::NotAnObject { index: 0 }))
        ));
    }
}
