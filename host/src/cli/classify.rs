//! `turnsafe classify`: JSON Lines observations in, one decision object out per line.

use serde_json::Value;

use crate::engine::EngineKind;

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
    super::answer_json_lines("classify", args.engine, |policy, text| {
        match crate::json_in::value(text) {
            Ok(Value::Object(_)) => policy.classify_json(text),
            Ok(_) => Ok(error_line("line is not a JSON object")),
            Err(e) => Ok(error_line(&format!("invalid JSON: {e}"))),
        }
    })
}

fn error_line(msg: &str) -> String {
    serde_json::json!({ "error": msg }).to_string()
}
