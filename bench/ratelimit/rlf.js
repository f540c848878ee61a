// bench/ratelimit/rlf.js — the rate-limiter-flexible side of bench/ratelimit.sh.
// Same phases as `fairgate_rate_bench` (bench/rate_bench.cpp): 4 instances
// (one ioredis client and one RateLimiterRedis each) in this process, each
// with `inflight` concurrent request loops, for `seconds`.
// Usage: node rlf.js PORT PHASE SECONDS INFLIGHT RATE PERIOD_MS KEYS LOCAL(0|1) PREFIX
// Prints one JSON line.
'use strict';
const Redis = require('ioredis');
const { RateLimiterRedis } = require('rate-limiter-flexible');

const [port, phase, seconds, inflight, rate, periodMs, keys, local, prefix] = process.argv.slice(2);
const instances = 4;

function percentile(sorted, p) {
  if (!sorted.length) return 0;
  return sorted[Math.min(sorted.length - 1, Math.floor((p / 100) * sorted.length))];
}

async function main() {
  const clients = [];
  const limiters = [];
  let commands = 0;
  for (let i = 0; i < instances; ++i) {
    const c = new Redis({ host: '127.0.0.1', port: Number(port), enableOfflineQueue: true, maxRetriesPerRequest: 1 });
    const send = c.sendCommand.bind(c);
    c.sendCommand = (cmd, ...rest) => {
      ++commands;
      return send(cmd, ...rest);
    };
    await c.ping();
    clients.push(c);
    const opts = {
      storeClient: c,
      keyPrefix: prefix,
      points: Number(rate),
      duration: Number(periodMs) / 1000,
    };
    if (local === '1') opts.inMemoryBlockOnConsumed = Number(rate);
    limiters.push(new RateLimiterRedis(opts));
  }
  commands = 0;
  const latencies = [];
  let allowed = 0;
  let refused = 0;
  let errors = 0;
  let windows = 0; // windows opened (an admission with consumedPoints 1: a fresh key)
  let maxWindow = 0; // the most admitted in one window (consumedPoints of an admission)
  const start = Date.now();
  const end = start + Number(seconds) * 1000;
  let seq = 0;
  async function loop(l) {
    while (Date.now() < end) {
      const key = Number(keys) > 1 ? 'k' + (seq++ % Number(keys)) : 'flood';
      const t0 = process.hrtime.bigint();
      try {
        const res = await l.consume(key, 1);
        ++allowed;
        if (res.consumedPoints === 1) ++windows;
        maxWindow = Math.max(maxWindow, res.consumedPoints);
      } catch (e) {
        if (e instanceof Error) ++errors;
        else ++refused;
      }
      latencies.push(Number(process.hrtime.bigint() - t0) / 1e3);
    }
  }
  const loops = [];
  for (const l of limiters) for (let j = 0; j < Number(inflight); ++j) loops.push(loop(l));
  await Promise.all(loops);
  const elapsed = (Date.now() - start) / 1000;
  latencies.sort((a, b) => a - b);
  // An exact fixed window whose windows start with the first request admits
  // `rate` per started window under a flood.
  const exact = Number(keys) > 1 ? 0 : Number(rate) * Math.ceil((end - start) / Number(periodMs));
  console.log(JSON.stringify({
    system: local === '1' ? 'rate-limiter-flexible + inMemoryBlockOnConsumed' : 'rate-limiter-flexible',
    phase, decisions: allowed + refused, allowed, refused, errors, seconds: elapsed,
    per_second: (allowed + refused) / elapsed,
    p50_us: percentile(latencies, 50), p99_us: percentile(latencies, 99),
    client_commands: commands, windows: Number(keys) > 1 ? 0 : windows, max_window: maxWindow, exact,
  }));
  for (const c of clients) c.disconnect();
}
main().catch((e) => { console.error('rlf.js:', e); process.exit(1); });
