// The installed npm package's TurnsafeSession under a real run() of
// @openai/agents, with a scripted model (no network): two turns stored,
// the second sent the first as history, and the static `turnsafe` reads
// the same transcript. Run by scripts/test-packages in a fresh npm project.
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

import { Agent, Usage, run, setTracingDisabled } from '@openai/agents';
import { TurnsafeSession } from 'turnsafe-store';

setTracingDisabled(true);

// The package under test is the installed one, in this project's node_modules.
const resolved = fileURLToPath(import.meta.resolve('turnsafe-store'));
assert.ok(resolved.startsWith(path.join(process.cwd(), 'node_modules', 'turnsafe-store') + path.sep), resolved);

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

const textOf = (item) => (typeof item.content === 'string' ? item.content : item.content.map((c) => c.text).join(''));

const home = path.join(fs.mkdtempSync(path.join(os.tmpdir(), 'turnsafe-pkg-js-')), 'home');
const model = new ScriptedModel(['Hi there.', 'You said hello.']);
const agent = new Agent({ name: 'Assistant', instructions: 'Reply briefly.', model });
const session = new TurnsafeSession('user-42', home);
assert.equal((await run(agent, 'Hello', { session })).finalOutput, 'Hi there.');
assert.equal((await run(agent, 'What did I say?', { session })).finalOutput, 'You said hello.');
assert.deepEqual(model.requests[1].input.map(textOf), ['Hello', 'Hi there.', 'What did I say?']);
const items = await session.getItems();
assert.deepEqual(items.map(textOf), ['Hello', 'Hi there.', 'What did I say?', 'You said hello.']);
await session.close();
const shown = execFileSync(process.env.TURNSAFE_BIN, ['show', '--home', home, '--session', 'user-42', '--json'], { encoding: 'utf8' })
  .trim().split('\n').map((l) => JSON.parse(l)).filter((l) => l.type === 'message').map((l) => l.data.message);
assert.deepEqual(shown, items);
fs.rmSync(path.dirname(home), { recursive: true, force: true });
console.log(`js: run() stored ${items.length} items through TurnsafeSession; turnsafe show reads the same ${shown.length}`);
