//! Which files in `sessions/` are turnsafe's divert files.
//!
//! Users share `sessions/` with their own runtime, whose transcripts may
//! also be named `<id>.jsonl`. A file is turnsafe's only when its name is
//! `<valid-id>.jsonl` and at least one of its lines is a divert line of
//! this format (`v` 1) for that session; a torn first line does not
//! disqualify it when another line qualifies. Every other file is foreign:
//! replay never moves or rewrites it, and doctor lists it apart.

use std::fs::File;
use std::io::{self, BufReader};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::divert::{FORMAT_VERSION, validate_session_id};

/// turnsafe's own settlement log, kept beside the divert files.
pub const LEDGER: &str = "ledger.jsonl";

/// The session a `sessions/` file name would divert for: `<valid-id>.jsonl`,
/// the ledger excepted.
pub fn session_of_name(name: &str) -> Option<&str> {
    if name == LEDGER {
        return None;
    }
    name.strip_suffix(".jsonl").filter(|s| validate_session_id(s).is_ok())
}

/// Whether one line is a divert line of this format for `session`: a JSON
/// object with `v` 1 or 2, that `session`, a `uid` string and a `message`;
/// or a LangGraph line, `v` 3 with `kind` `checkpoint` (and a `checkpoint`
/// object) or `write` (and a `write` object), that `session` and a `uid`.
pub fn is_divert_line(line: &[u8], session: &str) -> bool {
    let Ok(Value::Object(obj)) = crate::json_in::value_bytes(line) else {
        return false;
    };
    if crate::graph::is_graph_line(&obj, session) {
        return true;
    }
    matches!(obj.get("v").and_then(Value::as_u64), Some(v) if v == 1 || v == FORMAT_VERSION)
        && obj.get("session").and_then(Value::as_str) == Some(session)
        && obj.get("uid").is_some_and(Value::is_string)
        && obj.get("message").is_some_and(Value::is_object)
}

/// Whether `reader` holds at least one divert line for `session`. Reads
/// only up to the first one (the first line, for every file divert wrote
/// whole).
pub fn has_divert_line(reader: impl io::Read, session: &str) -> io::Result<bool> {
    let mut reader = BufReader::with_capacity(1 << 16, reader);
    let mut buf = Vec::new();
    // A line past the bound is no divert line (divert never writes one),
    // and is read past without being held.
    while let Some((_, fits)) = crate::lines::read_line(&mut reader, &mut buf, crate::lines::MAX_DIVERT_LINE)? {
        if fits == crate::lines::Line::Whole && is_divert_line(buf.trim_ascii(), session) {
            return Ok(true);
        }
    }
    Ok(false)
}

/// Open a candidate for reading: never through a symlink, and without
/// blocking should it have turned into a FIFO since it was listed.
fn open_candidate(path: &Path) -> io::Result<File> {
    crate::lines::open_regular(path)
}

/// What `sessions/` holds, by owner.
#[derive(Debug, Clone, Default)]
pub struct Listing {
    /// turnsafe's divert files: (session, path), sorted.
    pub divert: Vec<(String, PathBuf)>,
    /// File names that are not turnsafe's, sorted.
    pub foreign: Vec<String>,
    /// Of the foreign, `<valid-id>.jsonl` files owned by another user
    /// (neither this process's nor the folder's owner): (name, uid), sorted.
    /// Their lines could be anyone's words; replay never imports them.
    pub other_owner: Vec<(String, u32)>,
}

/// Sort the files directly in `sessions/` (folders are skipped, the ledger
/// is turnsafe's own). With `session`, only the file named for it is
/// looked at. A missing folder holds nothing.
pub fn list(sessions: &Path, session: Option<&str>) -> io::Result<Listing> {
    let rd = match std::fs::read_dir(sessions) {
        Ok(rd) => rd,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Listing::default()),
        Err(e) => return Err(e),
    };
    let mut out = Listing::default();
    // Whose files count as turnsafe's: this process's user's, or the
    // folder owner's (root replaying a user's home).
    let folder_owner = std::fs::symlink_metadata(sessions)?.uid();
    let me = rustix::process::geteuid().as_raw();
    for entry in rd {
        let entry = entry?;
        let file_type = entry.file_type()?;
        if file_type.is_dir() {
            continue;
        }
        let name = entry.file_name().to_string_lossy().into_owned();
        if name == LEDGER {
            continue;
        }
        let id = session_of_name(&name);
        if session.is_some_and(|s| id != Some(s)) {
            continue;
        }
        let path = entry.path();
        // Only regular files are read: divert never makes anything else.
        if let Some(owner) = id
            .filter(|_| file_type.is_file())
            .and_then(|_| entry.metadata().ok())
            .map(|m| m.uid())
            .filter(|uid| *uid != me && *uid != folder_owner)
        {
            out.other_owner.push((name.clone(), owner));
            out.foreign.push(name);
            continue;
        }
        let ours = match id {
            Some(id) if file_type.is_file() => match open_candidate(&path) {
                Ok(f) => has_divert_line(f, id)?,
                // Gone since it was listed: nothing to sort.
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => return Err(e),
            },
            _ => false,
        };
        match id {
            Some(id) if ours => out.divert.push((id.to_string(), path)),
            _ => out.foreign.push(name),
        }
    }
    out.divert.sort();
    out.foreign.sort();
    out.other_owner.sort();
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const OURS: &str = r#"{"v":1,"session":"s1","uid":"u1","seq":1,"batch":"b","cause":"disk","at":"t","message":{"role":"user","content":"hi","uid":"u1"}}"#;

    #[test]
    fn a_line_qualifies_only_in_this_format_for_this_session() {
        assert!(is_divert_line(OURS.as_bytes(), "s1"));
        assert!(!is_divert_line(OURS.as_bytes(), "s2"));
        assert!(is_divert_line(OURS.replace("\"v\":1", "\"v\":2").as_bytes(), "s1"));
        assert!(!is_divert_line(OURS.replace("\"v\":1", "\"v\":3").as_bytes(), "s1"));
        assert!(!is_divert_line(br#"{"role":"user","content":"hi"}"#, "s1"));
        assert!(!is_divert_line(&OURS.as_bytes()[..40], "s1"));
    }

    #[test]
    fn sorts_files_by_owner() {
        let dir = tempfile::tempdir().unwrap();
        let s = dir.path();
        std::fs::write(s.join("s1.jsonl"), format!("{OURS}\n")).unwrap();
        // Torn first line, then a good one: still ours.
        let torn = format!("{}\n{}\n", &OURS[..30], OURS.replace("s1", "s2"));
        std::fs::write(s.join("s2.jsonl"), torn).unwrap();
        // Another runtime's transcript, a line for another session, a bad name.
        std::fs::write(s.join("chat.jsonl"), "{\"role\":\"user\",\"content\":\"x\"}\n").unwrap();
        std::fs::write(s.join("s3.jsonl"), format!("{OURS}\n")).unwrap();
        std::fs::write(s.join("..x.jsonl"), format!("{OURS}\n")).unwrap();
        std::fs::write(s.join(LEDGER), "{}\n").unwrap();
        std::fs::create_dir(s.join("settled")).unwrap();
        std::os::unix::fs::symlink(s.join("s1.jsonl"), s.join("s4.jsonl")).unwrap();

        let l = list(s, None).unwrap();
        let ours: Vec<&str> = l.divert.iter().map(|(id, _)| id.as_str()).collect();
        assert_eq!(ours, ["s1", "s2"]);
        assert_eq!(l.foreign, ["..x.jsonl", "chat.jsonl", "s3.jsonl", "s4.jsonl"]);

        let only = list(s, Some("s2")).unwrap();
        assert_eq!(only.divert.len(), 1);
        assert!(only.foreign.is_empty());
        assert!(list(&s.join("absent"), None).unwrap().divert.is_empty());
    }
}
