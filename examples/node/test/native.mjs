import { execFileSync } from 'node:child_process';
import { readdirSync, readFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

export const ROOT = join(dirname(fileURLToPath(import.meta.url)), '..', '..', '..');

/** The Rust host's answers for the same input lines. */
export function native(command, lines) {
  const bin = process.env.TURNSAFE_BIN;
  if (!bin) throw new Error('TURNSAFE_BIN is not set: run through examples/run-all');
  let out;
  try {
    out = execFileSync(bin, [command], { input: lines.join('\n') + '\n', encoding: 'utf8' });
  } catch (e) {
    out = e.stdout;
  }
  return out.split('\n').filter((l) => l.length > 0);
}

export function vectors() {
  const dir = join(ROOT, 'tests', 'vectors');
  // flush_sequences.json, lease.json and scope.json have their own runners.
  const own = new Set(['flush_sequences.json', 'lease.json', 'scope.json']);
  return readdirSync(dir).filter((f) => f.endsWith('.json') && !own.has(f)).sort()
    .flatMap((f) => JSON.parse(readFileSync(join(dir, f), 'utf8')));
}

const inCi = () => {
  const ci = (process.env.CI ?? '').toLowerCase();
  return ci === 'true' || ci === '1';
};

/**
 * A capability the test needs (root, chattr, strace, a tmpfs mount): a
 * failure under CI=true, a skip elsewhere that scripts/skip-reporter.mjs
 * counts. Returns whether the test may go on.
 */
export function need(t, ok, why) {
  if (ok) return true;
  if (inCi()) throw new Error(`missing capability under CI: ${why}`);
  t.skip(`missing capability: ${why}`);
  return false;
}
