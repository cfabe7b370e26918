//! `turnsafe schema` (hidden): the statements this binary creates a new
//! `state.db` with and the DDL of each migration that only adds, as one
//! JSON object. The JavaScript host's build (`js/scripts/build.mjs`) writes
//! it into `js/gen/schema.json`, and that host runs exactly these strings,
//! so the schema has one source: `store/schema.rs` and `store/graph.rs`.

use crate::exit;
use crate::store::schema::{ADDING_STEPS, CREATE, VERSION};

/// Print the schema's statements as JSON (for the JavaScript host's build).
#[derive(Debug, clap::Args)]
pub struct Args {}

pub fn run(_: Args) -> i32 {
    let steps: Vec<serde_json::Value> = ADDING_STEPS
        .iter()
        .map(|(from, batches)| serde_json::json!({ "from": from, "to": from + 1, "ddl": batches }))
        .collect();
    let out = serde_json::json!({ "version": VERSION, "create": CREATE, "migrations": steps });
    if super::emit(&out.to_string()) {
        exit::OK
    } else {
        exit::FAILURE
    }
}
