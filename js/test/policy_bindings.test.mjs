// jco's generated bindings as the build leaves them: its debug switch,
// `JCO_DEBUG`, is read once when the module loads rather than on every
// call into the component (scripts/build.mjs), and still works.
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import fs from 'node:fs';
import { test } from 'node:test';

const BINDINGS = new URL('../gen/policy/turnsafe_policy.js', import.meta.url);

test("the bindings read JCO_DEBUG once, at load, and nowhere else", () => {
  const js = fs.readFileSync(BINDINGS, 'utf8');
  const reads = js.match(/process\?\.env\?\.JCO_DEBUG/g) ?? [];
  assert.equal(reads.length, 1, 'JCO_DEBUG is read more than once (the build did not rewrite _debugLog)');
  assert.match(js, /const JCO_DEBUG_AT_LOAD = Boolean\(globalThis\?\.process\?\.env\?\.JCO_DEBUG\);/);
});

test('JCO_DEBUG set when the bindings load still turns their debug log on', () => {
  const code = `import { engine } from ${JSON.stringify(BINDINGS.href)}; engine.version();`;
  const run = (env) => spawnSync(process.execPath, ['--input-type=module', '-e', code],
    { encoding: 'utf8', env: { ...process.env, JCO_DEBUG: env } });
  const on = run('1');
  assert.equal(on.status, 0, on.stderr);
  assert.match(on.stdout + on.stderr, /version/);
  const off = spawnSync(process.execPath, ['--input-type=module', '-e', code], { encoding: 'utf8',
    env: Object.fromEntries(Object.entries(process.env).filter(([k]) => k !== 'JCO_DEBUG')) });
  assert.equal(off.status, 0, off.stderr);
  assert.equal(off.stdout + off.stderr, '');
});
