//! Small builders of `serde_json::Value`s. They build each object field by
//! field instead of through `json!` and `Serialize`, which keeps the
//! component small: a `json!` field instantiates a serializer per type.
//! Objects keep serde_json's key order (sorted), so the output is the same.

#[allow(unused_imports)]
use crate::prelude::*;

use serde_json::{Map, Value};

use crate::machine::DivertReceipt;
use crate::model::{CaptureReceipt, DivertResidue};

pub(crate) fn obj(pairs: Vec<(&str, Value)>) -> Value {
    let mut m = Map::new();
    for (k, v) in pairs {
        m.insert(k.to_string(), v);
    }
    Value::Object(m)
}

pub(crate) fn s(x: &str) -> Value {
    Value::String(x.to_string())
}

pub(crate) fn opt_s(x: Option<&str>) -> Value {
    x.map_or(Value::Null, s)
}

pub(crate) fn opt_i(x: Option<i64>) -> Value {
    x.map_or(Value::Null, Value::from)
}

pub(crate) fn strs(xs: &[String]) -> Value {
    Value::Array(xs.iter().map(|x| s(x)).collect())
}

pub(crate) fn capture_receipt(r: &CaptureReceipt) -> Value {
    obj(vec![
        ("path", s(&r.path)),
        (
            "files",
            Value::Array(
                r.files
                    .iter()
                    .map(|f| obj(vec![("name", s(&f.name)), ("size", Value::from(f.size))]))
                    .collect(),
            ),
        ),
        ("manifest_sha256", s(&r.manifest_sha256)),
    ])
}

pub(crate) fn divert_receipt(r: &DivertReceipt) -> Value {
    obj(vec![
        ("path", s(&r.path)),
        ("offset", Value::from(r.offset)),
        ("length", Value::from(r.length)),
        ("count", Value::from(r.count)),
        ("sha256", s(&r.sha256)),
    ])
}

pub(crate) fn residue(r: Option<&DivertResidue>) -> Value {
    r.map_or(Value::Null, |r| {
        obj(vec![("path", s(&r.path)), ("offset", Value::from(r.offset))])
    })
}
