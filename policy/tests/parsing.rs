//! What the policy reads from free-form host input: a divert error's
//! operation and errno, and the integer fields of a JSON observation.

use serde_json::{Value, json};
use turnsafe_policy::json::classify_json;
use turnsafe_policy::{DivertFailure, RetryPlan, parse_divert_failure};

fn parsed(text: &str) -> (String, Option<i64>) {
    let DivertFailure { operation, errno } = parse_divert_failure(text);
    (operation, errno)
}

#[test]
fn a_divert_error_is_read_down_to_operation_and_errno() {
    let cases: &[(&str, &str, Option<i64>)] = &[
        (
            "open /x/sessions/s1.jsonl: Too many open files (os error 24)",
            "open",
            Some(24),
        ),
        ("Permission denied (os error 13)", "write", Some(13)),
        ("open: EMFILE", "open", Some(24)),
        ("fsync_dir: ENOSPC", "fsync_dir", Some(28)),
        // The first errno named wins over later numbers.
        ("open: EMFILE after 3 tries", "open", Some(24)),
        ("fsync:28", "fsync", Some(28)),
        ("mkdir 17", "mkdir", Some(17)),
        // Only upper-case E-names are errno names; a lower-case word is text.
        ("open: enospc", "open", None),
        ("fsync: Eio", "fsync", None),
        ("E", "write", None),
        // More than four digits is no errno; neither is a number in a path.
        ("write 12345", "write", None),
        ("open /tmp/dir1/s1.jsonl: failed", "open", None),
        ("", "write", None),
    ];
    for (text, operation, errno) in cases {
        assert_eq!(parsed(text), (operation.to_string(), *errno), "{text:?}");
    }
}

fn classify(v: Value) -> Value {
    serde_json::from_str(&classify_json(&v.to_string())).expect("classify answers JSON")
}

#[test]
fn integer_fields_accept_whole_floats_only() {
    assert_eq!(classify(json!({"code": 14.0}))["cause"], "disk");
    assert_eq!(classify(json!({"extended_code": 1032.0}))["cause"], "replaced");
    for bad in [json!({"code": 14.5}), json!({"errno": 28.25})] {
        let out = classify(bad.clone());
        assert!(
            out["error"].as_str().is_some_and(|e| e.contains("must be an integer")),
            "{bad} -> {out}"
        );
    }
}

#[test]
fn the_seed_reaches_the_retry_delay_as_a_u64() {
    let plan = RetryPlan::DEFAULT;
    let delay = |seed: Value| classify(json!({"code": 5, "attempt": 6, "seed": seed}))["delay_ms"].clone();
    assert_eq!(delay(json!(99)), json!(478));
    assert_eq!(delay(json!(1)), json!(plan.next_delay(6, 0, 1).unwrap()));
    assert_eq!(delay(json!(u64::MAX)), json!(plan.next_delay(6, 0, u64::MAX).unwrap()));
    // Negative seeds are taken modulo 2^64.
    assert_eq!(delay(json!(-1)), json!(plan.next_delay(6, 0, u64::MAX).unwrap()));
    assert_eq!(delay(Value::Null), json!(plan.next_delay(6, 0, 0).unwrap()));
    // The values differ, so a seed read wrongly cannot pass.
    let distinct: std::collections::BTreeSet<u64> = [0, 1, 99, u64::MAX, i64::MAX as u64]
        .into_iter()
        .map(|s| plan.next_delay(6, 0, s).unwrap())
        .collect();
    assert_eq!(distinct.len(), 5);
}

#[test]
fn an_unknown_operation_is_named_in_the_error_clipped() {
    let out = classify(json!({"operation": "bogus"}));
    let e = out["error"].as_str().unwrap();
    assert!(e.contains("unknown operation `bogus`"), "{e}");
    let long = "x".repeat(100);
    let out = classify(json!({ "operation": long }));
    let e = out["error"].as_str().unwrap();
    assert!(e.contains(&format!("`{}`", "x".repeat(40))), "{e}");
    assert!(!e.contains(&"x".repeat(41)), "{e}");
}

#[test]
fn remediation_for_a_cause_leads_every_copy_of_it() {
    use turnsafe_policy::{Cause, CopyContext, Outcome, cause_remediation, explain, is_producible};
    let ctx = CopyContext {
        receipt: Some(turnsafe_policy::machine::DivertReceipt {
            path: "/r/s.jsonl".into(),
            offset: 0,
            length: 9,
            count: 1,
            sha256: "5f2b".repeat(16),
        }),
        ..CopyContext::default()
    };
    for cause in Cause::ALL {
        let steps = cause_remediation(cause);
        assert!(
            !steps.is_empty() && steps.iter().all(|s| s.len() > 10),
            "{cause:?}: {steps:?}"
        );
        for outcome in Outcome::ALL {
            if !is_producible(cause, outcome) || outcome == Outcome::Persisted {
                continue;
            }
            let copy = explain(cause, outcome, &ctx).unwrap();
            assert_eq!(copy.remediation[..steps.len()], steps[..], "{cause:?}/{outcome:?}");
        }
    }
}

/// The divert-error reading as it was first written, with `str::split` on
/// `char` predicates and `trim_start_matches`: the policy now reads bytes
/// (cheaper in the component), and must read every text the same.
fn read_with_char_splits(text: &str) -> (String, Option<i64>) {
    let known = turnsafe_policy::KNOWN_DIVERT_OPS;
    let lower = text.to_ascii_lowercase();
    let operation = lower
        .split(|c: char| !(c.is_ascii_lowercase() || c == '_'))
        .find(|w| known.contains(w))
        .unwrap_or("write")
        .to_string();
    let number_after = |marker: &str| {
        let rest = lower[lower.find(marker)? + marker.len()..].trim_start_matches(' ');
        let end = rest.find(|c: char| !c.is_ascii_digit()).unwrap_or(rest.len());
        rest[..end].parse::<i64>().ok()
    };
    let mut errno = number_after("os error ").or_else(|| number_after("[errno "));
    if errno.is_none() {
        errno = text.split(|c: char| !c.is_ascii_alphanumeric()).find_map(|w| {
            let named = w.len() > 1 && w.starts_with('E') && w.bytes().all(|b| b.is_ascii_uppercase());
            named.then(|| turnsafe_policy::errno::from_name(w)).flatten()
        });
    }
    if errno.is_none() && !text.contains('/') {
        errno = text
            .split(|c: char| !c.is_ascii_digit())
            .filter(|w| !w.is_empty() && w.len() <= 4)
            .find_map(|w| w.parse().ok());
    }
    (operation, errno)
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(2000))]

    #[test]
    fn a_divert_error_reads_as_char_splits_read_it(
        parts in proptest::collection::vec(
            proptest::sample::select(vec![
                "open", "fsync_dir", "Fsync", "mkdir", "EMFILE", "ENOSPC", "Eio", "EWHAT", "E", "os error ",
                "[errno ", "(os error  13)", "24", "007", "1234", "12345", "-3", "/", " ", ":", "é", "日本", "x_y", "\u{1F600}",
            ]),
            0..8,
        ),
        noise in ".{0,12}",
    ) {
        let text = format!("{}{noise}", parts.concat());
        proptest::prop_assert_eq!(parsed(&text), read_with_char_splits(&text), "{:?}", text);
    }
}

#[test]
fn an_unknown_operation_is_clipped_by_characters_not_bytes() {
    for c in ["é", "日", "\u{1F600}"] {
        let out = classify(json!({ "operation": c.repeat(50) }));
        let e = out["error"].as_str().unwrap();
        assert!(e.contains(&format!("`{}`", c.repeat(40))), "{e}");
        assert!(!e.contains(&c.repeat(41)), "{e}");
    }
    // A short one is whole.
    let out = classify(json!({ "operation": "é".repeat(40) }));
    assert!(
        out["error"]
            .as_str()
            .unwrap()
            .contains(&format!("`{}`", "é".repeat(40)))
    );
}
