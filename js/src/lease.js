// Who holds a turn lease, in a form another writer can check, and the
// probe that checks it: the native host's host/src/lease_proof.rs, written
// to the same bytes.
//
// A writer records in `sessions.lease_holder` its name and a proof of the
// process behind it, one JSON object in this field order:
// `{"name", "boot", "pidns", "pid", "start"}` (the kernel's boot id, its pid
// namespace, its pid, and that process's start time in clock ticks since
// boot; absent fields left out). A plain string there is an older writer's
// name, with nothing to check. Another writer that meets the lease probes
// the proof here and asks the policy (`decide-lease-json`) whether the lease
// ends; it never decides here.
import fs from 'node:fs';

import { mintId } from './ids.js';
import { decideLease } from './policy.js';

/** The fields of `/proc/<pid>/stat` a probe reads; null when no process has `pid`. */
function readStat(pid) {
  let text;
  try {
    text = fs.readFileSync(`/proc/${pid}/stat`, 'latin1');
  } catch (e) {
    // Only a missing entry proves the process gone; any other error is unreadable.
    if (e.code === 'ENOENT') return null;
    throw e;
  }
  // The command name (field 2) is in parentheses and may hold spaces and
  // parentheses itself, so the fields are counted from the last `)`.
  const close = text.lastIndexOf(')');
  const fields = close < 0 ? [] : text.slice(close + 1).split(/[ \t\n\f\r]+/).filter(Boolean);
  // Field 3 is the state; field 22, the 20th after the name, the start time.
  if (fields.length < 20 || !/^\d+$/.test(fields[19])) throw new Error(`unreadable /proc/${pid}/stat line`);
  return { state: fields[0][0], start: BigInt(fields[19]) };
}

let self = null;

/** This machine and this process, read once. */
function me() {
  if (self) return self;
  const pid = process.pid;
  let boot = null;
  let pidns = null;
  let start = null;
  try {
    boot = fs.readFileSync('/proc/sys/kernel/random/boot_id', 'utf8').trim() || null;
  } catch {
    // unknown: a lease of ours then names no machine
  }
  try {
    pidns = fs.readlinkSync('/proc/self/ns/pid');
  } catch {
    // unknown
  }
  try {
    start = readStat(pid)?.start ?? null;
  } catch {
    // unknown
  }
  self = { boot, pidns, pid, start };
  return self;
}

/** What goes in `lease_holder` for a lease this process takes under `name`. */
export function proofText(name) {
  const { boot, pidns, pid, start } = me();
  const parts = [`"name":${JSON.stringify(name)}`];
  if (boot !== null) parts.push(`"boot":${JSON.stringify(boot)}`);
  if (pidns !== null) parts.push(`"pidns":${JSON.stringify(pidns)}`);
  parts.push(`"pid":${pid}`);
  // A BigInt: written as its digits, never rounded.
  if (start !== null) parts.push(`"start":${start}`);
  return `{${parts.join(',')}}`;
}

const isInt = (v, min, max) => typeof v === 'bigint' && v >= min && v <= max;
const optional = (v, ok) => v === undefined || v === null || ok(v);

/**
 * A `lease_holder` as stored: a proof, or an older writer's bare name.
 * Numbers are read as BigInt so a start time is compared exactly.
 */
export function readProof(stored) {
  const text = typeof stored === 'string' ? stored : '';
  const bare = { name: text, boot: null, pidns: null, pid: null, start: null, backend_pid: null };
  if (!text.startsWith('{')) return bare;
  let v;
  try {
    // Integers as BigInt: exactly as written where Node gives the
    // reviver the source text (22 and later), else from the number.
    v = JSON.parse(text, (_k, value, ctx) => {
      if (typeof value !== 'number') return value;
      if (typeof ctx?.source === 'string') return /^-?\d+$/.test(ctx.source) ? BigInt(ctx.source) : value;
      return Number.isSafeInteger(value) ? BigInt(value) : value;
    });
  } catch {
    return bare;
  }
  const str = (x) => typeof x === 'string';
  if (v === null || typeof v !== 'object' || Array.isArray(v) || !str(v.name)
    || !optional(v.boot, str) || !optional(v.pidns, str)
    || !optional(v.pid, (x) => isInt(x, 0n, 0xffffffffn))
    || !optional(v.start, (x) => isInt(x, 0n, 0xffffffffffffffffn))
    || !optional(v.backend_pid, (x) => isInt(x, -(2n ** 31n), 2n ** 31n - 1n))
    || !optional(v.backend_start, (x) => isInt(x, -(2n ** 63n), 2n ** 63n - 1n))) {
    return bare;
  }
  return { name: v.name, boot: v.boot ?? null, pidns: v.pidns ?? null, pid: v.pid ?? null, start: v.start ?? null,
    backend_pid: v.backend_pid ?? null };
}

/** Whether a proof was recorded on this machine, in this pid namespace; null when either side's identity is unknown. */
function here(proof) {
  const m = me();
  if (proof.boot === null || proof.pidns === null) return null;
  return proof.boot === m.boot && proof.pidns === m.pidns;
}

/** What the holder's process is now, seen from here: the policy's `local` probe label. */
export function probeLocal(proof) {
  const at = here(proof);
  if (proof.pid === null || at === null) return 'unrecorded';
  if (!at) return 'other_machine';
  let stat;
  try {
    stat = readStat(proof.pid);
  } catch {
    return 'unreadable';
  }
  if (stat === null) return 'exited';
  // A zombie (or a dead task) writes nothing more.
  if (['Z', 'X', 'x'].includes(stat.state)) return 'exited';
  if (proof.start === null) return 'unreadable';
  return proof.start === stat.start ? 'running' : 'pid_reused';
}

/** The holder as the copy names it: the `lease` of a `failed` event. */
export function holderOf(proof, expiresMs) {
  const at = here(proof);
  const out = { name: proof.name, place: at === null ? 'unknown' : at ? 'this_machine' : 'other_machine' };
  if (proof.pid !== null && proof.pid > 0n) out.pid = Number(proof.pid);
  if (proof.backend_pid !== null && proof.backend_pid > 0n) out.backend_pid = Number(proof.backend_pid);
  if (expiresMs !== null && expiresMs !== undefined) out.expires_ms = expiresMs;
  return out;
}

/**
 * What a writer does about a session's lease that it does not hold:
 * `{take: true}`, or `{take: false, holder}` (who fences it). `stored` is
 * the session's `lease_holder`, `expiresMs` its expiry when a token is set
 * (null when no lease is held). SQLite has no server to ask.
 */
export function judge(session, stored, expiresMs, nowMs) {
  const proof = readProof(stored);
  const local = probeLocal(proof);
  const request = { now_ms: nowMs, local, server: 'unrecorded' };
  if (expiresMs !== null && expiresMs !== undefined) request.expires_ms = expiresMs;
  const answer = JSON.parse(decideLease(request));
  // An answer that is not a verdict leaves the lease standing.
  if (answer.take_over !== true) return { take: false, holder: holderOf(proof, expiresMs) };
  if (answer.verdict !== 'free') {
    process.emitWarning(`took over the turn lease of session ${session} from a holder that is gone: ${answer.verdict}`, {
      code: 'TURNSAFE_LEASE_TAKEOVER',
      detail: JSON.stringify({ session, old_holder: proof.name, old_pid: proof.pid === null ? null : Number(proof.pid),
        expires_ms: expiresMs ?? null, verdict: answer.verdict }),
    });
  }
  return { take: true, verdict: answer.verdict };
}

/** Host's methods for its own turn leases: taken, renewed or fenced in a write, given back (host.js). */
export const leasing = {
  takeLease(session, cur, recreate) {
    const st = this.stmts;
    const now = Date.now();
    const row = st.lease.get(session);
    const mine = cur.lease;
    const ttl = this.leaseTtlMs;
    const lost = (lease) => Object.assign(new Error("the session's turn lease is held by another writer"), { leaseLost: true, lease });
    if (row && mine) {
      if (row.lease_token === mine) {
        if (row.lease_expires_ms === null || row.lease_expires_ms - now < ttl - Math.floor(ttl / 2)) st.renew.run(now + ttl, session);
        return mine;
      }
      // We held the lease and someone else took it: fenced, whatever its
      // expiry or its holder's state.
      throw lost(row.lease_token === null ? null : holderOf(readProof(row.lease_holder), row.lease_expires_ms));
    }
    if (row) {
      // Another holder's lease ends on its expiry, or on the policy's word
      // that its holder is gone (src/lease.js); never on this writer's guess.
      const judged = judge(session, row.lease_holder, row.lease_token === null ? null : row.lease_expires_ms, now);
      if (!judged.take) throw lost(judged.holder);
      const token = mintId();
      st.take.run(token, proofText(this.holder), now + ttl, session);
      return token;
    }
    // A session row that vanished after our first batch is left missing, so
    // the insert fails with a foreign-key error and the policy decides.
    if (mine && !recreate) return mine;
    const token = mine ?? mintId();
    st.newSession.run(session, now, token, proofText(this.holder), now + ttl);
    return token;
  },

  /** Give back this handle's lease on `session`. */
  releaseLease(session) {
    const cur = this.cursors.get(session);
    if (!cur?.lease || !this.db || this.stickyCause()) return;
    try {
      this.stmts.releaseLease.run(session, cur.lease);
    } catch {
      // the lease then expires on its own
    }
    cur.lease = null;
  },
};
