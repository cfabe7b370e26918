#!/usr/bin/env python3
"""Checks what scripts/package put in an artifact, file by file.

    package-contents.py wheel|sdist|npm ARTIFACT VERSION

A release carries what the package needs and nothing else: no test files
or test hooks, no build leftovers (bytecode, objects, virtual
environments), and the typing files (py.typed, the .pyi stub,
index.d.ts). Exits 1 and names every problem found.
"""

from __future__ import annotations

import io
import re
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# A path with one of these parts is a leftover or a test, never a release file.
STRAY_PARTS = {"tests", "test", "bench", "benches", "fuzz", ".venv", "venv", "target", "node_modules", "__pycache__", ".git", "dist"}
STRAY_SUFFIXES = (".pyc", ".pyo", ".o", ".a", ".whl", ".tgz", ".snap", ".new", ".orig", ".rej", ".swp")
# Only the test build's binary knows these names (host/src/failpoint.rs).
HOOK_MARKERS = (b"TURNSAFE_CRASH_AT", b"TURNSAFE_JITTER_US", b"TURNSAFE_IO_FAULT", b"exhaust-fds-after")
# manylinux_2_28: no symbol newer than glibc 2.28.
GLIBC_FLOOR = (2, 28)

problems: list[str] = []


def problem(msg: str) -> None:
    problems.append(msg)


def tracked(folder: str) -> set[str]:
    """Files git tracks under `folder`, relative to it."""
    out = subprocess.run(["git", "-C", str(ROOT), "ls-files", "--", folder], check=True, capture_output=True, text=True).stdout
    return {line[len(folder) + 1 :] for line in out.splitlines() if line}


def stray(name: str) -> bool:
    parts = name.split("/")
    return bool(STRAY_PARTS.intersection(parts)) or name.endswith(STRAY_SUFFIXES)


def elf_check(label: str, data: bytes, *, allow_needed: set[str] | None) -> None:
    """An x86-64 ELF shared object with no test hook, no debug info, and
    (when `allow_needed` is given) only those shared libraries, with no
    glibc symbol newer than the floor."""
    if data[:4] != b"\x7fELF" or data[4] != 2 or int.from_bytes(data[18:20], "little") != 62:
        problem(f"{label}: not a 64-bit x86-64 ELF object")
        return
    for marker in HOOK_MARKERS:
        if marker in data:
            problem(f"{label}: carries the test hook {marker.decode()}")
    with tempfile.NamedTemporaryFile(suffix=".so") as f:
        f.write(data)
        f.flush()
        sections = subprocess.run(["readelf", "-SW", f.name], check=True, capture_output=True, text=True).stdout
        if ".debug_info" in sections:
            problem(f"{label}: carries debug info (not stripped)")
        dynamic = subprocess.run(["readelf", "-dW", f.name], check=True, capture_output=True, text=True).stdout
        needed = set(re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", dynamic))
        if allow_needed is not None and not needed <= allow_needed:
            problem(f"{label}: needs {sorted(needed - allow_needed)} beyond {sorted(allow_needed)}")
        syms = subprocess.run(["readelf", "--dyn-syms", "-W", f.name], check=True, capture_output=True, text=True).stdout
        versions = {tuple(int(x) for x in m) for m in re.findall(r"@GLIBC_(\d+)\.(\d+)", syms)}
        too_new = sorted(v for v in versions if v > GLIBC_FLOOR)
        if too_new:
            problem(f"{label}: uses glibc symbols newer than {GLIBC_FLOOR}: {too_new}")


def check_wheel(path: Path, version: str) -> None:
    with zipfile.ZipFile(path) as z:
        names = set(z.namelist())
        info = f"turnsafe_store-{version}.dist-info"
        expected = {f"turnsafe_store/{n}" for n in tracked("python/python/turnsafe_store")}
        # maturin's software bill of materials (the crates linked in) is metadata too.
        expected |= {"turnsafe_store/_native.abi3.so", f"{info}/METADATA", f"{info}/WHEEL", f"{info}/RECORD",
                     f"{info}/sboms/turnsafe-store.cyclonedx.json"}
        for n in sorted(names - expected):
            problem(f"wheel: stray file {n}")
        for n in sorted(expected - names):
            problem(f"wheel: {n} is missing")
        if f"{info}/WHEEL" in names:
            wheel = z.read(f"{info}/WHEEL").decode()
            if "Tag: cp39-abi3-manylinux_2_28_x86_64" not in wheel:
                problem(f"wheel: WHEEL is not tagged cp39-abi3-manylinux_2_28_x86_64:\n{wheel}")
        if f"{info}/METADATA" in names:
            meta = z.read(f"{info}/METADATA").decode()
            for line in ("Name: turnsafe-store", f"Version: {version}", "Requires-Python: >=3.9",
                         "Provides-Extra: agents", "Provides-Extra: langgraph"):
                if line not in meta.splitlines():
                    problem(f"wheel: METADATA lacks {line!r}")
        if "turnsafe_store/_native.abi3.so" in names:
            elf_check("wheel: turnsafe_store/_native.abi3.so", z.read("turnsafe_store/_native.abi3.so"),
                      allow_needed={"libc.so.6", "libm.so.6", "libgcc_s.so.1", "libpthread.so.0", "libdl.so.2", "librt.so.1",
                                    "ld-linux-x86-64.so.2"})
    report("wheel", path, names)


def check_sdist(path: Path, version: str) -> None:
    top = f"turnsafe_store-{version}/"
    with tarfile.open(path) as t:
        names = {m.name for m in t.getmembers() if m.isfile()}
    outside = sorted(n for n in names if not n.startswith(top))
    for n in outside:
        problem(f"sdist: {n} is outside {top}")
    rel = {n[len(top):] for n in names if n.startswith(top)}
    for need in ("pyproject.toml", "PKG-INFO", "README.md", "Cargo.toml", "python/Cargo.toml", "python/Cargo.lock", "python/src/lib.rs",
                 "python/turnsafe_store/py.typed", "python/turnsafe_store/_native.pyi"):
        if need not in rel:
            problem(f"sdist: {need} is missing")
    for n in sorted(tracked("python/python/turnsafe_store")):
        if f"python/turnsafe_store/{n}" not in rel:
            problem(f"sdist: python/turnsafe_store/{n} is missing")
    for n in sorted(rel):
        if stray(n) or n.endswith(".so"):
            problem(f"sdist: stray file {n}")
    report("sdist", path, names)


def check_npm(path: Path, version: str) -> None:
    import json

    with tarfile.open(path) as t:
        members = {m.name: m for m in t.getmembers() if m.isfile()}
        names = set(members)
        rel = {n[len("package/"):] for n in names if n.startswith("package/")}
        for n in sorted(names):
            if not n.startswith("package/"):
                problem(f"npm: {n} is outside package/")
        expected = {f"src/{n}" for n in tracked("js/src")}
        expected |= {"package.json", "README.md", "index.d.ts", "native/no_ckpt_on_close.c",
                     "scripts/build.mjs", "scripts/prepare.mjs",
                     "gen/schema.json", "gen/sqlite-codes.json", "gen/no_ckpt_on_close.so",
                     "gen/policy/turnsafe_policy.js", "gen/policy/turnsafe_policy.core.wasm"}
        for n in sorted(expected - rel):
            problem(f"npm: {n} is missing")
        # jco's typings of the component are the only other files allowed.
        for n in sorted(rel - expected):
            if not (n.startswith("gen/policy/") and n.endswith(".d.ts")):
                problem(f"npm: stray file {n}")
        for n in sorted(rel):
            if stray(n) or "hooks" in n:
                problem(f"npm: stray file {n}")
        pkg = json.load(io.TextIOWrapper(t.extractfile(members["package/package.json"]), encoding="utf-8"))
        if pkg.get("version") != version:
            problem(f"npm: package.json says version {pkg.get('version')}, not {version}")
        if "package/gen/no_ckpt_on_close.so" in members:
            # Built with -nostdlib: it needs no C library, glibc or musl.
            elf_check("npm: gen/no_ckpt_on_close.so", t.extractfile(members["package/gen/no_ckpt_on_close.so"]).read(),
                      allow_needed=set())
    report("npm", path, names)


def report(kind: str, path: Path, names: set[str]) -> None:
    print(f"package: {kind} {path.name}: {len(names)} files", file=sys.stderr)
    for n in sorted(names):
        print(f"package:   {n}", file=sys.stderr)


def main() -> int:
    kind, artifact, version = sys.argv[1], Path(sys.argv[2]), sys.argv[3]
    {"wheel": check_wheel, "sdist": check_sdist, "npm": check_npm}[kind](artifact, version)
    for p in problems:
        print(f"error: {p}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
