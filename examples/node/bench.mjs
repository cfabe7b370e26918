// Time one policy decision through the jco-transpiled component in Node.
// Run: node bench.mjs (after `npm run build`).
import { classifyJson, evaluateJson, flushStep } from './src/policy.mjs';

const obs = JSON.stringify({ operation: 'open', code: 14, errno: 24, message: 'unable to open database file' });
const req = JSON.stringify({ observation: JSON.parse(obs), context: { receipt: { path: '/h/sessions/s1.jsonl', offset: 0, length: 231, count: 1, sha256: '5f2b'.repeat(16) } } });
const n = 50000;
for (let i = 0; i < 2000; i++) classifyJson(obs);
let t = process.hrtime.bigint();
for (let i = 0; i < n; i++) classifyJson(obs);
const classify = Number(process.hrtime.bigint() - t) / n / 1000;
t = process.hrtime.bigint();
for (let i = 0; i < n; i++) evaluateJson(req);
const evaluate = Number(process.hrtime.bigint() - t) / n / 1000;
console.log(`node jco: classify-json ${classify.toFixed(2)} us/call, evaluate-json (decision + copy) ${evaluate.toFixed(2)} us/call`);

// One whole flush through the machine, no I/O: open, a locked write, a
// wait, the write again, committed, done with its outcome.
const start = { session: 's1', uids: Array.from({ length: 10 }, (_, i) => `u${i}`), minted_uids: [], seed: 7 };
const events = [{ type: 'opened' }, { type: 'failed', code: 5, extended_code: 5, message: 'database is locked' },
  { type: 'waited', elapsed_ms: 30 }, { type: 'committed' }];
const flushes = n / 10;
t = process.hrtime.bigint();
for (let i = 0; i < flushes; i++) {
  let answer = JSON.parse(flushStep({ state: null, start }));
  for (const e of events) answer = JSON.parse(flushStep({ state: answer.state, event: e }));
  if (answer.step.type !== 'done') throw new Error('the flush did not end');
}
const flush = Number(process.hrtime.bigint() - t) / flushes / 1000;
console.log(`node jco: one whole flush through flush-step-json (5 calls) ${flush.toFixed(1)} us/flush`);
