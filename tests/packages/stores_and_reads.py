"""The wheel alone, with none of its extras: a Store stores a message and
reads it back. scripts/test-packages runs it on every CPython it finds."""

import sys
import tempfile

import turnsafe_store

with tempfile.TemporaryDirectory() as home:
    store = turnsafe_store.Store(home)
    assert store.append("s1", [{"role": "user", "content": "hi"}]).persisted
    assert [r["content"] for r in store.show("s1")] == ["hi"], store.show("s1")
    store.close()
print(f"test-packages: CPython {sys.version.split()[0]}: the wheel stores and reads", file=sys.stderr)
