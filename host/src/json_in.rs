//! JSON text from outside, read as the value it spells: the one way every
//! reader of stored rows, divert lines, `append` input and server rows
//! turns text into a [`Value`].
//!
//! Why not `serde_json::from_str` alone: the workspace builds serde_json
//! with `arbitrary_precision`, so numbers keep their exact text. That
//! feature hands a number to [`Value`] as an object with the single key
//! `$serde_json::private::Number`, and so an object that really has that
//! key (written as it is, or spelled with `\u` escapes) was read back as
//! the number its value spells, or refused. A message with such a key
//! would be committed and then shown, compared and replayed as other
//! bytes. Here, a text that could hold that key is read by the policy's
//! own parser, which takes every key literally, and converted; every
//! other text takes serde_json's path unchanged.
//!
//! Writing needs nothing: serde_json writes a key of an in-memory object
//! as it is, so what is read here and written again is the same text.

use serde::de::{DeserializeOwned, Error as _};
use serde_json::{Map, Number, Value};
use turnsafe_policy::jsontext_api::{Json, parse};

/// The object key serde_json's `arbitrary_precision` reserves for numbers.
pub const NUMBER_TOKEN: &str = "$serde_json::private::Number";

/// The value `text` spells, every object key literally.
pub fn value(text: &str) -> Result<Value, serde_json::Error> {
    if may_hold_token(text) && holds_token_key(text) {
        return literal(text);
    }
    serde_json::from_str(text)
}

/// [`value`] of bytes, which must be UTF-8 as JSON text is.
pub fn value_bytes(bytes: &[u8]) -> Result<Value, serde_json::Error> {
    let text = std::str::from_utf8(bytes).map_err(|e| serde_json::Error::custom(format!("not UTF-8: {e}")))?;
    value(text)
}

/// [`value`], which must be an object.
pub fn object(text: &str) -> Result<Map<String, Value>, serde_json::Error> {
    match value(text)? {
        Value::Object(map) => Ok(map),
        _ => Err(serde_json::Error::custom("not a JSON object")),
    }
}

/// One of turnsafe's own records (a receipt, a manifest, a divert line)
/// read from `text`. A record with the token as a key anywhere is refused:
/// serde cannot hand such an object to a typed field or a `Value` inside
/// one as it is, and none of turnsafe's records has a reason to hold it.
pub fn typed<T: DeserializeOwned>(text: &str) -> Result<T, serde_json::Error> {
    if may_hold_token(text) && holds_token_key(text) {
        return Err(serde_json::Error::custom(format!("an object key is `{NUMBER_TOKEN}`")));
    }
    serde_json::from_str(text)
}

/// [`typed`] of bytes, which must be UTF-8 as JSON text is.
pub fn typed_bytes<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, serde_json::Error> {
    let text = std::str::from_utf8(bytes).map_err(|e| serde_json::Error::custom(format!("not UTF-8: {e}")))?;
    typed(text)
}

/// Whether `text` could name the token as a key at all: literally, or
/// through `\u` escapes (the only escape that can spell its characters).
/// Two substring searches; most texts stop here.
fn may_hold_token(text: &str) -> bool {
    text.contains("private::Number") || text.contains("\\u")
}

/// Whether an object key of `text` decodes to the token. A text that is
/// not JSON may be misread here; it then goes to the policy's parser,
/// which refuses it as serde_json would.
fn holds_token_key(text: &str) -> bool {
    let b = text.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if b[i] != b'"' {
            i += 1;
            continue;
        }
        let start = i;
        i += 1;
        let mut escaped = false;
        while i < b.len() && b[i] != b'"' {
            escaped |= b[i] == b'\\';
            i += if b[i] == b'\\' { 2 } else { 1 };
        }
        let end = (i + 1).min(b.len());
        i = end;
        let mut j = i;
        while j < b.len() && matches!(b[j], b' ' | b'\t' | b'\n' | b'\r') {
            j += 1;
        }
        if b.get(j) != Some(&b':') {
            continue;
        }
        let raw = &text[start..end];
        let is_token = if escaped {
            serde_json::from_str::<String>(raw).is_ok_and(|k| k == NUMBER_TOKEN)
        } else {
            raw.len() == NUMBER_TOKEN.len() + 2 && &raw[1..raw.len() - 1] == NUMBER_TOKEN
        };
        if is_token {
            return true;
        }
    }
    false
}

/// `text` read by the policy's parser, every key as written.
fn literal(text: &str) -> Result<Value, serde_json::Error> {
    let json = parse(text).map_err(serde_json::Error::custom)?;
    convert(json)
}

fn convert(json: Json) -> Result<Value, serde_json::Error> {
    Ok(match json {
        Json::Null => Value::Null,
        Json::Bool(b) => Value::Bool(b),
        Json::Num(text) => Value::Number(text.parse::<Number>()?),
        Json::Str(s) => Value::String(s),
        Json::Arr(items) => Value::Array(items.into_iter().map(convert).collect::<Result<_, _>>()?),
        Json::Obj(fields) => {
            let mut map = Map::new();
            // A repeated key means its last value, as serde_json reads it.
            for (k, v) in fields {
                map.insert(k, convert(v)?);
            }
            Value::Object(map)
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_token_as_a_key_is_read_as_the_object_it_is() {
        for text in [
            r#"{"$serde_json::private::Number":"12"}"#,
            r#"{"\u0024serde_json::private::Number":"12"}"#,
            r#"{"$serde_json::private::Numbe\u0072" : "not a number"}"#,
            r#"[1, {"a": {"$serde_json::private::Number": [1.50, "x"]}}]"#,
        ] {
            let v = value(text).expect(text);
            let mut found = false;
            walk(&v, &mut |m| found |= m.contains_key(NUMBER_TOKEN));
            assert!(found, "{text} read as {v}");
            // Written and read again: the same value, the same text.
            let again = value(&v.to_string()).unwrap();
            assert_eq!(again, v);
            assert_eq!(again.to_string(), v.to_string());
        }
    }

    #[test]
    fn numbers_keep_their_text_on_both_paths() {
        // The slow path (a `\u` escape elsewhere) converts numbers from
        // their text: the same text serde_json keeps on the fast path.
        let nums = "[12345678901234567890123, 1.0, 1e400, -0, 1.50E-7]";
        let fast = value(nums).unwrap();
        let slow = value(&format!(r#"{{"\u0024serde_json::private::Number":1,"n":{nums}}}"#)).unwrap();
        assert_eq!(slow["n"].to_string(), fast.to_string());
        // serde_json writes the exponent in its own form on both paths.
        assert_eq!(fast.to_string(), "[12345678901234567890123,1.0,1e+400,-0,1.50e-7]");
    }

    #[test]
    fn the_token_elsewhere_changes_nothing() {
        for text in [
            r#"["$serde_json::private::Number"]"#,
            r#"{"a":"$serde_json::private::Number"}"#,
            r#"{"a\"$serde_json::private::Number\":":1}"#,
            r#"{"\u00e9t\u00e9": 5}"#,
        ] {
            assert_eq!(value(text).unwrap(), crate::json_in::value(text).unwrap(), "{text}");
        }
    }

    #[test]
    fn what_serde_json_refuses_is_refused() {
        for text in [
            "",
            "{",
            r#"{"\ud800": 1}"#,
            "[1,]",
            "nan",
            r#"{"$serde_json::private::Number":1,"\ud800":1}"#,
            r#"{"$serde_json::private::Number":1,}"#,
            r#"{"$serde_json::private::Number":01}"#,
        ] {
            assert!(value(text).is_err(), "{text:?}");
        }
        assert!(value_bytes(b"[\"\xff\"]").is_err());
    }

    #[test]
    fn typed_records_refuse_the_key() {
        #[derive(Debug, serde::Deserialize)]
        struct Line {
            #[allow(dead_code)]
            item: Value,
        }
        let err = typed::<Line>(r#"{"item":{"$serde_json::private::Number":"7"}}"#).unwrap_err();
        assert!(err.to_string().contains(NUMBER_TOKEN), "{err}");
        assert!(typed::<Line>(r#"{"item":{"\u00e9":"7"}}"#).unwrap().item.is_object());
    }

    fn walk(v: &Value, f: &mut impl FnMut(&Map<String, Value>)) {
        match v {
            Value::Object(m) => {
                f(m);
                m.values().for_each(|x| walk(x, f));
            }
            Value::Array(a) => a.iter().for_each(|x| walk(x, f)),
            _ => {}
        }
    }
}
