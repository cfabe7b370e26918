// turnsafe-store: a session store for JavaScript agents whose every
// decision is the turnsafe policy component's.
export { TurnsafeSession, safeSessionId } from './session.js';
export { Store } from './store.js';
export { TurnNotPersisted, TurnsafeError, Refused, HistoryIncomplete } from './errors.js';
export { SCHEMA_VERSION } from './host.js';
