// bottleneck.js — Bottleneck 2 in Redis clustering mode: one limiter per
// process, all sharing id = <prefix>-<limiter>, datastore "ioredis",
// maxConcurrent = N, clearDatastore: false, every other setting at its default
// (no minTime, no reservoir, no highWater, no job expiration; clustering
// heartbeatInterval 5 s and clientTimeout 10 s).
//
// Max wait. Bottleneck has no wait deadline and no way to withdraw a job, so:
// at the deadline, under the limiter's own register lock (so no drain is in
// the middle of registering this job), if the job is still QUEUED — in this
// process's local queue, not yet registered in Redis — it is unlinked from
// that queue and dropped with Bottleneck's own Job.doDrop (what `stop()` and
// the highWater strategies use). The request ends timed_out, and it never
// takes a permit. A job already registered when its deadline comes runs (it
// was granted in time). This reaches into Bottleneck's internals (_queues,
// _registerLock); see README.md.
//
// "queued": the job was still QUEUED once Bottleneck's own submit step
// (__submit__ then the first drain) was over, i.e. Redis had no room for it.
'use strict';

const Bottleneck = require('bottleneck');
const { nowNs, sleep, deferred, redisOptions } = require('./common');

// Redis >= 7 prefixes "ERR " to a script's redis.error_reply('UNKNOWN_CLIENT')
// (Redis 6 did not), and Bottleneck 2.19.5 compares the message exactly, so
// its own recovery (re-register a client that was dropped, re-init a missing
// settings key) never runs: a client that another one blacklisted (its
// capacity-priority answer came > 1 s late, which happens under load) stays
// dead and its queued jobs never run. This strips the prefix from those
// errors on Bottleneck's connection, i.e. restores the library's behaviour as
// written (as on Redis 6); it changes nothing else.
const BOTTLENECK_ERRORS = /^ERR (UNKNOWN_CLIENT|SETTINGS_KEY_NOT_FOUND|OVERWEIGHT:.*)$/;
function redis7ErrorShim(connection) {
  const scriptArgs = connection.__scriptArgs__.bind(connection);
  connection.__scriptArgs__ = (name, id, args, cb) =>
    scriptArgs(name, id, args, (err, replies) => {
      if (err && typeof err.message === 'string') {
        const m = BOTTLENECK_ERRORS.exec(err.message);
        if (m) err.message = m[1];
      }
      return cb(err, replies);
    });
}

module.exports.create = (opts, ctx) => {
  let limiter;
  const queuedWatch = new Map(); // job id -> req
  const held = [];
  let heldRelease = deferred();
  let nextHold = 0;

  /** Withdraws a job that is still waiting in the local queue; true if it was. */
  function withdraw(id, message) {
    return limiter._registerLock.schedule(() => {
      const status = limiter.jobStatus(id);
      if (status === 'RECEIVED') return 'retry'; // __submit__ still in flight
      if (status !== 'QUEUED') return false;
      for (const list of limiter._queues._lists) {
        for (let node = list._first; node; node = node.next) {
          if (node.value.options.id !== id) continue;
          if (node.prev) node.prev.next = node.next;
          else list._first = node.next;
          if (node.next) node.next.prev = node.prev;
          else list._last = node.prev;
          list.length--;
          if (typeof list.decr === 'function') list.decr();
          node.value.doDrop({ message });
          return true;
        }
      }
      return false;
    });
  }

  async function withdrawSoon(id, message) {
    for (let k = 0; k < 1000; k++) {
      const r = await withdraw(id, message);
      if (r !== 'retry') return r;
      await sleep(1);
    }
    return false;
  }

  return {
    async init() {
      limiter = new Bottleneck({
        id: `${opts.prefix}-${opts.limiter}`,
        maxConcurrent: opts.maxConcurrent,
        datastore: 'ioredis',
        clientOptions: redisOptions(opts.redis),
        clearDatastore: false,
      });
      limiter.on('error', (e) => process.stderr.write(`bottleneck: ${e && e.message ? e.message : e}\n`));
      redis7ErrorShim(limiter._store.connection);
      // Tell "queued" apart: still QUEUED once its own submit + first drain is over.
      const addToQueue = limiter._addToQueue;
      limiter._addToQueue = async (job) => {
        const r = await addToQueue(job);
        const req = queuedWatch.get(job.options.id);
        if (req && limiter.jobStatus(job.options.id) === 'QUEUED') ctx.queued(req);
        return r;
      };
      await limiter.ready();
    },

    async run(req) {
      const id = `${req.inst}-${req.i}`;
      req.id = id;
      queuedWatch.set(id, req);
      const job = limiter.schedule({ id }, async () => {
        req.grant = nowNs();
        await ctx.work(req.holdMs);
        req.release = nowNs();
      });
      const timer = setTimeout(() => {
        req.dropAs = req.dropAs || 'timed_out';
        withdrawSoon(id, 'timeout');
      }, req.maxWaitMs);
      try {
        await job;
        req.outcome = 'granted';
      } catch (e) {
        if (req.grant !== 0n) throw e;
        req.outcome = req.dropAs || 'rejected';
        req.reason = req.dropAs === 'timed_out' ? 'timeout' : req.dropAs === 'cancelled' ? 'cancelled' : `error: ${e.message}`;
      } finally {
        clearTimeout(timer);
        queuedWatch.delete(id);
      }
    },

    cancel(req) {
      if (!req.id || req.dropAs) return;
      req.dropAs = 'cancelled';
      withdrawSoon(req.id, 'cancelled').then((dropped) => {
        if (!dropped && req.dropAs === 'cancelled') req.dropAs = undefined;
      });
    },

    async hold(n) {
      const started = [];
      for (let k = 0; k < n; k++) {
        const up = deferred();
        started.push(up.promise);
        held.push(
          limiter.schedule({ id: `${opts.instance}-hold-${nextHold++}` }, async () => {
            up.resolve();
            await heldRelease.promise;
          }),
        );
      }
      await Promise.race([
        Promise.all(started),
        sleep(60000).then(() => {
          throw new Error('hold: not granted within 60 s');
        }),
      ]);
    },

    async releaseHeld() {
      heldRelease.resolve();
      heldRelease = deferred();
      held.splice(0);
    },

    async close(live) {
      heldRelease.resolve();
      for (const req of live) if (req.id && req.grant === 0n) this.cancel(req);
      await ctx.settled(live, 3000);
      try {
        await Promise.race([limiter.stop({ dropWaitingJobs: true }), sleep(3000)]);
      } catch (e) {
        // already stopped
      }
      await limiter.disconnect(true);
    },
  };
};
