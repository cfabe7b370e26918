// The turnsafe policy component, transpiled by jco (gen/policy). Its JSON
// entry points take and return strings.
import { engine } from '../gen/policy/turnsafe_policy.js';

export const classifyJson = (s) => engine.classifyJson(s);
export const explainJson = (s) => engine.explainJson(s);
export const evaluateJson = (s) => engine.evaluateJson(s);
export const flushStepJson = (s) => engine.flushStepJson(s);
export const decideLeaseJson = (s) => engine.decideLeaseJson(s);
export const decideScopeJson = (s) => engine.decideScopeJson(s);
export const version = () => engine.version();

/** One step of the flush machine; the answer's raw text. */
export const flushStep = (request) => engine.flushStepJson(JSON.stringify(request));

export const decide = (observation) => JSON.parse(engine.classifyJson(JSON.stringify(observation)));
export const explain = (cause, outcome, context = {}) =>
  JSON.parse(engine.explainJson(JSON.stringify({ cause, outcome, ...context })));
