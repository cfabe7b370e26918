"""An ADK agent on a scripted model, for the Runner tests (test_adk_runner.py)
and the child processes they start (``python adk_script.py MODE ...`` from
this folder). No network: the model answers from the request alone.

- ``add A B`` from the user: the model calls the tool ``add``, then says
  ``sum is <result>`` once the tool's answer is in the request;
- anything else: ``heard <N> contents``, N being how many contents (the
  whole history the Runner gave it) the request holds.
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import AsyncGenerator, Callable, List, Optional

from google.adk.agents import LlmAgent
from google.adk.models.base_llm import BaseLlm
from google.adk.models.llm_response import LlmResponse
from google.adk.runners import Runner
from google.genai import types

APP, USER, SESSION = "shop", "ann", "s1"

# Called inside the tool, between the tool call's event and its answer's.
between: Optional[Callable[[], None]] = None
# Whether the model, at its first call, says `ready` on stdout and waits for
# a line on stdin (a test holds the run at a known point).
gate: List[bool] = [False]


class Scripted(BaseLlm):
    model: str = "scripted"

    async def generate_content_async(self, llm_request, stream: bool = False) -> AsyncGenerator[LlmResponse, None]:
        if gate[0]:
            gate[0] = False
            print("ready", flush=True)
            await asyncio.to_thread(sys.stdin.readline)
        part = llm_request.contents[-1].parts[0]
        if part.function_response is not None:
            text = f"sum is {part.function_response.response['result']}"
            yield LlmResponse(content=types.Content(role="model", parts=[types.Part(text=text)]))
            return
        words = (part.text or "").split()
        if len(words) == 3 and words[0] == "add":
            call = types.FunctionCall(name="add", args={"a": int(words[1]), "b": int(words[2])})
            yield LlmResponse(content=types.Content(role="model", parts=[types.Part(function_call=call)]))
            return
        text = f"heard {len(llm_request.contents)} contents"
        yield LlmResponse(content=types.Content(role="model", parts=[types.Part(text=text)]))


def add(a: int, b: int) -> int:
    """Adds two numbers."""
    if between is not None:
        between()
    return a + b


def runner(sessions) -> Runner:
    agent = LlmAgent(name="clerk", model=Scripted(), instruction="Help the customer.", tools=[add])
    return Runner(app_name=APP, agent=agent, session_service=sessions)


def said(event) -> str:
    """What an event says, in short: its text, a tool call or a tool answer."""
    if event.content is None or not event.content.parts:
        return ""
    p = event.content.parts[0]
    if p.function_call is not None:
        return f"call {p.function_call.name}"
    if p.function_response is not None:
        return f"answer {p.function_response.name}"
    return p.text or ""


async def turn(r: Runner, text: str, seen: list, session: str = SESSION) -> None:
    """One run of the Runner; each event it yields goes to ``seen``."""
    msg = types.Content(role="user", parts=[types.Part(text=text)])
    async for ev in r.run_async(user_id=USER, session_id=session, new_message=msg):
        seen.append([ev.id, said(ev)])


async def child(mode: str, home: str, db: str, texts: List[str]) -> dict:
    from turnsafe_store.adk import TurnsafeSessionService

    global between
    sessions = TurnsafeSessionService(home, db=db or None)
    r = runner(sessions)
    seen: list = []
    out: dict = {"seen": seen}
    try:
        if mode == "create":
            await sessions.create_session(app_name=APP, user_id=USER, session_id=SESSION)
        if mode == "gated":
            gate[0] = True
        if mode == "emfile":
            # What the Runner imports lazily when it closes, imported before
            # the descriptors run out.
            import google.adk.tools._node_tool  # noqa: F401
            from fd_exhaust import exhaust

            errno: list = []
            out["errno"] = errno
            between = lambda: errno.append(exhaust())  # noqa: E731
        if mode == "held-emfile":
            # The tool says `ready` and waits for a line (the parent makes
            # state.db immutable meanwhile), then leaks every descriptor left.
            import google.adk.tools._node_tool  # noqa: F401
            from fd_exhaust import exhaust

            errno = []
            out["errno"] = errno

            def held() -> None:
                print("ready", flush=True)
                sys.stdin.readline()
                errno.append(exhaust())

            between = held
        if mode == "race":
            # Runs until each text had one; a run refused as stale is
            # counted and the next run loads the session again.
            from google.adk.errors import StaleSessionError

            out["stale"] = 0
            for text in texts:
                try:
                    await turn(r, text, seen)
                except StaleSessionError:
                    out["stale"] += 1
            return out
        for text in texts:
            await turn(r, text, seen)
    except Exception as e:  # noqa: BLE001 - the parent reads what was raised
        out["error"] = type(e).__name__
        out["message"] = str(e)
        outcome = getattr(e, "outcome", None)
        out["receipt"] = getattr(outcome, "receipt", None)
        if outcome is not None:
            out["outcome"] = outcome.to_dict()
    finally:
        await r.close()
        await sessions.close()
    return out


if __name__ == "__main__":
    mode, home, db, *texts = sys.argv[1:]
    print(json.dumps(asyncio.run(child(mode, home, db, texts))), flush=True)
