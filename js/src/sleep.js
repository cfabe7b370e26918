// Waiting in a synchronous host: the policy's retry delays and the flush
// machine's `wait` step block the thread (the store's worker), never an event loop.

export const sleep = (ms) => Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0, Math.max(0, ms));
