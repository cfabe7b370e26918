// The turnsafe policy component, transpiled by jco into gen/policy. The
// flush machine is called two ways, each through jco's generated bindings:
// typed (the `handle` and `flush` resources) for the write-and-commit road of
// a batch on a clean handle, and `flushStepJson` for every other step and
// state (src/flush.js says which, and why they agree). `editStepJson` drives
// every edit (see `editStep` below).
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

/**
 * The typed flush machine (WIT `handle` and `flush`), one call each: a new
 * handle; a flush started on it (`start` in the JSON form, converted here);
 * the step a flush waits on; the event that answers it. Cheaper than
 * `flushStep` by what the JSON form re-reads at every call (the state and
 * the running flush's inputs, replayed), measured in js/README.md.
 */
export const typedHandle = () => timed(() => new engine.Handle());
export const typedStart = (handle, start) => timed((s) => handle.start(s), {
  session: start.session,
  uids: start.uids,
  mintedUids: start.minted_uids,
  seed: BigInt(start.seed),
  durability: start.durability === 'unsynced' ? 'unsynced' : 'synced',
  ...(start.pending_capture ? { pendingCapture: { path: start.pending_capture.path,
    cause: start.pending_capture.cause.replaceAll('_', '-') } } : {}),
});
export const typedPoll = (flush) => timed((f) => f.poll(), flush);
export const typedEvent = (flush, event) => timed((e) => flush.handle(e), event);
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

