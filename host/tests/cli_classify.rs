//! The `turnsafe classify` streaming contract, driven through the binary.

use assert_cmd::Command;
use serde_json::Value;

fn classify(engine: &str, input: &str) -> (Vec<Value>, i32) {
    let out = Command::cargo_bin("turnsafe")
        .expect("binary built")
        .args(["classify", "--engine", engine])
        .write_stdin(input)
        .output()
        .expect("runs");
    let lines = String::from_utf8(out.stdout)
        .expect("utf-8")
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    (lines, out.status.code().expect("exit code"))
}

const INPUT: &str = r#"{"operation":"open","code":14,"errno":24,"message":"unable to open database file"}

{"operation":"append_batch","code":5,"attempt":1,"seed":7,"extra":"ignored"}
not json
[1,2]
{"operation":"append_batch","extended_code":1032,"message":"attempt to write a readonly database"}
{"operation":"append_batch","evidence":["deleted_wal_generation","nonsense"]}
{"message":"sqlite3.OperationalError: unable to open database file: database is locked"}
{"code":null,"extended_code":null,"errno":null,"message":"database disk image is malformed"}
"#;

#[test]
fn one_bare_object_per_line_and_errors_carry_the_line_number() {
    let (lines, code) = classify("native", INPUT);
    assert_eq!(
        lines.len(),
        8,
        "blank line skipped, every other line answered: {lines:?}"
    );
    assert_eq!(lines[0]["cause"], "disk");
    assert_eq!(lines[0]["basis"], "code");
    assert_eq!(lines[0]["action"], "divert");
    assert!(lines[0].get("delay_ms").is_none());
    assert_eq!(lines[1]["cause"], "locked");
    assert_eq!(lines[1]["action"], "retry");
    assert!(lines[1]["delay_ms"].as_u64().is_some_and(|d| d > 0));
    assert_eq!(lines[2]["line"], 4);
    assert!(lines[2]["error"].is_string());
    assert_eq!(lines[3]["line"], 5);
    assert_eq!(lines[4]["cause"], "replaced");
    assert_eq!(lines[4]["basis"], "code");
    assert_eq!(lines[5]["cause"], "deleted_wal");
    assert_eq!(lines[5]["basis"], "evidence");
    assert_eq!(lines[6]["cause"], "locked");
    assert_eq!(lines[7]["cause"], "corrupt");
    assert_eq!(lines[7]["basis"], "message");
    assert_eq!(code, 65, "bad lines make the run fail at the end");
}

#[test]
fn both_engines_print_the_same_bytes() {
    let run = |engine: &str| {
        Command::cargo_bin("turnsafe")
            .unwrap()
            .args(["classify", "--engine", engine])
            .write_stdin(INPUT)
            .output()
            .unwrap()
    };
    let (n, w) = (run("native"), run("wasm"));
    assert_eq!(String::from_utf8_lossy(&n.stdout), String::from_utf8_lossy(&w.stdout));
    assert_eq!(n.status.code(), w.status.code());
}

#[test]
fn clean_input_exits_zero() {
    let (lines, code) = classify("wasm", "{\"code\":13}\n{\"extended_code\":267}\n");
    assert_eq!(code, 0);
    assert_eq!(lines[0]["cause"], "disk_full");
    assert_eq!(lines[1]["action"], "degrade_fts");
}

#[test]
fn hostile_input_never_panics() {
    let mut input = String::new();
    for junk in [
        "{\"code\":99999999999999999999999}",
        "{\"code\":-1,\"extended_code\":-9223372036854775808}",
        "{\"attempt\":1e300,\"elapsed_ms\":-5,\"seed\":-1}",
        "{\"operation\":\"explode\"}",
        "{\"evidence\":\"db_replaced\"}",
        "{\"code\":\"14\"}",
        "\u{0}\u{1}\u{2}",
        "{",
        "null",
    ] {
        input.push_str(junk);
        input.push('\n');
    }
    input.push_str("{\"code\":14}\n");
    for engine in ["native", "wasm"] {
        let (lines, code) = classify(engine, &input);
        assert_eq!(lines.len(), 10, "{engine}: {lines:?}");
        assert_eq!(
            lines[9]["cause"], "disk",
            "{engine}: the line after the junk is still answered"
        );
        assert_eq!(code, 65);
        for l in &lines {
            assert!(l.get("cause").is_some() || l.get("line").is_some(), "{l}");
        }
    }
}
