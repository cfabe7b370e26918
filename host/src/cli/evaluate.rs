//! `turnsafe evaluate`: observation and context in, decision and copy out.

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
    let read = super::for_each_line(|line_no, text| {
        let answer = match policy.evaluate_json(text) {
            Ok(a) => a,
            Err(e) => serde_json::json!({ "error": e.to_string() }).to_string(),
        };
        super::emit(&super::answer_line(line_no, answer, &mut failed))
    });
    if let Err(e) = read {
        eprintln!("turnsafe evaluate: reading stdin: {e}");
        return exit::FAILURE;
    }
    if failed { exit::DATAERR } else { exit::OK }
}
