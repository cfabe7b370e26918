// The turnsafe session id of a free-form id (docs/DIVERT.md, "Which
// file"): the one mapping the native host (host/src/import_hermes.rs
// `safe_session_id`), the Python package and this package share.
import { createHash } from 'node:crypto';

const VALID = /^(?!\.)(?!.*\.\.)[A-Za-z0-9_.:-]{1,128}$/;

/**
 * The turnsafe session id for an SDK session id: a valid one as it is; any
 * other string maps to a stable id (a readable prefix of its safe
 * characters and a hash of the whole), as the Python package does.
 */
export function safeSessionId(sessionId) {
  if (VALID.test(sessionId)) return sessionId;
  const digest = createHash('sha256').update(Buffer.from(sessionId, 'utf8')).digest('hex').slice(0, 32);
  const prefix = Array.from(sessionId).map((c) => (/^[A-Za-z0-9_-]$/.test(c) ? c : '_')).join('').slice(0, 48).replace(/^\.+/, '');
  return prefix ? `${prefix}-h${digest}` : `h${digest}`;
}
