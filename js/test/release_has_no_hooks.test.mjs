// What the package ships carries none of the tests' worker holds
// (test/worker_hooks.mjs): its file list has no test/, and a store laid out
// from exactly those files, started with TURNSAFE_JS_TEST_HOOKS=1, knows no
// hook operation. In a checkout the worker has them only with the variable
// (the tests that hold it, session.test.mjs and failures.test.mjs, set it).
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { pathToFileURL } from 'node:url';
import { test } from 'node:test';

import { JS, tmp } from './helpers.mjs';

/** The files `npm pack` puts in the tarball (no scripts run). */
function shipped() {
  const r = spawnSync('npm', ['pack', '--dry-run', '--json', '--ignore-scripts'], { cwd: JS, encoding: 'utf8' });
  assert.equal(r.status, 0, r.stderr);
  return JSON.parse(r.stdout)[0].files.map((f) => f.path);
}

// A child that asks its store's worker for a hold and prints the answer.
const ASK = (index) => `
import { TurnsafeSession } from ${JSON.stringify(index)};
const s = new TurnsafeSession('s1', process.env.HOME_DIR);
let answer;
try {
  answer = { ok: await s.store.call('hold', { signal: new SharedArrayBuffer(8) }) };
} catch (e) {
  answer = { error: e.message };
}
await s.close();
process.stdout.write(JSON.stringify(answer));
`;

function ask(index, hooks) {
  const dir = tmp('turnsafe-js-hooks-');
  const file = path.join(dir, 'ask.mjs');
  fs.writeFileSync(file, ASK(index));
  // A hold that is there is never released here: the child would be ended
  // at the bound and the test fail.
  const r = spawnSync(process.execPath, [file], {
    env: { ...process.env, TURNSAFE_JS_TEST_HOOKS: hooks, HOME_DIR: tmp() }, encoding: 'utf8', timeout: 60_000,
  });
  assert.equal(r.status, 0, r.stderr);
  return JSON.parse(r.stdout);
}

test('the package ships no test hook, and its worker has none even when asked for', () => {
  const files = shipped();
  assert.ok(files.includes('src/worker.js'), files.join(' '));
  assert.deepEqual(files.filter((f) => f.startsWith('test/')), []);
  // The release, file for file, with the checkout's installed dependencies.
  const release = tmp('turnsafe-js-release-');
  for (const f of files) {
    fs.mkdirSync(path.dirname(path.join(release, f)), { recursive: true });
    fs.copyFileSync(path.join(JS, f), path.join(release, f));
  }
  fs.symlinkSync(path.join(JS, 'node_modules'), path.join(release, 'node_modules'));
  const answer = ask(pathToFileURL(path.join(release, 'src', 'index.js')).href, '1');
  assert.match(answer.error ?? '', /unknown store operation hold/, JSON.stringify(answer));
});

test("the checkout's worker has no hold without the variable", () => {
  const answer = ask(pathToFileURL(path.join(JS, 'src', 'index.js')).href, '');
  assert.match(answer.error ?? '', /unknown store operation hold/, JSON.stringify(answer));
});
