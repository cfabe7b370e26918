// SQLite result code names -> numbers, read from examples/sqlite-codes.json,
// which is generated from the libsqlite3-sys constants (`turnsafe codes`)
// and checked for staleness by a Rust test. Never hand-copied here.
import { readFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

const here = dirname(fileURLToPath(import.meta.url));
export const CODES = JSON.parse(readFileSync(join(here, '..', '..', 'sqlite-codes.json'), 'utf8'));

/** better-sqlite3 reports the extended code's name, e.g. `SQLITE_BUSY_SNAPSHOT`. */
export function codesOf(err) {
  const ext = typeof err?.code === 'string' ? CODES[err.code] : undefined;
  if (ext === undefined) return { code: null, extended_code: null };
  return { code: ext & 0xff, extended_code: ext };
}
