// A divert line read back (docs/DIVERT.md, "Line format"), as the native
// host reads it (host/src/replay.rs `parse_divert_line`, host/src/graph.rs
// `is_graph_line`, host/src/divert_files.rs `is_divert_line`), with the
// same reasons for a line that cannot be read. Fields are taken from the
// line's own text (js/src/same.js `membersOf`), never through JSON.parse
// alone: a message keeps its bytes, numbers digit for digit.
import { safeSessionId } from './safe_id.js';
import { NotJson, canonicalText, membersOf } from './same.js';

/** host/src/message.rs MAX_UID: a uid is 1 to 256 bytes. */
export const MAX_UID = 256;

const utf8 = new TextDecoder('utf-8', { fatal: true, ignoreBOM: true });

// Unicode's White_Space property, which Rust's str::trim strips (JavaScript's trim differs: U+FEFF, U+0085).
const WHITE_SPACE = /^[\t\n\v\f\r \u0085\u00a0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000]*$/;

/**
 * The members of one line, or null when it is not a JSON object
 * (`notObject`: JSON, but no object). `lossy`: bytes that are not UTF-8
 * read as U+FFFD, as replay reads a line; else they are not JSON, as the
 * native host decides whose a file is.
 */
function membersOfLine(bytes, lossy) {
  let text;
  if (lossy) {
    text = Buffer.from(bytes.buffer, bytes.byteOffset, bytes.length).toString('utf8');
  } else {
    try {
      text = utf8.decode(bytes);
    } catch {
      return { members: null, notObject: false };
    }
  }
  try {
    return { members: membersOf(text), notObject: false };
  } catch (e) {
    if (!(e instanceof NotJson)) throw e;
    try {
      canonicalText(text);
      return { members: null, notObject: true };
    } catch {
      return { members: null, notObject: false };
    }
  }
}

const stringOf = (m) => (m && m.raw.startsWith('"') ? JSON.parse(m.raw) : null);
const isObject = (m) => Boolean(m && m.raw.startsWith('{'));

/** Whether a line's members are a LangGraph line (version 3) of `session`. */
function isGraph(members, session) {
  const kind = stringOf(members.get('kind'));
  if (kind !== 'checkpoint' && kind !== 'write') return false;
  return members.get('v')?.raw === '3' && stringOf(members.get('session')) === session
    && stringOf(members.get('uid')) !== null && isObject(members.get(kind));
}

/** Whether a line's members are a message line (version 1 or 2) of `session`, readable or not. */
function isMessage(members, session) {
  const v = members.get('v')?.raw;
  return (v === '1' || v === '2') && stringOf(members.get('session')) === session
    && stringOf(members.get('uid')) !== null && isObject(members.get('message'));
}

/** Whether the bytes of a file hold at least one divert line of `session` (docs/DIVERT.md, "Whose files these are"). */
export function ownsLines(data, session) {
  for (const line of splitLines(data)) {
    if (line.blank) continue;
    const { members } = membersOfLine(line.bytes, false);
    if (members && (isGraph(members, session) || isMessage(members, session))) return true;
  }
  return false;
}

/**
 * The lines of a file's bytes: `{bytes, line, offset, blank}`, numbered
 * from 1 with the byte offset each starts at, as the ledger names them.
 */
export function splitLines(data) {
  const out = [];
  let at = 0;
  let no = 0;
  while (at < data.length) {
    const nl = data.indexOf(0x0a, at);
    const end = nl < 0 ? data.length : nl + 1;
    const bytes = data.subarray(at, end);
    no += 1;
    // Blank as replay counts it: nothing but Unicode White_Space (Rust's str::trim).
    const blank = WHITE_SPACE.test(Buffer.from(bytes.buffer, bytes.byteOffset, bytes.length).toString('utf8'));
    out.push({ bytes, line: no, offset: at, blank });
    at = end;
  }
  return out;
}

const B64 = /^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$/;

/** Standard base64 with padding, as the native host decodes a blob (no stray bits). */
const isBase64 = (s) => typeof s === 'string' && B64.test(s) && Buffer.from(s, 'base64').toString('base64') === s;

/** A JSON integer that fits an i64, as its text. */
const isI64 = (m) => {
  if (!m || !/^-?(0|[1-9][0-9]*)$/.test(m.raw)) return false;
  const n = BigInt(m.raw);
  return n >= -(2n ** 63n) && n < 2n ** 63n;
};

/**
 * Why a LangGraph line (`kind` checkpoint or write) cannot be read, as
 * host/src/graph.rs `GraphLine::parse` says it; null when it can.
 */
function graphUnreadable(members, kind, session) {
  if (members.get('v')?.raw !== '3') return 'unsupported or missing format version `v`';
  if (stringOf(members.get('session')) !== session) return 'line belongs to another session';
  const unreadable = `\`${kind}\` is missing or cannot be read`;
  const payload = members.get(kind);
  if (!isObject(payload)) return unreadable;
  const r = membersOf(payload.raw);
  const str = (k) => typeof stringOf(r.get(k)) === 'string';
  // Optional: absent, or the type (null too for an Option).
  const optStr = (k, nullable) => !r.has(k) || str(k) || (nullable && r.get(k).raw === 'null');
  const common = str('thread_id') && optStr('checkpoint_ns', false) && str('checkpoint_id') && optStr('type', true);
  const ok = kind === 'checkpoint'
    ? common && optStr('parent_checkpoint_id', true) && isBase64(stringOf(r.get('checkpoint')))
    : common && str('task_id') && optStr('task_path', false) && isI64(r.get('idx')) && str('channel')
      && isBase64(stringOf(r.get('value')));
  if (!ok) return unreadable;
  if (safeSessionId(stringOf(r.get('thread_id'))) !== session) return "the record's thread is not the file's";
  if (kind === 'checkpoint' && r.has('metadata') && !r.get('metadata').raw.startsWith('{')) {
    return 'checkpoint metadata is not a JSON object';
  }
  return null;
}

/**
 * One line of `session`'s divert file: `{kind: 'graph'}` (a LangGraph
 * line, not a message), `{kind: 'message', uid, seq, text, message}`
 * (`text`: the message's JSON text as diverted, `message`: its parsed
 * value for the index), or `{kind: 'bad', uid, reason}`.
 */
export function readLine(bytes, session) {
  const { members, notObject } = membersOfLine(bytes, true);
  if (!members) return { kind: 'bad', uid: null, reason: notObject ? 'not a JSON object' : 'torn or invalid JSON' };
  const uid = stringOf(members.get('uid'));
  const bad = (reason) => ({ kind: 'bad', uid, reason });
  const kind = stringOf(members.get('kind'));
  if (kind === 'checkpoint' || kind === 'write') {
    const why = graphUnreadable(members, kind, session);
    return why ? bad(why) : { kind: 'graph' };
  }
  const v = members.get('v')?.raw;
  if (v !== '1' && v !== '2') return bad('unsupported or missing format version `v`');
  if (stringOf(members.get('session')) !== session) return bad('line belongs to another session');
  if (uid === null || uid.length === 0 || Buffer.byteLength(uid) > MAX_UID) return bad('missing or invalid `uid`');
  const m = members.get('message');
  if (!isObject(m)) return bad('missing `message` object');
  let text = m.raw;
  if (v === '1') {
    // Version 1 wrote the uid inside the message, and always had `role`
    // and `content`; the uid lives beside the message now.
    const inner = membersOf(text);
    inner.delete('uid');
    if (!(inner.get('role')?.raw.startsWith('"') && inner.has('content'))) return bad('`message` needs `role` and `content`');
    text = `{${[...inner].map(([k, x]) => `${JSON.stringify(k)}:${x.raw}`).join(',')}}`;
  }
  let seq = null;
  const s = members.get('seq');
  if (s && s.raw !== 'null') {
    if (!/^-?(0|[1-9][0-9]*)$/.test(s.raw)) return bad('`seq` is not an integer');
    const big = BigInt(s.raw);
    if (big < -(2n ** 63n) || big >= 2n ** 63n) return bad('`seq` is not an integer');
    seq = Number.isSafeInteger(Number(big)) ? Number(big) : big;
  }
  // For the archive's role and content columns only; the row is `text`.
  return { kind: 'message', uid, seq, text, message: JSON.parse(text) };
}
