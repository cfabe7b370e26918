//! The small records turnsafe reads back from a home: a capture's
//! `manifest.json` and `SETTLED` marker, a divert receipt (as `explain
//! --receipt-json` takes one), and `sessions/ledger.jsonl` (as doctor
//! counts it).

use std::path::Path;

use serde_json::Value;
use sha2::{Digest, Sha256};
use turnsafe_host::captures::{self, MARKER, PREFIX};
use turnsafe_host::divert::{Receipt, verify_receipt};

/// A capture folder holding `manifest` (and `marker` as its `SETTLED`,
/// when given) in a fresh home under `scratch`.
///
/// Properties: reading never panics; a manifest is read only from a JSON
/// object (bytes that are not UTF-8 in a field it skips aside); a capture is settled only by a marker that is one, and
/// otherwise stays pending; a pending capture whose manifest cannot be
/// read holds every session (nothing it may hold is presumed absent).
pub fn check_capture_in(scratch: &Path, manifest: &[u8], marker: Option<&[u8]>) -> Result<(), String> {
    let home = tempfile::tempdir_in(scratch).map_err(|e| e.to_string())?;
    let dir = home.path().join(format!("{PREFIX}20260101T000000Z-1"));
    std::fs::create_dir(&dir).map_err(|e| e.to_string())?;
    std::fs::write(dir.join("manifest.json"), manifest).map_err(|e| e.to_string())?;
    if let Some(marker) = marker {
        std::fs::write(dir.join(MARKER), marker).map_err(|e| e.to_string())?;
    }
    let read = captures::manifest(&dir);
    // serde_json skips a field the manifest does not read without
    // checking that its string is UTF-8: harmless (nothing of it is read),
    // so the object is judged with such bytes replaced.
    let object = matches!(
        turnsafe_host::json_in::value(&String::from_utf8_lossy(manifest)),
        Ok(Value::Object(_))
    );
    if read.is_ok() && !object {
        return Err("a manifest read from bytes that are not a JSON object".into());
    }
    if let Err(e) = &read
        && !e.contains("manifest.json")
    {
        return Err(format!("an error that does not name the manifest: {e}"));
    }
    let settled = marker.is_some_and(|m| turnsafe_host::json_in::typed_bytes::<captures::Settled>(m).is_ok());
    let pending = captures::pending(home.path()).map_err(|e| e.to_string())?;
    if pending.is_empty() != settled {
        return Err(format!(
            "settled {settled}, yet pending lists {} capture(s)",
            pending.len()
        ));
    }
    let holds = captures::holds(home.path()).map_err(|e| e.to_string())?;
    if !settled && read.is_err() && !(holds.len() == 1 && holds[0].holds("any-session")) {
        return Err(format!("a pending capture with an unreadable manifest holds {holds:?}"));
    }
    if settled && !holds.is_empty() {
        return Err("a settled capture still holds sessions".into());
    }
    Ok(())
}

/// The input's first byte says whether a marker follows; the rest is
/// split at its first NUL: manifest before, marker after.
pub fn check_capture(data: &[u8]) -> Result<(), String> {
    let (with_marker, rest) = match data.split_first() {
        Some((b, rest)) => (b & 1 == 1, rest),
        None => (false, data),
    };
    let (manifest, marker) = match rest.iter().position(|b| *b == 0) {
        Some(at) if with_marker => (&rest[..at], Some(&rest[at + 1..])),
        _ => (rest, None),
    };
    check_capture_in(&std::env::temp_dir(), manifest, marker)
}

/// A receipt (the input's first line, JSON) checked against a divert
/// file (the rest of the input), with the receipt's path pointed at that
/// file: the fuzzer chooses the numbers and the bytes, never what is read.
///
/// Properties: reading and verifying never panic, whatever the offset and
/// length; a receipt holds only when its range is inside the file, its
/// bytes have its sha256, and it has its count of lines.
pub fn check_receipt_in(scratch: &Path, data: &[u8]) -> Result<(), String> {
    let (first, file) = match data.iter().position(|b| *b == b'\n') {
        Some(at) => (&data[..at], &data[at + 1..]),
        None => (data, &[][..]),
    };
    let Ok(mut receipt) = turnsafe_host::json_in::typed_bytes::<Receipt>(first) else {
        return Ok(());
    };
    let dir = tempfile::tempdir_in(scratch).map_err(|e| e.to_string())?;
    let path = dir.path().join("s1.jsonl");
    std::fs::write(&path, file).map_err(|e| e.to_string())?;
    receipt.path = path.to_string_lossy().into_owned();
    let _ = receipt.check();
    let holds = verify_receipt(&receipt).map_err(|e| format!("verify_receipt: {e}"))?;
    let range = usize::try_from(receipt.offset)
        .ok()
        .zip(usize::try_from(receipt.length).ok())
        .and_then(|(o, l)| Some(o..o.checked_add(l)?))
        .and_then(|r| file.get(r));
    let truly = range.is_some_and(|bytes| {
        hex::encode(Sha256::digest(bytes)) == receipt.sha256
            && bytes.iter().filter(|b| **b == b'\n').count() as u64 == receipt.count
    });
    if holds != truly {
        return Err(format!(
            "verify_receipt says {holds} of {receipt:?}, the bytes say {truly}"
        ));
    }
    Ok(())
}

pub fn check_receipt(data: &[u8]) -> Result<(), String> {
    check_receipt_in(&std::env::temp_dir(), data)
}

/// `sessions/ledger.jsonl` holding `bytes`, as doctor counts it.
///
/// Property: doctor's `quarantined_lines` is the number of ledger lines
/// that are JSON objects settled `quarantined` or `conflict`: an
/// unreadable line counts under no state, and hides no other line.
pub fn check_ledger_in(scratch: &Path, bytes: &[u8]) -> Result<(), String> {
    let home = tempfile::tempdir_in(scratch).map_err(|e| e.to_string())?;
    let sessions = home.path().join("sessions");
    std::fs::create_dir(&sessions).map_err(|e| e.to_string())?;
    std::fs::write(sessions.join("ledger.jsonl"), bytes).map_err(|e| e.to_string())?;
    let (_, facts) = turnsafe_host::doctor::examine(home.path(), false);
    let want = bytes
        .split(|b| *b == b'\n')
        .filter_map(|line| turnsafe_host::json_in::value_bytes(line).ok())
        .filter(|v| matches!(v.get("state").and_then(Value::as_str), Some("quarantined" | "conflict")))
        .count() as u64;
    let got = facts["quarantined_lines"].as_u64();
    if got != Some(want) {
        return Err(format!(
            "doctor counts {got:?} quarantined lines, the ledger holds {want}"
        ));
    }
    Ok(())
}

pub fn check_ledger(bytes: &[u8]) -> Result<(), String> {
    check_ledger_in(&std::env::temp_dir(), bytes)
}
