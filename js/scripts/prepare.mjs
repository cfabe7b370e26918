// `prepare` (run by `npm install` and `npm ci` in this folder, by
// `npm install path/to/turnsafe/js` elsewhere, and by `npm pack`): builds
// gen/ unless it is already whole. A tarball made by `npm pack` carries
// gen/ and never runs this. From a clone it costs a release build of the
// turnsafe binary with cargo when none is built yet (minutes), then about
// a second for jco; installed as a folder from elsewhere, npm runs this
// before it installs the folder's own dependencies, so it first installs
// them here (better-sqlite3 built from source: about a minute and a half).
import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const here = path.dirname(path.dirname(fileURLToPath(import.meta.url)));
// A schema.json without the schema's statements was written by an older build.
const hasStatements = () => {
  try {
    return Array.isArray(JSON.parse(fs.readFileSync(path.join(here, 'gen', 'schema.json'), 'utf8')).create);
  } catch {
    return false;
  }
};
const whole = ['gen/policy/turnsafe_policy.js', 'gen/policy/turnsafe_policy.core.wasm', 'gen/sqlite-codes.json', 'gen/schema.json']
  .every((f) => fs.existsSync(path.join(here, f))) && hasStatements();
if (whole) process.exit(0);
const has = (p) => fs.existsSync(path.join(here, 'node_modules', ...p.split('/')));
if (!has('@bytecodealliance/jco') || !has('better-sqlite3')) {
  if (process.env.TURNSAFE_PREPARE_NESTED === '1') {
    console.error('turnsafe-store: the build tools are still missing after installing them');
    process.exit(1);
  }
  const npm = process.env.npm_execpath;
  const [cmd, args] = npm ? [process.execPath, [npm]] : ['npm', []];
  // Its own prepare then runs this file again, with the tools, and builds.
  execFileSync(cmd, [...args, 'install', '--no-audit', '--no-fund', '--no-save'], {
    cwd: here, stdio: 'inherit', env: { ...process.env, TURNSAFE_PREPARE_NESTED: '1' },
  });
  if (fs.existsSync(path.join(here, 'gen', 'policy', 'turnsafe_policy.js')) && hasStatements()) process.exit(0);
}
execFileSync(process.execPath, [path.join(here, 'scripts', 'build.mjs')], { stdio: 'inherit' });
