// `npm run build` (and `prepare`): writes the policy component the turnsafe
// binary carries into gen/turnsafe_policy.wasm, transpiles it with jco into
// gen/policy/ (an ES module and its core wasm), and copies the SQLite code
// table beside it. A package made by `npm pack` ships gen/, so installing
// the tarball needs no Rust; a clone builds it here with cargo.
//
// The binary, first found: $TURNSAFE_BIN; the workspace's target/release or
// target/debug `turnsafe` when it is at least as new as the policy sources
// and the schema's definitions;
// else `cargo build --release -p turnsafe-host --bin turnsafe`.
import { execFileSync } from 'node:child_process';
import os from 'node:os';
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const here = path.dirname(path.dirname(fileURLToPath(import.meta.url)));
const root = path.dirname(here);
const gen = path.join(here, 'gen');

function newestSource() {
  let newest = 0;
  const walk = (dir) => {
    let entries;
    try {
      entries = fs.readdirSync(dir, { withFileTypes: true });
    } catch {
      // a file of its own
      try {
        newest = Math.max(newest, fs.statSync(dir).mtimeMs);
      } catch {
        // not there
      }
      return;
    }
    for (const e of entries) {
      const p = path.join(dir, e.name);
      if (e.isDirectory()) walk(p);
      else newest = Math.max(newest, fs.statSync(p).mtimeMs);
    }
  };
  for (const d of ['policy/src', 'wit', 'host/src/store/schema.rs', 'host/src/store/graph.rs', 'host/src/cli/schema.rs']) {
    walk(path.join(root, d));
  }
  return newest;
}

function findBinary() {
  if (process.env.TURNSAFE_BIN) return process.env.TURNSAFE_BIN;
  if (!fs.existsSync(path.join(root, 'Cargo.toml')) || !fs.existsSync(path.join(root, 'policy'))) {
    return null;
  }
  const target = process.env.CARGO_TARGET_DIR ?? path.join(root, 'target');
  const sources = newestSource();
  for (const profile of ['release', 'debug']) {
    const bin = path.join(target, profile, 'turnsafe');
    try {
      if (fs.statSync(bin).mtimeMs >= sources) return bin;
    } catch {
      // not built
    }
  }
  console.error('turnsafe-store: building the turnsafe binary (cargo build --release), which carries the policy component');
  execFileSync('cargo', ['build', '--locked', '--release', '-p', 'turnsafe-host', '--bin', 'turnsafe'],
    { cwd: root, stdio: 'inherit' });
  return path.join(target, 'release', 'turnsafe');
}

const bin = findBinary();
if (!bin) {
  if (fs.existsSync(path.join(gen, 'policy', 'turnsafe_policy.js'))) process.exit(0);
  console.error('turnsafe-store: no component in gen/ and no turnsafe source tree to build it from');
  process.exit(1);
}
fs.mkdirSync(gen, { recursive: true });
const wasm = path.join(gen, 'turnsafe_policy.wasm');
execFileSync(bin, ['component', '--out', wasm], { stdio: ['ignore', 'ignore', 'inherit'] });
const jcoBin = path.join(here, 'node_modules', '@bytecodealliance', 'jco', 'dist', 'jco.js');
execFileSync(process.execPath, [jcoBin, 'transpile', wasm, '-o', path.join(gen, 'policy'), '--name', 'turnsafe_policy', '--quiet'],
  { stdio: 'inherit' });
fs.copyFileSync(path.join(root, 'examples', 'sqlite-codes.json'), path.join(gen, 'sqlite-codes.json'));

// jco's bindings (1.35) ask `process.env.JCO_DEBUG` several times on every
// call into the component (each `_debugLog`); a lookup in the environment
// costs about half a microsecond in Node, some 3 µs a call. It is read once,
// when the module loads, instead: what the bindings do is otherwise
// unchanged (test/policy_bindings.test.mjs checks the rewrite took).
const bindings = path.join(gen, 'policy', 'turnsafe_policy.js');
const DEBUG_LOG = `const _debugLog = (...args) => {
  if (!globalThis?.process?.env?.JCO_DEBUG) { return; }
  console.debug(...args);
};`;
const js = fs.readFileSync(bindings, 'utf8');
if (js.split(DEBUG_LOG).length === 2) {
  fs.writeFileSync(bindings, js.replace(DEBUG_LOG, `const JCO_DEBUG_AT_LOAD = Boolean(globalThis?.process?.env?.JCO_DEBUG);
const _debugLog = (...args) => {
  if (!JCO_DEBUG_AT_LOAD) { return; }
  console.debug(...args);
};`));
} else {
  console.error('turnsafe-store: jco\'s bindings have no `_debugLog` of the form this build rewrites (another jco?); left as generated');
}

// The extension that switches off SQLite's checkpoint at close on a
// connection to a retired generation (native/no_ckpt_on_close.c), built
// against better-sqlite3's own SQLite headers. It calls SQLite only through
// the routines table it is handed, so it is linked with no C library: the
// one object loads on glibc and musl alike (x86-64 Linux, as the tarball
// ships it). Without it a store refuses to open (src/extension.js).
try {
  const headers = path.join(here, 'node_modules', 'better-sqlite3', 'deps', 'sqlite3');
  execFileSync(process.env.CC ?? 'cc', ['-shared', '-fPIC', '-O2', '-nostdlib', '-fno-stack-protector', '-I', headers,
    path.join(here, 'native', 'no_ckpt_on_close.c'), '-o', path.join(gen, 'no_ckpt_on_close.so')], { stdio: 'inherit' });
} catch (e) {
  console.error(`turnsafe-store: the no-checkpoint-at-close extension was not built (${e.message})`);
  process.exit(1);
}

// The schema this binary writes, so the JavaScript host writes the same one
// from the same statements: its version, the statements that create a new
// database and the DDL of each migration that only adds, as the binary runs
// them (`turnsafe schema`, from host/src/store/schema.rs), and every object
// of a home it creates (test/interop.test.mjs compares homes).
let statements;
try {
  statements = JSON.parse(execFileSync(bin, ['schema'], { stdio: ['ignore', 'pipe', 'inherit'], encoding: 'utf8' }));
} catch (e) {
  console.error(`turnsafe-store: ${bin} did not print its schema (\`turnsafe schema\`; a turnsafe older than this package?): ${e.message}`);
  process.exit(1);
}
const probe = fs.mkdtempSync(path.join(os.tmpdir(), 'turnsafe-schema-'));
try {
  execFileSync(bin, ['append', '--home', probe, '--session', 'probe'], { input: '[{"role":"user","content":"x"}]\n',
    stdio: ['pipe', 'ignore', 'inherit'] });
  const { default: Database } = await import('better-sqlite3');
  const db = new Database(path.join(probe, 'state.db'), { readonly: true });
  const version = db.pragma('user_version', { simple: true });
  if (version !== statements.version) {
    throw new Error(`turnsafe schema says version ${statements.version}, but a home the binary creates has ${version}`);
  }
  const schema = {
    version,
    create: statements.create,
    migrations: statements.migrations,
    objects: db.prepare("SELECT type, name, tbl_name, sql FROM sqlite_master WHERE name NOT LIKE 'sqlite_%' ORDER BY type, name").all(),
  };
  db.close();
  fs.writeFileSync(path.join(gen, 'schema.json'), JSON.stringify(schema, null, 2) + '\n');
} finally {
  fs.rmSync(probe, { recursive: true, force: true });
}
