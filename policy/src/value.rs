//! Small builders of [`Json`] values for the policy's outputs.

#[allow(unused_imports)]
use crate::prelude::*;

use crate::collect::map;
use crate::jsontext::Json;
use crate::lease::LeaseHolder;
use crate::model::{CaptureReceipt, Copy, DivertReceipt, DivertResidue};

/// An object built one field at a call. Why not a `vec![(key, value), ..]`
/// literal: there every value is built on the stack and copied into the
/// list, which in the component costs more code than a call that builds
/// the value in place. The writer sorts the keys, so the order of the
/// calls does not matter.
pub(crate) struct Obj(Vec<(String, Json)>);

impl Obj {
    pub(crate) fn new() -> Obj {
        Obj(Vec::new())
    }

    pub(crate) fn field(&mut self, key: &str, value: Json) {
        self.0.push((String::from(key), value));
    }

    pub(crate) fn str(&mut self, key: &str, value: &str) {
        self.field(key, s(value));
    }

    /// A string, or `null`.
    pub(crate) fn opt_str(&mut self, key: &str, value: Option<&str>) {
        self.field(key, opt_s(value));
    }

    pub(crate) fn uint(&mut self, key: &str, value: u64) {
        self.field(key, Json::uint(value));
    }

    /// An integer, or `null`.
    pub(crate) fn opt_int(&mut self, key: &str, value: Option<i64>) {
        self.field(key, opt_i(value));
    }

    pub(crate) fn bool(&mut self, key: &str, value: bool) {
        self.field(key, Json::Bool(value));
    }

    pub(crate) fn strs(&mut self, key: &str, value: &[String]) {
        self.field(key, strs(value));
    }

    pub(crate) fn done(self) -> Json {
        Json::Obj(self.0)
    }
}

pub(crate) fn s(x: &str) -> Json {
    Json::Str(x.to_string())
}

pub(crate) fn opt_s(x: Option<&str>) -> Json {
    match x {
        Some(x) => s(x),
        None => Json::Null,
    }
}

pub(crate) fn opt_i(x: Option<i64>) -> Json {
    match x {
        Some(x) => Json::int(x),
        None => Json::Null,
    }
}

pub(crate) fn strs(xs: &[String]) -> Json {
    Json::Arr(map(xs, |x| s(x)))
}

pub(crate) fn capture_receipt(r: &CaptureReceipt) -> Json {
    let mut o = Obj::new();
    o.str("path", &r.path);
    let files = map(&r.files, |f| {
        let mut file = Obj::new();
        file.str("name", &f.name);
        file.uint("size", f.size);
        file.done()
    });
    o.field("files", Json::Arr(files));
    o.str("manifest_sha256", &r.manifest_sha256);
    o.done()
}

pub(crate) fn divert_receipt(r: &DivertReceipt) -> Json {
    let mut o = Obj::new();
    o.str("path", &r.path);
    o.uint("offset", r.offset);
    o.uint("length", r.length);
    o.uint("count", r.count);
    o.str("sha256", &r.sha256);
    o.done()
}

pub(crate) fn residue(r: Option<&DivertResidue>) -> Json {
    let Some(r) = r else {
        return Json::Null;
    };
    let mut o = Obj::new();
    o.str("path", &r.path);
    o.uint("offset", r.offset);
    o.done()
}

/// `{"error": message}`: what every JSON entry point answers on failure.
pub(crate) fn error(message: String) -> Json {
    let mut o = Obj::new();
    o.field("error", Json::Str(message));
    o.done()
}

/// The wire object of a lease holder: what [`lease_holder`] reads.
pub(crate) fn lease_holder_value(h: &LeaseHolder) -> Json {
    let mut o = Obj::new();
    o.str("name", &h.name);
    o.str("place", h.place.label());
    o.opt_int("pid", h.pid.map(i64::from));
    o.opt_int("backend_pid", h.backend_pid.map(i64::from));
    o.opt_int("expires_ms", h.expires_ms);
    o.done()
}

/// The copy object every JSON entry point and `turnsafe append` print.
pub(crate) fn copy_json(c: &Copy) -> Json {
    let mut details = Obj::new();
    for (k, val) in &c.details {
        details.str(k, val);
    }
    let mut o = Obj::new();
    o.str("code", &c.code);
    o.str("cause", c.cause.label());
    o.str("outcome", c.outcome.label());
    o.str("title", &c.title);
    o.str("body", &c.body);
    o.strs("remediation", &c.remediation);
    o.field("details", details.done());
    o.done()
}
