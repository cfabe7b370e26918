//! A `turnsafe append` process driven one batch at a time.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};

use serde_json::Value;

pub fn bin() -> std::path::PathBuf {
    assert_cmd::cargo::cargo_bin("turnsafe")
}

pub struct Live {
    child: std::process::Child,
    stdin: std::process::ChildStdin,
    stdout: BufReader<std::process::ChildStdout>,
}

impl Live {
    pub fn start(home: &std::path::Path, session: &str) -> Live {
        Live::start_with(home, session, &[])
    }
    /// With more `turnsafe append` arguments (`--holder`, `--lease-ttl`, ...).
    pub fn start_with(home: &std::path::Path, session: &str, args: &[&str]) -> Live {
        let mut child = Command::new(bin())
            .args(["append", "--home"])
            .arg(home)
            .args(["--session", session])
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let stdin = child.stdin.take().unwrap();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        Live { child, stdin, stdout }
    }
    pub fn send(&mut self, line: &str) -> Value {
        writeln!(self.stdin, "{line}").unwrap();
        self.stdin.flush().unwrap();
        let mut out = String::new();
        self.stdout.read_line(&mut out).unwrap();
        serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out:?}"))
    }
    /// The process id, to kill it.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }
    /// SIGKILL, and reap.
    pub fn kill(mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }
    pub fn finish(self) -> i32 {
        drop(self.stdin);
        let mut child = self.child;
        child.wait().unwrap().code().unwrap()
    }
}
