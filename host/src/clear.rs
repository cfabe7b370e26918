//! Clear: a session's pending divert lines settled `cleared` when its
//! owner clears it, and the lines a clear archives with the rows.

use std::fs::DirBuilder;
use std::io::{self, Write};
use std::os::unix::fs::DirBuilderExt;
use std::path::Path;

use serde_json::{Value, json};

use crate::divert::sync_dir;
use crate::divert_files;
use crate::replay::{
    DivertLine, ReplayError, ReplayOptions, io_err, open_ledger, parse_divert_line, session_of_settling,
    settling_files, take,
};
use crate::store::now_ms;

/// Settle every pending divert line of `session` as `cleared` (the
/// session was cleared by its owner): the lines are not imported, each
/// gets a ledger entry, and the files move to `sessions/settled/`, kept.
/// Returns how many lines were settled.
pub fn clear_pending(home: &Path, session: &str) -> Result<u64, ReplayError> {
    let sessions = home.join("sessions");
    if !sessions.is_dir() {
        return Ok(0);
    }
    let settling = sessions.join("settling");
    let settled = sessions.join("settled");
    let listing =
        divert_files::list(&sessions, Some(session)).map_err(io_err(format!("list {}", sessions.display())))?;
    let opts = ReplayOptions {
        session: Some(session.to_string()),
        ..ReplayOptions::default()
    };
    let pending_settling = settling.is_dir() && !settling_files(&settling, &opts)?.is_empty();
    if listing.divert.is_empty() && !pending_settling {
        return Ok(0);
    }
    for dir in [&settling, &settled] {
        DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(io_err(format!("mkdir {}", dir.display())))?;
    }
    for (session, path) in &listing.divert {
        take(path, &settling, session)?;
    }
    sync_dir(&settling).map_err(io_err("fsync settling/"))?;
    let mut ledger = open_ledger(&sessions)?;
    let mut count = 0;
    for (session, path) in settling_files(&settling, &opts)? {
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let data = std::fs::read(&path).map_err(io_err(format!("read {name}")))?;
        let mut out = Vec::new();
        let mut graph_lines = Vec::new();
        let (mut offset, mut line_no) = (0u64, 0u64);
        for line in data.split_inclusive(|b| *b == b'\n') {
            line_no += 1;
            let line_offset = offset;
            offset += line.len() as u64;
            if line.iter().all(u8::is_ascii_whitespace) {
                continue;
            }
            // A LangGraph line of a thread that shares the session's id is
            // not the session's to clear: it stays pending.
            if let Ok(Value::Object(obj)) = serde_json::from_slice::<Value>(line)
                && crate::graph::is_graph_line(&obj, &session)
            {
                graph_lines.push(Value::Object(obj));
                continue;
            }
            let uid = serde_json::from_slice::<Value>(line)
                .ok()
                .and_then(|v| v.get("uid").and_then(Value::as_str).map(String::from));
            let entry = json!({
                "file": name, "line": line_no, "offset": line_offset, "session": session,
                "uid": uid, "state": "cleared", "reason": "the session was cleared", "at_ms": now_ms(),
            });
            serde_json::to_writer(&mut out, &entry).map_err(|e| io_err("encode ledger")(io::Error::other(e)))?;
            out.push(b'\n');
            count += 1;
        }
        if !graph_lines.is_empty() {
            // Written back (and fsynced) before the file is settled: a cut
            // in between leaves them twice, which replay stores once.
            crate::divert::append_lines(&sessions, &session, &graph_lines)
                .map_err(|e| io_err(format!("keep the LangGraph lines of {name}"))(io::Error::other(e.to_string())))?;
        }
        ledger.write_all(&out).map_err(io_err("write ledger.jsonl"))?;
        ledger.sync_all().map_err(io_err("fsync ledger.jsonl"))?;
        std::fs::rename(&path, settled.join(&name)).map_err(io_err(format!("settle {name}")))?;
        sync_dir(&settled).map_err(io_err("fsync settled/"))?;
    }
    sync_dir(&settling).map_err(io_err("fsync settling/"))?;
    Ok(count)
}

/// The readable lines of `session` still pending (its divert file, and
/// files of it being settled): what a clear archives with the rows.
pub(crate) fn pending_lines(home: &Path, session: &str) -> io::Result<Vec<DivertLine>> {
    let sessions = home.join("sessions");
    let mut files = vec![sessions.join(format!("{session}.jsonl"))];
    if let Ok(rd) = std::fs::read_dir(sessions.join("settling")) {
        files.extend(
            rd.flatten()
                .map(|e| e.path())
                .filter(|p| p.file_name().and_then(|n| n.to_str()).and_then(session_of_settling) == Some(session)),
        );
    }
    let mut out = Vec::new();
    for f in files {
        let data = match std::fs::read(&f) {
            Ok(d) => d,
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e),
        };
        for line in String::from_utf8_lossy(&data).lines() {
            if let Ok(parsed) = parse_divert_line(line, session) {
                out.push(parsed);
            }
        }
    }
    Ok(out)
}
