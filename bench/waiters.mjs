#!/usr/bin/env node
// bench/waiters.mjs — how many queued requests one `fairgate serve` holds, and
// at what memory cost (docs/bench.md: "waiters held", 10,000 with RSS ≤ 300 MB).
//
//   node bench/waiters.mjs --url http://127.0.0.1:PORT --pid PID [--limiter hold]
//        [--waiters 10000] [--timeout 120s]
//
// The server must run the limiter with max_concurrent = 1 and a long max wait,
// with max_connections and max_waiters_per_client above --waiters (all the
// connections come from 127.0.0.1). This script takes the one permit (an SSE
// acquire that stays open), then opens --waiters SSE acquires that queue. Once
// GET /v1/limiters/NAME says queued == --waiters it reads the server's VmRSS
// and Threads from /proc/PID/status (same machine); then it closes every
// waiter and the holder and checks that the queue empties. Prints one JSON line:
//   {"waiters":…,"queued":…,"rss_mb":…,"rss_idle_mb":…,"rss_per_waiter_kb":…,
//    "threads":…,"connect_ms":…,"drain_ms":…,"queued_after":…,"in_use_after":…,"errors":…}
// rss_per_waiter_kb = (rss_mb − rss_idle_mb) ÷ waiters, rss_idle_mb read before
// the first connection. Node 18+, no npm packages. Every wait is bounded by
// --timeout. Exit 1 when the waiters were not all queued or the queue did not
// empty, 2 on bad flags.
import fs from 'node:fs';
import http from 'node:http';
import { performance } from 'node:perf_hooks';

const usage = 'usage: node bench/waiters.mjs --url URL --pid PID [--limiter NAME] [--waiters N] [--timeout 120s]';
const opts = { url: null, pid: null, limiter: 'hold', waiters: 10000, timeout: 120000 };
const args = process.argv.slice(2);
for (let i = 0; i < args.length; i += 2) {
  const [flag, value] = [args[i], args[i + 1]];
  if (value === undefined) fail(`${flag}: missing value (${usage})`);
  if (flag === '--url') opts.url = value.replace(/\/$/, '');
  else if (flag === '--pid') opts.pid = Number(value);
  else if (flag === '--limiter') opts.limiter = value;
  else if (flag === '--waiters') opts.waiters = Number(value);
  else if (flag === '--timeout') opts.timeout = Number(/^(\d+)s$/.exec(value)?.[1] ?? NaN) * 1000;
  else fail(`${flag}: unknown option (${usage})`);
}
if (!opts.url || !(opts.pid > 0)) fail(usage);
if (!(opts.waiters >= 1 && opts.waiters <= 100000)) fail('--waiters: not in 1..100000');
if (!(opts.timeout > 0)) fail('--timeout: want seconds, e.g. 120s');

function fail(message) {
  process.stderr.write(`waiters: ${message}\n`);
  process.exit(2);
}
const now = () => performance.now();
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const deadline = now() + opts.timeout;

/** VmRSS (MB) and Threads of the server, from /proc. */
function procStatus(pid) {
  const text = fs.readFileSync(`/proc/${pid}/status`, 'utf8');
  const field = (name) => Number(new RegExp(`^${name}:\\s*(\\d+)`, 'm').exec(text)?.[1]);
  return { rssMb: field('VmRSS') / 1024, threads: field('Threads') };
}

/** GET /v1/limiters/NAME → its JSON, or null. */
function limiterStatus() {
  return new Promise((resolve) => {
    const req = http.get(`${opts.url}/v1/limiters/${opts.limiter}`, { agent: false, timeout: 10000 }, (res) => {
      let text = '';
      res.setEncoding('utf8');
      res.on('data', (c) => (text += c));
      res.on('end', () => {
        try {
          resolve(res.statusCode === 200 ? JSON.parse(text) : null);
        } catch {
          resolve(null);
        }
      });
    });
    req.on('timeout', () => req.destroy());
    req.on('error', () => resolve(null));
  });
}

/** Polls the limiter until pred(status) or the deadline; the last status. */
async function until(pred) {
  let s = null;
  while (now() < deadline) {
    s = await limiterStatus();
    if (s && pred(s)) return s;
    await sleep(100);
  }
  return s;
}

let errors = 0;
/** One SSE acquire that stays open; `onEvent(name)` for each event. */
function acquire(onEvent) {
  const req = http.request(`${opts.url}/v1/limiters/${opts.limiter}/acquire?max_wait_ms=600000`, {
    method: 'POST',
    headers: { Accept: 'text/event-stream' },
    agent: false,
  });
  let closing = false;
  req.on('response', (res) => {
    if (res.statusCode !== 200) ++errors;
    res.setEncoding('utf8');
    let buf = '';
    res.on('data', (chunk) => {
      buf += chunk;
      let i;
      while ((i = buf.indexOf('\n\n')) >= 0) {
        const block = buf.slice(0, i);
        buf = buf.slice(i + 2);
        const name = /^event: (.*)$/m.exec(block)?.[1];
        if (name) onEvent(name);
      }
    });
    res.on('error', () => {});
  });
  req.on('error', () => {
    if (!closing) ++errors;
  });
  req.end();
  return {
    close() {
      closing = true;
      req.destroy();
    },
  };
}

const idle = procStatus(opts.pid);
let granted = false;
const holder = acquire((name) => {
  if (name === 'granted') granted = true;
});
while (!granted && now() < deadline && errors === 0) await sleep(10);
if (!granted) fail('the holder was not granted (is max_concurrent 1 and the permit free?)');

const t0 = now();
let queuedEvents = 0;
const waiters = [];
for (let i = 0; i < opts.waiters && now() < deadline; i++) {
  waiters.push(acquire((name) => name === 'queued' && ++queuedEvents));
  if (i % 250 === 249) await sleep(5); // let the event loop connect what was opened
}
const full = await until((s) => s.queued >= opts.waiters || errors > 0);
const connectMs = now() - t0;
const loaded = procStatus(opts.pid);

const t1 = now();
for (const w of waiters) w.close();
const drained = await until((s) => s.queued === 0);
const drainMs = now() - t1;
holder.close();
const after = await until((s) => s.queued === 0 && s.in_use === 0);

const round = (x, d) => Math.round(x * 10 ** d) / 10 ** d;
const result = {
  waiters: opts.waiters,
  queued: full?.queued ?? null,
  rss_mb: round(loaded.rssMb, 1),
  rss_idle_mb: round(idle.rssMb, 1),
  rss_per_waiter_kb: round(((loaded.rssMb - idle.rssMb) * 1024) / opts.waiters, 2),
  threads: loaded.threads,
  connect_ms: Math.round(connectMs),
  drain_ms: drained?.queued === 0 ? Math.round(drainMs) : null,
  queued_after: after?.queued ?? null,
  in_use_after: after?.in_use ?? null,
  errors,
};
process.stdout.write(`${JSON.stringify(result)}\n`);
process.exit(result.queued === opts.waiters && result.queued_after === 0 ? 0 : 1);
