// A Node fairgate client (clients/node) driven over stdin/stdout by coordinator.py.
//
//   node puppet.mjs URL[,URL...]
//
// Same commands and events as puppet.py: acquire, release, raise, abort, run,
// exit → queued, granted, rejected, error, released {how}, cancelled, lost,
// done; "t" is CLOCK_MONOTONIC in ns (process.hrtime), comparable with Python's
// time.monotonic_ns(). "abort" aborts the AbortSignal given to acquire(): it
// cancels a wait, and releases a permit that is held.
import readline from 'node:readline';
import { Fairgate, FairgateError, Rejected } from '../../clients/node/index.js';

const urls = process.argv[2].split(',');
const clients = new Map(urls.map((u) => [u, new Fairgate(u)]));
const client = (url) => {
  if (!clients.has(url)) clients.set(url, new Fairgate(url, { timeoutMs: 3000 }));
  return clients.get(url);
};

function emit(ev, id, fields = {}) {
  process.stdout.write(JSON.stringify({ ...fields, ev, id, t: Number(process.hrtime.bigint()) }) + '\n');
}

function errorFields(e) {
  if (e instanceof FairgateError)
    return {
      kind: e.name,
      reason: e.reason,
      status: e.status,
      waited: e.waitedMs == null ? null : e.waitedMs / 1000,
      retry_after: e.retryAfterMs == null ? null : e.retryAfterMs / 1000,
    };
  return { kind: e?.name ?? 'Error', reason: String(e?.message ?? e), status: 0 };
}

const orders = new Map(); // id -> {resolve, reject}
const aborts = new Map(); // id -> AbortController
const running = [];

class Boom extends Error {}

async function acquire(cmd) {
  const { id } = cmd;
  const fg = client(cmd.url ?? urls[0]);
  const controller = new AbortController();
  aborts.set(id, controller);
  const order = new Promise((resolve, reject) => orders.set(id, { resolve, reject }));
  try {
    if (cmd.lease) {
      const lease = await fg.acquireLease(cmd.limiter, { maxWaitMs: cmd.max_wait_ms, tenant: cmd.tenant });
      emit('granted', id, { permit: lease.id, lease: lease.leaseMs / 1000 });
      const how = await order;
      await lease.release();
      emit('released', id, { how });
      return;
    }
    let held;
    // run(): the permit is released when the callback settles, also when it throws.
    await fg.run(
      cmd.limiter,
      async (permit) => {
        held = permit;
        emit('granted', id, { permit: permit.id, waited: permit.waitedMs / 1000 });
        const aborted = new Promise((_, reject) => permit.signal.addEventListener('abort', () => reject(permit.signal.reason), { once: true }));
        await Promise.race([order, aborted]);
      },
      {
        maxWaitMs: cmd.max_wait_ms,
        tenant: cmd.tenant,
        signal: controller.signal,
        onQueued: (q) => emit('queued', id, { position: q.position, queued: q.queued, eta: q.estimatedWaitMs }),
        onLost: (p) => emit('lost', id, { permit: p.id }),
      },
    );
    emit('released', id, { how: 'release', released: held.released });
  } catch (e) {
    if (e instanceof Boom) emit('released', id, { how: 'exception' });
    else if (e?.name === 'AbortError') emit('cancelled', id);
    else if (e instanceof Rejected) emit('rejected', id, errorFields(e));
    else emit('error', id, errorFields(e));
  }
}

async function run(cmd) {
  const { id } = cmd;
  const fg = client(cmd.url ?? urls[0]);
  for (let r = 0; r < (cmd.rounds ?? 1); r++) {
    try {
      const permit = await fg.acquire(cmd.limiter, { maxWaitMs: cmd.max_wait_ms });
      try {
        emit('granted', id, { round: r, permit: permit.id });
        const [lo, hi] = cmd.hold_ms;
        await new Promise((res) => setTimeout(res, lo + Math.random() * (hi - lo)));
        emit('released', id, { round: r, how: 'release' });
      } finally {
        await permit.release();
      }
    } catch (e) {
      emit('error', id, { round: r, ...errorFields(e) });
    }
  }
  emit('done', id);
}

const rl = readline.createInterface({ input: process.stdin });
for await (const line of rl) {
  const cmd = JSON.parse(line);
  if (cmd.cmd === 'exit') break;
  if (cmd.cmd === 'acquire') running.push(acquire(cmd));
  else if (cmd.cmd === 'run') running.push(run(cmd));
  else if (cmd.cmd === 'release') orders.get(cmd.id)?.resolve('release');
  else if (cmd.cmd === 'raise') orders.get(cmd.id)?.reject(new Boom('boom'));
  else if (cmd.cmd === 'abort') aborts.get(cmd.id)?.abort();
}
for (const order of orders.values()) order.resolve('release'); // exit: whatever is still held is released
await Promise.race([Promise.allSettled(running), new Promise((r) => setTimeout(r, 30000))]);
process.exit(0);
