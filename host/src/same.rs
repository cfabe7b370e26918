//! "The same" means the same bytes: the one comparison every "already
//! stored" decision goes through (replay on both engines, the resolution
//! of a lost COMMIT, a resend's uid conflict, the Hermes import).
//!
//! A record's **canonical bytes** are the canonical JSON text of its
//! stored JSON (`docs/DIVERT.md`, "Canonical bytes"):
//!
//! - no insignificant whitespace;
//! - object members sorted by key, comparing UTF-16 code units (RFC 8785,
//!   section 3.2.3);
//! - strings written as RFC 8785 writes them (section 3.2.2.2): `\"`,
//!   `\\`, `\b`, `\f`, `\n`, `\r`, `\t`, any other control character as
//!   `\u00xx` in lowercase hex, every other character as its UTF-8 bytes
//!   (so `"\u00e9"` and `"é"` are one string);
//! - numbers **as they were written**, digit for digit. Here the form
//!   departs from RFC 8785, which rewrites a number as the IEEE double it
//!   rounds to: that would make `1` and `1.0` one number, and two integers
//!   past 2^53 one integer, so two different records one record. A
//!   number's text is only kept when the JSON reader keeps it, which is
//!   why the host reads JSON with serde_json's `arbitrary_precision`.
//!   That reader writes an exponent back as `e` with its sign (`1E2` is
//!   `1e+2`), so that is the one rewrite a number's text gets.
//!
//! A blob (a LangGraph checkpoint or write value) is part of its record as
//! standard base64 with padding, a bijection of its raw bytes. A key
//! repeated in one object keeps its last value, as every JSON reader the
//! hosts use does. The digest of canonical bytes is `sha256:<hex>`.
//!
//! `tests/canonical.json` fixes the answer for every runtime: this module,
//! the Python package (which calls it) and the JavaScript host
//! (`js/src/same.js`) must print the same canonical text and digest for
//! each vector.

use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

/// The canonical JSON text of `v`.
pub fn canonical(v: &Value) -> String {
    let mut out = String::new();
    write_value(&mut out, v);
    out
}

/// The canonical JSON text of an object (a message's item).
pub fn canonical_object(map: &Map<String, Value>) -> String {
    let mut out = String::new();
    write_object(&mut out, map);
    out
}

/// Whether a stored JSON text holds the same canonical bytes as the
/// object `item` (a message as stored beside its uid).
pub fn same_object_text(stored: &str, item: &Map<String, Value>) -> bool {
    canonical_text(stored).is_ok_and(|c| c == canonical_object(item))
}

/// The canonical JSON text of a JSON text, or why it is not JSON.
pub fn canonical_text(text: &str) -> Result<String, serde_json::Error> {
    crate::json_in::value(text).map(|v| canonical(&v))
}

/// `sha256:<hex>` of `bytes`.
pub fn digest_bytes(bytes: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(bytes)))
}

/// The digest of `v`'s canonical bytes.
pub fn digest(v: &Value) -> String {
    digest_bytes(canonical(v).as_bytes())
}

/// Whether two JSON values have the same canonical bytes.
pub fn same(a: &Value, b: &Value) -> bool {
    // Equal canonical texts are equal bytes; comparing the texts is the
    // comparison of digests without the hashing.
    canonical(a) == canonical(b)
}

/// Whether a stored JSON text holds the same canonical bytes as `v`. A
/// stored text that is not JSON is never the same as anything.
pub fn same_text(stored: &str, v: &Value) -> bool {
    canonical_text(stored).is_ok_and(|c| c == canonical(v))
}

/// The digest of a stored JSON text, or of its raw bytes when it is not
/// JSON (what a ledger names for an unreadable stored row).
pub fn digest_text(stored: &str) -> String {
    match canonical_text(stored) {
        Ok(c) => digest_bytes(c.as_bytes()),
        Err(_) => digest_bytes(stored.as_bytes()),
    }
}

fn write_value(out: &mut String, v: &Value) {
    match v {
        Value::Null => out.push_str("null"),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        // With `arbitrary_precision`, a number displays as it was written.
        Value::Number(n) => out.push_str(&n.to_string()),
        Value::String(s) => write_string(out, s),
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_value(out, item);
            }
            out.push(']');
        }
        Value::Object(map) => write_object(out, map),
    }
}

fn write_object(out: &mut String, map: &Map<String, Value>) {
    let mut fields: Vec<(&String, &Value)> = map.iter().collect();
    fields.sort_by(|a, b| a.0.encode_utf16().cmp(b.0.encode_utf16()));
    out.push('{');
    for (i, (k, v)) in fields.into_iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        write_string(out, k);
        out.push(':');
        write_value(out, v);
    }
    out.push('}');
}

fn write_string(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\u{08}' => out.push_str("\\b"),
            '\u{0c}' => out.push_str("\\f"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every vector of `tests/canonical.json`: the canonical text and its
    /// digest, or that the input is refused.
    #[test]
    fn the_shared_vectors_agree() {
        let text = include_str!("../../tests/canonical.json");
        let doc: Value = serde_json::from_str(text).expect("tests/canonical.json is JSON");
        let vectors = doc["vectors"].as_array().expect("a `vectors` array");
        assert!(vectors.len() >= 20, "the vectors are all there");
        for v in vectors {
            let name = v["name"].as_str().expect("a name");
            let input = v["input"].as_str().expect("an input text");
            match v.get("canonical").and_then(Value::as_str) {
                Some(want) => {
                    let got = canonical_text(input).unwrap_or_else(|e| panic!("{name}: refused: {e}"));
                    assert_eq!(got, want, "{name}");
                    assert_eq!(
                        digest_bytes(got.as_bytes()),
                        v["digest"].as_str().unwrap_or(""),
                        "{name}"
                    );
                }
                None => assert!(canonical_text(input).is_err(), "{name}: must be refused"),
            }
        }
        // Pairs the file names as one record, or as two.
        for p in doc["pairs"].as_array().expect("a `pairs` array") {
            let (a, b) = (p["a"].as_str().unwrap_or(""), p["b"].as_str().unwrap_or(""));
            let same = canonical_text(a)
                .ok()
                .zip(canonical_text(b).ok())
                .is_some_and(|(x, y)| x == y);
            assert_eq!(same, p["same"].as_bool().unwrap_or(false), "{a} vs {b}");
        }
    }

    #[test]
    fn numbers_keep_their_digits() {
        let a: Value = serde_json::from_str("[12345678901234567890123, 1.0, 1e400]").unwrap();
        assert_eq!(canonical(&a), "[12345678901234567890123,1.0,1e+400]");
        let b: Value = serde_json::from_str("[12345678901234567890124, 1.0, 1e400]").unwrap();
        assert!(!same(&a, &b));
    }

    #[test]
    fn an_unreadable_stored_text_is_never_the_same() {
        assert!(!same_text("{\"role\":", &Value::Null));
        assert_eq!(digest_text("{\"role\":"), digest_bytes(b"{\"role\":"));
    }
}
