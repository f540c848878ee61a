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
  const windows = new Map(); // window end (ms, rounded to 20 ms) -> admitted
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
        const w = Math.round((Date.now() + res.msBeforeNext) / 20) * 20;
        windows.set(w, (windows.get(w) || 0) + 1);
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
  // Windows of a fixed window that start with the first request: merge ends within 40 ms.
  const ends = [...windows.keys()].sort((a, b) => a - b);
  const merged = [];
  for (const e of ends) {
    if (merged.length && e - merged[merged.length - 1].end <= 40) merged[merged.length - 1].n += windows.get(e);
    else merged.push({ end: e, n: windows.get(e) });
  }
  const maxWindow = merged.reduce((m, w) => Math.max(m, w.n), 0);
  console.log(JSON.stringify({
    system: local === '1' ? 'rate-limiter-flexible + inMemoryBlockOnConsumed' : 'rate-limiter-flexible',
    phase, decisions: allowed + refused, allowed, refused, errors, seconds: elapsed,
    per_second: (allowed + refused) / elapsed,
    p50_us: percentile(latencies, 50), p99_us: percentile(latencies, 99),
    client_commands: commands, windows: Number(keys) > 1 ? 0 : merged.length, max_window: maxWindow,
  }));
  for (const c of clients) c.disconnect();
}
main().catch((e) => { console.error('rlf.js:', e); process.exit(1); });
