"""turnsafe_store.pydantic_ai: Pydantic AI's ConversationStore on turnsafe.

Agents run on Pydantic AI's own offline models (TestModel, FunctionModel);
failures are induced for real (an immutable state.db, a lock held by
another process), and concurrent writers are real processes."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("pydantic_ai.conversation_store", reason="pydantic-ai-slim 2.68 is not installed")

from pydantic_ai import Agent, BinaryContent, ModelRetry  # noqa: E402
from pydantic_ai.conversation import Conversation  # noqa: E402
from pydantic_ai.conversation_store import (  # noqa: E402
    ConversationConflict,
    ConversationStore,
    InMemoryConversationStore,
)
from pydantic_ai.exceptions import UserError  # noqa: E402
from pydantic_ai.messages import (  # noqa: E402
    DocumentUrl,
    FilePart,
    ImageUrl,
    ModelMessagesTypeAdapter,
    ModelRequest,
    ModelResponse,
    RetryPromptPart,
    SystemPromptPart,
    TextPart,
    ThinkingPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel  # noqa: E402
from pydantic_ai.models.test import TestModel  # noqa: E402
from pydantic_ai.messages import PartDeltaEvent, TextPartDelta  # noqa: E402
from pydantic_ai.run import AgentRunResultEvent  # noqa: E402

import turnsafe_store  # noqa: E402
from conftest import immutable, turnsafe_bin  # noqa: E402
from turnsafe_store import TurnNotPersisted  # noqa: E402
from turnsafe_store.pydantic_ai import TurnsafeConversationStore, conversation_session_id  # noqa: E402


def dump(messages) -> bytes:
    """Pydantic AI's own bytes for a history: what "equal" means here."""
    return ModelMessagesTypeAdapter.dump_json(list(messages))


def rows(home: Path, conversation_id: str):
    with turnsafe_store.Store(home) as s:
        return s.rows(conversation_session_id(conversation_id))


def entry_rows(home: Path, conversation_id: str):
    return [r for r in rows(home, conversation_id) if r["message"]["pydantic_ai"]["kind"] == "entry"]


# A model that calls a tool, is told to retry once, thinks, and answers.
def scripted(messages, info: AgentInfo) -> ModelResponse:
    last = messages[-1]
    kinds = [p.part_kind for p in last.parts]
    if "user-prompt" in kinds:
        prompt = next(p for p in last.parts if p.part_kind == "user-prompt")
        text = prompt.content if isinstance(prompt.content, str) else prompt.content[0]
        return ModelResponse(parts=[ToolCallPart("lookup", {"word": text}, tool_call_id=f"call-{len(messages)}")])
    if "retry-prompt" in kinds:
        return ModelResponse(parts=[ToolCallPart("lookup", {"word": "again"}, tool_call_id=f"call-{len(messages)}")])
    found = next(p.content for p in last.parts if p.part_kind == "tool-return")
    return ModelResponse(parts=[ThinkingPart("the tool said so", signature="sig-1"), TextPart(f"answer: {found}")])


def scripted_agent() -> Agent:
    agent = Agent(FunctionModel(scripted), instructions="be brief")
    tries = {"n": 0}

    @agent.tool_plain
    def lookup(word: str) -> str:
        tries["n"] += 1
        if tries["n"] == 1:
            raise ModelRetry("once more")
        return f"<{word}>"

    return agent


async def turn(store: ConversationStore, agent: Agent, conversation_id: str, prompt, **kw):
    conversation = await store.load(conversation_id) or Conversation(conversation_id=conversation_id)
    result = await agent.run(prompt, conversation=conversation, **kw)
    await store.save(result)
    return result


# ------------------------------------------------------------ the protocol


def test_it_is_pydantic_ais_conversation_store_with_every_primitive(home):
    assert issubclass(TurnsafeConversationStore, ConversationStore)
    assert not TurnsafeConversationStore.__abstractmethods__
    s = TurnsafeConversationStore(home)
    try:
        assert asyncio.run(s.load("nobody")) is None
        assert asyncio.run(s.list_conversations()) == []
    finally:
        s.close()
    assert s.store.closed
    # A shared store stays open for its owner.
    with turnsafe_store.Store(home) as shared:
        TurnsafeConversationStore(home, store=shared).close()
        assert not shared.closed


EVERY_PART = [
    ModelRequest(
        parts=[
            SystemPromptPart("you are a test"),
            UserPromptPart(
                [
                    "look at these",
                    BinaryContent(data=bytes(range(256)), media_type="image/png"),
                    ImageUrl("https://example.invalid/cat.png"),
                    DocumentUrl("https://example.invalid/doc.pdf"),
                ]
            ),
        ],
        instructions="be brief",
    ),
    ModelResponse(
        parts=[
            ThinkingPart("hmm", signature="s1", provider_name="test"),
            TextPart("calling"),
            ToolCallPart("f", {"x": 1, "nested": {"y": [1.5, None, "z"]}}, tool_call_id="c1"),
            ToolCallPart("g", '{"raw": "json text"}', tool_call_id="c2"),
        ],
        model_name="test-model",
    ),
    ModelRequest(
        parts=[
            ToolReturnPart("f", {"ok": True, "bytes": b"\x00\x01"}, tool_call_id="c1"),
            ToolReturnPart("g", "bad arguments", tool_call_id="c2", outcome="retried"),
            RetryPromptPart("an older history's retry", tool_name="g", tool_call_id="c3"),
        ]
    ),
    ModelResponse(parts=[FilePart(BinaryContent(data=b"\x89PNG\r\n\x1a\n", media_type="image/png")), TextPart("é ☃ \u2028")]),
]


def test_every_part_kind_round_trips_as_pydantic_ais_own_adapter_brings_it_back(home):
    expected = ModelMessagesTypeAdapter.validate_json(dump(EVERY_PART))

    async def main():
        async with TurnsafeConversationStore(home) as s:
            await s.save(Conversation(conversation_id="parts", messages=list(EVERY_PART)))
        async with TurnsafeConversationStore(home) as s:
            loaded = await s.load("parts")
        # Exactly what Pydantic AI's own adapter gives back for them.
        assert dump(loaded.messages) == dump(expected)
        assert loaded.messages == expected

    asyncio.run(main())
    # One row per message, each its adapter JSON, readable by `turnsafe show`.
    stored = entry_rows(home, "parts")
    assert "[" + ",".join(r["message"]["pydantic_ai"]["message"] for r in stored) + "]" == dump(EVERY_PART).decode()
    assert [r["message"]["role"] for r in stored] == ["request", "response", "request", "response"]


# ------------------------------------------------------------ agent runs


LOAD_AND_DUMP = textwrap.dedent(
    """
    import asyncio, sys
    from pydantic_ai.messages import ModelMessagesTypeAdapter
    from turnsafe_store.pydantic_ai import TurnsafeConversationStore

    async def main():
        async with TurnsafeConversationStore(sys.argv[1]) as s:
            c = await s.load(sys.argv[2])
            sys.stdout.buffer.write(ModelMessagesTypeAdapter.dump_json(c.messages))
            sys.stderr.write(c.usage.model_dump_json() if hasattr(c.usage, "model_dump_json") else repr(c.usage))

    asyncio.run(main())
    """
)


def load_in_a_new_process(home: Path, conversation_id: str) -> tuple[bytes, str]:
    p = subprocess.run([sys.executable, "-c", LOAD_AND_DUMP, str(home), conversation_id], capture_output=True, check=True)
    return p.stdout, p.stderr.decode()


def test_a_multi_turn_agent_run_comes_back_equal_after_a_restart(home):
    agent = scripted_agent()

    async def main():
        s = TurnsafeConversationStore(home)
        first = await turn(s, agent, "chat-1", ["what is this?", BinaryContent(b"\x00img", media_type="image/png")])
        second = await turn(s, agent, "chat-1", "and now?")
        third = await turn(s, agent, "chat-1", "last one")
        s.close()
        return first, second, third

    first, second, third = asyncio.run(main())
    history = third.all_messages()
    # The run really had every kind of turn: a tool call, a retry, thinking.
    kinds = {p.part_kind for m in history for p in m.parts}
    assert {"user-prompt", "tool-call", "tool-return", "thinking", "text"} <= kinds
    assert any(getattr(p, "outcome", None) == "retried" for m in history for p in m.parts)
    assert third.output == "answer: <last one>"
    stored, usage = load_in_a_new_process(home, "chat-1")
    assert stored == dump(history)
    assert str(third.usage().requests) in usage
    # Each message stored once: the three saves appended what each run added.
    assert len(entry_rows(home, "chat-1")) == len(history)


def test_streamed_runs_are_saved_and_come_back_equal(home):
    agent = Agent(TestModel(custom_output_text="streamed answer", call_tools=[]))

    async def main():
        s = TurnsafeConversationStore(home)
        for prompt in ("one", "two", "three"):
            conversation = await s.load("stream") or Conversation(conversation_id="stream")
            chunks, result = [], None
            # `run_stream_events` (in 2.68 `run_stream`'s `.result` does not
            # carry the loaded revision, with Pydantic AI's own store too).
            async with agent.run_stream_events(prompt, conversation=conversation) as events:
                async for event in events:
                    if isinstance(event, PartDeltaEvent) and isinstance(event.delta, TextPartDelta):
                        chunks.append(event.delta.content_delta)
                    elif isinstance(event, AgentRunResultEvent):
                        result = event.result
            assert len(chunks) > 1 and "".join(chunks) == "streamed answer"
            await s.save(result)
        history = result.all_messages()
        s.close()
        return history

    history = asyncio.run(main())
    assert len(history) == 6
    assert load_in_a_new_process(home, "stream")[0] == dump(history)


# ------------------------------------------------------------ branch and fork


def test_a_branch_leaves_the_old_history_stored_and_comes_back_to_it(home):
    agent = Agent(TestModel(custom_output_text="reply", call_tools=[]))

    async def main():
        async with TurnsafeConversationStore(home) as s:
            await turn(s, agent, "b", "first")
            await turn(s, agent, "b", "second")
            loaded = await s.load("b")
            old = await s.load_entries("b")
            assert len(old) == 4
            # Regenerate the second turn: keep two messages, run again.
            branched = await s.branch("b", at=2, expected_revision=loaded.revision)
            assert dump(branched.messages) == dump(loaded.messages[:2])
            result = await agent.run("second, edited", conversation=branched)
            await s.save(result)
            now = await s.load("b")
            assert [m.parts[0].content for m in now.messages if isinstance(m, ModelRequest)] == [
                "first",
                "second, edited",
            ]
            record = await s.read_record("b")
            assert record.branches == [old[-1].id]
            # The branch it left is stored: switch back to it.
            back = await s.branch("b", from_entry=old[-1].id, expected_revision=now.revision)
            assert dump(back.messages) == dump(loaded.messages)
            # A branch with a stale revision is refused.
            with pytest.raises(ConversationConflict):
                await s.branch("b", at=1, expected_revision=now.revision)

    asyncio.run(main())
    # Six entries in all: the shared two, the old two, the new two.
    assert len(entry_rows(home, "b")) == 6


def test_a_fork_shares_entries_and_the_original_goes_on(home):
    agent = Agent(TestModel(custom_output_text="reply", call_tools=[]))

    async def main():
        async with TurnsafeConversationStore(home) as s:
            await turn(s, agent, "origin", "first")
            await turn(s, agent, "origin", "second")
            origin = await s.load("origin")
            fork = await s.fork("origin", at=2, new_conversation_id="fork")
            assert dump(fork.messages) == dump(origin.messages[:2])
            await s.save(await agent.run("fork's own", conversation=fork))
            await turn(s, agent, "origin", "third")
        # A new store (a new process's view): both histories, as written.
        async with TurnsafeConversationStore(home) as s:
            f = await s.load("fork")
            o = await s.load("origin")
            fe = await s.load_entries("fork")
            oe = await s.load_entries("origin")
            record = await s.read_record("fork")
        assert [m.parts[0].content for m in f.messages if isinstance(m, ModelRequest)] == ["first", "fork's own"]
        assert [m.parts[0].content for m in o.messages if isinstance(m, ModelRequest)] == ["first", "second", "third"]
        # The fork points at the original's entries instead of copying them.
        assert [e.id for e in fe[:2]] == [e.id for e in oe[:2]]
        assert (record.forked_from, record.forked_at) == ("origin", oe[1].id)
        # An entry read by its id alone, by a store that has met none.
        async with TurnsafeConversationStore(home) as s:
            assert dump([(await s.read_entry(fe[-1].id)).message]) == dump([fe[-1].message])
            assert (await s.read_entry(oe[0].id)).id == oe[0].id
            with pytest.raises(KeyError):
                await s.read_entry("no-such-entry")
        with pytest.raises(ConversationConflict):
            async with TurnsafeConversationStore(home) as s:
                await s.fork("origin", new_conversation_id="fork")

    asyncio.run(main())
    assert len(entry_rows(home, "fork")) == 2  # only what the fork added
    assert len(entry_rows(home, "origin")) == 6


def test_a_rewritten_history_branches_off_the_last_shared_message(home):
    async def main():
        async with TurnsafeConversationStore(home) as s:
            base = [ModelRequest.user_text_prompt("a"), ModelResponse(parts=[TextPart("b")])]
            await s.save(Conversation(conversation_id="rw", messages=list(base)))
            loaded = await s.load("rw")
            # Serialized and read back: `save` compares with the stored history.
            rewritten = Conversation(
                conversation_id="rw",
                messages=[base[0], ModelResponse(parts=[TextPart("b, rewritten")])],
                revision=loaded.revision,
            )
            entries = await s.save(rewritten)
            assert len(entries) == 1
            record = await s.read_record("rw")
            assert len(record.branches) == 1
            assert [e.message for e in await s.read_history(record.branches[0])][1].parts[0].content == "b"
            now = await s.load("rw")
            assert now.messages[1].parts[0].content == "b, rewritten"

    asyncio.run(main())
    assert len(entry_rows(home, "rw")) == 3


# ------------------------------------------------------------ the contract's rules


def test_scope_limit_and_the_order_of_the_list(home):
    async def main():
        async with TurnsafeConversationStore(home) as s:
            for cid, scope in (("c1", "alice"), ("c2", "bob"), ("c3", "alice")):
                await s.save(
                    Conversation(conversation_id=cid, messages=[ModelRequest.user_text_prompt(cid)]), scope=scope
                )
            # c1 saved again: the most recently saved comes first.
            c1 = await s.load("c1", scope="alice")
            c1.messages.append(ModelResponse(parts=[TextPart("later")]))
            await s.save(c1)
            assert [r.conversation_id for r in await s.list_conversations()] == ["c1", "c3", "c2"]
            assert [r.conversation_id for r in await s.list_conversations(scope="alice")] == ["c1", "c3"]
            assert [r.conversation_id for r in await s.list_conversations(limit=1)] == ["c1"]
            # Another scope reads as a conversation the store does not have.
            assert await s.load("c1", scope="bob") is None
            with pytest.raises(ConversationConflict):
                await s.save(c1, scope="bob")
            await s.delete("c1", scope="bob")
            assert await s.load("c1") is not None
            # `limit` loads the last messages only; saving still appends.
            last = await s.load("c1", limit=1)
            assert [m.parts[0].content for m in last.messages] == ["later"]
            with pytest.raises(UserError):
                await s.load("c1", limit=-1)

    asyncio.run(main())


def test_a_stale_or_unknown_revision_is_a_conflict_and_stores_nothing(home):
    async def main():
        async with TurnsafeConversationStore(home) as s:
            await s.save(Conversation(conversation_id="r", messages=[ModelRequest.user_text_prompt("1")]))
            a = await s.load("r")
            b = await s.load("r")
            a.messages.append(ModelResponse(parts=[TextPart("a's")]))
            await s.save(a)
            b.messages.append(ModelResponse(parts=[TextPart("b's")]))
            with pytest.raises(ConversationConflict):
                await s.save(b)
            # A conversation created fresh under an existing id.
            with pytest.raises(ConversationConflict):
                await s.save(Conversation(conversation_id="r", messages=[ModelRequest.user_text_prompt("x")]))
            # A revision the store never gave out.
            record = await s.read_record("r")
            with pytest.raises(ConversationConflict):
                await s.write_record(record, expected_revision="never-given")
            # A head that names an entry the store does not have.
            orphan = dataclasses.replace(record, conversation_id="orphan", head_id="no-such-entry")
            with pytest.raises(ConversationConflict):
                await s.write_record(orphan, expected_revision=None)
            assert await s.read_record("orphan") is None
            # Deleted and created again: a copy loaded before is refused.
            await s.delete("r")
            assert await s.load("r") is None and await s.list_conversations() == []
            await s.save(Conversation(conversation_id="r", messages=[ModelRequest.user_text_prompt("new")]))
            a.messages.append(ModelResponse(parts=[TextPart("stale")]))
            with pytest.raises(ConversationConflict):
                await s.save(a)
            final = await s.load("r")
            assert [m.parts[0].content for m in final.messages] == ["new"]

    asyncio.run(main())
    # b's and the stale copy's messages were never stored.
    contents = [json.loads(r["message"]["pydantic_ai"]["message"])["parts"][0]["content"] for r in entry_rows(home, "r")]
    assert contents == ["1", "a's", "new"]


def test_a_delete_between_a_saves_read_and_its_write_wins(home):
    """A store read the conversation, another deleted it, then the first
    writes after what it read (as `save` does once it has read): its write
    claims the position the tombstone holds, so it is refused, and the
    conversation stays deleted."""

    async def main():
        async with TurnsafeConversationStore(home) as s0:
            await s0.save(Conversation(conversation_id="del", messages=[ModelRequest.user_text_prompt("1")]))
        async with TurnsafeConversationStore(home) as s1, TurnsafeConversationStore(home) as s2:
            read = await s1.read_record("del")
            await s2.delete("del")
            later = dataclasses.replace(read, revision="after-the-read")
            with pytest.raises(ConversationConflict):
                await s1.write_record(later, expected_revision=read.revision)
            assert await s2.load("del") is None and await s1.load("del") is None
            assert await s1.list_conversations() == []

    asyncio.run(main())


def test_it_answers_as_the_in_memory_store_does(home):
    """The same script of calls against Pydantic AI's own store and this one:
    the same histories, records (but their tokens) and errors."""

    one, two, three, two_b = (
        ModelRequest.user_text_prompt("1"),
        ModelResponse(parts=[TextPart("2")]),
        ModelRequest.user_text_prompt("3"),
        ModelResponse(parts=[TextPart("2b")]),
    )

    async def script(s: ConversationStore):
        out = []

        async def step(name, coro):
            try:
                value = await coro
            except (ConversationConflict, UserError) as e:
                value = type(e).__name__
            out.append((name, shape(value)))
            return value

        await step("save1", s.save(Conversation(conversation_id="d", messages=[one])))
        c = await step("load", s.load("d"))
        c.messages += [two, three]
        await step("save2", s.save(c, scope=None))
        await step("branch-at-9", s.branch("d", at=9, expected_revision=c.revision))
        br = await step("branch-at-1", s.branch("d", at=1, expected_revision=c.revision))
        br.messages.append(two_b)
        await step("save-branch", s.save(br))
        await step("fork-all", s.fork("d", new_conversation_id="f1", scope="team"))
        await step("fork-at-0", s.fork("d", at=0, new_conversation_id="f0"))
        await step("fork-both", s.fork("d", at=0, from_entry="x", new_conversation_id="f2"))
        await step("fork-missing", s.fork("nobody"))
        await step("list", s.list_conversations())
        await step("list-team", s.list_conversations(scope="team"))
        await step("load-limit", s.load("d", limit=1))
        await step("entries", s.load_entries("f1"))
        await step("delete-f1", s.delete("f1"))
        await step("load-f1", s.load("f1"))
        await step("load-d", s.load("d"))
        return out

    def shape(value):
        # Ids and revisions are minted; compare what they stand for.
        if isinstance(value, Conversation):
            return ("conversation", dump(value.messages), value.conversation_id, value.revision is not None)
        if isinstance(value, list):
            return [shape(v) for v in value]
        if hasattr(value, "head_id") and hasattr(value, "branches"):
            return ("record", value.conversation_id, value.scope, value.forked_from, len(value.branches))
        if hasattr(value, "message") and hasattr(value, "parent_id"):
            return ("entry", dump([value.message]))
        return value

    async def main():
        reference = await script(InMemoryConversationStore())
        async with TurnsafeConversationStore(home) as s:
            ours = await script(s)
        assert ours == reference

    asyncio.run(main())


def test_on_postgresql_histories_branches_forks_lists_and_conflicts(tmp_path, pg):
    """The same store with `db=`: the rows on a real PostgreSQL server."""
    url = pg.url()
    agent = Agent(TestModel(custom_output_text="reply", call_tools=[]))

    async def main():
        async with TurnsafeConversationStore(tmp_path / "home", db=url) as s:
            await turn(s, agent, "pg", "first")
            second = await turn(s, agent, "pg", "second")
            loaded = await s.load("pg")
            stale = await s.load("pg")
            fork = await s.fork("pg", at=2, new_conversation_id="pg-fork")
            await s.save(await agent.run("fork's own", conversation=fork))
            branched = await s.branch("pg", at=2, expected_revision=loaded.revision)
            await s.save(await agent.run("edited", conversation=branched))
            stale.messages.append(ModelResponse(parts=[TextPart("lost?")]))
            with pytest.raises(ConversationConflict):
                await s.save(stale)
        async with TurnsafeConversationStore(tmp_path / "other", db=url) as s:
            assert sorted(r.conversation_id for r in await s.list_conversations()) == ["pg", "pg-fork"]
            now = await s.load("pg")
            record = await s.read_record("pg")
            back = await s.read_history(record.branches[0])
            f = await s.load("pg-fork")
        assert [m.parts[0].content for m in now.messages if isinstance(m, ModelRequest)] == ["first", "edited"]
        assert dump([e.message for e in back]) == dump(second.all_messages())
        assert [m.parts[0].content for m in f.messages if isinstance(m, ModelRequest)] == ["first", "fork's own"]

    asyncio.run(main())


# ------------------------------------------------------------ failures


def test_an_immutable_state_db_raises_turn_not_persisted_and_replay_brings_the_turn_back_once(home):
    agent = Agent(TestModel(custom_output_text="reply", call_tools=[]))

    async def main():
        async with TurnsafeConversationStore(home) as s:
            first = await turn(s, agent, "f", "kept")
        with immutable(home / "state.db"):
            async with TurnsafeConversationStore(home) as s:
                conversation = await s.load("f")
                result = await agent.run("diverted", conversation=conversation)
                with pytest.raises(TurnNotPersisted) as e:
                    await s.save(result)
        return first, result, e.value.outcome

    first, result, out = asyncio.run(main())
    assert (out.cause, out.action, out.persisted) == ("disk", "divert", False)
    # The save's two messages and its record, in one receipted copy.
    assert out.receipt is not None and out.receipt["count"] == out.diverted == 3
    assert Path(out.receipt["path"]).is_file()
    assert load_in_a_new_process(home, "f")[0] == dump(first.all_messages())

    replayed = subprocess.run([turnsafe_bin(), "replay", "--home", str(home), "--json"], capture_output=True, text=True)
    assert replayed.returncode == 0, replayed.stderr
    assert load_in_a_new_process(home, "f")[0] == dump(result.all_messages())
    again = turnsafe_store.replay(home)
    assert again["replayed"] == 0
    assert len(entry_rows(home, "f")) == 4


def test_a_save_retried_after_a_failure_and_a_replay_store_each_message_once(home):
    agent = Agent(TestModel(custom_output_text="reply", call_tools=[]))

    async def main():
        async with TurnsafeConversationStore(home) as s:
            await turn(s, agent, "retry", "kept")
            conversation = await s.load("retry")
            result = await agent.run("twice?", conversation=conversation)
            s.close()
            with immutable(home / "state.db"):
                s2 = TurnsafeConversationStore(home)
                with pytest.raises(TurnNotPersisted):
                    await s2.save(result)
                s2.close()
            s3 = TurnsafeConversationStore(home)
            await s3.save(result)  # the same result, saved again
            s3.close()
            report = turnsafe_store.replay(home)
            async with TurnsafeConversationStore(home) as s4:
                loaded = await s4.load("retry")
            return result, report, loaded

    result, report, loaded = asyncio.run(main())
    assert dump(loaded.messages) == dump(result.all_messages())
    # The diverted lines claim the position the retried save took: kept
    # aside by replay, never stored a second time.
    assert report["replayed"] == 0 and report["quarantined"] == 3
    assert len(entry_rows(home, "retry")) == 4


HOLD_LOCK = textwrap.dedent(
    """
    import sqlite3, sys
    c = sqlite3.connect(sys.argv[1], isolation_level=None)
    c.execute("BEGIN IMMEDIATE")
    print("ready", flush=True)
    sys.stdin.readline()
    c.execute("COMMIT")
    """
)


def test_a_lock_held_past_the_policys_patience_diverts_the_save_with_a_receipt(home):
    agent = Agent(TestModel(custom_output_text="reply", call_tools=[]))

    async def main():
        async with TurnsafeConversationStore(home) as s:
            await turn(s, agent, "locked", "kept")
            conversation = await s.load("locked")
            result = await agent.run("while locked", conversation=conversation)
            locker = subprocess.Popen(
                [sys.executable, "-c", HOLD_LOCK, str(home / "state.db")],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
            try:
                assert locker.stdout.readline().strip() == "ready"
                with pytest.raises(TurnNotPersisted) as e:
                    await s.save(result)
            finally:
                locker.stdin.write("go\n")
                locker.stdin.close()
                locker.wait()
            out = e.value.outcome
            assert (out.cause, out.action) == ("locked", "divert") and out.attempts > 1
            assert out.receipt is not None and out.receipt["count"] == 3
        assert turnsafe_store.replay(home)["replayed"] == 3
        async with TurnsafeConversationStore(home) as s:
            assert dump((await s.load("locked")).messages) == dump(result.all_messages())

    asyncio.run(main())


def test_a_conversation_moves_between_writers_from_one_save_to_the_next(home):
    """Two stores (two lease holders, as two workers of a server) save one
    conversation in turns: each takes over the other's lease, and a writer
    whose lease was taken gives it back and saves; none gets a conflict."""
    agent = Agent(TestModel(custom_output_text="reply", call_tools=[]))

    async def main():
        a, b = TurnsafeConversationStore(home), TurnsafeConversationStore(home)
        try:
            for i, s in enumerate((a, b, a, b, a)):
                await turn(s, agent, "moves", f"turn {i}")
            final = await a.load("moves")
        finally:
            a.close()
            b.close()
        return final

    final = asyncio.run(main())
    assert [m.parts[0].content for m in final.messages if isinstance(m, ModelRequest)] == [f"turn {i}" for i in range(5)]


# ------------------------------------------------------------ two processes

WRITER = textwrap.dedent(
    """
    import asyncio, sys
    from pydantic_ai import Agent
    from pydantic_ai.conversation_store import ConversationConflict
    from pydantic_ai.models.test import TestModel
    from turnsafe_store.pydantic_ai import TurnsafeConversationStore

    home, name = sys.argv[1], sys.argv[2]
    agent = Agent(TestModel(custom_output_text="from " + name, call_tools=[]))

    def say(word):
        print(word, flush=True)

    async def main():
        s = TurnsafeConversationStore(home)
        conversation = await s.load("shared")
        result = await agent.run("turn of " + name, conversation=conversation)
        say("loaded")
        sys.stdin.readline()  # the test's word: save now
        try:
            await s.save(result)
            say("saved")
        except ConversationConflict:
            say("conflict")
            sys.stdin.readline()  # the test's word: load again and retry
            conversation = await s.load("shared")
            result = await agent.run("turn of " + name, conversation=conversation)
            await s.save(result)
            say("saved")
        s.close()
        say("closed")

    asyncio.run(main())
    """
)


def test_two_processes_on_one_conversation_one_gets_conversation_conflict_and_nothing_is_lost(home):
    agent = Agent(TestModel(custom_output_text="first", call_tools=[]))

    async def seed():
        async with TurnsafeConversationStore(home) as s:
            await turn(s, agent, "shared", "seed")

    asyncio.run(seed())
    procs = {
        name: subprocess.Popen(
            [sys.executable, "-c", WRITER, str(home), name], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        for name in ("a", "b")
    }
    try:
        # Both have loaded the same revision and run their turn.
        for p in procs.values():
            assert p.stdout.readline().strip() == "loaded"
        # Both save at once: the database takes exactly one.
        for p in procs.values():
            p.stdin.write("save\n")
            p.stdin.flush()
        said = {name: p.stdout.readline().strip() for name, p in procs.items()}
        assert sorted(said.values()) == ["conflict", "saved"], said
        winner = next(n for n, w in said.items() if w == "saved")
        loser = next(n for n, w in said.items() if w == "conflict")
        assert procs[winner].stdout.readline().strip() == "closed"
        # The loser loads again (the winner's turn included) and saves.
        procs[loser].stdin.write("retry\n")
        procs[loser].stdin.flush()
        assert procs[loser].stdout.readline().strip() == "saved"
        assert procs[loser].stdout.readline().strip() == "closed"
    finally:
        for p in procs.values():
            p.stdin.close()
            p.wait(timeout=60)

    async def check():
        async with TurnsafeConversationStore(home) as s:
            return await s.load("shared")

    final = asyncio.run(check())
    prompts = [m.parts[0].content for m in final.messages if isinstance(m, ModelRequest)]
    assert prompts == ["seed", f"turn of {winner}", f"turn of {loser}"]
    # Nothing the loser tried first was stored beside it.
    assert len(entry_rows(home, "shared")) == len(final.messages) == 6
