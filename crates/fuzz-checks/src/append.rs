//! `turnsafe append`'s stdin: JSON Lines, each a batch of messages (an
//! array, or `{"items", "uids"}`).
//!
//! Properties, for any line: reading never panics; a line that is not
//! UTF-8 is never a batch (it is answered with an error, see
//! `tests/fuzz_findings.rs`); a batch read from a line holds, message for
//! message, the canonical bytes of the line's own objects
//! (`host/src/same.rs`): each array element without the top-level `uid`
//! it names, or each of `items` as it stands, with the uid the line gives.

use serde_json::Value;
use turnsafe_host::message::Message;
use turnsafe_host::same::canonical_object;

/// One line's bytes, as the command takes them.
pub fn check_line(raw: &[u8]) -> Result<(), String> {
    let Ok(text) = std::str::from_utf8(raw) else {
        // Not UTF-8: the command refuses the line before reading it
        // (`turnsafe_host::cli::for_each_line`); serde_json refuses it too.
        return match turnsafe_host::json_in::value_bytes(raw) {
            Ok(_) => Err("serde_json read a line that is not UTF-8".into()),
            Err(_) => Ok(()),
        };
    };
    let text = text.trim();
    let Ok(batch) = Message::batch_from_json(text) else {
        return Ok(());
    };
    let line: Value =
        turnsafe_host::json_in::value(text).map_err(|e| format!("a batch read from a line that is not JSON: {e}"))?;
    let (objects, uids): (Vec<Value>, Vec<Option<String>>) = match line {
        Value::Array(items) => {
            let uids = items
                .iter()
                .map(|m| m.get("uid").and_then(Value::as_str).map(String::from))
                .collect();
            let objects = items
                .into_iter()
                .map(|mut m| {
                    if let Value::Object(o) = &mut m {
                        o.remove("uid");
                    }
                    m
                })
                .collect();
            (objects, uids)
        }
        Value::Object(mut o) => {
            let Some(Value::Array(items)) = o.remove("items") else {
                return Err("a batch from an object without `items`".into());
            };
            let uids = match o.remove("uids") {
                Some(Value::Array(u)) => u.iter().map(|x| x.as_str().map(String::from)).collect(),
                _ => vec![None; items.len()],
            };
            (items, uids)
        }
        other => return Err(format!("a batch read from {other}")),
    };
    if objects.len() != batch.len() {
        return Err(format!(
            "{} objects on the line, {} messages read",
            objects.len(),
            batch.len()
        ));
    }
    for (i, ((message, object), uid)) in batch.iter().zip(&objects).zip(&uids).enumerate() {
        let Value::Object(object) = object else {
            return Err(format!("message {i} read from {object}, not an object"));
        };
        let (got, want) = (canonical_object(message.item()), canonical_object(object));
        if got != want {
            return Err(format!("message {i}: stored bytes {got}, the line's {want}"));
        }
        if message.uid.as_deref() != uid.as_deref() {
            return Err(format!("message {i}: uid {:?}, the line's {uid:?}", message.uid));
        }
    }
    Ok(())
}

/// Every line of a stdin stream.
pub fn check(data: &[u8]) -> Result<(), String> {
    data.split(|b| *b == b'\n').try_for_each(check_line)
}
