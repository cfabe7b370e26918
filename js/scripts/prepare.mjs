// `prepare` (run by `npm install` in a clone, `npm ci`, and `npm pack`):
// builds gen/ unless it is already whole. A tarball made by `npm pack`
// carries gen/ and never runs this; a clone builds it with cargo (the
// first time, a release build of turnsafe: minutes), then jco.
import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const here = path.dirname(path.dirname(fileURLToPath(import.meta.url)));
const whole = ['gen/policy/turnsafe_policy.js', 'gen/policy/turnsafe_policy.core.wasm', 'gen/sqlite-codes.json']
  .every((f) => fs.existsSync(path.join(here, f)));
const jco = fs.existsSync(path.join(here, 'node_modules', '@bytecodealliance', 'jco'));
if (whole && (!jco || process.env.TURNSAFE_REBUILD !== '1')) process.exit(0);
execFileSync(process.execPath, [path.join(here, 'scripts', 'build.mjs')], { stdio: 'inherit' });
