//! `turnsafe append` without `--session`: each line names its session, and
//! the lines already waiting on stdin are committed together.
//!
//! A reader thread takes lines off stdin as they come, so whatever arrived
//! while a group was committing is waiting, whole, when the next group is
//! formed. Answers are printed in input order, each only after its batch
//! settled.

use std::sync::mpsc;

use serde_json::Value;

use super::Store;
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
