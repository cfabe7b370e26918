// Time one policy decision through the jco-transpiled component in Node.
// Run: node bench.mjs (after `npm run build`).
import { classifyJson, evaluateJson } from './src/policy.mjs';

const obs = JSON.stringify({ operation: 'open', code: 14, errno: 24, message: 'unable to open database file' });
const req = JSON.stringify({ observation: JSON.parse(obs), context: { receipt_path: '/h/sessions/s1.jsonl' } });
const n = 50000;
for (let i = 0; i < 2000; i++) classifyJson(obs);
let t = process.hrtime.bigint();
for (let i = 0; i < n; i++) classifyJson(obs);
const classify = Number(process.hrtime.bigint() - t) / n / 1000;
t = process.hrtime.bigint();
for (let i = 0; i < n; i++) evaluateJson(req);
const evaluate = Number(process.hrtime.bigint() - t) / n / 1000;
console.log(`node jco: classify-json ${classify.toFixed(2)} us/call, evaluate-json (decision + copy) ${evaluate.toFixed(2)} us/call`);
