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
    pub(crate) fn durability(&mut self, key: &str) -> crate::Durability {
        let Some(label) = self.opt_string(key) else {
            return crate::Durability::Synced;
        };
        match crate::Durability::from_label(&label) {
            Some(d) => d,
            None => {
                self.fail_field(key, "must be `synced` or `unsynced`");
                crate::Durability::Synced
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
