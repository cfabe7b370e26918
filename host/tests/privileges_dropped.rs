//! Privileges dropped with `setpriv` (root cannot be stopped by modes, a
//! nobody process can): the store cannot be opened, the divert cannot be
//! written, and the outcome claims nothing.

use serde_json::Value;

#[test]
fn an_unprivileged_writer_gets_disk_and_a_failed_divert() {
    let is_root = rustix::process::geteuid().is_root();
    let have_setpriv = std::process::Command::new("setpriv")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    let capable = if is_root && have_setpriv {
        Ok(())
    } else {
        Err(format!(
            "needs root and setpriv (root: {is_root}, setpriv: {have_setpriv})"
        ))
    };
    turnsafe_tests::require!(capable);
    let dir = tempfile::tempdir().unwrap();
    // Root makes a healthy store first.
    let ok = assert_cmd::Command::cargo_bin("turnsafe")
        .unwrap()
        .args(["append", "--session", "s1", "--home"])
        .arg(dir.path())
        .write_stdin("[{\"role\":\"user\",\"content\":\"root\"}]\n")
        .output()
        .unwrap();
    assert_eq!(ok.status.code(), Some(0));
    // Let nobody reach the home, but not write what root made (0600/0700).
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let out = std::process::Command::new("setpriv")
        .args(["--reuid", "nobody", "--regid", "nogroup", "--clear-groups"])
        .arg(assert_cmd::cargo::cargo_bin("turnsafe"))
        .args(["append", "--session", "s1", "--home"])
        .arg(dir.path())
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .and_then(|mut c| {
            use std::io::Write;
            c.stdin
                .take()
                .unwrap()
                .write_all(b"[{\"role\":\"user\",\"content\":\"nobody\"}]\n")?;
            c.wait_with_output()
        })
        .unwrap();
    assert_eq!(out.status.code(), Some(3));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["cause"], "disk", "{v}");
    assert_eq!(v["handed_back"], 1);
    assert!(v["receipt"].is_null());
    assert_eq!(v["divert_error"]["errno"], libc::EACCES);
    assert_eq!(v["copy"]["code"], "disk.divert_failed");
}
