// The package ships gen/no_ckpt_on_close.so for x86-64 Linux. Where it
// cannot be loaded (another platform, a damaged install), a store refuses
// to open, loudly and before its home is made, rather than run without the
// one step that keeps a retired WAL generation from being checkpointed at
// close. Laid out file for file as `npm pack` ships it, with the checkout's
// dependencies, then the object taken away or replaced.
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { pathToFileURL } from 'node:url';
import { test } from 'node:test';

import { JS, tmp } from './helpers.mjs';

const SO = path.join('gen', 'no_ckpt_on_close.so');

/** The package as the tarball lays it out (no scripts run), in a fresh folder. */
function release() {
  const r = spawnSync('npm', ['pack', '--dry-run', '--json', '--ignore-scripts'], { cwd: JS, encoding: 'utf8' });
  assert.equal(r.status, 0, r.stderr);
  const files = JSON.parse(r.stdout)[0].files.map((f) => f.path);
  assert.ok(files.includes(SO), `the package does not ship ${SO}: ${files.join(' ')}`);
  const dir = tmp('turnsafe-js-release-');
  for (const f of files) {
    fs.mkdirSync(path.dirname(path.join(dir, f)), { recursive: true });
    fs.copyFileSync(path.join(JS, f), path.join(dir, f));
  }
  fs.symlinkSync(path.join(JS, 'node_modules'), path.join(dir, 'node_modules'));
  return dir;
}

// Opens a session on HOME_DIR and stores one item; prints what happened.
const OPEN = (index) => `
import fs from 'node:fs';
import { TurnsafeSession } from ${JSON.stringify(index)};
let answer;
try {
  const s = new TurnsafeSession('s1', process.env.HOME_DIR);
  await s.addItems([{ role: 'user', content: 'hi' }]);
  answer = { stored: (await s.getItems()).length };
  await s.close();
} catch (e) {
  answer = { name: e.name, code: e.code, message: e.message };
}
answer.home_made = fs.existsSync(process.env.HOME_DIR);
process.stdout.write(JSON.stringify(answer));
`;

function open(dir) {
  const file = path.join(tmp('turnsafe-js-ext-'), 'open.mjs');
  fs.writeFileSync(file, OPEN(pathToFileURL(path.join(dir, 'src', 'index.js')).href));
  const home = path.join(tmp(), 'home');
  const r = spawnSync(process.execPath, [file], { env: { ...process.env, HOME_DIR: home }, encoding: 'utf8', timeout: 60_000 });
  assert.equal(r.status, 0, r.stderr);
  return JSON.parse(r.stdout);
}

test('with the shipped extension a store opens and stores', () => {
  assert.deepEqual(open(release()), { stored: 1, home_made: true });
});

test('without the extension a store refuses to open, says why, and makes no home', () => {
  const dir = release();
  fs.rmSync(path.join(dir, SO));
  const answer = open(dir);
  assert.equal(answer.name, 'TurnsafeError', JSON.stringify(answer));
  assert.equal(answer.code, 'extension_unavailable');
  assert.match(answer.message, /cannot open a store on this platform/);
  assert.match(answer.message, /no_ckpt_on_close\.so/);
  assert.equal(answer.home_made, false);
});

test('an extension built for another machine is refused the same way', () => {
  const dir = release();
  // An ELF header for AArch64 (e_machine 183): dlopen refuses it on x86-64.
  const elf = Buffer.alloc(64);
  elf.set([0x7f, 0x45, 0x4c, 0x46, 2, 1, 1]);
  elf.writeUInt16LE(3, 16);
  elf.writeUInt16LE(183, 18);
  fs.writeFileSync(path.join(dir, SO), elf);
  const answer = open(dir);
  assert.equal(answer.code, 'extension_unavailable', JSON.stringify(answer));
  assert.equal(answer.home_made, false);
});
