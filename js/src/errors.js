// The errors a TurnsafeSession rejects with. Each has a `name` a caller can
// test without importing the class.

/** A batch that is not committed: `.outcome` says where every item is (the component's outcome object). */
export class TurnNotPersisted extends Error {
  constructor(outcome, outcomeText = JSON.stringify(outcome)) {
    const copy = outcome?.copy;
    super(copy ? `${outcome.error}: ${copy.title}. ${copy.body}` : String(outcome?.error ?? 'the batch was not persisted'));
    this.name = 'TurnNotPersisted';
    /** cause, action, receipt, capture, copy, uids, ... exactly as `turnsafe append` prints it. */
    this.outcome = outcome;
    this.outcomeText = outcomeText;
  }
}

/** Base of turnsafe's other errors; `cause` is the policy's cause label when there is one. */
export class TurnsafeError extends Error {
  constructor(message, props = {}) {
    super(message);
    this.name = 'TurnsafeError';
    Object.assign(this, props);
  }
}

/** Refused before anything was written: a newer schema, an invalid session id. */
export class Refused extends TurnsafeError {
  constructor(message, props = {}) {
    super(message, props);
    this.name = 'Refused';
  }
}

/** A read while an unsettled capture holds rows of the session: `.rows` (the items read) and `.captures`. */
export class HistoryIncomplete extends TurnsafeError {
  constructor(message, props = {}) {
    super(message, props);
    this.name = 'HistoryIncomplete';
  }
}

/** An error crossing from the worker, rebuilt with its class. */
export function revive(e) {
  const { name, message, ...props } = e;
  switch (name) {
    case 'Refused':
      return new Refused(message, props);
    case 'HistoryIncomplete':
      return new HistoryIncomplete(message, props);
    case 'TurnsafeError':
      return new TurnsafeError(message, props);
    default: {
      const err = new Error(message);
      err.name = name ?? 'Error';
      Object.assign(err, props);
      return err;
    }
  }
}

/** What crosses to the main thread of an error thrown in the worker. */
export function flatten(e) {
  if (!(e instanceof Error)) return { name: 'Error', message: String(e) };
  const out = { name: e.name, message: e.message };
  for (const k of Object.keys(e)) {
    const v = e[k];
    if (v === undefined || typeof v === 'function') continue;
    try {
      out[k] = structuredClone(v);
    } catch {
      out[k] = String(v);
    }
  }
  if (e.stack) out.workerStack = e.stack;
  return out;
}

// The host's own errors, thrown in the worker (or the calling thread) and
// flattened across: a Refusal crosses as Refused, an EditFailure as
// TurnsafeError, an Incomplete as HistoryIncomplete (their names).

/** A refusal before anything is written: a newer (or older) schema, an invalid session id. */
export class Refusal extends Error {
  constructor(message, extra = {}) {
    super(message);
    this.name = 'Refused';
    Object.assign(this, extra);
  }
}

/** An edit that did not happen: nothing was changed. */
export class EditFailure extends Error {
  /**
   * `copy` is the policy's copy of the failed edit (`code`, `cause`,
   * `title`, `body`, `remediation`, `details`), word for word what the
   * native host prints for the same edit and cause.
   */
  constructor(edit, session, cause, action, message, attempts, copy = null, possiblyWritten = false) {
    super(`${edit} of session ${session} failed: session_persistence_failed:${cause}: ${message}`);
    this.name = 'TurnsafeError';
    Object.assign(this, { edit, session, cause, action, attempts, copy, possiblyWritten });
  }
}

/** Reads that cannot present the transcript as complete while a capture holds rows of it. */
export class Incomplete extends Error {
  constructor(session, rows, captures) {
    super(`the history of session ${session} is not complete: an unsettled capture holds rows of it (${captures.map((c) => c.path).join(', ')})`);
    this.name = 'HistoryIncomplete';
    Object.assign(this, { session, rows, captures });
  }
}

/** A caller's mistake the SDK reports as its own UserError (a history operation replayed differently). */
export function userError(message) {
  return Object.assign(new Error(message), { userError: true, name: 'UserError' });
}
