//! `powerfs-ctl BACKING MOUNTPOINT`: powerfs for tests written in other
//! languages. It mounts, prints `ready`, then answers one command a line on
//! stdin with one line on stdout, `ok [value]` or `err <why>`:
//!
//! | command | what it does | answer |
//! |---|---|---|
//! | `sync_count` | syncs seen since the mount | `ok N` |
//! | `cut_at_sync N` | plan the power loss at sync point N | `ok` |
//! | `frozen` | the sync point frozen at, if reached | `ok N` or `ok none` |
//! | `cut drop`, `cut keep`, `cut torn SEED`, `cut reorder SEED` | the power loss | `ok` |
//! | `remount` | a fresh mount over what survived | `ok` |
//! | `quit` (or end of input) | unmount and exit | `ok` |
//!
//! Without root or `/dev/fuse` it prints `unavailable <why>` and exits 3,
//! so the caller can tell a missing capability from a broken harness.

use std::io::{BufRead, Write};

use powerfs::{CutMode, PowerFs};

fn cut_mode(words: &[&str]) -> Result<CutMode, String> {
    let seed = |w: Option<&&str>| -> Result<u64, String> {
        w.ok_or("a seed is needed")?
            .parse()
            .map_err(|e| format!("bad seed: {e}"))
    };
    match words.first().copied() {
        Some("drop") => Ok(CutMode::DropPending),
        Some("keep") => Ok(CutMode::KeepPending),
        Some("torn") => Ok(CutMode::TornPrefix {
            seed: seed(words.get(1))?,
        }),
        Some("reorder") => Ok(CutMode::Reorder {
            seed: seed(words.get(1))?,
        }),
        _ => Err("cut takes drop, keep, torn SEED or reorder SEED".into()),
    }
}

fn answer(fs: &mut PowerFs, line: &str) -> Result<String, String> {
    let words: Vec<&str> = line.split_whitespace().collect();
    match words.as_slice() {
        ["sync_count"] => Ok(fs.sync_count().to_string()),
        ["cut_at_sync", n] => {
            fs.cut_at_sync(n.parse().map_err(|e| format!("bad sync point: {e}"))?);
            Ok(String::new())
        }
        ["frozen"] => Ok(fs.frozen_at().map_or_else(|| "none".to_string(), |p| p.n.to_string())),
        ["cut", rest @ ..] => {
            let mode = cut_mode(rest)?;
            fs.cut(mode).map(|_| String::new()).map_err(|e| e.to_string())
        }
        ["remount"] => fs.remount().map(|()| String::new()).map_err(|e| e.to_string()),
        _ => Err(format!("unknown command {line:?}")),
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [backing, mountpoint] = args.as_slice() else {
        eprintln!("usage: powerfs-ctl BACKING MOUNTPOINT");
        std::process::exit(2);
    };
    if let Err(why) = PowerFs::available() {
        println!("unavailable {why}");
        std::process::exit(3);
    }
    let mut fs = match PowerFs::mount(backing, mountpoint) {
        Ok(fs) => fs,
        Err(e) => {
            eprintln!("powerfs-ctl: mount failed: {e}");
            std::process::exit(1);
        }
    };
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "ready");
    let _ = out.flush();
    for line in std::io::stdin().lock().lines() {
        let Ok(line) = line else { break };
        let line = line.trim();
        if line == "quit" {
            break;
        }
        let reply = match answer(&mut fs, line) {
            Ok(v) if v.is_empty() => "ok".to_string(),
            Ok(v) => format!("ok {v}"),
            Err(e) => format!("err {e}"),
        };
        if writeln!(out, "{reply}").and_then(|()| out.flush()).is_err() {
            break;
        }
    }
    if fs.is_mounted()
        && let Err(e) = fs.unmount()
    {
        eprintln!("powerfs-ctl: unmount failed: {e}");
    }
    let _ = writeln!(out, "ok");
}
