//! An object keyed `$serde_json::private::Number` (the key serde_json's
//! `arbitrary_precision` reserves for numbers) is stored, shown, compared,
//! diverted and replayed as the object it is: never read back as the
//! number its value spells, never settled as the same record as that
//! number. Found by the JSON fuzz target (fuzz/README.md).

use std::path::Path;
use std::process::Output;

use assert_cmd::Command;
use serde_json::{Value, json};

const TOKEN: &str = "$serde_json::private::Number";

fn turnsafe(home: &Path, args: &[&str], stdin: &str) -> Output {
    Command::cargo_bin("turnsafe")
        .unwrap()
        .args(args)
        .arg("--home")
        .arg(home)
        .write_stdin(stdin)
        .timeout(std::time::Duration::from_secs(120))
        .output()
        .unwrap()
}

fn lines(out: &Output) -> Vec<Value> {
    String::from_utf8_lossy(&out.stdout)
        .lines()
        // Read as the store reads: serde_json alone would take the key for a number.
        .map(|l| turnsafe_host::json_in::value(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect()
}

/// The stored messages of `session`, by uid, as `show --json` prints them.
fn shown(home: &Path, session: &str) -> Vec<(String, Value)> {
    let out = turnsafe(home, &["show", "--session", session, "--json"], "");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    lines(&out)
        .into_iter()
        .filter(|l| l["type"] == "message")
        .map(|l| {
            (
                l["data"]["uid"].as_str().unwrap().to_string(),
                l["data"]["message"].clone(),
            )
        })
        .collect()
}

/// The content the test sent under each uid, built in memory: a map with
/// the key, as written (serde_json writes an in-memory key as it is).
fn expected(value: &str) -> Value {
    let mut inner = serde_json::Map::new();
    inner.insert(TOKEN.into(), Value::String(value.into()));
    Value::Object(inner)
}

#[test]
fn the_key_is_stored_shown_and_compared_as_written() {
    let home = tempfile::tempdir().unwrap();
    // Written as it is, and spelled with `\u` escapes.
    let input = concat!(
        r#"[{"role":"user","uid":"lit","content":{"$serde_json::private::Number":"12"}},"#,
        r#"{"role":"user","uid":"esc","content":{"\u0024serde_json::private::Numbe\u0072":"not a number"}}]"#,
        "\n"
    );
    let out = turnsafe(home.path(), &["append", "--session", "s1"], input);
    let outcome = &lines(&out)[0];
    assert_eq!(outcome["committed"], 2, "{outcome}");

    let rows = shown(home.path(), "s1");
    assert_eq!(
        rows,
        [
            ("lit".to_string(), json!({"role": "user", "content": expected("12")})),
            (
                "esc".to_string(),
                json!({"role": "user", "content": expected("not a number")})
            ),
        ]
    );

    // The same bytes again: already stored, nothing added.
    let again = turnsafe(home.path(), &["append", "--session", "s1"], input);
    assert_eq!(lines(&again)[0]["persisted"], true, "{:?}", lines(&again));
    assert_eq!(shown(home.path(), "s1").len(), 2);

    // The number the value spells is other content under the same uid.
    let number = r#"[{"role":"user","uid":"lit","content":12}]"#;
    let conflict = turnsafe(home.path(), &["append", "--session", "s1"], &format!("{number}\n"));
    assert_eq!(lines(&conflict)[0]["cause"], "uid_conflict", "{:?}", lines(&conflict));
    assert_eq!(shown(home.path(), "s1")[0].1["content"], expected("12"));
}

#[test]
fn a_diverted_message_with_the_key_replays_as_written() {
    let home = tempfile::tempdir().unwrap();
    // A folder where state.db belongs: the batch is diverted.
    std::fs::create_dir(home.path().join("state.db")).unwrap();
    let input = r#"[{"role":"tool","uid":"d1","content":{"\u0024serde_json::private::Number":"1e400"}}]"#;
    let out = turnsafe(home.path(), &["append", "--session", "s2"], &format!("{input}\n"));
    let outcome = &lines(&out)[0];
    assert_eq!(outcome["diverted"], 1, "{outcome}");
    let divert = std::fs::read_to_string(home.path().join("sessions/s2.jsonl")).unwrap();
    assert!(divert.contains(&format!("{{\"{TOKEN}\":\"1e400\"}}")), "{divert}");

    std::fs::remove_dir(home.path().join("state.db")).unwrap();
    let replayed = turnsafe(home.path(), &["replay"], "");
    assert!(
        replayed.status.success(),
        "{}",
        String::from_utf8_lossy(&replayed.stderr)
    );
    assert_eq!(
        shown(home.path(), "s2"),
        [("d1".to_string(), json!({"role": "tool", "content": expected("1e400")}))]
    );

    // The same line offered again settles as a duplicate, not a conflict.
    let settled: Vec<_> = std::fs::read_dir(home.path().join("sessions/settled"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(settled.len(), 1, "{settled:?}");
    std::fs::copy(&settled[0], home.path().join("sessions/s2.jsonl")).unwrap();
    let again = turnsafe(home.path(), &["replay"], "");
    let text = String::from_utf8_lossy(&again.stdout);
    assert!(again.status.success(), "{text}");
    assert!(text.contains("1 lines: 0 replayed, 1 duplicate"), "{text}");
    assert!(text.contains("(0 conflict)"), "{text}");
    assert_eq!(shown(home.path(), "s2").len(), 1);
}
