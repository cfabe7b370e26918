"""The induced vectors this runtime recorded (``induced`` starts with
"Python") are induced again for real, in Python's own sqlite3, and the
observation this host builds (``session_writer.observation``) must equal
the vector's: operation, codes, errno, evidence and message. Attempt,
elapsed time and seed vary by nature and are left out."""

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from session_writer import observation

HERE = Path(__file__).resolve().parent.parent


def build(operation: str, err: BaseException) -> dict:
    return observation(operation, err, 1, 0, 0)


def raised(fn) -> sqlite3.Error:
    with pytest.raises(sqlite3.Error) as e:
        fn()
    return e.value


def missing_directory(tmp: Path) -> dict:
    db = tmp / "nope" / "state.db"
    return build("open", raised(lambda: sqlite3.connect(str(db)).execute("CREATE TABLE t(x)")))


def directory_at_db_path(tmp: Path) -> dict:
    db = tmp / "state.db"
    db.mkdir()
    return build("open", raised(lambda: sqlite3.connect(str(db)).execute("CREATE TABLE t(x)")))


def readonly_uri(tmp: Path) -> dict:
    db = tmp / "state.db"
    sqlite3.connect(str(db)).execute("CREATE TABLE t(x)")
    ro = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    return build("append_batch", raised(lambda: ro.execute("INSERT INTO t VALUES (1)")))


def busy_second_writer(tmp: Path) -> dict:
    db = str(tmp / "state.db")
    a = sqlite3.connect(db, isolation_level=None)
    a.execute("CREATE TABLE t(x)")
    a.execute("BEGIN IMMEDIATE")
    b = sqlite3.connect(db, timeout=0, isolation_level=None)
    return build("append_batch", raised(lambda: b.execute("BEGIN IMMEDIATE")))


def notadb_garbage_header(tmp: Path) -> dict:
    db = tmp / "state.db"
    db.write_bytes(b"x" * 4096)
    return build("open", raised(lambda: sqlite3.connect(str(db)).execute("SELECT * FROM sqlite_master")))


def full_max_page_count(tmp: Path) -> dict:
    c = sqlite3.connect(str(tmp / "state.db"))
    c.execute("CREATE TABLE t(b)")
    c.execute("PRAGMA max_page_count=3")
    return build("append_batch", raised(lambda: c.execute("INSERT INTO t VALUES (zeroblob(100000))")))


def unique_constraint(tmp: Path) -> dict:
    c = sqlite3.connect(str(tmp / "state.db"))
    c.execute("CREATE TABLE u(v UNIQUE)")
    c.execute("INSERT INTO u VALUES (1)")
    return build("append_batch", raised(lambda: c.execute("INSERT INTO u VALUES (1)")))


def foreign_key(tmp: Path) -> dict:
    c = sqlite3.connect(str(tmp / "state.db"))
    c.execute("PRAGMA foreign_keys=ON")
    c.execute("CREATE TABLE p(id INTEGER PRIMARY KEY)")
    c.execute("CREATE TABLE c(pid REFERENCES p(id))")
    return build("append_batch", raised(lambda: c.execute("INSERT INTO c VALUES (1)")))


FD_CHILD = """
import json, os, resource, sqlite3, sys
from session_writer import observation
db = sys.argv[1]
resource.setrlimit(resource.RLIMIT_NOFILE, (8, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
held = []
while True:
    try:
        held.append(os.open("/dev/null", os.O_RDONLY))
    except OSError:
        break
try:
    sqlite3.connect(db).execute("SELECT 1")
    print(json.dumps({"error": "no failure"}))
except sqlite3.Error as e:
    print(json.dumps(observation("open", e, 1, 0, 0)))
"""


def fd_exhaustion(tmp: Path) -> dict:
    # RLIMIT_NOFILE=8 with every free descriptor taken, in a child process.
    out = subprocess.run([sys.executable, "-c", FD_CHILD, str(tmp / "state.db")], cwd=HERE,
                         env={**os.environ, "PYTHONPATH": str(HERE)},
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


INDUCERS = {
    "induced_missing_directory": missing_directory,
    "induced_directory_at_db_path": directory_at_db_path,
    "induced_readonly_uri": readonly_uri,
    "induced_busy_second_writer": busy_second_writer,
    "induced_notadb_garbage_header": notadb_garbage_header,
    "induced_full_max_page_count": full_max_page_count,
    "induced_unique_constraint": unique_constraint,
    "induced_foreign_key": foreign_key,
    "induced_fd_exhaustion": fd_exhaustion,
}


def normalised(obs: dict) -> dict:
    """The fields a real failure fixes, with the policy's defaults for absent ones."""
    return {
        "operation": obs.get("operation"),
        "code": obs.get("code"),
        "extended_code": obs.get("extended_code"),
        "message": obs.get("message", ""),
        "errno": obs.get("errno"),
        "evidence": sorted(obs.get("evidence") or []),
    }


def python_vectors(vectors: list[dict]) -> list[dict]:
    return [v for v in vectors if v.get("induced", "").startswith("Python")]


def test_every_python_vector_has_an_inducer(vectors):
    names = {v["name"] for v in python_vectors(vectors)}
    assert len(names) >= 5
    assert names <= set(INDUCERS), f"no inducer for {sorted(names - set(INDUCERS))}"


@pytest.mark.parametrize("name", sorted(INDUCERS))
def test_python_builds_the_recorded_observation(name, vectors, tmp_path):
    recorded = [v for v in python_vectors(vectors) if v["name"] == name]
    assert len(recorded) == 1, f"{name} is not a Python-induced vector"
    induced = INDUCERS[name](tmp_path)
    assert normalised(induced) == normalised(recorded[0]["observation"])
