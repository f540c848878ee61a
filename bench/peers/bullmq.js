// bullmq.js — BullMQ global concurrency as a limiter. One Queue per run, named
// from --limiter (prefix "<prefix>-bullmq"), with setGlobalConcurrency(N);
// every process adds one job per request and runs a Worker (local
// concurrency N, every other option at its default: lockDuration 30 s,
// stalledInterval 30 s, ...). A job is the permit: it is granted when some
// worker — in any process — starts it, and released when it returns.
//
// The job runs wherever BullMQ puts it, so the processor stamps grant and
// release itself (the same monotonic clock: one machine) and returns them; the
// producing process learns the end from QueueEvents (one per process,
// "completed"/"failed" matched by job id — what Job.waitUntilFinished does,
// with one listener for all jobs) and writes the record.
//
// Max wait: at the deadline the producer calls job.remove(); BullMQ refuses
// to remove a job that a worker holds (active, locked), so either the job is
// gone before it started (timed_out, never granted) or it was started in time
// and is awaited to the end (granted). Cancel is the same removal.
// Jobs are added with removeOnComplete/removeOnFail so a run leaves no job
// data behind.
// "queued" is true for every request: every job waits in BullMQ's wait list
// until a worker takes it, there is no "granted at once".
// `hold` adds H jobs whose processor waits for a Pub/Sub message on
// <prefix>-bullmq:<queue>:peer-release (every process subscribes at start,
// since the hold jobs may run anywhere); `release` publishes it (on a
// connection of its own, opened at start).
'use strict';

const Redis = require('ioredis');
const { Queue, Worker, QueueEvents } = require('bullmq');
const { nowNs, sleep, deferred, redisOptions } = require('./common');

module.exports.create = (opts, ctx) => {
  const name = opts.limiter.replace(/:/g, '_');
  const prefix = `${opts.prefix}-bullmq`.replace(/:/g, '_');
  const connection = { ...redisOptions(opts.redis), maxRetriesPerRequest: null };
  const releaseChannel = `${prefix}:${name}:peer-release`;
  let queue, worker, events, sub, pub;
  const waiting = new Map(); // job id -> deferred of {event, returnvalue|failedReason}
  const activeWatch = new Map(); // job id -> deferred (hold jobs)
  const holdGroups = new Map(); // hold group -> deferred (in the process that runs the job)
  let holdGroup = null;
  let nextHold = 0;
  const jobs = new Map(); // req -> Job (for removal at exit)

  const safe = (s) => String(s).replace(/:/g, '_');

  async function processor(job) {
    const grant = nowNs();
    if (job.data.holdGroup) {
      let d = holdGroups.get(job.data.holdGroup);
      if (!d) holdGroups.set(job.data.holdGroup, (d = deferred()));
      await Promise.race([d.promise, ctx.work(2 ** 31 - 1)]); // released, or this process exits
    } else {
      await ctx.work(job.data.hold);
    }
    return { grant: grant.toString(), release: nowNs().toString() };
  }

  function settle(jobId, value) {
    const d = waiting.get(jobId);
    if (d) {
      waiting.delete(jobId);
      d.resolve(value);
    }
  }

  return {
    async init() {
      queue = new Queue(name, { connection, prefix });
      queue.on('error', (e) => process.stderr.write(`bullmq queue: ${e.message}\n`));
      events = new QueueEvents(name, { connection, prefix, lastEventId: '0-0' });
      events.on('error', (e) => process.stderr.write(`bullmq events: ${e.message}\n`));
      events.setMaxListeners(0);
      events.on('completed', ({ jobId, returnvalue }) => settle(jobId, { event: 'completed', returnvalue }));
      events.on('failed', ({ jobId, failedReason }) => settle(jobId, { event: 'failed', failedReason }));
      events.on('active', ({ jobId }) => {
        const d = activeWatch.get(jobId);
        if (d) {
          activeWatch.delete(jobId);
          d.resolve();
        }
      });
      sub = new Redis(connection);
      sub.on('error', () => {});
      sub.on('message', (channel, group) => {
        let d = holdGroups.get(group);
        if (!d) holdGroups.set(group, (d = deferred()));
        d.resolve();
      });
      await sub.subscribe(releaseChannel);
      pub = new Redis(connection);
      pub.on('error', () => {});
      await pub.ping();
      await queue.waitUntilReady();
      await queue.setGlobalConcurrency(opts.maxConcurrent);
      worker = new Worker(name, processor, { connection, prefix, concurrency: opts.maxConcurrent });
      worker.on('error', (e) => process.stderr.write(`bullmq worker: ${e.message}\n`));
      await Promise.all([worker.waitUntilReady(), events.waitUntilReady()]);
    },

    async run(req) {
      const jobId = safe(`${req.inst}-${req.i}`);
      const end = deferred();
      waiting.set(jobId, end);
      const job = await queue.add('req', { hold: req.holdMs }, { jobId, removeOnComplete: true, removeOnFail: true });
      jobs.set(req, job);
      ctx.queued(req);
      const withdraw = async (outcome) => {
        try {
          await job.remove();
        } catch (e) {
          return; // started (locked by a worker) or already finished: it runs to its end
        }
        settle(jobId, { event: outcome });
      };
      req.withdraw = withdraw;
      const remaining = req.maxWaitMs - Number(nowNs() - req.arrive) / 1e6;
      const timer = setTimeout(() => withdraw('timed_out'), Math.max(0, remaining));
      let r;
      try {
        r = await end.promise;
      } finally {
        clearTimeout(timer);
        jobs.delete(req);
      }
      if (r.event === 'completed') {
        const v = typeof r.returnvalue === 'string' ? JSON.parse(r.returnvalue) : r.returnvalue;
        req.grant = BigInt(v.grant);
        req.release = BigInt(v.release);
        req.outcome = 'granted';
      } else if (r.event === 'timed_out') {
        req.outcome = 'timed_out';
        req.reason = 'timeout';
      } else if (r.event === 'cancelled') {
        req.outcome = 'cancelled';
        req.reason = 'cancelled';
      } else {
        req.outcome = 'rejected';
        req.reason = `failed: ${r.failedReason}`;
      }
    },

    cancel(req) {
      if (req.withdraw) req.withdraw('cancelled');
    },

    async hold(n) {
      holdGroup = safe(`${opts.instance}-hold-${nextHold++}`);
      const active = [];
      for (let k = 0; k < n; k++) {
        const jobId = `${holdGroup}-${k}`;
        const d = deferred();
        activeWatch.set(jobId, d);
        active.push(d.promise);
        waiting.set(jobId, deferred());
        await queue.add('hold', { holdGroup }, { jobId, removeOnComplete: true, removeOnFail: true });
      }
      await Promise.race([
        Promise.all(active),
        sleep(60000).then(() => {
          throw new Error('hold: not started within 60 s');
        }),
      ]);
    },

    async releaseHeld() {
      if (!holdGroup) return;
      const group = holdGroup;
      holdGroup = null;
      await pub.publish(releaseChannel, group);
    },

    async close(live) {
      if (holdGroup) await this.releaseHeld().catch(() => {});
      await Promise.all(
        live.filter((req) => req.grant === 0n && req.withdraw).map((req) => req.withdraw('cancelled').catch(() => {})),
      );
      // Jobs running here end at once (their hold is cut short by exit); wait
      // for them so none is left active and locked.
      await Promise.race([worker.close(), sleep(3000)]).catch(() => {});
      await ctx.settled(live, 1000);
      await Promise.race([Promise.all([queue.close(), events.close()]), sleep(3000)]).catch(() => {});
      await sub.quit().catch(() => {});
      await pub.quit().catch(() => {});
    },
  };
};
