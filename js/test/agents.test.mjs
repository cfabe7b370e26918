// run() of @openai/agents with a scripted model written for the test (no
// network): a turn stored, and a turn whose storage fails, which ends the
// run with TurnNotPersisted and a receipt that `turnsafe replay` brings in.
import assert from 'node:assert/strict';
import path from 'node:path';
import { test } from 'node:test';

import { Agent, Usage, run, setTracingDisabled } from '@openai/agents';

import { TurnsafeSession } from '../src/index.js';
import { holdLock, receiptHolds, tmp, turnsafe } from './helpers.mjs';

setTracingDisabled(true);

/** A Model that answers each request with the next scripted reply and records what it was sent. */
class ScriptedModel {
  constructor(replies) {
    this.replies = [...replies];
    this.requests = [];
  }

  async getResponse(request) {
    this.requests.push(request);
    const text = this.replies.shift();
    if (text === undefined) throw new Error('the script has no more replies');
    return {
      usage: new Usage(),
      responseId: `resp_${this.requests.length}`,
      output: [{ type: 'message', id: `msg_${this.requests.length}`, role: 'assistant', status: 'completed',
        content: [{ type: 'output_text', text }] }],
    };
  }

  // eslint-disable-next-line require-yield
  async* getStreamedResponse() {
    throw new Error('not scripted');
  }
}

const shown = (home, session) => turnsafe(['show', '--home', home, '--session', session, '--json']).lines
  .filter((l) => l.type === 'message').map((l) => l.data.message);

const textOf = (item) => (typeof item.content === 'string' ? item.content : item.content.map((c) => c.text).join(''));

test('a turn is stored, and the next turn is sent its history', async () => {
  const home = tmp();
  const model = new ScriptedModel(['Hi there.', 'You said hello before.']);
  const agent = new Agent({ name: 'Assistant', instructions: 'Reply briefly.', model });
  const session = new TurnsafeSession('user-42', home);
  const first = await run(agent, 'Hello', { session });
  assert.equal(first.finalOutput, 'Hi there.');
  const second = await run(agent, 'What did I say?', { session });
  assert.equal(second.finalOutput, 'You said hello before.');
  const items = await session.getItems();
  assert.deepEqual(items.map(textOf), ['Hello', 'Hi there.', 'What did I say?', 'You said hello before.']);
  // The second request carried the stored history.
  const sent = model.requests[1].input;
  assert.deepEqual(sent.map(textOf), ['Hello', 'Hi there.', 'What did I say?']);
  await session.close();
  // The native host reads what the JavaScript host wrote.
  assert.deepEqual(shown(home, 'user-42').map(textOf), ['Hello', 'Hi there.', 'What did I say?', 'You said hello before.']);
});

test('a turn whose storage fails ends the run with TurnNotPersisted; turnsafe replay brings it in', async () => {
  const home = tmp();
  const agent = new Agent({ name: 'Assistant', instructions: 'Reply briefly.', model: new ScriptedModel(['First.', 'Second.']) });
  const session = new TurnsafeSession('user-7', home);
  await run(agent, 'one', { session });
  // Another process holds the write lock past the policy's patience: until
  // the run has ended, however long the writer took to give up.
  const holder = await holdLock(path.join(home, 'state.db'));
  let err;
  try {
    await run(agent, 'two', { session });
  } catch (e) {
    err = e;
  } finally {
    await holder.release();
  }
  assert.ok(err, 'the run ended as if the turn were stored');
  assert.equal(err.name, 'TurnNotPersisted', err.stack);
  const out = err.outcome;
  assert.equal(out.cause, 'locked');
  assert.equal(out.action, 'divert');
  assert.ok(receiptHolds(out.receipt));
  assert.ok(out.copy.body.includes(out.receipt.path));
  await session.close();
  const before = shown(home, 'user-7').map(textOf);
  assert.deepEqual(before, ['one', 'First.']);
  const replay = turnsafe(['replay', '--home', home, '--json']);
  assert.equal(replay.status, 0, replay.stderr);
  const summary = (r) => r.lines.filter((l) => l.type === 'summary').map((l) => l.data);
  // The diverted turn is the input and the model's answer, replayed once each.
  assert.deepEqual(summary(replay).map((s) => [s.lines, s.replayed, s.duplicate, s.quarantined]), [[2, 2, 0, 0]]);
  const after = shown(home, 'user-7').map(textOf);
  assert.deepEqual(after, ['one', 'First.', 'two', 'Second.']);
  // Replay is idempotent: a second one reads no line and brings nothing new.
  const again = turnsafe(['replay', '--home', home, '--json']);
  assert.equal(again.status, 0, again.stderr);
  assert.deepEqual(summary(again).map((s) => [s.files, s.lines, s.replayed]), [[0, 0, 0]]);
  assert.deepEqual(shown(home, 'user-7').map(textOf), after);
});
