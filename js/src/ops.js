// The operations a store runs on its Host, by name: the same table serves
// the worker thread and the in-thread mode.
import { Host } from './host.js';
import { spent } from './policy.js';

/**
 * An append's batch as the Host takes it: `texts`, the items' JSON texts as
 * a session sends them, are parsed here, in the store's thread, and stored
 * as they are (JSON.stringify of what JSON.parse makes of a text that
 * JSON.stringify wrote is that text: test/texts.test.mjs).
 */
export const batchOf = ({ session, items, texts, uids }) => (items
  ? { session, items, uids }
  : { session, items: texts.map((t) => JSON.parse(t)), uids, texts });

export function makeOps(home, options) {
  const host = new Host(home, options);
  return {
    host,
    append: (args) => {
      const { session, items, uids } = batchOf(args);
      return host.append(session, items, uids);
    },
    appendGroup: ({ batches }) => host.appendGroup(batches),
    /** A history append by operation id: done already, a conflict, or flushed. */
    appendTransaction: ({ session, items, uids }) => {
      const stored = host.storedUids(session, uids, items);
      if (stored === 'conflict') {
        throw Object.assign(new Error('Session history operation was already applied with a different transaction.'), { name: 'UserError' });
      }
      if (stored === 'all') return { already: true };
      return host.append(session, items, uids);
    },
    show: ({ session, limit }) => host.show(session, limit),
    pop: ({ session }) => host.pop(session),
    clear: ({ session }) => host.clear(session),
    replace: ({ session, expected, replacement, uids, edit }) => host.replace(session, expected, replacement, uids, edit),
    release: ({ session }) => host.releaseLease(session),
    close: () => host.close(),
    stats: () => ({ ...host.counters, componentCalls: spent.calls, componentMsTotal: spent.ms }),
    resetStats: () => {
      Object.assign(host.counters, { opens: 0, writes: 0, groups: 0, flushes: 0, typed: 0, handedOver: 0, diverts: 0, flushMs: 0, componentMs: 0 });
      spent.ms = 0;
      spent.calls = 0;
    },
    ping: () => 'pong',
  };
}
