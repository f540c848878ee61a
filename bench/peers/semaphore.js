// semaphore.js — redis-semaphore's `Semaphore` (a ZSET of holders scored by
// their acquire time; acquire = a Lua try, retried every retryInterval until
// acquireTimeout; a held lock is refreshed every refreshInterval).
//
// Settings (one Semaphore object per request, on one shared ioredis client
// per process, key <prefix>:{<limiter>}:semaphore):
//   acquireTimeout  = --max-wait-ms   the request's max wait (the contract);
//   lockTimeout     = --ttl-ms        a crashed holder's permit comes back
//                                     after the same time as fairgate's
//                                     liveness TTL (library default: 10 s);
//   refreshInterval = --heartbeat-ms  refresh a held lock as often as fairgate
//                                     heartbeats (default 0.8 x lockTimeout =
//                                     2.4 s would leave only 0.6 s of slack
//                                     under load, and a late refresh loses
//                                     the lock);
//   retryInterval   = 10 ms           the library default;
//   acquireAttemptsLimit = default (unlimited).
// "queued": the first acquire attempt failed. To see that, the first attempt
// is made alone (acquireAttemptsLimit 1), then the library's own loop runs on
// with the rest of the wait after one retryInterval — the same sequence of
// attempts as a plain acquire(). Cancel uses the library's AbortSignal.
'use strict';

const Redis = require('ioredis');
const { Semaphore } = require('redis-semaphore');
const { nowNs, sleep, redisOptions } = require('./common');

const RETRY_INTERVAL_MS = 10;

module.exports.create = (opts, ctx) => {
  let client;
  const key = `${opts.prefix}:{${opts.limiter}}:semaphore`;
  const held = [];
  let lost = 0;

  function semaphore(acquireTimeout) {
    return new Semaphore(client, key, opts.maxConcurrent, {
      acquireTimeout,
      lockTimeout: opts.ttlMs,
      refreshInterval: opts.heartbeatMs,
      retryInterval: RETRY_INTERVAL_MS,
      onLockLost: (err) => {
        lost++;
        process.stderr.write(`semaphore: lock lost (${lost}): ${err.message}\n`);
      },
    });
  }

  /** acquire() with the first attempt seen apart; resolves true when acquired. */
  async function acquire(sem, maxWaitMs, signal, onQueued) {
    const started = Date.now();
    const o = sem._acquireOptions;
    const attempts = o.acquireAttemptsLimit;
    o.acquireAttemptsLimit = 1;
    let ok;
    try {
      ok = await sem.tryAcquire(signal);
    } finally {
      o.acquireAttemptsLimit = attempts;
    }
    if (ok) return true;
    onQueued();
    await sleep(RETRY_INTERVAL_MS);
    signal.throwIfAborted();
    o.acquireTimeout = Math.max(0, maxWaitMs - (Date.now() - started));
    if (o.acquireTimeout <= 0) return false;
    return sem.tryAcquire(signal);
  }

  return {
    async init() {
      client = new Redis({ ...redisOptions(opts.redis), lazyConnect: true });
      client.on('error', () => {});
      await client.connect();
      await client.ping();
    },

    async run(req) {
      const sem = semaphore(req.maxWaitMs);
      req.abort = new AbortController();
      let ok;
      try {
        ok = await acquire(sem, req.maxWaitMs, req.abort.signal, () => ctx.queued(req));
      } catch (e) {
        if (req.abort.signal.aborted) {
          req.outcome = 'cancelled';
          req.reason = 'cancelled';
          return;
        }
        throw e;
      }
      if (!ok) {
        req.outcome = 'timed_out';
        req.reason = 'timeout';
        return;
      }
      req.grant = nowNs();
      req.outcome = 'granted';
      await ctx.work(req.holdMs);
      req.release = nowNs();
      await sem.release();
    },

    cancel(req) {
      if (req.abort) req.abort.abort();
    },

    async hold(n) {
      const sems = [];
      for (let k = 0; k < n; k++) sems.push(semaphore(60000));
      const got = await Promise.all(sems.map((s) => s.tryAcquire()));
      held.push(...sems.filter((s, k) => got[k]));
      if (got.includes(false)) throw new Error('not granted within 60 s');
    },

    async releaseHeld() {
      const sems = held.splice(0);
      await Promise.all(sems.map((s) => s.release()));
    },

    async close(live) {
      for (const req of live) if (req.abort && req.grant === 0n) req.abort.abort();
      await this.releaseHeld();
      await ctx.settled(live, 3000);
      await client.quit().catch(() => {});
    },
  };
};
