//! `turnsafe evaluate`: observation and context in, decision and copy out.

use crate::engine::EngineKind;

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
    super::answer_json_lines("evaluate", args.engine, |policy, text| policy.evaluate_json(text))
}
