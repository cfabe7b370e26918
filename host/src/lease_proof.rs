//! Who holds a turn lease, in a form another writer can check, and the
//! probe that checks it.
//!
//! A writer records, with each lease it takes, its name and a proof of the
//! process behind it: the kernel's boot id, its pid namespace, its pid and
//! the start time of that process (`/proc/<pid>/stat`, field 22, clock
//! ticks since boot). On PostgreSQL it adds its server backend (its
//! `pg_backend_pid()` and that backend's `backend_start`). All of it goes
//! in the `lease_holder` column as one JSON object
//! (`{"name", "boot", "pidns", "pid", "start", "backend_pid",
//! "backend_start"}`); a plain string there is an older writer's name,
//! with nothing to check.
//!
//! Another writer that meets the lease probes the proof (this module, the
//! effect) and asks the policy whether the lease ends
//! ([`turnsafe_policy::lease_verdict`]); it never decides here.

use std::sync::OnceLock;

use serde::{Deserialize, Serialize};
use turnsafe_policy::{HolderPlace, LeaseHolder, LeaseProbe, LeaseVerdict, LocalProbe, ServerProbe, lease_verdict};

/// What a lease's holder recorded of itself.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Proof {
    /// The name the writer gave (`--holder`; `pid-<pid>` by default).
    pub name: String,
    /// `/proc/sys/kernel/random/boot_id`: a new one at every boot.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub boot: Option<String>,
    /// `/proc/self/ns/pid`'s link (`pid:[4026531836]`): a pid means the
    /// same process only inside one pid namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pidns: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid: Option<u32>,
    /// The process's start time, in clock ticks since boot.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start: Option<u64>,
    /// PostgreSQL: the server backend of the connection that wrote the lease.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backend_pid: Option<i32>,
    /// PostgreSQL: that backend's `backend_start`, in microseconds since
    /// the Unix epoch (a number, so no session's time zone or date style
    /// changes how it reads).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backend_start: Option<i64>,
}

/// This machine and this process, read once.
#[derive(Debug, Clone, Default)]
struct Me {
    boot: Option<String>,
    pidns: Option<String>,
    pid: u32,
    start: Option<u64>,
}

fn me() -> &'static Me {
    static ME: OnceLock<Me> = OnceLock::new();
    ME.get_or_init(|| {
        let pid = std::process::id();
        Me {
            boot: std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
                .ok()
                .map(|s| s.trim().to_string())
                .filter(|s| !s.is_empty()),
            pidns: std::fs::read_link("/proc/self/ns/pid")
                .ok()
                .map(|p| p.to_string_lossy().into_owned()),
            pid,
            start: match read_stat(pid) {
                Ok(Some(stat)) => Some(stat.start),
                _ => None,
            },
        }
    })
}

impl Proof {
    /// The proof this process writes with its leases, under `name`.
    pub fn mine(name: &str) -> Proof {
        let me = me();
        Proof {
            name: name.to_string(),
            boot: me.boot.clone(),
            pidns: me.pidns.clone(),
            pid: Some(me.pid),
            start: me.start,
            backend_pid: None,
            backend_start: None,
        }
    }

    /// What goes in `lease_holder`.
    pub fn to_text(&self) -> String {
        // A struct of strings and integers always serializes.
        serde_json::to_string(self).unwrap_or_else(|_| self.name.clone())
    }

    /// A `lease_holder` as stored: a proof, or an older writer's bare name.
    pub fn read(stored: Option<&str>) -> Proof {
        let text = stored.unwrap_or_default();
        if text.starts_with('{')
            && let Ok(proof) = crate::json_in::typed::<Proof>(text)
        {
            return proof;
        }
        Proof {
            name: text.to_string(),
            ..Proof::default()
        }
    }

    /// Whether it was recorded on this machine, in this pid namespace:
    /// `None` when either side's identity is unknown.
    fn here(&self) -> Option<bool> {
        let me = me();
        let (boot, pidns) = (self.boot.as_ref()?, self.pidns.as_ref()?);
        Some(Some(boot) == me.boot.as_ref() && Some(pidns) == me.pidns.as_ref())
    }

    /// What the holder's process is now, seen from here.
    pub fn probe_local(&self) -> LocalProbe {
        let (Some(pid), Some(here)) = (self.pid, self.here()) else {
            return LocalProbe::Unrecorded;
        };
        if !here {
            return LocalProbe::OtherMachine;
        }
        match read_stat(pid) {
            Ok(None) => LocalProbe::Exited,
            Err(_) => LocalProbe::Unreadable,
            // A zombie (or a dead task) writes nothing more.
            Ok(Some(stat)) if matches!(stat.state, 'Z' | 'X' | 'x') => LocalProbe::Exited,
            Ok(Some(stat)) => match self.start {
                Some(start) if start == stat.start => LocalProbe::Running,
                Some(_) => LocalProbe::PidReused,
                None => LocalProbe::Unreadable,
            },
        }
    }

    /// The holder as the copy names it.
    pub fn holder(&self, expires_ms: Option<i64>) -> LeaseHolder {
        LeaseHolder {
            name: self.name.clone(),
            place: match self.here() {
                Some(true) => HolderPlace::ThisMachine,
                Some(false) => HolderPlace::OtherMachine,
                None => HolderPlace::Unknown,
            },
            pid: self.pid.filter(|p| *p > 0),
            backend_pid: self.backend_pid.and_then(|p| u32::try_from(p).ok()).filter(|p| *p > 0),
            expires_ms,
        }
    }
}

/// What a writer does about a session's lease that it does not hold.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Judged {
    /// It takes the lease: nobody holds it, or it expired, or the policy
    /// found its holder gone (`verdict` says which).
    Take(LeaseVerdict),
    /// It is fenced by the holder the copy names.
    Fenced(Box<LeaseHolder>),
}

/// Ask the policy about a lease another holder may have: `stored` is the
/// session's `lease_holder`, `expires_ms` its expiry when a token is set
/// (`None` when no lease is held), `server` what the host's server probe
/// found of the holder's backend.
pub fn judge(session: &str, stored: Option<&str>, expires_ms: Option<i64>, now_ms: i64, server: ServerProbe) -> Judged {
    let proof = Proof::read(stored);
    let probe = LeaseProbe {
        now_ms,
        expires_ms,
        local: proof.probe_local(),
        server,
    };
    let verdict = lease_verdict(&probe);
    match verdict {
        LeaseVerdict::Stands => Judged::Fenced(Box::new(proof.holder(expires_ms))),
        LeaseVerdict::Free => Judged::Take(verdict),
        _ => {
            tracing::warn!(
                session,
                old_holder = %proof.name,
                old_pid = ?proof.pid,
                old_backend_pid = ?proof.backend_pid,
                expires_ms = ?expires_ms,
                verdict = verdict.label(),
                "took over the turn lease of a holder that is gone"
            );
            Judged::Take(verdict)
        }
    }
}

/// The fields of `/proc/<pid>/stat` a probe reads.
struct Stat {
    state: char,
    start: u64,
}

/// `Ok(None)` when no process has `pid`.
fn read_stat(pid: u32) -> std::io::Result<Option<Stat>> {
    let text = match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    parse_stat(&text)
        .map(Some)
        .ok_or_else(|| std::io::Error::new(std::io::ErrorKind::InvalidData, "unreadable /proc stat line"))
}

/// The state and start time of a `stat` line. The command name (field 2)
/// is in parentheses and may hold spaces and parentheses itself, so the
/// fields are counted from the last `)`.
fn parse_stat(text: &str) -> Option<Stat> {
    let rest = text.get(text.rfind(')')? + 1..)?;
    let mut fields = rest.split_ascii_whitespace();
    // Field 3 is the state; field 22, the 20th after the name, the start time.
    let state = fields.next()?.chars().next()?;
    let start = fields.nth(18)?.parse().ok()?;
    Some(Stat { state, start })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stat_line_is_read_past_a_name_with_spaces_and_parentheses() {
        let line = "4242 (a (b) c) S 1 4242 4242 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 987654 1000 10";
        let stat = parse_stat(line).unwrap();
        assert_eq!((stat.state, stat.start), ('S', 987_654));
        assert!(parse_stat("4242 (x) S 1").is_none());
        assert!(parse_stat("no parenthesis").is_none());
    }

    #[test]
    fn this_process_is_running_and_its_proof_reads_back() {
        let proof = Proof::mine("worker-7");
        assert_eq!(Proof::read(Some(&proof.to_text())), proof);
        assert_eq!(proof.probe_local(), LocalProbe::Running);
        assert_eq!(proof.holder(Some(5)).place, HolderPlace::ThisMachine);
    }

    #[test]
    fn an_older_writers_name_is_a_name_with_nothing_to_check() {
        let proof = Proof::read(Some("pid-42"));
        assert_eq!(proof.name, "pid-42");
        assert_eq!(proof.probe_local(), LocalProbe::Unrecorded);
        assert_eq!(Proof::read(Some("{not json")).name, "{not json");
        assert_eq!(Proof::read(None).probe_local(), LocalProbe::Unrecorded);
    }

    #[test]
    fn another_boot_or_pid_namespace_is_another_machine() {
        let mut proof = Proof::mine("w");
        proof.boot = Some("00000000-0000-0000-0000-000000000000".into());
        assert_eq!(proof.probe_local(), LocalProbe::OtherMachine);
        let mut proof = Proof::mine("w");
        proof.pidns = Some("pid:[1]".into());
        assert_eq!(proof.probe_local(), LocalProbe::OtherMachine);
    }

    #[test]
    fn a_reaped_child_has_exited_and_a_live_pid_with_another_start_was_reused() {
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        child.wait().unwrap();
        let proof = Proof {
            pid: Some(pid),
            start: Some(1),
            ..Proof::mine("w")
        };
        assert_eq!(proof.probe_local(), LocalProbe::Exited);
        // Our own pid, with a start time that is not ours.
        let mut reused = Proof::mine("w");
        reused.start = reused.start.map(|s| s + 1);
        assert_eq!(reused.probe_local(), LocalProbe::PidReused);
    }

    #[test]
    fn a_zombie_has_exited() {
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        // Unreaped: a zombie once it ends. Wait for that state, not for time.
        let start = loop {
            match read_stat(pid).unwrap() {
                Some(stat) if stat.state == 'Z' => break stat.start,
                Some(_) => std::thread::yield_now(),
                None => panic!("an unreaped child left /proc"),
            }
        };
        let proof = Proof {
            pid: Some(pid),
            start: Some(start),
            ..Proof::mine("w")
        };
        assert_eq!(proof.probe_local(), LocalProbe::Exited);
        child.wait().unwrap();
    }
}
