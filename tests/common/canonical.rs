//! The tests' own canonical text of the plain ASCII records they send
//! (sorted keys, no whitespace) and its digest: a reader of the tests'
//! own, so a recount never checks the code under test with itself. The
//! store's definition is `host/src/same.rs`; for these records the two
//! agree.
#![allow(dead_code)]

use serde_json::Value;
use sha2::Digest as _;

/// Sorted keys, no whitespace.
pub fn canonical(v: &Value) -> String {
    match v {
        Value::Object(m) => {
            let mut keys: Vec<&String> = m.keys().collect();
            keys.sort();
            let fields: Vec<String> = keys
                .iter()
                .map(|k| format!("{}:{}", Value::from(k.as_str()), canonical(&m[*k])))
                .collect();
            format!("{{{}}}", fields.join(","))
        }
        Value::Array(items) => format!("[{}]", items.iter().map(canonical).collect::<Vec<_>>().join(",")),
        other => other.to_string(),
    }
}

pub fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(sha2::Sha256::digest(bytes))
}

/// `sha256:<hex>` of [`canonical`], as the ledger names a digest.
pub fn digest(v: &Value) -> String {
    format!("sha256:{}", sha256_hex(canonical(v).as_bytes()))
}
