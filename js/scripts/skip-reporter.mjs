// A `node --test` reporter that counts skipped and todo tests: each one is
// appended to the file named by TURNSAFE_SKIP_LOG (scripts/test-all counts
// them with the Rust and Python skips), and under CI=true any skip fails
// the run. It prints nothing else; the spec reporter still shows the tests.
import fs from 'node:fs';

const inCi = () => {
  const ci = (process.env.CI ?? '').toLowerCase();
  return ci === 'true' || ci === '1';
};

const skipped = (flag) => flag !== undefined && flag !== false;

export default async function* skipReporter(source) {
  const names = [];
  for await (const event of source) {
    if (event.type !== 'test:pass' && event.type !== 'test:fail') continue;
    const { skip, todo, name, file } = event.data;
    if (!skipped(skip) && !skipped(todo)) continue;
    const kind = skipped(skip) ? 'skip' : 'todo';
    const reason = typeof (skipped(skip) ? skip : todo) === 'string' ? (skipped(skip) ? skip : todo) : kind;
    const where = file ? `${file.split('/').slice(-2).join('/')} > ` : '';
    const line = `node ${where}${name}: ${reason.replace(/\s+/g, ' ')}\n`;
    names.push(line);
    const log = process.env.TURNSAFE_SKIP_LOG;
    if (log) fs.appendFileSync(log, line);
  }
  if (names.length > 0 && inCi()) {
    process.exitCode = 1;
    yield `error: CI=true allows no skipped test, and ${names.length} were skipped:\n${names.join('')}`;
  }
}
