//! Capture folders under a home, and whether each is settled.
//!
//! A capture (`state.db.retired-<UTC>-<pid>/`, written by
//! [`crate::capture`]) holds rows of a retired generation that may exist
//! nowhere else. It is *pending* until an operator settles it, by
//! installing a database rebuilt from it (`recover --install`) or by
//! dismissing it (`recover --dismiss`). Settling writes [`MARKER`] into the
//! folder. While a capture is pending, replay refuses and doctor reports an
//! error: diverted lines imported into a database that lacks the captured
//! rows would leave holes in the transcripts.

use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};

use crate::stamps::Stamp;

/// Name prefix of capture folders, next to `state.db`.
pub const PREFIX: &str = "state.db.retired-";
/// The settled marker's file name inside a capture folder.
pub const MARKER: &str = "SETTLED";
/// Version of the marker's format.
pub const MARKER_FORMAT: u32 = 1;

/// How a capture was settled.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum How {
    /// A database rebuilt from it was installed.
    Installed,
    /// The operator decided its frames do not matter.
    Dismissed,
}

impl How {
    pub fn label(self) -> &'static str {
        match self {
            How::Installed => "installed",
            How::Dismissed => "dismissed",
        }
    }
}

/// The content of `SETTLED`.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Settled {
    pub format: u32,
    /// UTC, RFC 3339 with milliseconds.
    pub settled_at: String,
    pub how: How,
    /// Rows of the replaced `state.db` copied into the installed database
    /// because the capture lacked them (0 when dismissed).
    pub carried_over: u64,
    /// The same rows counted per session.
    #[serde(default)]
    pub carried_over_by_session: BTreeMap<String, u64>,
    /// Where the rebuilt database was installed (install only).
    #[serde(default)]
    pub installed: Option<String>,
    /// The process that settled it.
    pub pid: u32,
    pub turnsafe: String,
}

impl Settled {
    /// A marker stamped now by this process.
    pub fn now(how: How) -> Settled {
        Settled {
            format: MARKER_FORMAT,
            settled_at: humantime::format_rfc3339_millis(std::time::SystemTime::now()).to_string(),
            how,
            carried_over: 0,
            carried_over_by_session: BTreeMap::new(),
            installed: None,
            pid: std::process::id(),
            turnsafe: env!("CARGO_PKG_VERSION").to_string(),
        }
    }
}

/// Where a capture stands.
#[derive(Debug, Clone, PartialEq)]
pub enum Status {
    /// No marker: its rows are in no database yet.
    Pending,
    Settled(Settled),
    /// A marker that cannot be read is no proof: treated as pending.
    Unreadable(String),
}

impl Status {
    pub fn is_settled(&self) -> bool {
        matches!(self, Status::Settled(_))
    }
}

/// One capture folder under a home.
#[derive(Debug, Clone)]
pub struct CaptureFolder {
    pub name: String,
    pub path: PathBuf,
    pub status: Status,
}

impl CaptureFolder {
    /// What its manifest says of it, or why that cannot be read.
    pub fn manifest(&self) -> Result<Manifest, String> {
        manifest(&self.path)
    }
}

/// What a capture's `manifest.json` says of why it was made and what it
/// holds. Fields an earlier turnsafe did not write are absent.
#[derive(Debug, Clone, Default, PartialEq, serde::Deserialize)]
pub struct Manifest {
    #[serde(default)]
    pub trigger: String,
    /// The policy's cause label.
    #[serde(default)]
    pub cause: Option<String>,
    #[serde(default)]
    pub evidence: Vec<String>,
    /// The process that made it, and when that process started.
    #[serde(default)]
    pub pid: Option<u32>,
    #[serde(default)]
    pub pid_start: Option<u64>,
    /// Rows of the captured generation the database at the path lacked
    /// when it was made, by session; absent when that could not be known.
    #[serde(default)]
    pub missing_rows: Option<BTreeMap<String, u64>>,
    #[serde(default)]
    pub missing_rows_error: Option<String>,
}

impl Manifest {
    /// The cause it records; `unknown` for a manifest that records none,
    /// or one no capture is made for (a capture is made for a sticky
    /// cause: `replaced`, `deleted_wal`, `corrupt`). The manifest is read
    /// from disk, and the cause shapes the copy of every batch it holds
    /// back: `outcome_unknown` there would tell of a lost COMMIT that
    /// never happened.
    pub fn cause(&self) -> turnsafe_policy::Cause {
        self.cause
            .as_deref()
            .and_then(turnsafe_policy::Cause::from_label)
            .filter(|c| turnsafe_policy::is_sticky(*c))
            .unwrap_or(turnsafe_policy::Cause::Unknown)
    }
}

/// Read `capture/manifest.json`.
pub fn manifest(capture: &Path) -> Result<Manifest, String> {
    let bytes = std::fs::read(capture.join("manifest.json")).map_err(|e| format!("manifest.json: {e}"))?;
    crate::json_in::typed_bytes(&bytes).map_err(|e| format!("manifest.json is not a capture manifest: {e}"))
}

/// An unsettled capture that holds rows some sessions' history lacks.
/// While it is pending, no writer commits a batch of those sessions, and
/// no read presents their transcripts as complete.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Hold {
    /// The capture folder's absolute path.
    pub path: String,
    /// The cause its manifest records (`unknown` when it records none).
    #[serde(serialize_with = "cause_label")]
    pub cause: turnsafe_policy::Cause,
    /// The rows it holds that the database lacks, by session; `None` when
    /// that is not known (an unreadable manifest, a capture an earlier
    /// turnsafe made, one whose comparison failed): then it holds every
    /// session.
    pub sessions: Option<BTreeMap<String, u64>>,
}

fn cause_label<S: serde::Serializer>(c: &turnsafe_policy::Cause, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(c.label())
}

impl Hold {
    /// Whether it holds rows of `session`.
    pub fn holds(&self, session: &str) -> bool {
        match &self.sessions {
            None => true,
            Some(by) => by.get(session).is_some_and(|n| *n > 0),
        }
    }

    /// The hold as `show`, `search` and Python report it: `{path, cause,
    /// rows}`, `rows` being this session's count (null when unknown).
    pub fn to_value(&self, session: Option<&str>) -> serde_json::Value {
        let rows = match (&self.sessions, session) {
            (Some(by), Some(s)) => serde_json::json!(by.get(s).copied().unwrap_or(0)),
            (Some(by), None) => serde_json::json!(by.values().sum::<u64>()),
            (None, _) => serde_json::Value::Null,
        };
        serde_json::json!({ "path": self.path, "cause": self.cause.label(), "rows": rows })
    }
}

/// The unsettled captures under `home` that hold rows of some session: a
/// capture that holds nothing new (a checkpoint had already moved every
/// row into the main file) stops nothing.
pub fn holds(home: &Path) -> io::Result<Vec<Hold>> {
    let mut out = Vec::new();
    for c in pending(home)? {
        let path = std::path::absolute(&c.path).unwrap_or(c.path.clone());
        let (cause, sessions) = match c.manifest() {
            Ok(m) => (m.cause(), m.missing_rows.clone()),
            Err(_) => (turnsafe_policy::Cause::Unknown, None),
        };
        let hold = Hold {
            path: path.to_string_lossy().into_owned(),
            cause,
            sessions: sessions.map(|by| by.into_iter().filter(|(_, n)| *n > 0).collect()),
        };
        if hold.sessions.as_ref().is_none_or(|by| !by.is_empty()) {
            out.push(hold);
        }
    }
    Ok(out)
}

/// [`holds`], read again only when the home or one of its capture
/// folders changed since the last read ([`crate::stamps`]). A capture
/// appears in, or leaves, the home by a rename or a new folder, and its
/// manifest and marker each arrive by a rename into its folder: every one
/// moves a stamp watched here. With no capture in the home, a commit pays
/// one `statx` of the home instead of a listing.
#[derive(Debug)]
pub struct HoldsWatch {
    /// Learned from the home's filesystem at the first look that finds it,
    /// unless given.
    racy: Option<std::time::Duration>,
    seen: Option<Seen>,
    reads: u64,
}

#[derive(Debug)]
struct Seen {
    home: Stamp,
    folders: Vec<(PathBuf, Stamp)>,
    holds: Vec<Hold>,
}

impl Default for HoldsWatch {
    /// A watch whose racy window is the one of the home's filesystem
    /// ([`crate::stamps::racy_for`]).
    fn default() -> Self {
        HoldsWatch {
            racy: None,
            seen: None,
            reads: 0,
        }
    }
}

impl HoldsWatch {
    /// A watch that trusts a stamp only once it is `racy` old.
    pub fn with_racy(racy: std::time::Duration) -> HoldsWatch {
        HoldsWatch {
            racy: Some(racy),
            ..HoldsWatch::default()
        }
    }

    /// How many times the home was read in full.
    pub fn reads(&self) -> u64 {
        self.reads
    }

    /// The unsettled captures under `home` that hold rows, as [`holds`].
    pub fn holds(&mut self, home: &Path) -> io::Result<Vec<Hold>> {
        let read_at = std::time::SystemTime::now();
        let Some(home_stamp) = Stamp::at(home)? else {
            self.seen = None;
            return Ok(Vec::new());
        };
        if let Some(seen) = &self.seen
            && seen.home == home_stamp
            && seen
                .folders
                .iter()
                .all(|(path, stamp)| Stamp::at(path).ok().flatten() == Some(*stamp))
        {
            return Ok(seen.holds.clone());
        }
        self.seen = None;
        self.reads += 1;
        // Each stamp is read before what it stands for, so a change made
        // during the read moves a stamp the next look compares.
        let mut folders = Vec::new();
        for entry in std::fs::read_dir(home)? {
            let entry = entry?;
            if entry.file_name().to_string_lossy().starts_with(PREFIX) && entry.file_type()?.is_dir() {
                let path = entry.path();
                if let Some(stamp) = Stamp::at(&path)? {
                    folders.push((path, stamp));
                }
            }
        }
        let found = holds(home)?;
        let racy = *self.racy.get_or_insert_with(|| crate::stamps::racy_for(home));
        let settled = |s: &Stamp| s.settled_at(read_at, racy);
        if settled(&home_stamp) && folders.iter().all(|(_, s)| settled(s)) {
            self.seen = Some(Seen {
                home: home_stamp,
                folders,
                holds: found.clone(),
            });
        }
        Ok(found)
    }
}

/// The holds among `holds` that hold `session`.
pub fn holding<'a>(holds: &'a [Hold], session: &str) -> Vec<&'a Hold> {
    holds.iter().filter(|h| h.holds(session)).collect()
}

/// The capture folders directly under `home`, sorted by name (their names
/// start with the UTC time, so oldest first). A missing home has none.
pub fn list(home: &Path) -> io::Result<Vec<CaptureFolder>> {
    let rd = match std::fs::read_dir(home) {
        Ok(rd) => rd,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let mut out = Vec::new();
    for entry in rd {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().into_owned();
        // Only real folders: a symlink named like a capture was not made here.
        if !name.starts_with(PREFIX) || !entry.file_type()?.is_dir() {
            continue;
        }
        let path = entry.path();
        out.push(CaptureFolder {
            status: status(&path),
            name,
            path,
        });
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(out)
}

/// The capture folders under `home` that are not settled.
pub fn pending(home: &Path) -> io::Result<Vec<CaptureFolder>> {
    Ok(list(home)?.into_iter().filter(|c| !c.status.is_settled()).collect())
}

/// Read a capture folder's marker.
pub fn status(capture: &Path) -> Status {
    match std::fs::read(capture.join(MARKER)) {
        Ok(bytes) => match crate::json_in::typed_bytes::<Settled>(&bytes) {
            Ok(s) => Status::Settled(s),
            Err(e) => Status::Unreadable(format!("{MARKER} is not a settled marker: {e}")),
        },
        Err(e) if e.kind() == io::ErrorKind::NotFound => Status::Pending,
        Err(e) => Status::Unreadable(format!("{MARKER}: {e}")),
    }
}

/// Write the marker into `capture` (temporary name, fsync, rename, fsync
/// the folder) and return its path.
pub fn settle(capture: &Path, marker: &Settled) -> io::Result<PathBuf> {
    let path = capture.join(MARKER);
    let text = serde_json::to_vec_pretty(marker).map_err(io::Error::other)?;
    crate::durable::write_file(&path, &text)?;
    Ok(path)
}

/// Whether `dir` looks like a capture folder: named like one, or holding
/// a capture manifest (a capture copied elsewhere may be renamed).
pub fn is_capture(dir: &Path) -> bool {
    let named = dir.file_name().is_some_and(|n| n.to_string_lossy().starts_with(PREFIX));
    dir.is_dir() && (named || dir.join("manifest.json").is_file())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_capture_is_pending_until_its_marker_is_written() {
        let home = tempfile::tempdir().unwrap();
        let cap = home.path().join(format!("{PREFIX}20250101T000000Z-1"));
        std::fs::create_dir(&cap).unwrap();
        // Neither a file nor a symlink named like a capture counts.
        std::fs::write(home.path().join(format!("{PREFIX}file")), b"").unwrap();
        std::os::unix::fs::symlink(&cap, home.path().join(format!("{PREFIX}link"))).unwrap();
        let found = list(home.path()).unwrap();
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].status, Status::Pending);
        assert_eq!(pending(home.path()).unwrap().len(), 1);

        let mut marker = Settled::now(How::Dismissed);
        marker.carried_over = 0;
        settle(&cap, &marker).unwrap();
        assert_eq!(status(&cap), Status::Settled(marker));
        assert!(pending(home.path()).unwrap().is_empty());
    }

    #[test]
    fn an_unreadable_marker_is_no_proof() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(MARKER), b"{\"how\":\"installed\"").unwrap();
        assert!(matches!(status(dir.path()), Status::Unreadable(_)));
    }

    /// A pending capture folder holding `rows` of session `s1`, its
    /// manifest renamed into it as a capture writes it.
    fn pending_capture(home: &Path, name: &str, rows: u64) -> PathBuf {
        let cap = home.join(format!("{PREFIX}{name}"));
        std::fs::create_dir(&cap).unwrap();
        let manifest = serde_json::json!({"trigger": "test", "missing_rows": {"s1": rows}});
        crate::durable::write_file(&cap.join("manifest.json"), manifest.to_string().as_bytes()).unwrap();
        cap
    }

    /// Past a coarse clock's tick and the shortened racy window below.
    fn age() {
        std::thread::sleep(std::time::Duration::from_millis(120));
    }

    #[test]
    fn the_watch_reads_the_home_again_only_when_it_or_a_capture_changed() {
        let home = tempfile::tempdir().unwrap();
        let mut watch = HoldsWatch::with_racy(std::time::Duration::from_millis(50));
        age();
        assert!(watch.holds(home.path()).unwrap().is_empty());
        assert!(watch.holds(home.path()).unwrap().is_empty());
        assert_eq!(watch.reads(), 1, "an unchanged home is not read again");
        // Another file in the home changes nothing it watches for, but the
        // home's stamp moved: read again.
        std::fs::write(home.path().join("unrelated"), b"").unwrap();
        assert!(watch.holds(home.path()).unwrap().is_empty());
        assert_eq!(watch.reads(), 2);

        // A capture appears: seen at once, while its stamps are young.
        let cap = pending_capture(home.path(), "20250101T000000Z-1", 3);
        let held = watch.holds(home.path()).unwrap();
        assert_eq!(held.len(), 1);
        assert!(held[0].holds("s1"));
        assert_eq!(watch.holds(home.path()).unwrap(), held);
        assert_eq!(watch.reads(), 4, "young stamps prove nothing: read each time");
        age();
        assert_eq!(watch.holds(home.path()).unwrap(), held);
        assert_eq!(watch.holds(home.path()).unwrap(), held);
        assert_eq!(watch.reads(), 5);

        // Settled: its marker arrives by a rename into the folder.
        settle(&cap, &Settled::now(How::Dismissed)).unwrap();
        assert!(watch.holds(home.path()).unwrap().is_empty());
        age();
        assert!(watch.holds(home.path()).unwrap().is_empty());
        let reads = watch.reads();
        // A marker taken away makes the capture pending again.
        std::fs::remove_file(cap.join(MARKER)).unwrap();
        assert_eq!(watch.holds(home.path()).unwrap(), held);
        assert_eq!(watch.reads(), reads + 1);
    }

    #[test]
    fn a_capture_made_in_the_same_tick_as_a_look_is_seen() {
        // The real window (the home's filesystem's): a stamp read just now
        // proves nothing, however coarse the filesystem's clock.
        let home = tempfile::tempdir().unwrap();
        let mut watch = HoldsWatch::default();
        for k in 0..20 {
            assert_eq!(watch.holds(home.path()).unwrap().len(), k);
            pending_capture(home.path(), &format!("20250101T0000{k:02}Z-1"), 1);
        }
        assert_eq!(watch.holds(home.path()).unwrap().len(), 20);
    }

    #[test]
    fn a_home_that_is_gone_or_replaced_is_read_again() {
        let parent = tempfile::tempdir().unwrap();
        let home = parent.path().join("home");
        std::fs::create_dir(&home).unwrap();
        let mut watch = HoldsWatch::with_racy(std::time::Duration::from_millis(50));
        age();
        assert!(watch.holds(&home).unwrap().is_empty());
        std::fs::remove_dir(&home).unwrap();
        assert!(watch.holds(&home).unwrap().is_empty());
        // Another folder at the path, already holding a capture.
        let other = parent.path().join("other");
        std::fs::create_dir(&other).unwrap();
        pending_capture(&other, "20250101T000000Z-1", 2);
        age();
        std::fs::rename(&other, &home).unwrap();
        assert_eq!(watch.holds(&home).unwrap().len(), 1);
    }

    #[test]
    fn a_missing_home_has_no_captures() {
        let dir = tempfile::tempdir().unwrap();
        assert!(list(&dir.path().join("absent")).unwrap().is_empty());
    }
}
