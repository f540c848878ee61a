#!/usr/bin/env node
// worker.js — one benchmark instance of a peer system, run as its own process
// by `fairgate bench --system seed|bottleneck|semaphore|bullmq`. It speaks the
// line protocol of `fairgate bench-worker` (src/bench/worker.hpp): the same
// flags plus --system, the same stdin commands (go, hold, release, mark, exit)
// and the same stdout lines (ready, req, queued_all, done, holding, released,
// mark, error). See README.md.
'use strict';

const { commands, nowNs, line, rng, sleep, deferred } = require('./common');

const SYSTEMS = ['seed', 'bottleneck', 'semaphore', 'bullmq'];

function fail(message) {
  line({ ev: 'error', message: String(message) });
  process.exit(1);
}

function parseArgs(argv) {
  const o = {
    system: '',
    redis: '',
    prefix: 'fairgate-bench',
    limiter: 'bench',
    instance: `peer-${process.pid}`,
    maxConcurrent: 3,
    heartbeatMs: 1000,
    ttlMs: 3000,
    commandTimeoutMs: 1000,
    holdMinMs: 0,
    holdMaxMs: 0,
    maxWaitMs: 30000,
    seed: 1,
    requests: 0,
    spreadMs: 0,
    clients: 0,
    durationMs: 0,
    cancelFraction: 0,
    timeoutFraction: 0,
    holders: 0,
  };
  const names = {
    '--system': ['system', String],
    '--redis': ['redis', String],
    '--prefix': ['prefix', String],
    '--limiter': ['limiter', String],
    '--instance': ['instance', String],
    '--max-concurrent': ['maxConcurrent', Number],
    '--heartbeat-ms': ['heartbeatMs', Number],
    '--ttl-ms': ['ttlMs', Number],
    '--command-timeout-ms': ['commandTimeoutMs', Number],
    '--hold-min-ms': ['holdMinMs', Number],
    '--hold-max-ms': ['holdMaxMs', Number],
    '--max-wait-ms': ['maxWaitMs', Number],
    '--seed': ['seed', String],
    '--requests': ['requests', Number],
    '--spread-ms': ['spreadMs', Number],
    '--clients': ['clients', Number],
    '--duration-ms': ['durationMs', Number],
    '--cancel-fraction': ['cancelFraction', Number],
    '--timeout-fraction': ['timeoutFraction', Number],
    '--holders': ['holders', Number],
  };
  for (let i = 0; i < argv.length; i++) {
    let flag = argv[i];
    let value;
    const eq = flag.indexOf('=');
    if (eq > 0) {
      value = flag.slice(eq + 1);
      flag = flag.slice(0, eq);
    }
    const spec = names[flag];
    if (!spec) throw new Error(`unknown flag: ${flag}`);
    if (value === undefined) {
      if (i + 1 >= argv.length) throw new Error(`${flag}: needs a value`);
      value = argv[++i];
    }
    const v = spec[1](value);
    if (spec[1] === Number && !Number.isFinite(v)) throw new Error(`${flag}: not a number: ${value}`);
    o[spec[0]] = v;
  }
  if (!SYSTEMS.includes(o.system)) throw new Error(`--system: one of ${SYSTEMS.join(', ')}`);
  if (!o.redis) throw new Error('--redis: required');
  if (!(o.maxConcurrent >= 1)) throw new Error('--max-concurrent: at least 1');
  o.closedLoop = o.clients > 0;
  return o;
}

class Worker {
  constructor(opts) {
    this.opts = opts;
    this.random = rng(opts.seed);
    this.going = false;
    this.exiting = false;
    this.nextIndex = 0;
    this.outstanding = 0;
    this.answeredCount = 0;
    this.live = new Set();
    this.exitSignal = deferred();
    this.system = require(`./${opts.system}`).create(opts, {
      queued: (req) => this.queued(req),
      exiting: () => this.exiting,
      // The work of a granted request: its hold time, cut short by `exit`.
      work: (ms) => (ms > 0 && !this.exiting ? Promise.race([sleep(ms), this.exitSignal.promise]) : Promise.resolve()),
      // Resolves once every given request has written its record (or after `ms`).
      settled: (reqs, ms) => Promise.race([Promise.all(reqs.map((r) => r.finished.promise)), sleep(ms)]),
    });
  }

  between(lo, hi) {
    if (hi <= lo) return lo;
    return lo + Math.floor(this.random() * (hi - lo + 1));
  }
  chance(p) {
    return p > 0 && this.random() < p;
  }

  async start() {
    const ready = this.system.init();
    const timeout = sleep(15000).then(() => {
      throw new Error('not ready after 15 s: is Redis reachable?');
    });
    await Promise.race([ready, timeout]);
    line({ ev: 'ready', inst: this.opts.instance, commands: commands() });
  }

  command(text) {
    switch (text) {
      case 'go':
        return this.go();
      case 'hold':
        return this.hold();
      case 'release':
        return this.releaseHeld();
      case 'mark':
        return line({ ev: 'mark', t: nowNs(), commands: commands() });
      case 'exit':
        return this.exit();
      case '':
        return undefined;
      default:
        return line({ ev: 'error', message: `unknown command: ${text.slice(0, 40)}` });
    }
  }

  go() {
    if (this.going) return;
    this.going = true;
    this.goAt = Date.now();
    const o = this.opts;
    if (o.closedLoop) {
      this.outstanding = o.clients;
      for (let c = 0; c < o.clients; c++) this.client(c);
      return;
    }
    const offsets = [];
    for (let i = 0; i < o.requests; i++) offsets.push(o.spreadMs > 0 ? this.between(0, o.spreadMs - 1) : 0);
    offsets.sort((a, b) => a - b);
    this.outstanding = offsets.length;
    if (offsets.length === 0) return this.finish();
    for (const offset of offsets) {
      const req = this.newRequest();
      const start = () => this.run(req).then(() => this.ended());
      if (offset === 0) start();
      else setTimeout(start, offset);
    }
  }

  newRequest() {
    const o = this.opts;
    const req = {
      inst: o.instance,
      i: this.nextIndex++,
      arrive: 0n,
      grant: 0n,
      release: 0n,
      queued: false,
      seq: undefined,
      outcome: '',
      reason: undefined,
      answered: false,
      holdMs: this.between(o.holdMinMs, o.holdMaxMs),
      maxWaitMs: o.maxWaitMs,
      cancelAfterMs: undefined,
    };
    if (!o.closedLoop) {
      if (this.chance(o.timeoutFraction)) req.maxWaitMs = this.between(10, 100);
      else if (this.chance(o.cancelFraction)) req.cancelAfterMs = this.between(5, 150);
    }
    return req;
  }

  async client() {
    const o = this.opts;
    while (!this.exiting && Date.now() - this.goAt < o.durationMs) {
      await this.run(this.newRequest());
    }
    this.ended();
  }

  /** One request, start to end; writes its record. */
  async run(req) {
    if (this.exiting) {
      req.arrive = nowNs();
      req.outcome = 'cancelled';
      req.reason = 'shutdown';
      this.record(req);
      return;
    }
    req.finished = deferred();
    this.live.add(req);
    let cancelTimer;
    req.arrive = nowNs();
    try {
      const running = this.system.run(req);
      if (req.cancelAfterMs !== undefined) {
        cancelTimer = setTimeout(() => {
          if (req.grant === 0n && !req.outcome) this.system.cancel(req);
        }, req.cancelAfterMs);
      }
      await running;
    } catch (e) {
      if (!req.outcome) {
        req.outcome = 'rejected';
        req.reason = `error: ${e && e.message ? e.message : e}`.slice(0, 200);
      }
      process.stderr.write(`${this.opts.system} ${req.inst}#${req.i}: ${e && e.stack ? e.stack : e}\n`);
    } finally {
      clearTimeout(cancelTimer);
      this.live.delete(req);
    }
    this.record(req);
    req.finished.resolve();
  }

  queued(req) {
    if (req.grant === 0n && !req.outcome) req.queued = true;
    this.answered(req);
  }

  answered(req) {
    if (req.answered) return;
    req.answered = true;
    if (++this.answeredCount === this.opts.requests && !this.opts.closedLoop) line({ ev: 'queued_all' });
  }

  record(req) {
    this.answered(req);
    line({
      ev: 'req',
      inst: req.inst,
      i: req.i,
      arrive: req.arrive,
      grant: req.grant,
      release: req.release,
      queued: req.queued,
      seq: req.seq,
      outcome: req.outcome,
      reason: req.reason,
    });
  }

  ended() {
    if (--this.outstanding === 0) this.finish();
  }

  finish() {
    line({ ev: 'done', t: nowNs(), commands: commands() });
  }

  hold() {
    const n = this.opts.holders;
    if (n <= 0) return line({ ev: 'holding', t: nowNs(), n: 0 });
    this.system.hold(n).then(
      () => line({ ev: 'holding', t: nowNs(), n }),
      (e) => line({ ev: 'error', message: `hold: ${e && e.message ? e.message : e}` }),
    );
  }

  releaseHeld() {
    // As fairgate's worker: the line goes out at once, before any waiter can
    // be granted (the driver reads request records again only after it).
    const t = nowNs();
    line({ ev: 'released', t });
    Promise.resolve(this.system.releaseHeld()).catch((e) =>
      line({ ev: 'error', message: `release: ${e && e.message ? e.message : e}` }),
    );
  }

  async exit() {
    if (this.exiting) return;
    this.exiting = true;
    this.exitSignal.resolve();
    // Bounded: whatever is not closed after 10 s is left to the OS.
    setTimeout(() => process.exit(0), 10000).unref();
    try {
      await this.system.close([...this.live]);
    } catch (e) {
      process.stderr.write(`close: ${e && e.stack ? e.stack : e}\n`);
    }
    process.exit(0);
  }
}

async function main() {
  let opts;
  try {
    opts = parseArgs(process.argv.slice(2));
  } catch (e) {
    fail(e.message);
  }
  process.on('uncaughtException', (e) => fail(`uncaught: ${e && e.stack ? e.stack : e}`));
  process.on('unhandledRejection', (e) => fail(`unhandled rejection: ${e && e.stack ? e.stack : e}`));
  const worker = new Worker(opts);
  // Commands are read from the start and run once the worker is ready.
  const pending = [];
  let ready = false;
  let buffer = '';
  const feed = (text) => {
    if (ready) worker.command(text);
    else pending.push(text);
  };
  process.stdin.setEncoding('utf8');
  process.stdin.on('data', (chunk) => {
    buffer += chunk;
    let nl;
    while ((nl = buffer.indexOf('\n')) >= 0) {
      feed(buffer.slice(0, nl).replace(/\r$/, '').trim());
      buffer = buffer.slice(nl + 1);
    }
  });
  process.stdin.on('end', () => feed('exit'));
  try {
    await worker.start();
  } catch (e) {
    fail(`${opts.system} at ${opts.redis.replace(/\/\/[^@/]*@/, '//***@')}: ${e && e.message ? e.message : e}`);
  }
  ready = true;
  for (const text of pending.splice(0)) worker.command(text);
}

main();
