// Writes the component the turnsafe binary carries, then transpiles it
// with jco into gen/ (ES module + core wasm). No WASI shim is needed: the
// component imports nothing.
import { execFileSync } from 'node:child_process';
import { mkdirSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

const here = dirname(dirname(fileURLToPath(import.meta.url)));
const bin = process.env.TURNSAFE_BIN;
if (!bin) {
  console.error('TURNSAFE_BIN is not set: run through examples/run-all');
  process.exit(1);
}
mkdirSync(join(here, 'gen'), { recursive: true });
const wasm = join(here, 'gen', 'turnsafe_policy.wasm');
execFileSync(bin, ['component', '--out', wasm], { stdio: 'inherit' });
execFileSync(process.execPath, [join(here, 'node_modules', '@bytecodealliance', 'jco', 'dist', 'jco.js'),
  'transpile', wasm, '-o', join(here, 'gen', 'policy'), '--name', 'turnsafe_policy', '--quiet'], { stdio: 'inherit' });
