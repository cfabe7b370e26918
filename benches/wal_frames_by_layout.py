"""WAL frames per commit of the `messages` layout, and of layouts it could
take, measured the same way: 600 commits of 10 messages of about 230 B
(the benches' batch) into one session, WAL, `synchronous=FULL`, no
checkpoint; frames per commit over the last 500, and which b-tree each
frame belongs to (read from the `dbstat` table through the `sqlite3`
command).

Each secondary index appended at its right edge costs SQLite about 1.6 to
2.5 frames a commit (the leaf is rebalanced with its siblings, and their
parent rewritten); the `content` projection about 0.9. What a layout
change would save is read here before its migration is written.

    python3 benches/wal_frames_by_layout.py   # env DIR (default a temporary folder)
"""

import collections
import itertools
import json
import os
import shutil
import sqlite3
import struct
import subprocess
import tempfile

DIR = os.environ.get("DIR") or tempfile.mkdtemp(prefix="wal-frames-")
COMMITS, SKIP = 600, 100

SESSIONS = """CREATE TABLE sessions(id TEXT PRIMARY KEY, created_ms INTEGER NOT NULL, lease_token TEXT,
    lease_holder TEXT, lease_expires_ms INTEGER, forked_from TEXT, forked_at_seq INTEGER) WITHOUT ROWID;"""

# name -> (the layout, its insert, the insert's parameters from (seq, uid, item, its JSON text))
LAYOUTS = {
    "now (schema v6)": (
        SESSIONS + """CREATE TABLE messages(id INTEGER PRIMARY KEY, session_id TEXT NOT NULL REFERENCES sessions(id),
            uid TEXT NOT NULL, seq INTEGER NOT NULL, role TEXT, content TEXT, item TEXT NOT NULL,
            created_ms INTEGER NOT NULL, UNIQUE(session_id, uid));
        CREATE INDEX messages_by_seq ON messages(session_id, seq);""",
        "INSERT INTO messages(session_id, uid, seq, role, content, item, created_ms) VALUES ('s1', ?, ?, ?, ?, ?, 0)",
        lambda seq, uid, m, text: (uid, seq, m["role"], m["content"], text),
    ),
    "without the content column": (
        SESSIONS + """CREATE TABLE messages(id INTEGER PRIMARY KEY, session_id TEXT NOT NULL REFERENCES sessions(id),
            uid TEXT NOT NULL, seq INTEGER NOT NULL, role TEXT, item TEXT NOT NULL, created_ms INTEGER NOT NULL,
            UNIQUE(session_id, uid));
        CREATE INDEX messages_by_seq ON messages(session_id, seq);""",
        "INSERT INTO messages(session_id, uid, seq, role, item, created_ms) VALUES ('s1', ?, ?, ?, ?, 0)",
        lambda seq, uid, m, text: (uid, seq, m["role"], text),
    ),
    "keyed by (session, seq), no rowid": (
        SESSIONS + """CREATE TABLE messages(session_id TEXT NOT NULL, seq INTEGER NOT NULL, uid TEXT NOT NULL,
            role TEXT, item TEXT NOT NULL, created_ms INTEGER NOT NULL, PRIMARY KEY(session_id, seq)) WITHOUT ROWID;
        CREATE UNIQUE INDEX messages_by_uid ON messages(session_id, uid);""",
        "INSERT INTO messages(session_id, seq, uid, role, item, created_ms) VALUES ('s1', ?, ?, ?, ?, 0)",
        lambda seq, uid, m, text: (seq, uid, m["role"], text),
    ),
    "no content, the uid index only": (
        SESSIONS + """CREATE TABLE messages(id INTEGER PRIMARY KEY, session_id TEXT NOT NULL, uid TEXT NOT NULL,
            seq INTEGER NOT NULL, role TEXT, item TEXT NOT NULL, created_ms INTEGER NOT NULL);
        CREATE UNIQUE INDEX messages_by_uid ON messages(session_id, uid);""",
        "INSERT INTO messages(session_id, uid, seq, role, item, created_ms) VALUES ('s1', ?, ?, ?, ?, 0)",
        lambda seq, uid, m, text: (uid, seq, m["role"], text),
    ),
    "SQLiteSession's (its session row not updated)": (
        """CREATE TABLE sessions(id TEXT PRIMARY KEY, created_ms INTEGER);
        CREATE TABLE agent_messages(id INTEGER PRIMARY KEY AUTOINCREMENT, session_id TEXT NOT NULL,
            message_data TEXT NOT NULL, created_at TIMESTAMP DEFAULT CURRENT_TIMESTAMP);
        CREATE INDEX idx_agent_messages_session_id ON agent_messages(session_id, created_at);""",
        "INSERT INTO agent_messages(session_id, message_data) VALUES ('s1', ?)",
        lambda seq, uid, m, text: (json.dumps(m),),
    ),
}


def wal_commits(db: str) -> list:
    """The page numbers of each commit in the WAL, oldest first."""
    with open(db + "-wal", "rb") as f:
        wal = f.read()
    page_size = struct.unpack(">I", wal[8:12])[0]
    commits, pages, off = [], [], 32
    while off + 24 + page_size <= len(wal):
        page, commit_size = struct.unpack(">II", wal[off:off + 8])
        pages.append(page)
        if commit_size:
            commits.append(pages)
            pages = []
        off += 24 + page_size
    return commits


def owners(db: str) -> dict:
    """Page number -> `b-tree|page type`, on a copy (the WAL applied, the original's connection still open)."""
    copy = os.path.join(DIR, "copy.db")
    for suffix in ("", "-wal"):
        shutil.copy(db + suffix, copy + suffix)
    if os.path.exists(copy + "-shm"):
        os.remove(copy + "-shm")
    out = subprocess.run(["sqlite3", copy, "SELECT pageno, name, pagetype FROM dbstat"],
                         capture_output=True, text=True, check=True).stdout
    return {int(line.split("|")[0]): line.split("|", 1)[1] for line in out.splitlines()}


def measure(name: str, ddl: str, insert: str, params) -> None:
    db = os.path.join(DIR, "layout.db")
    for suffix in ("", "-wal", "-shm"):
        if os.path.exists(db + suffix):
            os.remove(db + suffix)
    conn = sqlite3.connect(db, isolation_level=None)
    try:
        for pragma in ("journal_mode=WAL", "synchronous=FULL", "wal_autocheckpoint=0"):
            conn.execute(f"PRAGMA {pragma}")
        conn.executescript(ddl)
        conn.execute("INSERT INTO sessions(id, created_ms) VALUES ('s1', 0)")
        # Minted uids grow with time, as turnsafe's do.
        uids = itertools.count(0x01A251EEAAE6935E594F76D820644DB8)
        seq = 0
        for b in range(COMMITS):
            conn.execute("BEGIN IMMEDIATE")
            for i in range(10):
                seq += 1
                m = {"role": "user" if i % 2 == 0 else "assistant",
                     "content": f"batch {b:>4} message {i} " + "x" * 210}
                conn.execute(insert, params(seq, f"{next(uids):032x}", m, json.dumps(m, separators=(",", ":"))))
            conn.execute("COMMIT")
        commits = wal_commits(db)[-(COMMITS - SKIP):]
        owner = owners(db)
    finally:
        conn.close()
    tally = collections.Counter(owner.get(p, "?") for c in commits for p in c)
    total = sum(len(c) for c in commits) / len(commits)
    parts = ", ".join(f"{k} {v / len(commits):.2f}" for k, v in tally.most_common())
    print(f"{name:<48} {total:5.2f} frames/commit   {parts}")


def main() -> None:
    print(f"{COMMITS} commits of 10 messages of ~230 B, one session; frames per commit over the last {COMMITS - SKIP}")
    for name, (ddl, insert, params) in LAYOUTS.items():
        measure(name, ddl, insert, params)


if __name__ == "__main__":
    main()
