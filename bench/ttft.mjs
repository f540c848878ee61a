#!/usr/bin/env node
// bench/ttft.mjs — time to first token of an OpenAI-compatible streaming
// endpoint (fairgate mock-llm directly, or through the gateway).
//
//   node bench/ttft.mjs --url http://127.0.0.1:9000/v1/chat/completions \
//        [--requests 200] [--concurrency 1] [--label X] [--timeout 30s] \
//        [--max-duration 5m] [--max-tokens N] [--model NAME]
//
// Sends streaming chat completions (--concurrency at a time, --requests in
// all) and records, per request, the milliseconds from sending it until the
// first `data:` line whose choices[0].delta.content is non-empty (TTFT), and
// until the stream ends (total). Prints one JSON line:
//   {"label":…,"requests":…,"ttft_ms":{"p50":…,"p99":…,"max":…},"total_ms":{"p50":…},"errors":…,…}
// Percentiles are nearest-rank over the successful requests. An error is a
// non-200 answer, a stream without content or [DONE], a network failure or a
// request over --timeout. No request starts after --max-duration.
// Node 18+ (global fetch), no npm packages. Exit 2 on bad flags, 1 when every
// request failed, else 0.

const usage =
  'usage: node bench/ttft.mjs --url URL [--requests N] [--concurrency N] [--label X] ' +
  '[--timeout 30s] [--max-duration 5m] [--max-tokens N] [--model NAME]';

function fail(message) {
  process.stderr.write(`ttft: ${message}\n`);
  process.exit(2);
}

/** "250ms", "30s", "5m" or a bare number of milliseconds → ms. */
function parseDuration(flag, text) {
  const m = /^(\d+(?:\.\d+)?)(ms|s|m)?$/.exec(text);
  if (!m) fail(`${flag}: "${text}" is not a duration (e.g. 250ms, 30s, 5m)`);
  const n = Number(m[1]) * ({ ms: 1, s: 1000, m: 60000 }[m[2] ?? 'ms']);
  if (!(n > 0)) fail(`${flag}: must be > 0`);
  return n;
}

function parseCount(flag, text, lo, hi) {
  if (!/^\d+$/.test(text)) fail(`${flag}: "${text}" is not a whole number`);
  const n = Number(text);
  if (n < lo || n > hi) fail(`${flag}: ${n} not in ${lo}..${hi}`);
  return n;
}

function parseArgs(argv) {
  const opts = { url: null, requests: 200, concurrency: 1, label: '', timeout: 30000, maxDuration: 300000,
    maxTokens: null, model: 'fairgate-mock' };
  for (let i = 0; i < argv.length; ++i) {
    const flag = argv[i];
    if (flag === '--help' || flag === '-h') {
      process.stdout.write(`${usage}\n`);
      process.exit(0);
    }
    const value = argv[i + 1];
    if (value === undefined) fail(`${flag}: missing value`);
    ++i;
    switch (flag) {
      case '--url':
        try { new URL(value); } catch { fail(`--url: "${value}" is not a URL`); }
        opts.url = value;
        break;
      case '--requests': opts.requests = parseCount(flag, value, 1, 1000000); break;
      case '--concurrency': opts.concurrency = parseCount(flag, value, 1, 10000); break;
      case '--label': opts.label = value; break;
      case '--timeout': opts.timeout = parseDuration(flag, value); break;
      case '--max-duration': opts.maxDuration = parseDuration(flag, value); break;
      case '--max-tokens': opts.maxTokens = parseCount(flag, value, 1, 1000000); break;
      case '--model': opts.model = value; break;
      default: fail(`${flag}: unknown option (${usage})`);
    }
  }
  if (!opts.url) fail(`--url: required (${usage})`);
  return opts;
}

/** One streaming request: {ttft, total} in ms, or throws. */
async function one(opts, index) {
  const body = { model: opts.model, stream: true,
    messages: [{ role: 'user', content: `ttft probe ${index}` }] };
  if (opts.maxTokens !== null) body.max_tokens = opts.maxTokens;
  const controller = new AbortController();
  const timer = setTimeout(() => controller.abort(), opts.timeout);
  const start = performance.now();
  try {
    const res = await fetch(opts.url, {
      method: 'POST', headers: { 'content-type': 'application/json', accept: 'text/event-stream' },
      body: JSON.stringify(body), signal: controller.signal,
    });
    if (res.status !== 200) {
      await res.body?.cancel().catch(() => {});
      throw new Error(`HTTP ${res.status}`);
    }
    const decoder = new TextDecoder();
    let pending = '';
    let ttft = null;
    let done = false;
    for await (const bytes of res.body) {
      pending += decoder.decode(bytes, { stream: true });
      let nl;
      while ((nl = pending.indexOf('\n')) >= 0) {
        const line = pending.slice(0, nl).replace(/\r$/, '');
        pending = pending.slice(nl + 1);
        if (!line.startsWith('data:')) continue;
        const data = line.slice(5).trim();
        if (data === '[DONE]') { done = true; continue; }
        if (ttft !== null) continue;
        let chunk;
        try { chunk = JSON.parse(data); } catch { continue; }
        const content = chunk?.choices?.[0]?.delta?.content;
        if (typeof content === 'string' && content.length > 0) ttft = performance.now() - start;
      }
    }
    if (ttft === null) throw new Error('no content in the stream');
    if (!done) throw new Error('the stream ended without [DONE]');
    return { ttft, total: performance.now() - start };
  } finally {
    clearTimeout(timer);
  }
}

/** Nearest-rank percentile of sorted `xs`, rounded to 0.01 ms; null when empty. */
function pct(xs, p) {
  if (xs.length === 0) return null;
  const rank = Math.min(xs.length, Math.max(1, Math.ceil((p / 100) * xs.length)));
  return Math.round(xs[rank - 1] * 100) / 100;
}

async function main() {
  const opts = parseArgs(process.argv.slice(2));
  const ttfts = [];
  const totals = [];
  const errorKinds = {};
  let errors = 0;
  let next = 0;
  const began = performance.now();
  async function worker() {
    while (next < opts.requests && performance.now() - began < opts.maxDuration) {
      const index = next++;
      try {
        const r = await one(opts, index);
        ttfts.push(r.ttft);
        totals.push(r.total);
      } catch (e) {
        ++errors;
        const kind = e.name === 'AbortError' ? 'timeout' : String(e.message ?? e).slice(0, 80);
        errorKinds[kind] = (errorKinds[kind] ?? 0) + 1;
      }
    }
  }
  await Promise.all(Array.from({ length: Math.min(opts.concurrency, opts.requests) }, worker));
  ttfts.sort((a, b) => a - b);
  totals.sort((a, b) => a - b);
  const out = {
    label: opts.label,
    requests: ttfts.length + errors,
    ttft_ms: { p50: pct(ttfts, 50), p99: pct(ttfts, 99), max: pct(ttfts, 100) },
    total_ms: { p50: pct(totals, 50), p99: pct(totals, 99) },
    errors,
    error_kinds: errorKinds,
    concurrency: opts.concurrency,
    wall_ms: Math.round(performance.now() - began),
  };
  process.stdout.write(`${JSON.stringify(out)}\n`);
  process.exit(ttfts.length === 0 ? 1 : 0);
}

main();
