//! `turnsafe capture`: keep the retired generation a live writer holds.

use std::path::PathBuf;

use crate::exit;

/// Copy the retired state.db, WAL and shm that a live writer still holds
/// open into a capture folder, before anything stops that writer.
///
/// When a writer's own capture failed, the retired generation exists only
/// in its open descriptors: stopping the process destroys it, and
/// `turnsafe recover --source state.db` cannot see an unlinked WAL. This
/// reads each file through `/proc/PID/fd/` and writes
/// `<home>/state.db.retired-<UTC>-<PID>/` with the same manifest and
/// receipt as a writer's own capture (each file fsynced and renamed, then
/// the manifest, then the folders). `turnsafe doctor` names the pids that
/// hold deleted files.
///
/// Exit 1, with nothing called a capture, when the process holds no
/// retired file of the home, or a file cannot be read whole.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The writer process that holds the retired files.
    #[arg(long)]
    pid: u32,
    /// The turnsafe home whose state.db the process held.
    #[arg(long)]
    home: PathBuf,
    /// Print the capture receipt as a JSON envelope line.
    #[arg(long)]
    json: bool,
}

pub fn run(args: Args) -> i32 {
    match crate::capture_pid::capture_pid(args.pid, &args.home) {
        Ok(receipt) => {
            let data = serde_json::to_value(&receipt).unwrap_or_default();
            let line = if args.json {
                super::envelope("capture", data)
            } else {
                let files: Vec<String> = receipt
                    .files
                    .iter()
                    .map(|f| format!("{} ({} B)", f.name, f.size))
                    .collect();
                format!(
                    "captured: {}\nfiles: {}\nmanifest sha256: {}\nSettle it with `turnsafe recover --source {} \
                     --output <new.db> --install --home {}` or `--dismiss`.",
                    receipt.path,
                    files.join(", "),
                    receipt.manifest_sha256,
                    receipt.path,
                    args.home.display()
                )
            };
            if super::emit(&line) { exit::OK } else { exit::FAILURE }
        }
        Err(e) => {
            eprintln!("error: CAPTURE FAILED: {e}");
            eprintln!(
                "Do not stop pid {}: the retired generation may exist only in its open files.",
                args.pid
            );
            exit::FAILURE
        }
    }
}
