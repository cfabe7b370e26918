//! The component's own JSON parser and writer (`jsontext`) held to
//! serde_json, which native hosts use on the same texts: random values
//! printed by serde_json, mutations of them, arbitrary strings, hand-made
//! escapes and values built directly must be read, refused and printed
//! alike.
//!
//! Where the two differ by design, the test asserts jsontext's documented
//! behaviour instead of equality:
//!
//! - numbers are kept as their text, so jsontext accepts numbers that
//!   overflow an f64 (`1e400`), which serde_json refuses as "number out of
//!   range", and prints a number as it was written (`1e3`, `5.00`, `-0`)
//!   where serde_json prints its f64 or integer;
//! - a repeated key keeps every field in jsontext's value, and the last one
//!   counts, as in serde_json's map: the comparison reads the fields in
//!   order, the last one winning.
//!
//! Lone surrogates, control characters in strings, trailing commas and
//! leading zeros are refused by both; those are compared, not excused.

use proptest::prelude::*;
use proptest::sample::Index;
use serde::{Serialize, Serializer};
use serde_json::{Map, Value};
use turnsafe_policy::jsontext_api::{Json, parse};

// ---- jsontext's value seen as serde_json's -----------------------------

/// jsontext's value as serde_json reads the same text: numbers through
/// serde_json's own number parsing, repeated keys the last one winning.
/// `None` when a number is outside what serde_json represents.
fn to_value(j: &Json) -> Option<Value> {
    Some(match j {
        Json::Null => Value::Null,
        Json::Bool(b) => Value::Bool(*b),
        Json::Num(t) => {
            let v: Value = serde_json::from_str(t).ok()?;
            assert!(v.is_number(), "jsontext kept {t:?} as a number");
            v
        }
        Json::Str(s) => Value::String(s.clone()),
        Json::Arr(items) => Value::Array(items.iter().map(to_value).collect::<Option<_>>()?),
        Json::Obj(fields) => {
            let mut map = Map::new();
            for (k, v) in fields {
                map.insert(k.clone(), to_value(v)?);
            }
            Value::Object(map)
        }
    })
}

/// The same value with each number's text as serde_json prints that
/// number: the one place jsontext's printing may differ by design.
fn canonical_numbers(j: &Json) -> Json {
    match j {
        Json::Num(t) => {
            let v: Value = serde_json::from_str(t).expect("a number serde_json reads");
            Json::Num(serde_json::to_string(&v).unwrap())
        }
        Json::Arr(items) => Json::Arr(items.iter().map(canonical_numbers).collect()),
        Json::Obj(fields) => Json::Obj(fields.iter().map(|(k, v)| (k.clone(), canonical_numbers(v))).collect()),
        other => other.clone(),
    }
}

/// jsontext and serde_json accept or refuse `text` alike, and where both
/// accept, read the same value and print the same bytes.
fn agree(text: &str) -> Result<(), TestCaseError> {
    match (parse(text), serde_json::from_str::<Value>(text)) {
        (Ok(ours), Ok(theirs)) => {
            prop_assert_eq!(to_value(&ours), Some(theirs.clone()), "read differently: {:?}", text);
            prop_assert_eq!(
                canonical_numbers(&ours).to_text(),
                serde_json::to_string(&theirs).unwrap(),
                "printed differently: {:?}",
                text
            );
        }
        (Ok(ours), Err(e)) => {
            let e = e.to_string();
            if e.starts_with("number out of range") {
                // Numbers are kept as text: no range to exceed.
                prop_assert!(to_value(&ours).is_none(), "{:?}: {}", text, e);
            } else {
                prop_assert!(false, "jsontext accepted what serde_json refuses ({}): {:?}", e, text);
            }
        }
        (Err(e), Ok(_)) => prop_assert!(false, "jsontext refused what serde_json reads ({}): {:?}", e, text),
        (Err(e), Err(_)) => {
            prop_assert!(e.contains(" at byte "), "an error that says where: {:?}", e);
        }
    }
    Ok(())
}

// ---- values, printed by serde_json --------------------------------------

/// A JSON document whose objects may repeat keys, in any order; serde_json
/// prints it as it stands.
#[derive(Debug, Clone)]
enum Doc {
    Leaf(Value),
    Arr(Vec<Doc>),
    Obj(Vec<(String, Doc)>),
}

impl Serialize for Doc {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Doc::Leaf(v) => v.serialize(s),
            Doc::Arr(items) => s.collect_seq(items),
            Doc::Obj(fields) => s.collect_map(fields.iter().map(|(k, v)| (k, v))),
        }
    }
}

impl Doc {
    /// The value the document denotes: of repeated keys, the last.
    fn value(&self) -> Value {
        match self {
            Doc::Leaf(v) => v.clone(),
            Doc::Arr(items) => Value::Array(items.iter().map(Doc::value).collect()),
            Doc::Obj(fields) => {
                let mut map = Map::new();
                for (k, v) in fields {
                    map.insert(k.clone(), v.value());
                }
                Value::Object(map)
            }
        }
    }
}

fn number() -> impl Strategy<Value = Value> {
    prop_oneof![
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        prop::sample::select(vec![i64::MIN, i64::MIN + 1, -1, 0, 1, i64::MAX - 1, i64::MAX]).prop_map(Value::from),
        prop::sample::select(vec![u64::MAX, u64::MAX - 1, 1 << 63, (1 << 63) - 1, 1 << 53]).prop_map(Value::from),
        any::<f64>().prop_filter_map("finite", |f| serde_json::Number::from_f64(f).map(Value::Number)),
        // Integral floats: printed `5.0`, `1e16`.
        any::<i32>().prop_map(|n| Value::from(f64::from(n))),
        prop::sample::select(vec![
            0.0,
            -0.0,
            1e15,
            1e16,
            1e17,
            9007199254740992.0,
            9.223372036854776e18,
            -9.223372036854776e18,
            1.8446744073709552e19,
            1e300,
            f64::MAX,
            f64::MIN,
            f64::MIN_POSITIVE,
            5e-324,
            0.1,
        ])
        .prop_map(Value::from),
    ]
}

fn text_char() -> impl Strategy<Value = char> {
    prop_oneof![
        3 => any::<char>(),
        2 => (0u32..0x20).prop_map(|c| char::from_u32(c).unwrap()),
        3 => prop::sample::select(vec![
            '"', '\\', '/', '\u{7f}', '\u{80}', 'é', '\u{2028}', '\u{fffd}', '\u{ffff}', '😀', '\u{10000}',
            '\u{10ffff}', 'a', ' ',
        ]),
    ]
}

fn string() -> impl Strategy<Value = String> {
    prop::collection::vec(text_char(), 0..8).prop_map(|cs| cs.into_iter().collect())
}

/// Keys from a small pool, so that objects repeat them, or any string.
fn key() -> impl Strategy<Value = String> {
    prop_oneof![
        2 => prop::sample::select(vec!["a", "b", "", "A", "ab", "é", "😀", "a\u{0}", "\u{7f}"]).prop_map(String::from),
        1 => string(),
    ]
}

fn doc() -> impl Strategy<Value = Doc> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        number(),
        string().prop_map(Value::String),
    ]
    .prop_map(Doc::Leaf);
    leaf.prop_recursive(4, 24, 5, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..5).prop_map(Doc::Arr),
            prop::collection::vec((key(), inner), 0..5).prop_map(Doc::Obj),
        ]
    })
}

fn printed(doc: &Doc, pretty: bool) -> String {
    if pretty {
        serde_json::to_string_pretty(doc).unwrap()
    } else {
        serde_json::to_string(doc).unwrap()
    }
}

// ---- mutations -------------------------------------------------------------

#[derive(Debug, Clone)]
enum Edit {
    Insert(Index, String),
    Delete(Index, usize),
    Replace(Index, String),
}

/// Pieces that matter to a JSON reader, to insert or replace with.
fn fragment() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => prop::sample::select(vec![
            "{", "}", "[", "]", ",", ":", "\"", "\\", "0", "-", "1", "e", "E", ".", "+", "t", "true", "null",
            "false", "f", " ", "\n", "\t", "\r", "\u{0}", "\u{1f}", "\u{7f}", "\\u", "\\u00", "\\ud800", "\\udc00",
            "\\ud83d\\ude00", "\\uD83D\\uDE00", "\\ud83d", "\\u0041", "\\/", "\\n", "\\x", "é", "😀", "1e400",
            "-1e400", "1e-400", "-0", "00", "1.", ".5", "99999999999999999999", "18446744073709551616",
            "-9223372036854775809", ",]", ",}", "\"\":", "[]", "{}", "\u{feff}",
        ])
        .prop_map(String::from),
        1 => any::<char>().prop_map(String::from),
    ]
}

fn edit() -> impl Strategy<Value = Edit> {
    prop_oneof![
        (any::<Index>(), fragment()).prop_map(|(i, s)| Edit::Insert(i, s)),
        (any::<Index>(), 1usize..4).prop_map(|(i, n)| Edit::Delete(i, n)),
        (any::<Index>(), fragment()).prop_map(|(i, s)| Edit::Replace(i, s)),
    ]
}

/// `text` with the edits applied, at character positions so that it stays
/// a string (jsontext reads `&str`; bytes are the host's to decode).
fn mutated(text: &str, edits: &[Edit]) -> String {
    let mut cs: Vec<char> = text.chars().collect();
    for e in edits {
        match e {
            Edit::Insert(i, s) => {
                let at = i.index(cs.len() + 1);
                cs.splice(at..at, s.chars());
            }
            Edit::Delete(i, n) if !cs.is_empty() => {
                let at = i.index(cs.len());
                let end = (at + n).min(cs.len());
                cs.drain(at..end);
            }
            Edit::Replace(i, s) if !cs.is_empty() => {
                let at = i.index(cs.len());
                cs.splice(at..at + 1, s.chars());
            }
            _ => {}
        }
    }
    cs.into_iter().collect()
}

// ---- values built directly -----------------------------------------------

/// Values as the policy builds them: integers, strings, objects with keys
/// in any order and repeated.
fn built() -> impl Strategy<Value = Json> {
    let leaf = prop_oneof![
        Just(Json::Null),
        any::<bool>().prop_map(Json::Bool),
        any::<i64>().prop_map(|n| Json::Num(n.to_string())),
        any::<u64>().prop_map(|n| Json::Num(n.to_string())),
        prop::sample::select(vec![i64::MIN, i64::MAX, 0, -1]).prop_map(|n| Json::Num(n.to_string())),
        Just(Json::Num(u64::MAX.to_string())),
        string().prop_map(Json::Str),
    ];
    leaf.prop_recursive(4, 24, 5, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..5).prop_map(Json::Arr),
            prop::collection::vec((key(), inner), 0..5).prop_map(Json::Obj),
        ]
    })
}

/// A string's body from raw characters and escapes of every form, some
/// of them invalid: short escapes, `\u` in either case, surrogate pairs,
/// lone or mismatched surrogates.
fn escaped_string() -> impl Strategy<Value = String> {
    let piece = prop_oneof![
        2 => any::<char>().prop_map(String::from),
        1 => (0u32..0x20).prop_map(|c| char::from_u32(c).unwrap().to_string()),
        2 => prop::sample::select(vec![
            "\\\"", "\\\\", "\\/", "\\b", "\\f", "\\n", "\\r", "\\t", "\\u0000", "\\u001F", "\\u001f", "\\u0020",
            "\\u00e9", "\\u00E9", "\\u2028", "\\uFFFF", "\\ufffd", "\\ud83d\\ude00", "\\uD83D\\uDE00", "\\udbff\\udfff",
            "\\ud800\\udc00", "\\ud800", "\\udfff", "\\ud800\\u0041", "\\ud800\\ud800", "\\ud800x", "\\ud800\\n",
            "\\u12", "\\u12g4", "\\x", "\\", "\\U0041", "\\'", "\\0", "\"",
        ])
        .prop_map(String::from),
        2 => (0u32..=0xFFFF, any::<bool>()).prop_map(|(n, upper)| if upper {
            format!("\\u{n:04X}")
        } else {
            format!("\\u{n:04x}")
        }),
    ];
    prop::collection::vec(piece, 0..8).prop_map(|ps| format!("\"{}\"", ps.concat()))
}

// ---- the properties ----------------------------------------------------------

proptest! {
    #![proptest_config(ProptestConfig { cases: 25_000, ..ProptestConfig::default() })]

    /// What serde_json prints, jsontext reads as serde_json does, and
    /// prints back as serde_json prints the value: keys sorted, the last
    /// of repeated keys, the same escapes and numbers.
    #[test]
    fn serde_json_texts_read_and_print_back(doc in doc(), pretty in any::<bool>()) {
        let text = printed(&doc, pretty);
        let ours = parse(&text);
        prop_assert!(ours.is_ok(), "refused {:?}: {:?}", text, ours);
        let ours = ours.unwrap();
        let theirs: Value = serde_json::from_str(&text).unwrap();
        prop_assert_eq!(to_value(&ours), Some(theirs), "{:?}", text);
        // serde_json's numbers printed as they stand: jsontext's echo of
        // them is serde_json's own printing of the value.
        prop_assert_eq!(ours.to_text(), serde_json::to_string(&doc.value()).unwrap(), "{:?}", text);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 30_000, ..ProptestConfig::default() })]

    /// A valid text with bytes inserted, deleted or replaced: accepted or
    /// refused alike, read and printed alike.
    #[test]
    fn mutated_texts_agree(doc in doc(), pretty in any::<bool>(), edits in prop::collection::vec(edit(), 1..5)) {
        agree(&mutated(&printed(&doc, pretty), &edits))?;
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 15_000, ..ProptestConfig::default() })]

    /// Any string at all, and strings of JSON's own characters.
    #[test]
    fn arbitrary_strings_agree(text in prop_oneof![
        any::<String>(),
        "[\\[\\]{}\",:0-9eE.+\\- \t\n\\\\/truefalsn]{0,24}",
        "[ -~]{0,24}",
    ]) {
        agree(&text)?;
    }

    /// Arbitrary bytes: what is not UTF-8, jsontext (which reads `&str`)
    /// never sees, and serde_json refuses too; the rest agree.
    #[test]
    fn arbitrary_bytes_agree(bytes in prop::collection::vec(any::<u8>(), 0..24)) {
        match core::str::from_utf8(&bytes) {
            Ok(text) => agree(text)?,
            Err(_) => prop_assert!(serde_json::from_slice::<Value>(&bytes).is_err()),
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 10_000, ..ProptestConfig::default() })]

    /// Strings written with every form of escape, valid or not, alone and
    /// as an object's key.
    #[test]
    fn escapes_agree(s in escaped_string()) {
        agree(&s)?;
        agree(&format!("{{{s}:{s}}}"))?;
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 15_000, ..ProptestConfig::default() })]

    /// Values built as the policy builds them print as serde_json prints
    /// the value, and read back as it.
    #[test]
    fn built_values_print_as_serde_json(j in built()) {
        let value = to_value(&j).expect("integers serde_json reads");
        let text = j.to_text();
        prop_assert_eq!(&text, &serde_json::to_string(&value).unwrap());
        let back = parse(&text);
        prop_assert!(back.is_ok(), "{:?}", text);
        prop_assert_eq!(to_value(&back.unwrap()), Some(value));
    }
}

/// The nesting limit: jsontext takes 127 levels of arrays or objects,
/// whatever the innermost holds, and refuses 128, as serde_json does.
#[test]
fn nesting_limit_is_127_levels_whatever_the_innermost_holds() {
    // `levels` levels of arrays or objects, the innermost holding `inner`
    // (a scalar, or nothing).
    let nest = |levels: usize, array: bool, inner: &str| {
        let (open, close) = if array { ("[", "]") } else { ("{\"a\":", "}") };
        let inner = match (array, inner) {
            (true, "") => "[]".to_string(),
            (false, "") => "{}".to_string(),
            (true, s) => format!("[{s}]"),
            (false, s) => format!("{{\"a\":{s}}}"),
        };
        format!("{}{}{}", open.repeat(levels - 1), inner, close.repeat(levels - 1))
    };
    for array in [true, false] {
        for inner in ["", "0", "\"s\"", "null"] {
            assert!(
                parse(&nest(127, array, inner)).is_ok(),
                "127 levels, array {array}, {inner:?}"
            );
            for levels in [128, 129] {
                let refused = parse(&nest(levels, array, inner));
                assert!(
                    refused.is_err_and(|e| e.starts_with("recursion limit exceeded at byte ")),
                    "{levels} levels, array {array}, {inner:?}"
                );
            }
            assert!(serde_json::from_str::<Value>(&nest(127, array, inner)).is_ok());
            assert!(serde_json::from_str::<Value>(&nest(128, array, inner)).is_err());
            for levels in [126, 127, 128, 129] {
                agree(&nest(levels, array, inner)).unwrap();
            }
        }
    }
}
