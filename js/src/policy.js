// The turnsafe policy component, transpiled by jco into gen/policy. The
// host calls only its JSON entry points: `flushStepJson` drives every flush,
// `editStepJson` drives every edit (see `editStep` below).
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

import { engine } from '../gen/policy/turnsafe_policy.js';

const here = path.dirname(fileURLToPath(import.meta.url));

/** SQLite result code names -> numbers (`turnsafe codes`, copied in by the build). */
export const CODES = JSON.parse(fs.readFileSync(path.join(here, '..', 'gen', 'sqlite-codes.json'), 'utf8'));

/** better-sqlite3 reports the extended code's name, e.g. `SQLITE_BUSY_SNAPSHOT`. */
export function codesOf(err) {
  const ext = typeof err?.code === 'string' ? CODES[err.code] : undefined;
  if (ext === undefined) return { code: null, extended_code: null };
  return { code: ext & 0xff, extended_code: ext };
}

/** Time spent inside the component, for the bench (milliseconds, high resolution). */
export const spent = { ms: 0, calls: 0 };

function timed(f, arg) {
  const t = performance.now();
  try {
    return f(arg);
  } finally {
    spent.ms += performance.now() - t;
    spent.calls += 1;
  }
}

/** One step of the flush machine: the answer's raw text. */
export const flushStep = (request) => timed((s) => engine.flushStepJson(s), JSON.stringify(request));
export const classifyJson = (s) => timed((x) => engine.classifyJson(x), s);
export const explainJson = (s) => timed((x) => engine.explainJson(x), s);
/** Whether a writer may take a lease another holder has: `{verdict, take_over}`'s raw text. */
export const decideLease = (request) => timed((s) => engine.decideLeaseJson(s), JSON.stringify(request));
/**
 * How far a failure inside a group's transaction reaches:
 * `{observation, transaction_open}` in, `{scope}`'s raw text out
 * (`batch`: its savepoint; `transaction`: the whole transaction).
 */
export const decideScope = (request) => timed((s) => engine.decideScopeJson(s), JSON.stringify(request));
export const version = () => engine.version();

/** The outcome object of a `done` answer, byte for byte as the component wrote it. */
export function outcomeText(answer) {
  const head = '"step":{"outcome":';
  const tail = ',"type":"done"}}';
  return answer.slice(answer.indexOf(head) + head.length, answer.lastIndexOf(tail));
}

/**
 * One step of the edit machine (`edit-step-json`): `{state, sticky?,
 * seed?, edit, session, event?}` in, `{state, step}` out. Each attempt is
 * one transaction; a cause the policy retries is waited out on its plan,
 * a damaged search index is written around once, anything else fails the
 * edit with its cause and copy. The decisions are the component's; this
 * only carries them.
 */
export function editStep(request) {
  const answer = JSON.parse(timed((x) => engine.editStepJson(x), JSON.stringify(request)));
  if (answer.error) throw new Error(`turnsafe policy (edit-step-json): ${answer.error}`);
  return answer;
}

