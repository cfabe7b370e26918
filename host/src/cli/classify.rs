//! `turnsafe classify`: JSON Lines observations in, one decision object out per line.

use serde_json::Value;

use crate::engine::{self, EngineKind};
use crate::exit;

/// Classify observations read as JSON Lines on stdin.
///
/// Each non-blank line is one observation object: `operation`
/// (open|append_batch|checkpoint|divert|replay), `code`, `extended_code`,
/// `errno` (integers or null), `message`, `evidence` (labels), `attempt`,
/// `elapsed_ms`, `seed`. Each gets one JSON object: `cause`, `basis`,
/// `action`, `delay_ms` (retry only), `sticky`, `capture`, `failure` (`session_persistence_failed:<cause>`). A line
/// that is not an observation gets `{"error": ..., "line": N}` and the exit
/// status is 65 at the end.
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
            eprintln!("turnsafe classify: {e}");
            return exit::FAILURE;
        }
    };
    let mut failed = false;
    let read = super::for_each_line(|line_no, text| {
        let answer = match serde_json::from_str::<Value>(text) {
            Ok(Value::Object(_)) => match policy.classify_json(text) {
                Ok(out) => out,
                Err(e) => error_line(&e.to_string()),
            },
            Ok(_) => error_line("line is not a JSON object"),
            Err(e) => error_line(&format!("invalid JSON: {e}")),
        };
        super::emit(&super::answer_line(line_no, answer, &mut failed))
    });
    if let Err(e) = read {
        eprintln!("turnsafe classify: reading stdin: {e}");
        return exit::FAILURE;
    }
    if failed { exit::DATAERR } else { exit::OK }
}

fn error_line(msg: &str) -> String {
    serde_json::json!({ "error": msg }).to_string()
}
