//! One message of a turn: any JSON object, stored and read back exactly as
//! it was written, with its uid beside it (never inside).
//!
//! `role` and a text projection of `content` are read from the object when
//! present, for `show` and search; an item without them (a tool call, its
//! output, a reasoning item) is stored all the same.

use serde_json::{Map, Value};

/// Longest accepted uid, in bytes.
pub const MAX_UID: usize = 256;

/// A message: the object as the caller sent it, and the caller's uid for
/// it, if any (turnsafe mints one otherwise).
#[derive(Debug, Clone, PartialEq)]
pub struct Message {
    pub uid: Option<String>,
    item: Map<String, Value>,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum MessageError {
    #[error("a batch must be a JSON array of message objects, or {{\"items\": [...], \"uids\": [...]}}")]
    NotABatch,
    #[error("message {index} is not a JSON object")]
    NotAnObject { index: usize },
    #[error("message {index}: `uid` must be a non-empty string of at most 256 bytes")]
    Uid { index: usize },
    #[error("`uids` must be an array, one per item, of strings of 1 to 256 bytes or nulls")]
    Uids,
}

/// Every message's uid, in batch order, minting one for each message that
/// came without; and the minted ones, which the outcome lists apart.
pub fn uids_minting(messages: &[Message]) -> (Vec<String>, Vec<String>) {
    let mut minted = Vec::new();
    let uids = messages
        .iter()
        .map(|m| {
            m.uid.clone().unwrap_or_else(|| {
                let u = crate::ids::mint();
                minted.push(u.clone());
                u
            })
        })
        .collect();
    (uids, minted)
}

/// Whether `uid` is a usable uid: 1 to 256 bytes.
pub fn valid_uid(uid: &str) -> bool {
    !uid.is_empty() && uid.len() <= MAX_UID
}

/// The searchable text of a `content` value: a string as it is; the
/// `text` of each part of a list of parts (and its plain strings), one per
/// line; nothing for `null` or for parts with no text (an image); any
/// other value as its JSON text.
pub fn text_of(content: &Value) -> Option<String> {
    match content {
        Value::Null => None,
        Value::String(s) => Some(s.clone()),
        Value::Array(parts) => {
            let texts: Vec<&str> = parts
                .iter()
                .filter_map(|p| match p {
                    Value::String(s) => Some(s.as_str()),
                    Value::Object(o) => o.get("text").and_then(Value::as_str),
                    _ => None,
                })
                .collect();
            (!texts.is_empty()).then(|| texts.join("\n"))
        }
        Value::Object(o) => match o.get("text") {
            Some(Value::String(s)) => Some(s.clone()),
            _ => Some(content.to_string()),
        },
        other => Some(other.to_string()),
    }
}

impl Message {
    /// A `{"role", "content"}` message with text content.
    pub fn new(role: &str, content: &str) -> Message {
        let mut item = Map::new();
        item.insert("role".into(), role.into());
        item.insert("content".into(), content.into());
        Message { uid: None, item }
    }

    /// Any JSON object, kept exactly as it is.
    pub fn from_item(item: Map<String, Value>) -> Message {
        Message { uid: None, item }
    }

    pub fn with_uid(mut self, uid: &str) -> Message {
        self.uid = Some(uid.into());
        self
    }

    /// The object as written.
    pub fn item(&self) -> &Map<String, Value> {
        &self.item
    }

    pub fn into_item(self) -> Map<String, Value> {
        self.item
    }

    /// `role`, when the object has a string one.
    pub fn role(&self) -> Option<&str> {
        self.item.get("role").and_then(Value::as_str)
    }

    /// The text projection of `content` (see [`text_of`]), when there is one.
    pub fn content_text(&self) -> Option<String> {
        self.item.get("content").and_then(text_of)
    }

    /// The length of [`Message::item_text`], without building it.
    pub fn encoded_len(&self) -> usize {
        struct Count(usize);
        impl std::io::Write for Count {
            fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
                self.0 += buf.len();
                Ok(buf.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let mut count = Count(0);
        // Writing a map of JSON values to a counter cannot fail.
        let _ = serde_json::to_writer(&mut count, &self.item);
        count.0
    }

    /// The object as JSON text, as stored.
    pub fn item_text(&self) -> String {
        // Serialized in place (no copy of the object first); a map of JSON
        // values always serializes, the fallback is never taken.
        serde_json::to_string(&self.item).unwrap_or_else(|_| Value::Object(self.item.clone()).to_string())
    }

    /// One message of a `turnsafe append` array: any object. A top-level
    /// string `uid` is the message's uid and is not part of the stored
    /// object (the line format's own field); any other `uid` is refused.
    pub fn from_value(index: usize, v: &Value) -> Result<Message, MessageError> {
        let mut item = v.as_object().ok_or(MessageError::NotAnObject { index })?.clone();
        let uid = match item.remove("uid") {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) if valid_uid(&s) => Some(s),
            Some(_) => return Err(MessageError::Uid { index }),
        };
        Ok(Message { uid, item })
    }

    /// Parse one `turnsafe append` input line: a JSON array of messages
    /// (see [`Message::from_value`]), or `{"items": [...], "uids": [...]}`
    /// whose items are stored exactly as they are, any `uid` field
    /// included, with `uids` (optional; `null` entries are minted) beside.
    pub fn batch_from_json(line: &str) -> Result<Vec<Message>, MessageError> {
        let v = crate::json_in::value(line).map_err(|_| MessageError::NotABatch)?;
        Message::batch_from_value(v)
    }

    /// [`Message::batch_from_json`] of a parsed value.
    pub fn batch_from_value(v: Value) -> Result<Vec<Message>, MessageError> {
        match v {
            Value::Array(items) => items
                .iter()
                .enumerate()
                .map(|(i, m)| Message::from_value(i, m))
                .collect(),
            Value::Object(mut obj) => {
                let Some(Value::Array(items)) = obj.remove("items") else {
                    return Err(MessageError::NotABatch);
                };
                let uids: Vec<Option<String>> = match obj.remove("uids") {
                    None | Some(Value::Null) => vec![None; items.len()],
                    Some(Value::Array(u)) if u.len() == items.len() => u
                        .into_iter()
                        .map(|x| match x {
                            Value::Null => Ok(None),
                            Value::String(s) if valid_uid(&s) => Ok(Some(s)),
                            _ => Err(MessageError::Uids),
                        })
                        .collect::<Result<_, _>>()?,
                    Some(_) => return Err(MessageError::Uids),
                };
                if !obj.is_empty() {
                    return Err(MessageError::NotABatch);
                }
                items
                    .into_iter()
                    .zip(uids)
                    .enumerate()
                    .map(|(index, (m, uid))| match m {
                        Value::Object(item) => Ok(Message { uid, item }),
                        _ => Err(MessageError::NotAnObject { index }),
                    })
                    .collect()
            }
            _ => Err(MessageError::NotABatch),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_stored_text_is_the_objects_json_and_its_length_is_counted_right() {
        let shapes = [
            json!({}),
            json!({"role": "user", "content": "plain"}),
            json!({"content": "quote \" backslash \\ newline \n tab \t nul \u{0} ünï 😀", "n": -1.5e300}),
            json!({"type": "message", "content": [{"type": "output_text", "text": "x", "annotations": []}], "z": null, "a": true}),
            json!({"deep": {"a": [1, [2, [3, {"b": "c"}]]], "u": 18446744073709551615u64, "i": i64::MIN}}),
        ];
        for v in shapes {
            let m = Message::from_item(v.as_object().unwrap().clone());
            assert_eq!(m.item_text(), v.to_string());
            assert_eq!(m.encoded_len(), v.to_string().len());
            let back: Value = serde_json::from_str(&m.item_text()).unwrap();
            assert_eq!(back, v);
        }
    }

    #[test]
    fn any_object_is_a_message_and_a_legacy_uid_is_taken_out() {
        let m = Message::from_value(0, &json!({"type": "function_call", "name": "f", "uid": "u1"})).unwrap();
        assert_eq!(m.uid.as_deref(), Some("u1"));
        assert_eq!(
            Value::Object(m.item().clone()),
            json!({"type": "function_call", "name": "f"})
        );
        assert_eq!((m.role(), m.content_text()), (None, None));
        assert_eq!(
            Message::from_value(0, &json!({"uid": 5})),
            Err(MessageError::Uid { index: 0 })
        );
        assert_eq!(
            Message::from_value(1, &json!([1])),
            Err(MessageError::NotAnObject { index: 1 })
        );
    }

    #[test]
    fn the_object_form_keeps_items_verbatim_with_uids_beside() {
        let b = Message::batch_from_json(r#"{"items": [{"uid": "inside", "x": 1}, {"y": 2}], "uids": ["u1", null]}"#)
            .unwrap();
        assert_eq!(b[0].uid.as_deref(), Some("u1"));
        assert_eq!(Value::Object(b[0].item().clone()), json!({"uid": "inside", "x": 1}));
        assert_eq!(b[1].uid, None);
        for bad in [
            r#"{"items": [{}], "uids": []}"#,
            r#"{"items": [{}], "uids": [""]}"#,
            r#"{"items": [{}], "other": 1}"#,
            r#"{"uids": []}"#,
            r#""text""#,
        ] {
            assert!(Message::batch_from_json(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn text_projection() {
        assert_eq!(text_of(&json!("hi")).as_deref(), Some("hi"));
        assert_eq!(
            text_of(&json!([{"type": "input_text", "text": "a"}, {"type": "input_image", "image_url": "x"}, "b"]))
                .as_deref(),
            Some("a\nb")
        );
        assert_eq!(text_of(&json!([{"type": "input_image"}])), None);
        assert_eq!(text_of(&Value::Null), None);
        assert_eq!(text_of(&json!({"k": [1]})).as_deref(), Some(r#"{"k":[1]}"#));
        assert_eq!(text_of(&json!(42)).as_deref(), Some("42"));
    }
}
