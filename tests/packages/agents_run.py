"""The installed wheel's drop-in Session under a real `Runner.run` of the
OpenAI Agents SDK, with a scripted model (no network): two turns stored,
the second sent the first as history, and the static `turnsafe` reads the
same transcript. Run by scripts/test-packages in a fresh venv."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("OPENAI_AGENTS_DISABLE_TRACING", "1")

from agents import Agent, Runner  # noqa: E402
from agents.testing import ScriptedModel, assistant_message  # noqa: E402

import turnsafe_store  # noqa: E402
from turnsafe_store.agents import TurnsafeSession  # noqa: E402

# The package under test is the installed one, never a source tree.
assert Path(turnsafe_store.__file__).resolve().is_relative_to(Path(sys.prefix).resolve()), turnsafe_store.__file__


async def main(home: Path) -> None:
    model = ScriptedModel()
    agent = Agent(name="Assistant", instructions="Reply briefly.", model=model)
    session = TurnsafeSession("user-42", home)
    model.enqueue([assistant_message("Hi there.")])
    first = await Runner.run(agent, "Hello", session=session)
    assert first.final_output == "Hi there.", first.final_output
    model.enqueue([assistant_message("You said hello.")])
    second = await Runner.run(agent, "What did I say?", session=session)
    assert second.final_output == "You said hello.", second.final_output
    sent = model.calls[-1].input
    assert [i["content"] for i in sent[:1]] == ["Hello"], sent
    items = await session.get_items()
    assert [i.get("role") for i in items] == ["user", "assistant", "user", "assistant"], items
    session.store.close()
    shown = subprocess.run(
        [os.environ["TURNSAFE_BIN"], "show", "--home", str(home), "--session", "user-42", "--json"],
        capture_output=True, text=True, check=True,
    ).stdout.splitlines()
    rows = [json.loads(line)["data"]["message"] for line in shown if json.loads(line)["type"] == "message"]
    assert rows == items, (rows, items)
    print(f"agents: Runner.run stored {len(items)} items; turnsafe show reads the same {len(rows)}")


with tempfile.TemporaryDirectory() as tmp:
    asyncio.run(main(Path(tmp) / "home"))
