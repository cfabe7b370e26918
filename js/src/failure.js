// A failure as the flush machine (and an edit's policy) hears of it: the
// `failed` event, with SQLite's codes as the component's table names them.
import { codesOf } from './policy.js';

/** A failed SQLite call (or any failure to open) as the flush machine's `failed` event. */
export function failedEvent(err, startedMs, extra = {}) {
  let codes = codesOf(err);
  let errno = null;
  if (codes.code === null && extra.openCode) {
    // better-sqlite3 throws a codeless TypeError for a missing folder: a
    // failure to open the file is what SQLite calls CANTOPEN.
    codes = { code: 14, extended_code: 14 };
    errno = extra.errno ?? null;
  }
  return {
    type: 'failed',
    ...codes,
    message: `${err?.code && typeof err.code === 'string' ? `${err.code}: ` : ''}${err?.message ?? String(err)}`,
    errno,
    evidence: extra.evidence ?? [],
    elapsed_ms: Math.max(0, Math.round(performance.now() - startedMs)),
  };
}
