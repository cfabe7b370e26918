//! Reading the fields of one input object with a single exit.
//!
//! Why: in the component, every `?` in a function that is building a value
//! brings its own clean-up of everything built so far (each string and
//! list read before it), and the readers of events and contexts have a
//! dozen such exits each. A [`Fields`] remembers the first field that is
//! wrong and reads it (and every later one) as its default, so the caller
//! builds its whole value and checks once, in [`Fields::done`]. Fields are
//! read in the order they are written, so the error is the one the first
//! wrong field gives, exactly as a `?` after each read would.

#[allow(unused_imports)]
use crate::prelude::*;

use crate::jsontext::Json;
use crate::lease::{HolderPlace, LeaseHolder};
use crate::model::{Engine, Evidence};
use crate::text::cat;

pub(crate) struct Fields<'a> {
    obj: &'a Json,
    /// What the object is, to start each message with (`start`, "event
    /// `failed`"); empty for messages that name the field alone.
    what: &'a str,
    error: Option<String>,
}

impl<'a> Fields<'a> {
    pub(crate) fn new(obj: &'a Json, what: &'a str) -> Fields<'a> {
        Fields { obj, what, error: None }
    }

    /// A present field: missing and `null` are both absent.
    pub(crate) fn get(&self, key: &str) -> Option<&'a Json> {
        self.obj.get(key).filter(|v| !v.is_null())
    }

    /// Keep `message` if it is the first error.
    pub(crate) fn fail(&mut self, message: String) {
        if self.error.is_none() {
            self.error = Some(message);
        }
    }

    /// `what: field `key` <rule>`, or `field `key` <rule>` without a `what`.
    pub(crate) fn fail_field(&mut self, key: &str, rule: &str) {
        if self.error.is_none() {
            let sep = if self.what.is_empty() { "" } else { ": " };
            self.error = Some(cat(&[self.what, sep, "field `", key, "` ", rule]));
        }
    }

    /// A string; missing is empty.
    pub(crate) fn string(&mut self, key: &str) -> String {
        match self.get(key) {
            Some(Json::Str(s)) => s.clone(),
            None => String::new(),
            Some(_) => {
                self.fail_field(key, "must be a string");
                String::new()
            }
        }
    }

    /// A string that must be there.
    pub(crate) fn required_string(&mut self, key: &str) -> String {
        match self.get(key) {
            Some(Json::Str(s)) => s.clone(),
            _ => {
                self.fail_field(key, "must be a string");
                String::new()
            }
        }
    }

    /// A durability label (`synced`, `unsynced`); absent is `synced`.
    pub(crate) fn durability(&mut self, key: &str) -> crate::model::Durability {
        let Some(label) = self.opt_string(key) else {
            return crate::model::Durability::Synced;
        };
        match crate::model::Durability::from_label(&label) {
            Some(d) => d,
            None => {
                self.fail_field(key, "must be `synced` or `unsynced`");
                crate::model::Durability::Synced
            }
        }
    }

    /// A string, or absent.
    pub(crate) fn opt_string(&mut self, key: &str) -> Option<String> {
        match self.get(key)? {
            Json::Str(s) => Some(s.clone()),
            _ => {
                self.fail_field(key, "must be a string");
                None
            }
        }
    }

    /// Any JSON integer (an integral float too), saturated to i64, or
    /// absent (the JSON entry points: a number that is not whole "must be
    /// an integer", anything else "an integer or null").
    pub(crate) fn int(&mut self, key: &str) -> Option<i64> {
        let v = self.get(key)?;
        let n = v.as_i64();
        if n.is_none() {
            let rule = match v {
                Json::Num(_) => "must be an integer",
                _ => "must be an integer or null",
            };
            self.fail_field(key, rule);
        }
        n
    }

    /// A non-negative integer; missing is 0.
    pub(crate) fn u64(&mut self, key: &str) -> u64 {
        match self.get(key) {
            None => 0,
            Some(v) => v.as_u64().unwrap_or_else(|| {
                self.fail_field(key, "must be a non-negative integer");
                0
            }),
        }
    }

    /// An integer, or absent (the flush machine's wire: anything else is
    /// "an integer or null").
    pub(crate) fn i64_opt(&mut self, key: &str) -> Option<i64> {
        let v = self.get(key)?;
        let n = v.as_i64();
        if n.is_none() {
            self.fail_field(key, "must be an integer or null");
        }
        n
    }

    /// A list of strings; missing is empty.
    pub(crate) fn strings(&mut self, key: &str) -> Vec<String> {
        let mut out = Vec::new();
        let all_strings = match self.get(key) {
            None => true,
            Some(Json::Arr(items)) => {
                let mut ok = true;
                for item in items {
                    match item.as_str() {
                        Some(s) => out.push(String::from(s)),
                        None => ok = false,
                    }
                }
                ok
            }
            Some(_) => false,
        };
        if !all_strings {
            self.fail(cat(&[self.what, ": `", key, "` must be a list of strings"]));
        }
        out
    }

    /// The value of a reading that can fail on its own, or its default.
    pub(crate) fn check<T: Default>(&mut self, read: Result<T, String>) -> T {
        read.unwrap_or_else(|e| {
            self.fail(e);
            T::default()
        })
    }

    /// The value built from the fields, or the first error met reading them.
    pub(crate) fn done<T>(self, value: T) -> Result<T, String> {
        match self.error {
            None => Ok(value),
            Some(e) => Err(e),
        }
    }
}

/// A pid field of a lease: absent, or an integer from 1 to 2^32 - 1.
fn pid_field(f: &mut Fields<'_>, key: &str) -> Option<u32> {
    let n = f.int(key)?;
    match u32::try_from(n) {
        Ok(pid) if pid > 0 => Some(pid),
        _ => {
            f.fail_field(key, "must be a pid from 1 to 4294967295");
            None
        }
    }
}

/// A present `lease` object, the holder of the lease that fenced a write:
/// `{name, place, pid?, backend_pid?, expires_ms?}`, `place` one of
/// `this_machine`, `other_machine`, `unknown` (the default).
pub(crate) fn lease_holder(v: Option<&Json>) -> Result<Option<LeaseHolder>, String> {
    let Some(obj) = v.filter(|v| !v.is_null()) else {
        return Ok(None);
    };
    if !obj.is_object() {
        return Err("field `lease` must be a JSON object".into());
    }
    let mut f = Fields::new(obj, "lease");
    let name = f.string("name");
    let place = match f.opt_string("place") {
        None => HolderPlace::Unknown,
        Some(label) => HolderPlace::from_label(&label).unwrap_or_else(|| {
            f.fail_field("place", "must be this_machine, other_machine or unknown");
            HolderPlace::Unknown
        }),
    };
    let holder = LeaseHolder {
        name,
        place,
        pid: pid_field(&mut f, "pid"),
        backend_pid: pid_field(&mut f, "backend_pid"),
        expires_ms: f.int("expires_ms"),
    };
    f.done(Some(holder))
}

/// A present `sqlstate`: five digits or capitals.
pub(crate) fn sqlstate_value(v: Option<&Json>) -> Result<Option<String>, String> {
    match v {
        None => Ok(None),
        Some(Json::Str(s)) if s.len() == 5 && s.bytes().all(|b| b.is_ascii_digit() || b.is_ascii_uppercase()) => {
            Ok(Some(s.clone()))
        }
        Some(_) => Err("field `sqlstate` must be a five-character SQLSTATE such as \"08006\"".into()),
    }
}

/// A present `engine`; when missing, PostgreSQL if there is a SQLSTATE.
pub(crate) fn engine_value(v: Option<&Json>, has_sqlstate: bool) -> Result<Engine, String> {
    match v {
        None if has_sqlstate => Ok(Engine::Postgres),
        None => Ok(Engine::Sqlite),
        Some(Json::Str(s)) => {
            Engine::from_label(s).ok_or_else(|| cat(&["unknown engine `", clip(s), "`: expected sqlite or postgres"]))
        }
        Some(_) => Err("field `engine` must be a string".into()),
    }
}

/// The evidence a list of labels names: sorted, without repeats; labels
/// this build does not know are ignored.
pub(crate) fn evidence_labels(items: &[Json]) -> Vec<Evidence> {
    Evidence::set(items.iter().filter_map(|i| i.as_str().and_then(Evidence::from_label)))
}

/// The first 40 characters of `s`. Counted by their first bytes (every
/// byte but a UTF-8 continuation byte), not with `char_indices`, whose
/// decoding the component would carry for this alone.
pub(crate) fn clip(s: &str) -> &str {
    let mut chars = 0;
    for (i, b) in s.bytes().enumerate() {
        if b & 0xC0 != 0x80 {
            if chars == 40 {
                return s.get(..i).unwrap_or(s);
            }
            chars += 1;
        }
    }
    s
}
