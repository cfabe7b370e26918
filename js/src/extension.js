// The loadable extension the host needs to close a connection to a retired
// WAL generation safely (native/no_ckpt_on_close.c, built into gen/ by
// scripts/build.mjs and shipped in the tarball for x86-64 Linux). Whether
// it loads is known at open, before anything is written: a store that
// could not switch off SQLite's checkpoint at close would find out only
// when a generation is retired, the moment it matters most.
import { fileURLToPath } from 'node:url';

import Database from 'better-sqlite3';

import { TurnsafeError } from './errors.js';

export const NO_CKPT_EXTENSION = fileURLToPath(new URL('../gen/no_ckpt_on_close.so', import.meta.url));
export const NO_CKPT_ENTRY = 'sqlite3_turnsafe_nockpt_init';

let checked = null;

/**
 * Load the extension once in this process, into a connection of its own
 * (`:memory:`), and throw a TurnsafeError (code `extension_unavailable`)
 * that says why and how to build it when it cannot be loaded.
 */
export function requireNoCkptExtension() {
  if (checked) return;
  const db = new Database(':memory:');
  try {
    db.loadExtension(NO_CKPT_EXTENSION, NO_CKPT_ENTRY);
  } catch (e) {
    throw new TurnsafeError(`turnsafe-store cannot open a store on this platform (${process.platform}-${process.arch}): `
      + `the extension that keeps a retired WAL generation from being checkpointed at close did not load from ${NO_CKPT_EXTENSION} `
      + `(${e.message}). The package ships it for x86-64 Linux; elsewhere build it with a C compiler: `
      + 'cc -shared -fPIC -O2 -nostdlib -I node_modules/better-sqlite3/deps/sqlite3 '
      + `native/no_ckpt_on_close.c -o gen/no_ckpt_on_close.so (in ${fileURLToPath(new URL('..', import.meta.url))})`,
    { code: 'extension_unavailable', path: NO_CKPT_EXTENSION });
  } finally {
    db.close();
  }
  checked = true;
}
