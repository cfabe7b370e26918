//! Turn leases: whether a writer may take over a session's turn lease that
//! another holder has, and how the copy names that holder.
//!
//! A lease is a claim about a process. While its holder may be alive, a
//! second writer is fenced: two writers interleaving one transcript is the
//! worst outcome a store can have. But a holder that died (an OOM kill, a
//! SIGKILL at deploy) fences its sessions for nothing until the lease's
//! expiry, and the copy would send the user to wait for a process that no
//! longer exists. So a lease ends early on **evidence** that its holder is
//! gone, never on a guess:
//! - on the holder's own machine (same boot id and pid namespace), its pid
//!   runs no process, or runs one with another start time (the pid was
//!   reused);
//! - or the holder's PostgreSQL backend is gone from the server.
//!
//! Anything less (another machine, a live process, `/proc` unreadable, a
//! server that cannot be asked, a lease an older writer recorded no proof
//! for) leaves the lease standing until it expires, as before.

#[allow(unused_imports)]
use crate::prelude::*;
use crate::text::{cat, signed, unsigned};
use serde::{Deserialize, Serialize};

/// What the host's probe found of the holder's process, from the proof the
/// holder recorded with its lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LocalProbe {
    /// The lease records no process (an older writer, or a writer whose
    /// own identity could not be read).
    Unrecorded,
    /// The holder ran on another machine, or in another pid namespace:
    /// its pid means nothing here.
    OtherMachine,
    /// Its pid runs the process that took the lease (same start time).
    Running,
    /// Its pid runs no process (or only a zombie, which writes nothing).
    Exited,
    /// Its pid runs a process with another start time: the holder exited
    /// and the pid was given to another process.
    PidReused,
    /// The holder ran here, but its process could not be read.
    Unreadable,
}

impl LocalProbe {
    pub const ALL: [LocalProbe; 6] = [
        LocalProbe::Unrecorded,
        LocalProbe::OtherMachine,
        LocalProbe::Running,
        LocalProbe::Exited,
        LocalProbe::PidReused,
        LocalProbe::Unreadable,
    ];
    const LABELS: [&'static str; 6] = [
        "unrecorded",
        "other_machine",
        "running",
        "exited",
        "pid_reused",
        "unreadable",
    ];

    pub fn label(self) -> &'static str {
        Self::LABELS[self as usize]
    }

    pub fn from_label(s: &str) -> Option<LocalProbe> {
        Self::ALL.get(crate::text::position(&Self::LABELS, s)).copied()
    }
}

/// What the host's probe found of the holder's database-server backend
/// (PostgreSQL: `pg_backend_pid()` and its `backend_start`, looked up in
/// `pg_stat_activity`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ServerProbe {
    /// No backend recorded (SQLite, or an older writer).
    Unrecorded,
    /// The backend is connected, with the start time recorded.
    Alive,
    /// No backend with that pid and start time is connected.
    Gone,
    /// The server could not be asked, or would not say.
    Unknown,
}

impl ServerProbe {
    pub const ALL: [ServerProbe; 4] = [
        ServerProbe::Unrecorded,
        ServerProbe::Alive,
        ServerProbe::Gone,
        ServerProbe::Unknown,
    ];
    const LABELS: [&'static str; 4] = ["unrecorded", "alive", "gone", "unknown"];

    pub fn label(self) -> &'static str {
        Self::LABELS[self as usize]
    }

    pub fn from_label(s: &str) -> Option<ServerProbe> {
        Self::ALL.get(crate::text::position(&Self::LABELS, s)).copied()
    }
}

/// Everything the decision rests on: the lease's expiry against the
/// host's clock, and what the probes found of its holder. Only a lease
/// another holder has is asked about: one's own lease is renewed, and a
/// lease taken from under one's own token is fenced whatever this says.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LeaseProbe {
    /// The host's wall clock, in milliseconds since the Unix epoch.
    pub now_ms: i64,
    /// When the lease ends unless renewed; `None` when no lease is held.
    pub expires_ms: Option<i64>,
    pub local: LocalProbe,
    pub server: ServerProbe,
}

/// Whether the writer takes the lease, and on what.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LeaseVerdict {
    /// Nobody holds it, or it expired: take it.
    Free,
    /// Its holder's process exited: take it over.
    HolderExited,
    /// Its holder's pid runs another process now: take it over.
    PidReused,
    /// Its holder's server backend is gone: take it over.
    BackendGone,
    /// Its holder may be alive: the writer is fenced.
    Stands,
}

impl LeaseVerdict {
    pub const ALL: [LeaseVerdict; 5] = [
        LeaseVerdict::Free,
        LeaseVerdict::HolderExited,
        LeaseVerdict::PidReused,
        LeaseVerdict::BackendGone,
        LeaseVerdict::Stands,
    ];
    const LABELS: [&'static str; 5] = ["free", "holder_exited", "pid_reused", "backend_gone", "stands"];

    pub fn label(self) -> &'static str {
        Self::LABELS[self as usize]
    }

    pub fn from_label(s: &str) -> Option<LeaseVerdict> {
        Self::ALL.get(crate::text::position(&Self::LABELS, s)).copied()
    }

    /// Whether the writer takes the lease (every verdict but [`LeaseVerdict::Stands`]).
    pub fn takes_over(self) -> bool {
        self != LeaseVerdict::Stands
    }
}

/// Whether a writer may take a lease another holder has.
///
/// In order: an expired lease is free. A process proven alive on this
/// machine keeps its lease even if its server connection is gone (it will
/// reconnect and renew; a takeover would fence a live writer). Then a
/// proven exit or pid reuse, then a proven-gone backend, ends it. Nothing
/// else does.
pub fn lease_verdict(probe: &LeaseProbe) -> LeaseVerdict {
    match probe.expires_ms {
        None => return LeaseVerdict::Free,
        Some(e) if e <= probe.now_ms => return LeaseVerdict::Free,
        Some(_) => {}
    }
    match probe.local {
        LocalProbe::Running => LeaseVerdict::Stands,
        LocalProbe::Exited => LeaseVerdict::HolderExited,
        LocalProbe::PidReused => LeaseVerdict::PidReused,
        LocalProbe::Unrecorded | LocalProbe::OtherMachine | LocalProbe::Unreadable => match probe.server {
            ServerProbe::Gone => LeaseVerdict::BackendGone,
            ServerProbe::Unrecorded | ServerProbe::Alive | ServerProbe::Unknown => LeaseVerdict::Stands,
        },
    }
}

/// Where a lease's holder runs, as far as the host could tell.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HolderPlace {
    /// The same boot and pid namespace as the host that met the lease.
    ThisMachine,
    /// Another machine (or pid namespace).
    OtherMachine,
    /// The lease records nothing checkable.
    #[default]
    Unknown,
}

impl HolderPlace {
    pub const ALL: [HolderPlace; 3] = [
        HolderPlace::ThisMachine,
        HolderPlace::OtherMachine,
        HolderPlace::Unknown,
    ];
    const LABELS: [&'static str; 3] = ["this_machine", "other_machine", "unknown"];

    pub fn label(self) -> &'static str {
        Self::LABELS[self as usize]
    }

    pub fn from_label(s: &str) -> Option<HolderPlace> {
        Self::ALL.get(crate::text::position(&Self::LABELS, s)).copied()
    }
}

/// The holder of a lease that fenced a write, as the copy names it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct LeaseHolder {
    /// The name the holder wrote with its lease (`--holder`; `pid-<pid>` by default).
    pub name: String,
    pub place: HolderPlace,
    /// The holder's pid on its machine, when its lease records one.
    pub pid: Option<u32>,
    /// The holder's PostgreSQL backend pid, when its lease records one.
    pub backend_pid: Option<u32>,
    /// When the lease ends unless renewed, in milliseconds since the Unix epoch.
    pub expires_ms: Option<i64>,
}

impl LeaseHolder {
    /// Who holds the lease, in the copy's words: never more than the
    /// lease proves (no claim that the holder is working).
    pub(crate) fn who(&self) -> String {
        match (self.pid, self.place, self.backend_pid) {
            (Some(pid), HolderPlace::ThisMachine, _) => cat(&["pid ", &unsigned(u64::from(pid)), " on this machine"]),
            (Some(pid), HolderPlace::OtherMachine, _) => {
                cat(&["pid ", &unsigned(u64::from(pid)), " on another machine"])
            }
            (_, _, Some(backend)) => cat(&[
                "a process whose database-server connection is backend ",
                &unsigned(u64::from(backend)),
            ]),
            (_, HolderPlace::OtherMachine, None) => "a process on another machine".into(),
            _ => "another process".into(),
        }
    }

    /// The sentence that names the holder and the lease's end.
    pub(crate) fn reason(&self) -> String {
        let until = match self.expires_ms {
            Some(ms) => cat(&[" until ", &utc_clock(ms)]),
            None => String::new(),
        };
        cat(&["this conversation turn is held by ", &self.who(), &until])
    }

    /// What ends the lease, in words that claim only what the host can see.
    pub(crate) fn remedy(&self) -> String {
        let at = match self.expires_ms {
            Some(ms) => cat(&["at ", &utc_clock(ms)]),
            None => "when it expires".into(),
        };
        let again = " Send the messages again after that if they are still needed.";
        match (self.pid, self.place, self.backend_pid) {
            (Some(pid), HolderPlace::ThisMachine, _) => cat(&[
                "The lease ends when pid ",
                &unsigned(u64::from(pid)),
                " exits (the next write then takes the turn over at once), or ",
                &at,
                " unless that process renews it.",
                again,
            ]),
            (_, _, Some(_)) => cat(&[
                "The lease ends when that process's connection to the database server closes (the next write then \
                 takes the turn over at once), or ",
                &at,
                " unless it renews the lease.",
                again,
            ]),
            (_, HolderPlace::OtherMachine, None) => cat(&[
                "turnsafe cannot see processes on another machine: the lease ends ",
                &at,
                " unless its holder renews it. Stop that process on its machine, or wait.",
                again,
            ]),
            _ => cat(&[
                "The lease records no process turnsafe can check: the lease ends ",
                &at,
                " unless its holder renews it.",
                again,
            ]),
        }
    }

    /// The copy's details of the holder, in a fixed order.
    pub(crate) fn details(&self, add: &mut dyn FnMut(&str, &str)) {
        add("lease_holder", clip(&self.name));
        add("lease_place", self.place.label());
        if let Some(pid) = self.pid {
            add("lease_pid", &unsigned(u64::from(pid)));
        }
        if let Some(pid) = self.backend_pid {
            add("lease_backend_pid", &unsigned(u64::from(pid)));
        }
        if let Some(ms) = self.expires_ms {
            add("lease_expires", &utc_stamp(ms));
        }
    }
}

/// A holder's name as the copy shows it: at most 64 characters, control
/// characters as `?` (it is whatever a writer stored).
fn clip(name: &str) -> &str {
    let mut chars = 0;
    for (i, b) in name.bytes().enumerate() {
        if b & 0xC0 != 0x80 {
            if chars == 64 || b < 0x20 || b == 0x7F {
                return name.get(..i).unwrap_or("");
            }
            chars += 1;
        }
    }
    name
}

/// Days since 1970-01-01 as a proleptic Gregorian (year, month, day)
/// (H. Hinnant's `civil_from_days`): total for every `i64` of days a
/// millisecond clock can give.
fn civil(days: i64) -> (i64, i64, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    (yoe + era * 400 + i64::from(month <= 2), month, day)
}

fn two(n: i64) -> String {
    let digits = signed(n);
    if (0..10).contains(&n) {
        cat(&["0", &digits])
    } else {
        digits
    }
}

/// `HH:MM:SS` of the day, for a lease that ends within the hour it is read in.
fn clock(secs: i64) -> String {
    let of_day = secs.rem_euclid(86_400);
    cat(&[&two(of_day / 3600), ":", &two(of_day / 60 % 60), ":", &two(of_day % 60)])
}

/// `12:00:31 UTC` for a time in milliseconds since the Unix epoch.
pub(crate) fn utc_clock(ms: i64) -> String {
    cat(&[&clock(ms.div_euclid(1000)), " UTC"])
}

/// `2026-12-07T12:00:31Z` for a time in milliseconds since the Unix epoch.
pub(crate) fn utc_stamp(ms: i64) -> String {
    let secs = ms.div_euclid(1000);
    let (y, m, d) = civil(secs.div_euclid(86_400));
    let year = signed(y);
    let pad = "000".get(..4usize.saturating_sub(year.len())).unwrap_or("");
    cat(&[pad, &year, "-", &two(m), "-", &two(d), "T", &clock(secs), "Z"])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn probe(expires: Option<i64>, local: LocalProbe, server: ServerProbe) -> LeaseProbe {
        LeaseProbe {
            now_ms: 1_000,
            expires_ms: expires,
            local,
            server,
        }
    }

    #[test]
    fn a_live_lease_ends_only_on_evidence() {
        use LeaseVerdict::*;
        for local in LocalProbe::ALL {
            for server in ServerProbe::ALL {
                let v = lease_verdict(&probe(Some(2_000), local, server));
                let expected = match (local, server) {
                    (LocalProbe::Running, _) => Stands,
                    (LocalProbe::Exited, _) => HolderExited,
                    (LocalProbe::PidReused, _) => PidReused,
                    (_, ServerProbe::Gone) => BackendGone,
                    _ => Stands,
                };
                assert_eq!(v, expected, "{local:?} {server:?}");
                // Expired or absent, any lease is free.
                assert_eq!(lease_verdict(&probe(Some(1_000), local, server)), Free);
                assert_eq!(lease_verdict(&probe(None, local, server)), Free);
            }
        }
    }

    #[test]
    fn labels_read_back() {
        for x in LocalProbe::ALL {
            assert_eq!(LocalProbe::from_label(x.label()), Some(x));
        }
        for x in ServerProbe::ALL {
            assert_eq!(ServerProbe::from_label(x.label()), Some(x));
        }
        for x in LeaseVerdict::ALL {
            assert_eq!(LeaseVerdict::from_label(x.label()), Some(x));
        }
        for x in HolderPlace::ALL {
            assert_eq!(HolderPlace::from_label(x.label()), Some(x));
        }
        assert_eq!(LocalProbe::from_label("nope"), None);
    }

    #[test]
    fn times_are_written_in_utc() {
        // 2026-12-07T12:00:31Z
        let ms = 1_796_644_831_000;
        assert_eq!(utc_stamp(ms), "2026-12-07T12:00:31Z");
        assert_eq!(utc_clock(ms + 999), "12:00:31 UTC");
        assert_eq!(utc_stamp(0), "1970-01-01T00:00:00Z");
        assert_eq!(utc_stamp(-1), "1969-12-31T23:59:59Z");
        assert_eq!(utc_stamp(951_782_400_000), "2000-02-29T00:00:00Z");
        // Total on the extremes.
        let _ = utc_stamp(i64::MAX);
        let _ = utc_stamp(i64::MIN);
    }

    #[test]
    fn a_holder_name_is_clipped_at_a_control_character_and_64_characters() {
        assert_eq!(clip("worker\nrm -rf"), "worker");
        assert_eq!(clip(&"é".repeat(80)).chars().count(), 64);
        assert_eq!(clip("pid-42"), "pid-42");
    }
}
