// Closing a handle: every lease given back, the generation checked once
// more, and a connection to a retired generation closed only with SQLite's
// checkpoint at close switched off (else kept open until the process ends).
// A room of Host (host.js).
import { fileURLToPath } from 'node:url';

import { capture } from './captures.js';
import { version } from './policy.js';

/** The extension that switches off the checkpoint at close (built into gen/ by scripts/build.mjs). */
const NO_CKPT_EXTENSION = fileURLToPath(new URL('../gen/no_ckpt_on_close.so', import.meta.url));

/** Connections to retired generations, kept open until the process ends. */
export const kept = [];

/** Host's methods for closing. */
export const closing = {
  /**
   * Switch off SQLite's checkpoint at close on this connection, the one
   * step that keeps a close from writing a retired generation over the file
   * now at the path (and unlinking the WAL by its path). better-sqlite3 has
   * no sqlite3_db_config, so a small extension does it when it is loaded
   * (native/no_ckpt_on_close.c). If it cannot be, the handle remembers, and
   * close() never closes the connection.
   */
  forbidCloseCheckpoint() {
    if (!this.db || this.ckptForbidden !== null) return;
    try {
      this.db.loadExtension(NO_CKPT_EXTENSION, 'sqlite3_turnsafe_nockpt_init');
      this.ckptForbidden = true;
    } catch (e) {
      this.ckptForbidden = false;
      this.ckptError = e.message;
    }
  },

  /**
   * Release every lease, check the generation once more, and close. A
   * connection whose generation is retired is never closed: better-sqlite3
   * cannot switch off SQLite's checkpoint at close, which would write the
   * retired frames over whatever file is at the path now.
   */
  close() {
    this.dropTyped();
    if (!this.db) return { closed: true };
    for (const s of this.cursors.keys()) this.releaseLease(s);
    let verdict = null;
    try {
      verdict = this.guard ? this.guard.check() : null;
    } catch {
      verdict = { evidence: 'probe_failed', detail: 'a guard probe failed at close' };
    }
    if (verdict || this.retired || this.stickyCause()) {
      this.forbidCloseCheckpoint();
      let captured = null;
      if (verdict && !this.captured && this.guard && verdict.evidence !== 'probe_failed') {
        this.captured = capture(this.guard, { trigger: `close: ${verdict.detail}`,
          cause: verdict.evidence === 'db_replaced' ? 'replaced' : 'deleted_wal', evidence: [verdict.evidence] }, version());
        captured = this.captured;
      }
      const reason = verdict?.detail ?? 'the handle is sticky: its generation is retired';
      if (this.ckptForbidden) {
        // Closed without a checkpoint: the retired frames stay where they were.
        this.db.close();
        this.db = null;
        return { closed: true, checkpoint: false, reason, capture: captured };
      }
      kept.push(this.db);
      this.db = null;
      return { closed: false, reason: `${reason}; the checkpoint at close could not be switched off (${this.ckptError}), `
        + 'so the connection stays open until the process ends', capture: captured };
    }
    this.db.close();
    this.db = null;
    return { closed: true };
  },
};
