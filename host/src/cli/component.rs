//! `turnsafe component`: write out the policy component this binary carries.

use std::path::PathBuf;

use crate::engine::{COMPONENT, WasmEngine};
use crate::exit;

/// Write out the policy component this binary carries.
///
/// WIT `turnsafe:policy@0.4.0`, world `policy`, no imports; written byte
/// for byte as embedded.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Where to write the component.
    #[arg(long)]
    out: Option<PathBuf>,
    /// Print the component's imports and exports.
    #[arg(long)]
    list: bool,
}

pub fn run(args: Args) -> i32 {
    if args.out.is_none() && !args.list {
        eprintln!("error: give `--out FILE` to write the component, or `--list` to show its imports and exports");
        return exit::USAGE;
    }
    if let Some(out) = &args.out {
        if let Err(e) = std::fs::write(out, COMPONENT) {
            eprintln!("turnsafe component: writing {}: {e}", out.display());
            // A folder that is not there, or not writable: the path given is wrong.
            return match e.kind() {
                std::io::ErrorKind::NotFound
                | std::io::ErrorKind::PermissionDenied
                | std::io::ErrorKind::IsADirectory => exit::USAGE,
                _ => exit::FAILURE,
            };
        }
        eprintln!("wrote {} ({} bytes)", out.display(), COMPONENT.len());
    }
    if args.list {
        let engine = match WasmEngine::new() {
            Ok(e) => e,
            Err(e) => {
                eprintln!("turnsafe component: {e}");
                return exit::FAILURE;
            }
        };
        println!(
            "imports: {}",
            if engine.imports().is_empty() {
                "(none)".to_string()
            } else {
                engine.imports().join(", ")
            }
        );
        println!("exports: {}", engine.exports().join(", "));
    }
    exit::OK
}
