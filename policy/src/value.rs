//! Small builders of [`Json`] values for the policy's outputs.

#[allow(unused_imports)]
use crate::prelude::*;

use crate::collect::map;
use crate::jsontext::Json;
use crate::machine::DivertReceipt;
use crate::model::{CaptureReceipt, DivertResidue};

pub(crate) fn obj(pairs: Vec<(&str, Json)>) -> Json {
    let mut fields = Vec::with_capacity(pairs.len());
    for (k, v) in pairs {
        fields.push((String::from(k), v));
    }
    Json::Obj(fields)
}

pub(crate) fn s(x: &str) -> Json {
    Json::Str(x.to_string())
}

pub(crate) fn opt_s(x: Option<&str>) -> Json {
    x.map_or(Json::Null, s)
}

pub(crate) fn opt_i(x: Option<i64>) -> Json {
    x.map_or(Json::Null, Json::int)
}

pub(crate) fn strs(xs: &[String]) -> Json {
    Json::Arr(map(xs, |x| s(x)))
}

pub(crate) fn capture_receipt(r: &CaptureReceipt) -> Json {
    obj(vec![
        ("path", s(&r.path)),
        (
            "files",
            Json::Arr(map(&r.files, |f| {
                obj(vec![("name", s(&f.name)), ("size", Json::uint(f.size))])
            })),
        ),
        ("manifest_sha256", s(&r.manifest_sha256)),
    ])
}

pub(crate) fn divert_receipt(r: &DivertReceipt) -> Json {
    obj(vec![
        ("path", s(&r.path)),
        ("offset", Json::uint(r.offset)),
        ("length", Json::uint(r.length)),
        ("count", Json::uint(r.count)),
        ("sha256", s(&r.sha256)),
    ])
}

pub(crate) fn residue(r: Option<&DivertResidue>) -> Json {
    r.map_or(Json::Null, |r| {
        obj(vec![("path", s(&r.path)), ("offset", Json::uint(r.offset))])
    })
}
