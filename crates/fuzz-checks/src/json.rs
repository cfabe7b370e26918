//! The component's JSON entry points (`classify_json`, `explain_json`,
//! `evaluate_json`, `flush_step_json`) and their parser, `jsontext`, held
//! to the native hosts' reader of JSON text, `turnsafe_host::json_in`:
//! serde_json as the hosts configure it (with `arbitrary_precision`, so a
//! number is kept as its text on both sides), except that an object keyed
//! `$serde_json::private::Number` is read as the object it is (serde_json
//! alone reads it as a number; fuzz/README.md, findings).
//!
//! Properties, for any bytes:
//! - what is not UTF-8 never reaches the component (its entry points take
//!   a string) and serde_json refuses it too;
//! - jsontext and serde_json accept and refuse the same texts, and where
//!   both accept they read the same value, a repeated key meaning its last
//!   value in both;
//! - the nesting limit is the same: 127 levels of arrays and objects;
//! - where both accept, jsontext prints what serde_json prints, with one
//!   stated exception: a number prints as it was written, where serde_json
//!   writes an exponent back in its own form (`1E2` as `1e+2`); the
//!   comparison reads each number through serde_json first;
//! - every entry point answers every text with one JSON object that
//!   serde_json reads; a text serde_json refuses is answered `invalid
//!   JSON: ... at byte N`, and a text it reads never is.

use serde_json::{Map, Value};
use turnsafe_policy::jsontext_api::{Json, parse};

/// jsontext's value as serde_json reads the same text: numbers through
/// serde_json's own number reading, repeated keys the last one winning.
fn to_value(j: &Json) -> Result<Value, String> {
    Ok(match j {
        Json::Null => Value::Null,
        Json::Bool(b) => Value::Bool(*b),
        Json::Num(t) => match serde_json::from_str::<Value>(t) {
            Ok(v) if v.is_number() => v,
            other => return Err(format!("jsontext kept {t:?} as a number; serde_json reads {other:?}")),
        },
        Json::Str(s) => Value::String(s.clone()),
        Json::Arr(items) => Value::Array(items.iter().map(to_value).collect::<Result<_, _>>()?),
        Json::Obj(fields) => {
            let mut map = Map::new();
            for (k, v) in fields {
                map.insert(k.clone(), to_value(v)?);
            }
            Value::Object(map)
        }
    })
}

/// The same value with each number's text as serde_json prints it: the
/// one stated place where jsontext's printing differs.
fn serde_numbers(j: &Json) -> Json {
    match j {
        Json::Num(t) => match serde_json::from_str::<Value>(t) {
            Ok(v) => Json::Num(v.to_string()),
            Err(_) => j.clone(),
        },
        Json::Arr(items) => Json::Arr(items.iter().map(serde_numbers).collect()),
        Json::Obj(fields) => Json::Obj(fields.iter().map(|(k, v)| (k.clone(), serde_numbers(v))).collect()),
        other => other.clone(),
    }
}

/// jsontext and serde_json agree on `text`: accepted alike, read alike,
/// printed alike (numbers excepted as stated).
pub fn agree(text: &str) -> Result<(), String> {
    match (parse(text), turnsafe_host::json_in::value(text)) {
        (Ok(ours), Ok(theirs)) => {
            let read = to_value(&ours)?;
            if read != theirs {
                return Err(format!("read differently: {text:?}: {read} / {theirs}"));
            }
            let printed = serde_numbers(&ours).to_text();
            let want = serde_json::to_string(&theirs).map_err(|e| e.to_string())?;
            if printed != want {
                return Err(format!("printed differently: {text:?}: {printed} / {want}"));
            }
            Ok(())
        }
        (Ok(_), Err(e)) => Err(format!("jsontext accepted what serde_json refuses ({e}): {text:?}")),
        (Err(e), Ok(_)) => Err(format!("jsontext refused what serde_json reads ({e}): {text:?}")),
        (Err(e), Err(_)) if !e.contains(" at byte ") => Err(format!("an error that does not say where: {e:?}")),
        (Err(_), Err(_)) => Ok(()),
    }
}

/// An entry point: JSON text in, JSON text out.
pub type EntryPoint = fn(&str) -> String;

/// The component's entry points, natively.
pub const ENTRY_POINTS: [(&str, EntryPoint); 5] = [
    ("classify_json", turnsafe_policy::json::classify_json),
    ("explain_json", turnsafe_policy::json::explain_json),
    ("evaluate_json", turnsafe_policy::json::evaluate_json),
    ("flush_step_json", turnsafe_policy::machine::flush_step_json),
    ("edit_step_json", turnsafe_policy::machine::edit_step_json),
];

/// Every entry point answers `text` with one JSON object, an `invalid
/// JSON` error exactly when serde_json refuses the text.
pub fn entry_points_answer(text: &str) -> Result<(), String> {
    let readable = turnsafe_host::json_in::value(text).is_ok();
    for (name, entry) in ENTRY_POINTS {
        let answer = entry(text);
        let Ok(Value::Object(obj)) = turnsafe_host::json_in::value(&answer) else {
            return Err(format!(
                "{name}: an answer that is not a JSON object: {answer:?} for {text:?}"
            ));
        };
        let invalid = obj
            .get("error")
            .and_then(Value::as_str)
            .is_some_and(|e| e.starts_with("invalid JSON: "));
        if invalid == readable {
            return Err(format!(
                "{name}: serde_json {} the text, the answer is {answer}: {text:?}",
                if readable { "reads" } else { "refuses" }
            ));
        }
    }
    Ok(())
}

/// The whole property for one input.
pub fn check(data: &[u8]) -> Result<(), String> {
    let Ok(text) = std::str::from_utf8(data) else {
        return match turnsafe_host::json_in::value_bytes(data) {
            Ok(v) => Err(format!("serde_json read bytes that are not UTF-8 as {v}")),
            Err(_) => Ok(()),
        };
    };
    agree(text)?;
    entry_points_answer(text)
}
