// Points where a test stops the store's worker thread until it says go, so
// that what a test asserts about the worker follows from events the test
// controls, never from how fast a thread happens to run. src/worker.js
// loads this file only when TURNSAFE_JS_TEST_HOOKS=1 and the file is there:
// the package does not ship test/, so a release has none of it.
//
// Every point shares one protocol, over a SharedArrayBuffer of two Int32
// cells `[reached, released]` (helpers.mjs `WorkerPoint` is the test's
// side): the worker adds one to `reached` and wakes the test each time it
// arrives at the point, then blocks until `released` has caught up.

/** Block this thread at a point: counted in `reached`, released by the test. */
function arrive(cells) {
  const n = Atomics.add(cells, 0, 1) + 1;
  Atomics.notify(cells, 0);
  for (;;) {
    const released = Atomics.load(cells, 1);
    if (released >= n) return;
    Atomics.wait(cells, 1, released);
  }
}

/** Add the hooks to the worker's operation table. */
export function install(ops) {
  // The worker stops inside this operation: whatever reaches it meanwhile
  // waits in its port, and is queued together once the test lets it go.
  ops.hold = ({ signal }) => {
    arrive(new Int32Array(signal));
    return 'released';
  };
  // From now on, every write attempt of the store's Host that fails waits
  // at the point before the flush machine hears of it: the flush goes on
  // only when the test's event loop answers.
  ops.gateFailedWrites = ({ signal }) => {
    const cells = new Int32Array(signal);
    const { host } = ops;
    const write = host.writeGroup.bind(host);
    host.writeGroup = (entries, startedMs) => {
      const events = write(entries, startedMs);
      if (events.some((e) => e.type === 'failed')) arrive(cells);
      return events;
    };
    return 'gated';
  };
}
