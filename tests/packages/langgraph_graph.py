"""The installed wheel's TurnsafeSaver under a real LangGraph graph: a run
checkpointed step by step, read back by a fresh saver in a new connection,
resumed on the same thread, and listed by the static `turnsafe`. Run by
scripts/test-packages in a fresh venv."""

from __future__ import annotations

import json
import operator
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Annotated

from langgraph.graph import END, START, StateGraph
from typing_extensions import TypedDict

import turnsafe_store
from turnsafe_store.langgraph import TurnsafeSaver

assert Path(turnsafe_store.__file__).resolve().is_relative_to(Path(sys.prefix).resolve()), turnsafe_store.__file__


class State(TypedDict):
    log: Annotated[list, operator.add]


def graph():
    g = StateGraph(State)
    for name in "abc":
        g.add_node(name, lambda state, name=name: {"log": [name]})
    g.add_edge(START, "a")
    g.add_edge("a", "b")
    g.add_edge("b", "c")
    g.add_edge("c", END)
    return g


cfg = {"configurable": {"thread_id": "t-1"}}
with tempfile.TemporaryDirectory() as tmp:
    home = Path(tmp) / "home"
    with TurnsafeSaver(home) as saver:
        out = graph().compile(checkpointer=saver).invoke({"log": ["start"]}, cfg)
        assert out["log"] == ["start", "a", "b", "c"], out
    # A fresh saver reads what the first one stored.
    with TurnsafeSaver(home) as saver:
        app = graph().compile(checkpointer=saver)
        assert app.get_state(cfg).values["log"] == ["start", "a", "b", "c"]
        out = app.invoke({"log": ["again"]}, cfg)
        assert out["log"] == ["start", "a", "b", "c", "again", "a", "b", "c"], out
        steps = len(list(saver.list(cfg)))
    shown = subprocess.run(
        [os.environ["TURNSAFE_BIN"], "show", "--home", str(home), "--thread", "t-1", "--json"],
        capture_output=True, text=True, check=True,
    ).stdout.splitlines()
    listed = [json.loads(line) for line in shown]
    checkpoints = [line for line in listed if line.get("type") == "checkpoint"]
    assert len(checkpoints) == steps, (len(checkpoints), steps, listed[:3])
    print(f"langgraph: two runs on TurnsafeSaver, {steps} checkpoints, turnsafe show --thread lists {len(checkpoints)}")
