// tests/gateway/gateway_client.mjs — clients that drive a running `fairgate
// serve` gateway in front of a running `fairgate mock-llm`, and check what
// they see. The SDK scenarios use the official `openai` npm package
// (installed into ./node_modules by scripts/test.sh, never committed).
//
//   node gateway_client.mjs SCENARIO --gateway http://127.0.0.1:P --mock http://127.0.0.1:Q [--key value]...
//
// Scenarios:
//   sdk       10 concurrent streaming completions through a limiter of 3 in front
//             of a mock whose own ceiling is 3: every stream complete, the mock never 429s.
//   timeouts  requests that time out in the queue: the SDK raises RateLimitError (429)
//             for plain requests and for streams on a `queue_events = "none"` route,
//             and an APIError with code queue_timeout inside a committed stream.
//   proxy     the reverse proxy itself: pass-through, upstream errors, path rewrite,
//             unreachable upstream, disconnects while queued and while streaming,
//             named queue events, the seed's rejection, keep-alive pooling, tenants.
// Prints "FAIL: ..." lines and one "summary: {...}" line; exits 1 when a check failed.
import http from 'node:http';
import net from 'node:net';
import { performance } from 'node:perf_hooks';

const argv = process.argv.slice(2);
const scenario = argv[0];
const opts = {};
for (let i = 1; i < argv.length; i += 2) {
  if (!argv[i].startsWith('--') || i + 1 >= argv.length) {
    console.error('usage: node gateway_client.mjs SCENARIO --gateway URL --mock URL [--key value]...');
    process.exit(2);
  }
  opts[argv[i].slice(2)] = argv[i + 1];
}
const gateways = (opts.gateway ?? '').split(',').filter(Boolean);
const gateway = gateways[0];
const mock = opts.mock;
const num = (k, d) => (opts[k] === undefined ? d : Number(opts[k]));

const failures = [];
const summary = { scenario };
function check(ok, message) {
  if (!ok) {
    failures.push(message);
    console.log(`FAIL: ${message}`);
  }
  return ok;
}
const now = () => performance.now();
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const expected = (n) => Array.from({ length: n }, (_, i) => `t${i} `).join('');

function request(base, method, path, { body, headers = {}, timeout = 15000 } = {}) {
  return new Promise((resolve) => {
    const req = http.request(base + path, { method, headers, agent: false }, (res) => {
      let text = '';
      res.setEncoding('utf8');
      res.on('data', (c) => (text += c));
      res.on('end', () => {
        let json = null;
        try {
          json = text ? JSON.parse(text) : null;
        } catch {}
        resolve({ status: res.statusCode, headers: res.headers, text, json });
      });
      res.on('error', (e) => resolve({ status: 0, error: String(e), text }));
    });
    req.setTimeout(timeout, () => req.destroy(new Error('client timeout')));
    req.on('error', (e) => resolve({ status: 0, error: String(e) }));
    if (body !== undefined) req.write(body);
    req.end();
  });
}

const chatBody = (extra = {}) =>
  JSON.stringify({ model: 'fairgate-mock', messages: [{ role: 'user', content: 'hello' }], ...extra });

/// Starts a streaming request and returns a handle: .text (all bytes so far),
/// .waitFor(substring, ms), .close() (the client goes away), .done (promise of the end).
function openStream(base, path, body, headers = {}) {
  const h = { text: '', status: 0, ended: false, headers: null };
  let req;
  h.done = new Promise((resolve) => {
    req = http.request(
      base + path,
      { method: 'POST', agent: false, headers: { 'content-type': 'application/json', ...headers } },
      (res) => {
        h.status = res.statusCode;
        h.headers = res.headers;
        res.setEncoding('utf8');
        res.on('data', (c) => (h.text += c));
        res.on('end', () => {
          h.ended = true;
          resolve(h);
        });
        res.on('error', () => {
          h.ended = true;
          resolve(h);
        });
      },
    );
    req.on('error', () => {
      h.ended = true;
      resolve(h);
    });
    req.setTimeout(30000, () => req.destroy(new Error('client timeout')));
    req.end(body);
  });
  h.waitFor = async (s, ms = 5000) => {
    const end = now() + ms;
    while (!h.text.includes(s) && !h.ended && now() < end) await sleep(5);
    return h.text.includes(s);
  };
  h.close = () => req.destroy();
  return h;
}

const stats = async () => (await request(mock, 'GET', '/stats')).json;
const limiter = async (name) => (await request(gateway, 'GET', `/v1/limiters/${name}`)).json;
async function until(what, fn, ms = 5000) {
  const end = now() + ms;
  for (;;) {
    const v = await fn();
    if (v || now() > end) return v;
    await sleep(20);
  }
}
async function idleLimiter(name) {
  return until(`${name} idle`, async () => {
    const l = await limiter(name);
    return l && l.in_use === 0 && l.queued === 0;
  });
}

// --- sdk ------------------------------------------------------------------------

async function sdk() {
  const { default: OpenAI } = await import('openai');
  const clients = num('clients', 10);
  const cap = num('cap', 3);
  const tokens = num('tokens', 20);
  // Client i talks to gateway i mod n: with several gateways on one Redis, the cap is cluster-wide.
  const sdks = gateways.map((g) => new OpenAI({ baseURL: `${g}/v1`, apiKey: 'not-needed', maxRetries: 0, timeout: 60000 }));
  const before = await stats();
  const t0 = now();
  const runs = await Promise.all(
    Array.from({ length: clients }, async (_, i) => {
      const r = { i, content: '', chunks: 0, finish: null, error: null };
      try {
        const stream = await sdks[i % sdks.length].chat.completions.create({
          model: 'fairgate-mock',
          messages: [{ role: 'user', content: `question ${i}` }],
          stream: true,
          max_tokens: tokens,
        });
        for await (const chunk of stream) {
          const c = chunk.choices?.[0];
          if (c?.delta?.content) {
            if (r.chunks === 0) r.first = now() - t0;
            r.content += c.delta.content;
            r.chunks++;
          }
          if (c?.finish_reason) r.finish = c.finish_reason;
        }
        r.end = now() - t0;
      } catch (e) {
        r.error = `${e.constructor.name} ${e.status ?? ''} ${e.message}`;
      }
      return r;
    }),
  );
  const after = await stats();
  for (const r of runs) {
    check(r.error === null, `client ${r.i}: ${r.error}`);
    check(r.content === expected(tokens), `client ${r.i}: content ${JSON.stringify(r.content)}`);
    check(r.chunks === tokens, `client ${r.i}: ${r.chunks} content chunks, want ${tokens}`);
    check(r.finish !== null, `client ${r.i}: no finish_reason`);
  }
  const rejected = after.rejected_429 - before.rejected_429;
  check(rejected === 0, `the mock answered 429 ${rejected} times: the gateway let more than its cap through`);
  check(after.completed - before.completed === clients, `the mock completed ${after.completed - before.completed}`);
  check(after.peak_in_flight <= cap, `the mock saw ${after.peak_in_flight} at once (cap ${cap})`);
  check(after.peak_in_flight === cap, `the mock never reached the cap (${after.peak_in_flight}): no queueing tested`);
  for (const g of gateways) {
    const l = await until('idle', async () => {
      const x = (await request(g, 'GET', '/v1/limiters/chat')).json;
      return x && x.in_use === 0 && x.queued === 0 ? x : null;
    });
    check(l, `gateway ${g} still holds or queues after every stream ended`);
  }
  Object.assign(summary, {
    gateways: gateways.length,
    clients,
    completed: runs.filter((r) => r.error === null && r.content === expected(tokens)).length,
    mock_429: rejected,
    mock_peak_in_flight: after.peak_in_flight,
    first_token_ms: runs.map((r) => Math.round(r.first ?? -1)).sort((a, b) => a - b),
  });
}

// --- timeouts --------------------------------------------------------------------

async function timeouts() {
  const { default: OpenAI, RateLimitError, APIError } = await import('openai');
  const sdkFor = (prefix) =>
    new OpenAI({ baseURL: `${gateway}${prefix}/v1`, apiKey: 'not-needed', maxRetries: 0, timeout: 60000 });
  const comment = sdkFor('/one');
  const none = sdkFor('/none');
  const before = await stats();

  // A holder of the only permit of limiter "one" (max_wait 300 ms) for about 2 s,
  // so the three below time out in the queue even on a slow (sanitized, loaded) machine.
  const holder = openStream(gateway, '/one/v1/chat/completions', chatBody({ stream: true, max_tokens: 400 }));
  check(await holder.waitFor('"t0 "', 5000), 'the holder got no first token');

  const plain = comment.chat.completions
    .create({ model: 'fairgate-mock', messages: [{ role: 'user', content: 'x' }] })
    .then(() => null, (e) => e);
  const noneStream = none.chat.completions
    .create({ model: 'fairgate-mock', messages: [{ role: 'user', content: 'x' }], stream: true })
    .then(async (s) => {
      for await (const _ of s);
      return null;
    }, (e) => e);
  const commentStream = comment.chat.completions
    .create({ model: 'fairgate-mock', messages: [{ role: 'user', content: 'x' }], stream: true })
    .then(
      async (s) => {
        try {
          for await (const _ of s);
          return null;
        } catch (e) {
          return e;
        }
      },
      (e) => e,
    );
  const [e1, e2, e3] = await Promise.all([plain, noneStream, commentStream]);
  await holder.done;

  check(e1 instanceof RateLimitError, `plain request: want RateLimitError, got ${e1?.constructor?.name} ${e1?.message}`);
  check(e1?.status === 429, `plain request: status ${e1?.status}`);
  check(e1?.code === 'queue_timeout' && e1?.type === 'rate_limit_error', `plain request: code ${e1?.code} type ${e1?.type}`);
  check(Number(e1?.headers?.get?.('retry-after')) >= 1, `plain request: Retry-After ${e1?.headers?.get?.('retry-after')}`);
  check(e2 instanceof RateLimitError && e2.status === 429, `stream on queue_events=none: got ${e2?.constructor?.name} ${e2?.status}`);
  check(e2?.code === 'queue_timeout', `stream on queue_events=none: code ${e2?.code}`);
  check(e3 instanceof APIError && !(e3 instanceof RateLimitError), `committed stream: got ${e3?.constructor?.name}`);
  check(e3?.code === 'queue_timeout' && e3?.type === 'rate_limit_error', `committed stream: code ${e3?.code} type ${e3?.type}`);
  check(holder.text.includes('data: [DONE]'), 'the holder stream did not end with [DONE]');

  // The permit is free again: a request goes through.
  const ok = await comment.chat.completions
    .create({ model: 'fairgate-mock', messages: [{ role: 'user', content: 'x' }], max_tokens: 3 })
    .then((r) => r, (e) => e);
  check(ok?.choices?.[0]?.message?.content === expected(3), `after the timeouts: ${ok?.message ?? JSON.stringify(ok)}`);
  const after = await stats();
  check(after.rejected_429 === before.rejected_429, 'the mock answered 429');
  check(after.requests - before.requests === 2, `the mock saw ${after.requests - before.requests} requests, want 2 (timed-out ones never reach it)`);
  check(await idleLimiter('one'), 'limiter one not idle at the end');
  Object.assign(summary, {
    plain: `${e1?.constructor?.name} ${e1?.status} ${e1?.code}`,
    stream_none: `${e2?.constructor?.name} ${e2?.status} ${e2?.code}`,
    stream_comment: `${e3?.constructor?.name} ${e3?.status} ${e3?.code}`,
  });
}

// --- proxy -------------------------------------------------------------------------

async function proxy() {
  const json = { 'content-type': 'application/json' };
  // 1. A plain answer through the gateway equals the mock's own.
  const direct = await request(mock, 'POST', '/v1/chat/completions', { body: chatBody({ max_tokens: 5 }), headers: json });
  const via = await request(gateway, 'POST', '/v1/chat/completions', { body: chatBody({ max_tokens: 5 }), headers: json });
  check(via.status === 200, `plain via gateway: ${via.status} ${via.text}`);
  check(via.json?.choices?.[0]?.message?.content === direct.json?.choices?.[0]?.message?.content,
        `plain content differs: ${via.text} vs ${direct.text}`);
  check(JSON.stringify(via.json?.usage) === JSON.stringify(direct.json?.usage), 'usage differs');
  check(via.headers['content-type'] === direct.headers['content-type'], 'content-type not passed through');

  // 2. A stream through the gateway: the same events as direct, byte for byte (ids and times aside).
  const norm = (t) => t.replace(/"id":"[^"]*"/g, '"id":""').replace(/"created":\d+/g, '"created":0');
  const ds = openStream(mock, '/v1/chat/completions', chatBody({ stream: true, max_tokens: 6 }));
  const gs = openStream(gateway, '/v1/chat/completions', chatBody({ stream: true, max_tokens: 6 }));
  await Promise.all([ds.done, gs.done]);
  check(gs.status === 200 && norm(gs.text) === norm(ds.text), `stream differs:\n${gs.text}\nvs\n${ds.text}`);

  // 3. Upstream errors pass through with their status and body.
  const bad = await request(gateway, 'POST', '/v1/chat/completions', { body: '{"model":"x"}', headers: json });
  check(bad.status === 400 && bad.json?.error?.type === 'invalid_request_error', `upstream 400: ${bad.status} ${bad.text}`);
  // 4. Path rewrite (upstream with a path) and an upstream 404.
  const models = await request(gateway, 'GET', '/raw/v1/models');
  check(models.status === 200 && models.json?.data?.[0]?.id === 'fairgate-mock', `rewrite: ${models.status} ${models.text}`);
  const missing = await request(gateway, 'GET', '/raw/nowhere');
  check(missing.status === 404, `upstream 404: ${missing.status}`);
  // 5. An unreachable upstream: 502 in the OpenAI shape.
  const down = await request(gateway, 'POST', '/down/v1/chat/completions', { body: chatBody(), headers: json });
  check(down.status === 502 && down.json?.error?.code === 'upstream_unreachable', `unreachable: ${down.status} ${down.text}`);

  // 6. Disconnect while streaming: the upstream call is aborted, the permit released.
  let s0 = await stats();
  const cut = openStream(gateway, '/v1/chat/completions', chatBody({ stream: true, max_tokens: 400 }));
  check(await cut.waitFor('"t2 "'), 'no tokens before the cut');
  cut.close();
  check(await until('abort', async () => (await stats()).client_aborts > s0.client_aborts), 'the mock did not see the abort');
  check(await idleLimiter('chat'), 'permit not released after a disconnect while streaming');

  // 7. Disconnect while queued (limiter "one"): the queue empties and the mock never sees it.
  const holder = openStream(gateway, '/named/v1/chat/completions', chatBody({ stream: true, max_tokens: 200 }));
  check(await holder.waitFor('"t0 "'), 'holder on limiter one got no token');
  s0 = await stats();
  const waiter = openStream(gateway, '/named/v1/chat/completions', chatBody({ stream: true, max_tokens: 2 }));
  check(await waiter.waitFor('event: queue'), `no named queue event: ${JSON.stringify(waiter.text)}`);
  check(/event: queue\ndata: \{"position":1,"queued":\d+/.test(waiter.text), `queue event shape: ${JSON.stringify(waiter.text)}`);
  check((await limiter('one')).queued === 1, 'the waiter is not queued');
  waiter.close();
  check(await until('left', async () => (await limiter('one')).queued === 0), 'the queue did not empty after a disconnect');
  // A waiter that stays is told when it is admitted, before the model's first token.
  const stays = openStream(gateway, '/named/v1/chat/completions', chatBody({ stream: true, max_tokens: 2 }));
  check(await stays.waitFor('event: queue'), 'the second waiter was not queued');
  await holder.done;
  await stays.done;
  const admittedAt = stays.text.search(/event: admitted\ndata: \{"waited_ms":\d+\}/);
  check(admittedAt > 0 && admittedAt < stays.text.indexOf('"t0 "'), `no admitted event before the first token: ${JSON.stringify(stays.text.slice(0, 300))}`);
  check((await stats()).requests - s0.requests === 1, 'a cancelled waiter reached the upstream');

  // 8. The seed's rejection sequence (limiter "one", max_wait 300 ms).
  const h2 = openStream(gateway, '/named/v1/chat/completions', chatBody({ stream: true, max_tokens: 400 }));
  check(await h2.waitFor('"t0 "'), 'holder 2 got no token');
  const seed = openStream(gateway, '/seed/v1/chat/completions', chatBody({ stream: true, conversation_id: 'c-7' }));
  await seed.done;
  const events = [...seed.text.matchAll(/^event: (\w+)$/gm)].map((m) => m[1]);
  check(JSON.stringify(events) === '["META","REJECT","FINISH","DONE"]', `seed events ${JSON.stringify(events)}: ${seed.text}`);
  check(seed.text.includes('"conversationId":"c-7"'), 'META lacks the conversation id');
  await h2.done;

  // 9. Keep-alive pooling: ten sequential calls open at most two upstream connections.
  const metric = async (name) => {
    const m = (await request(gateway, 'GET', '/metrics')).text.match(new RegExp(`^${name}\\{route="/v1/chat/completions"\\} (\\d+)$`, 'm'));
    return m ? Number(m[1]) : NaN;
  };
  const opened0 = await metric('fairgate_gateway_upstream_connections_opened_total');
  for (let i = 0; i < 10; i++) await request(gateway, 'POST', '/v1/chat/completions', { body: chatBody({ max_tokens: 1 }), headers: json });
  const opened = (await metric('fairgate_gateway_upstream_connections_opened_total')) - opened0;
  check(opened <= 2, `ten sequential calls opened ${opened} upstream connections`);
  const idle = await metric('fairgate_gateway_upstream_connections_idle');
  check(idle >= 1 && idle <= 2, `after ten sequential calls ${idle} idle upstream connections are kept`);

  // 10. The tenant header reaches the limiter.
  const t = openStream(gateway, '/v1/chat/completions', chatBody({ stream: true, max_tokens: 60 }), { 'x-user-id': 'alice' });
  check(await t.waitFor('"t0 "'), 'tenant stream got no token');
  const holders = (await limiter('chat')).holders ?? [];
  check(holders.some((x) => x.tenant === 'alice'), `tenant not seen: ${JSON.stringify(holders)}`);
  await t.done;
  const badTenant = await request(gateway, 'POST', '/v1/chat/completions', { body: chatBody(), headers: { ...json, 'x-user-id': 'a'.repeat(200) } });
  check(badTenant.status === 400 && badTenant.json?.error?.code === 'invalid_tenant', `bad tenant: ${badTenant.status}`);
  // The one tenant rule (printable ASCII without spaces, 1..128), as in the admission API.
  const spaced = await request(gateway, 'POST', '/v1/chat/completions', { body: chatBody(), headers: { ...json, 'x-user-id': 'a b' } });
  check(spaced.status === 400 && spaced.json?.error?.code === 'invalid_tenant', `tenant with a space: ${spaced.status}`);
  check(/printable ASCII characters without spaces/.test(spaced.json?.error?.message ?? ''), `tenant message: ${spaced.json?.error?.message}`);
  // Given twice (Node sends an array as two lines), the header names no tenant: a client's own
  // line could otherwise choose one ahead of its proxy's.
  const twice = await request(gateway, 'POST', '/v1/chat/completions', { body: chatBody(), headers: { ...json, 'x-user-id': ['mallory', 'alice'] } });
  check(twice.status === 400 && twice.json?.error?.code === 'invalid_tenant', `tenant given twice: ${twice.status}`);
  check(/more than once/.test(twice.json?.error?.message ?? ''), `tenant twice message: ${twice.json?.error?.message}`);

  // 11. Expect: 100-continue (curl sends it for big bodies): the gateway says "continue" at once.
  const expectRun = await new Promise((resolve) => {
    const u = new URL(gateway);
    const body = chatBody({ max_tokens: 2 });
    const sock = net.connect(Number(u.port), u.hostname);
    let got = '';
    let sentBody = false;
    const t0 = now();
    const timer = setTimeout(() => {
      sock.destroy();
      resolve({ got, continueMs: null });
    }, 3000);
    let continueMs = null;
    sock.on('connect', () =>
      sock.write(`POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nExpect: 100-continue\r\nConnection: close\r\nContent-Length: ${Buffer.byteLength(body)}\r\n\r\n`));
    sock.on('data', (d) => {
      got += d;
      if (!sentBody && got.startsWith('HTTP/1.1 100')) {
        sentBody = true;
        continueMs = now() - t0;
        sock.write(body);
      }
    });
    sock.on('close', () => {
      clearTimeout(timer);
      resolve({ got, continueMs });
    });
    sock.on('error', () => {});
  });
  check(expectRun.continueMs !== null && expectRun.continueMs < 900, `no prompt 100 Continue (${expectRun.continueMs} ms)`);
  check(/HTTP\/1\.1 200[^]*"t0 t1 "/.test(expectRun.got), `no answer after 100 Continue: ${JSON.stringify(expectRun.got.slice(0, 300))}`);

  check(await idleLimiter('chat'), 'chat not idle at the end');
  check(await idleLimiter('one'), 'one not idle at the end');
  Object.assign(summary, { upstream_connections_for_10_calls: opened });
}

const scenarios = { sdk, timeouts, proxy };
if (!scenarios[scenario]) {
  console.error(`unknown scenario ${scenario}`);
  process.exit(2);
}
const guard = setTimeout(() => {
  console.log('FAIL: the scenario did not finish within 120 s');
  process.exit(1);
}, 120000);
try {
  await scenarios[scenario]();
} catch (e) {
  check(false, `exception: ${e?.stack ?? e}`);
}
clearTimeout(guard);
summary.failures = failures.length;
console.log(`summary: ${JSON.stringify(summary)}`);
process.exit(failures.length ? 1 : 0);
