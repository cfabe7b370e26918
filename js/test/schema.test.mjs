// The schema has one source, the native host's definitions
// (host/src/store/schema.rs, store/graph.rs): the build writes the
// statements that binary runs into gen/schema.json (`turnsafe schema`),
// and the JavaScript host creates and migrates state.db with those alone.
// The homes either host makes are compared in interop.test.mjs.
import Database from 'better-sqlite3';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { test } from 'node:test';

import { TurnsafeSession } from '../src/index.js';
import { OLDEST_MIGRATED, SCHEMA_VERSION } from '../src/schema.js';
import { JS, ROOT, tmp, turnsafe } from './helpers.mjs';

const GEN = JSON.parse(fs.readFileSync(path.join(JS, 'gen', 'schema.json'), 'utf8'));
const user = (content) => ({ role: 'user', content });

test('gen/schema.json holds the statements the native binary runs, as it prints them', () => {
  const r = turnsafe(['schema']);
  assert.equal(r.status, 0, r.stderr);
  assert.equal(r.lines.length, 1);
  const printed = r.lines[0];
  assert.deepEqual({ version: GEN.version, create: GEN.create, migrations: GEN.migrations }, printed);
  assert.equal(SCHEMA_VERSION, printed.version);
  // Every version from the oldest this host migrates has its step.
  assert.deepEqual(printed.migrations.map((m) => m.from).filter((v) => v >= OLDEST_MIGRATED),
    Array.from({ length: SCHEMA_VERSION - OLDEST_MIGRATED }, (_, i) => OLDEST_MIGRATED + i));
});

test('the JavaScript host writes no schema statement of its own', () => {
  const ddl = /\b(CREATE|ALTER|DROP)\s+(VIRTUAL\s+)?(TABLE|INDEX|TRIGGER|VIEW)\b/i;
  const src = path.join(JS, 'src');
  const found = fs.readdirSync(src).filter((f) => f.endsWith('.js'))
    .flatMap((f) => fs.readFileSync(path.join(src, f), 'utf8').split('\n').map((line, i) => ({ f, i: i + 1, line })))
    .filter(({ line }) => ddl.test(line))
    .map(({ f, i, line }) => `${f}:${i}: ${line.trim()}`);
  assert.deepEqual(found, []);
});

test('a home older than every adding step is refused, and nothing is written', async () => {
  // Schema 2 moves rows on its way to 3: the native host alone migrates it.
  assert.ok(OLDEST_MIGRATED > 2);
  const home = tmp();
  const db = path.join(home, 'state.db');
  fs.copyFileSync(path.join(ROOT, 'tests', 'fixtures', 'state-v2.db'), db);
  const before = fs.readFileSync(db);
  const s = new TurnsafeSession('s1', home);
  await assert.rejects(s.addItems([user('a')]), (e) => e.name === 'Refused' && e.code === 'older_schema' && e.found === 2
    && /older than this host migrates \(3 to \d+\); the native host's first write migrates it/.test(e.message));
  await assert.rejects(s.getItems(), { name: 'Refused' });
  await s.close();
  assert.ok(before.equals(fs.readFileSync(db)));
  assert.ok(!fs.existsSync(`${db}-wal`));
  // The native host's first write migrates it, as the refusal says; the
  // JavaScript host then writes on.
  assert.equal(turnsafe(['append', '--home', home, '--session', 's1'], '').status, 0);
  const again = new TurnsafeSession('s1', home);
  await again.addItems([user('after')]);
  assert.equal((await again.getItems()).at(-1).content, 'after');
  await again.close();
  const c = new Database(db, { readonly: true });
  try {
    assert.equal(c.pragma('user_version', { simple: true }), SCHEMA_VERSION);
  } finally {
    c.close();
  }
});
