// Folders made durable as the native host makes them (host/src/durable.rs
// `create_dir_all`): a folder's entry survives a power cut only once its
// parent folder is fsynced, and SQLite fsyncs the folder its files are in,
// never that folder's parents. A home made with its missing parents in one
// recursive mkdir, with only the home's own parent fsynced, loses every
// level above it, and every commit and receipt inside, to a power cut.
import fs from 'node:fs';
import path from 'node:path';

import { fsyncDir } from './divert.js';

/**
 * Create `dir` and its missing parents, one level at a time with `mode`,
 * fsyncing the parent of each level created here (a failure is thrown:
 * the folder would not survive a power cut).
 */
export function createDirAll(dir, mode) {
  const missing = [];
  for (let p = path.resolve(dir); ; p = path.dirname(p)) {
    try {
      fs.lstatSync(p);
      break;
    } catch (e) {
      if (e.code !== 'ENOENT') throw e;
    }
    missing.push(p);
    if (path.dirname(p) === p) break;
  }
  for (const p of missing.reverse()) {
    try {
      fs.mkdirSync(p, { mode });
    } catch (e) {
      // Made by another process meanwhile: its parent is fsynced here all
      // the same, as its maker may not have got that far.
      if (e.code !== 'EEXIST') throw e;
    }
    fsyncDir(path.dirname(p));
  }
}
