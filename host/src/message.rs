//! One message of a turn, as the caller sends it and as it is stored.

use serde_json::{Map, Value};

/// A message: `role`, `content` (a string, or any JSON value), an optional
/// caller `uid`, and every other field kept verbatim in `extra`.
#[derive(Debug, Clone, PartialEq)]
pub struct Message {
    pub uid: Option<String>,
    pub role: String,
    pub content: Value,
    pub extra: Map<String, Value>,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum MessageError {
    #[error("a batch must be a JSON array of message objects")]
    NotAnArray,
    #[error("message {index} is not a JSON object")]
    NotAnObject { index: usize },
    #[error("message {index} needs a string `role`")]
    Role { index: usize },
    #[error("message {index} needs a `content`")]
    Content { index: usize },
    #[error("message {index}: `uid` must be a non-empty string of at most 256 bytes")]
    Uid { index: usize },
}

impl Message {
    pub fn new(role: &str, content: &str) -> Message {
        Message {
            uid: None,
            role: role.into(),
            content: Value::String(content.into()),
            extra: Map::new(),
        }
    }

    pub fn with_uid(mut self, uid: &str) -> Message {
        self.uid = Some(uid.into());
        self
    }

    pub fn from_value(index: usize, v: &Value) -> Result<Message, MessageError> {
        let obj = v.as_object().ok_or(MessageError::NotAnObject { index })?;
        let role = obj
            .get("role")
            .and_then(Value::as_str)
            .ok_or(MessageError::Role { index })?
            .to_string();
        let content = match obj.get("content") {
            None => return Err(MessageError::Content { index }),
            Some(c) => c.clone(),
        };
        let uid = match obj.get("uid") {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) if !s.is_empty() && s.len() <= 256 => Some(s.clone()),
            Some(_) => return Err(MessageError::Uid { index }),
        };
        let extra = obj
            .iter()
            .filter(|(k, _)| !matches!(k.as_str(), "role" | "content" | "uid"))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        Ok(Message {
            uid,
            role,
            content,
            extra,
        })
    }

    /// Parse one input line: a JSON array of message objects.
    pub fn batch_from_json(line: &str) -> Result<Vec<Message>, MessageError> {
        let v: Value = serde_json::from_str(line).map_err(|_| MessageError::NotAnArray)?;
        let items = v.as_array().ok_or(MessageError::NotAnArray)?;
        items
            .iter()
            .enumerate()
            .map(|(i, m)| Message::from_value(i, m))
            .collect()
    }

    /// The stored form of the content: text as is, other JSON as its text.
    pub fn content_text(&self) -> (String, bool) {
        match &self.content {
            Value::String(s) => (s.clone(), false),
            other => (other.to_string(), true),
        }
    }

    pub fn extra_text(&self) -> String {
        Value::Object(self.extra.clone()).to_string()
    }

    /// The message as an object, with its uid (as written to divert lines and `show`).
    pub fn to_value(&self, uid: &str) -> Value {
        let mut m = self.extra.clone();
        m.insert("uid".into(), uid.into());
        m.insert("role".into(), self.role.clone().into());
        m.insert("content".into(), self.content.clone());
        Value::Object(m)
    }
}
