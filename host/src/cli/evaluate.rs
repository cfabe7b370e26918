//! `turnsafe evaluate`: observation and context in, decision and copy out.

use std::io::BufRead;

use serde_json::Value;

use crate::engine::{self, EngineKind};
use crate::exit;

/// Decide and explain observations with context, one JSON line each.
///
/// Requests are `{"observation": {...}, "context": {...}}`; each gets
/// one bare JSON object, the classify fields plus `outcome` and
/// `copy` (the `evaluate-json` entry point of the component). Other
/// runtimes compare their answers with this one byte for byte.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Which implementation of the policy answers.
    #[arg(long, value_enum, default_value = "native")]
    engine: EngineKind,
}

pub fn run(args: Args) -> i32 {
    let mut policy = match engine::open(args.engine) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("turnsafe evaluate: {e}");
            return exit::FAILURE;
        }
    };
    let mut failed = false;
    for (i, line) in std::io::stdin().lock().split(b'\n').enumerate() {
        let Ok(line) = line else { return exit::FAILURE };
        let text = String::from_utf8_lossy(&line);
        if text.trim().is_empty() {
            continue;
        }
        let answer = match policy.evaluate_json(text.trim()) {
            Ok(a) => a,
            Err(e) => serde_json::json!({ "error": e.to_string() }).to_string(),
        };
        let answer = match serde_json::from_str::<Value>(&answer) {
            Ok(Value::Object(mut m)) if m.contains_key("error") && !m.contains_key("cause") => {
                failed = true;
                m.insert("line".into(), (i + 1).into());
                Value::Object(m).to_string()
            }
            _ => answer,
        };
        if !super::emit(&answer) {
            break;
        }
    }
    if failed { exit::DATAERR } else { exit::OK }
}
