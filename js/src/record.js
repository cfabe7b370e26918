// The observations this host hands the policy, written down as they are
// made: with TURNSAFE_JS_RECORD_OBSERVATIONS naming a file, each failure
// the host observed is appended to it as one line, the observation's JSON
// (the form of examples/observations.jsonl). The shared vectors
// recorded from this host (tests/vectors/induced_js.json) come from it,
// and the test that induces each of them again (test/induced.test.mjs)
// reads what the host built from it. Without the variable nothing is written.
import fs from 'node:fs';

/**
 * Record the observation of one failure: `operation` (what the policy
 * names it by) and the host's `failed` event (codes, message, errno,
 * evidence, elapsed time), or an edit's whole observation.
 */
export function recordObservation(operation, failed) {
  const file = process.env.TURNSAFE_JS_RECORD_OBSERVATIONS;
  if (!file) return;
  const { type: _type, ...fields } = failed;
  const line = JSON.stringify({ operation, ...fields });
  try {
    // One write of a whole line: lines of several workers never interleave.
    fs.appendFileSync(file, `${line}\n`);
  } catch {
    // A record that cannot be written changes nothing the host does.
  }
}
