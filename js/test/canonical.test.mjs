// Canonical bytes (js/src/same.js) against the vectors every runtime reads
// (tests/canonical.json): the canonical text and digest of each vector,
// each refusal, each pair; and how the host uses them.
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { test } from 'node:test';

import { NotJson, canonical, canonicalBytes, canonicalText, digest, digestBytes, digestText, same, sameText, sameTexts }
  from '../src/same.js';
import { ROOT } from './helpers.mjs';

const FILE = JSON.parse(fs.readFileSync(path.join(ROOT, 'tests', 'canonical.json'), 'utf8'));
// What the file holds today: fewer means vectors went missing.
const VECTORS = 27;
const PAIRS = 8;

test('the file holds every vector and pair', () => {
  assert.ok(FILE.vectors.length >= VECTORS, `tests/canonical.json has ${FILE.vectors.length} vectors, expected ${VECTORS}`);
  assert.ok(FILE.pairs.length >= PAIRS, `tests/canonical.json has ${FILE.pairs.length} pairs, expected ${PAIRS}`);
});

for (const v of FILE.vectors) {
  test(`vector ${v.name}`, () => {
    if (v.canonical === undefined) {
      assert.throws(() => canonicalText(v.input), NotJson, `${v.name} must be refused`);
      assert.throws(() => canonicalBytes(Buffer.from(v.input, 'utf8')), NotJson);
      return;
    }
    const got = canonicalText(v.input);
    assert.equal(got, v.canonical);
    assert.equal(digestBytes(got), v.digest);
    assert.equal(digestText(v.input), v.digest);
    // Read from a file's bytes, the same answer.
    assert.equal(canonicalBytes(Buffer.from(v.input, 'utf8')), v.canonical);
    // The canonical text is its own canonical text.
    assert.equal(canonicalText(got), got);
  });
}

for (const [i, p] of FILE.pairs.entries()) {
  test(`pair ${i}: ${p.a} vs ${p.b}`, () => {
    assert.equal(sameTexts(p.a, p.b), p.same);
    assert.equal(sameTexts(p.b, p.a), p.same);
  });
}

test('numbers keep their digits where JSON.parse would round them', () => {
  const a = '{"n":9007199254740993,"m":1.0}';
  // JSON.parse makes both of these the same object; their bytes differ.
  assert.deepEqual(JSON.parse(a), JSON.parse('{"n":9007199254740992,"m":1}'));
  assert.equal(sameTexts(a, '{"n":9007199254740992,"m":1.0}'), false);
  assert.equal(sameTexts(a, '{"m":1,"n":9007199254740993}'), false);
  assert.equal(canonicalText(a), '{"m":1.0,"n":9007199254740993}');
});

test('a live value is compared through its JSON text', () => {
  const m = { role: 'user', content: [{ type: 'text', text: 'caf\u00e9' }], z: undefined };
  assert.equal(canonical(m), '{"content":[{"text":"café","type":"text"}],"role":"user"}');
  assert.equal(sameText('{ "role": "user", "content": [{"type": "text", "text": "caf\\u00e9"}] }', m), true);
  assert.equal(sameText('{"role":"user","content":[{"type":"text","text":"cafe"}]}', m), false);
  assert.equal(same(m, { content: m.content, role: 'user' }), true);
  assert.equal(digest(m), digestBytes(canonical(m)));
  // A stored 1.0 is not the number 1 this host would write.
  assert.equal(sameText('{"n":1.0}', { n: 1 }), false);
  assert.equal(sameText('{"n":1}', { n: 1 }), true);
});

test('what is not JSON is never the same as anything', () => {
  assert.equal(sameText('{"role":', null), false);
  assert.equal(sameText('{"role":"user"}', { role: '\ud83d' }), false, 'a lone surrogate has no bytes');
  assert.equal(digestText('{"role":'), digestBytes('{"role":'));
  assert.throws(() => canonical(undefined), NotJson);
  assert.throws(() => canonicalText('"\ud83d"'), NotJson);
  assert.throws(() => canonicalText('\ufeff{}'), NotJson);
  assert.throws(() => canonicalText('{"s":"a\u0001"}'), NotJson);
  assert.throws(() => canonicalBytes(Buffer.from([0x22, 0xff, 0x22])), NotJson);
  assert.throws(() => canonicalText('[1,]'), NotJson);
  assert.throws(() => canonicalText('{"a":1} x'), NotJson);
});

test('nesting stops where the native reader stops (127 containers)', () => {
  assert.equal(canonicalText(`${'['.repeat(127)}${']'.repeat(127)}`), `${'['.repeat(127)}${']'.repeat(127)}`);
  assert.throws(() => canonicalText(`${'['.repeat(128)}${']'.repeat(128)}`), NotJson);
  assert.throws(() => canonicalText(`${'{"a":'.repeat(128)}1${'}'.repeat(128)}`), NotJson);
});
