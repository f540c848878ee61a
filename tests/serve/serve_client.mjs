// tests/serve/serve_client.mjs — HTTP/SSE clients that drive running
// `fairgate serve` processes and check what they see (Node 20, no packages).
//
//   node serve_client.mjs SCENARIO --urls http://127.0.0.1:P1,http://127.0.0.1:P2 --limiter NAME [options]
//
// Scenarios: fifo, timeout, disconnect, hostile, longpoll, many, clientcap.
// Prints one JSON summary line ("summary: {...}") and "FAIL: ..." lines;
// exits 1 when any check failed, 2 on a usage error. Every wait is bounded.
import http from 'node:http';
import net from 'node:net';
import { performance } from 'node:perf_hooks';

// --- arguments ------------------------------------------------------------
const argv = process.argv.slice(2);
const scenario = argv[0];
const opts = {};
for (let i = 1; i < argv.length; i += 2) {
  if (!argv[i].startsWith('--') || i + 1 >= argv.length) {
    console.error(`usage: node serve_client.mjs SCENARIO --urls URL[,URL] --limiter NAME [--key value]...`);
    process.exit(2);
  }
  opts[argv[i].slice(2)] = argv[i + 1];
}
const urls = (opts.urls ?? '').split(',').filter(Boolean);
const limiter = opts.limiter ?? 'chat';
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

// --- HTTP helpers -----------------------------------------------------------
function request(base, method, path, { body, headers = {}, timeout = 10000 } = {}) {
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
      res.on('error', (e) => resolve({ status: 0, error: String(e) }));
    });
    req.setTimeout(timeout, () => req.destroy(new Error('client timeout')));
    req.on('error', (e) => resolve({ status: 0, error: String(e) }));
    if (body !== undefined) req.write(body);
    req.end();
  });
}

async function status(base) {
  const r = await request(base, 'GET', `/v1/limiters/${limiter}`);
  return r.status === 200 ? r.json : null;
}

/// Opens an SSE acquire. `handlers.event(name, data)`; `handlers.end(why)`.
function sseAcquire(base, query, handlers) {
  const req = http.request(`${base}/v1/limiters/${limiter}/acquire${query}`, {
    method: 'POST',
    headers: { Accept: 'text/event-stream' },
    agent: false,
  });
  let ended = false;
  const end = (why) => {
    if (!ended) {
      ended = true;
      handlers.end?.(why);
    }
  };
  req.on('response', (res) => {
    if (res.statusCode !== 200) {
      let text = '';
      res.on('data', (c) => (text += c));
      res.on('end', () => end(`status ${res.statusCode} ${text.trim()}`));
      return;
    }
    res.setEncoding('utf8');
    let buf = '';
    res.on('data', (chunk) => {
      buf += chunk;
      let i;
      while ((i = buf.indexOf('\n\n')) >= 0) {
        const block = buf.slice(0, i);
        buf = buf.slice(i + 2);
        let name = null;
        let data = null;
        for (const line of block.split('\n')) {
          if (line.startsWith('event: ')) name = line.slice(7);
          else if (line.startsWith('data: ')) data = line.slice(6);
          else if (line.startsWith(':')) name = name ?? 'comment';
        }
        let parsed = null;
        try {
          parsed = data ? JSON.parse(data) : null;
        } catch {
          check(false, `unparsable SSE data: ${data}`);
        }
        handlers.event?.(name, parsed);
      }
    });
    res.on('end', () => end('end'));
    res.on('error', () => end('error'));
    res.on('close', () => end('close'));
  });
  req.on('error', (e) => end(`error ${e.code ?? e}`));
  req.end();
  return req;
}

/// Polls every server until `pred(statuses)` holds or `ms` pass; returns the last statuses.
async function waitFor(pred, ms, what) {
  const deadline = now() + ms;
  let last = null;
  while (now() < deadline) {
    last = await Promise.all(urls.map(status));
    if (last.every(Boolean) && pred(last)) return last;
    await sleep(25);
  }
  check(false, `${what} not reached within ${ms} ms; last: ${JSON.stringify(last?.map(brief))}`);
  return last;
}
const brief = (s) => s && { in_use: s.in_use, queued: s.queued, holders: s.holders?.length, queue: s.queue?.length };
// Every instance lists the whole limiter (on Redis, every instance's holders and queue).
const everyLists = (ss, k, n) => ss.every((s) => s[k].length === n);

/// Deterministic "random" hold times.
function holdOf(i, lo, hi) {
  let x = (i + 1) * 2654435761;
  x = (x ^ (x >>> 13)) >>> 0;
  return lo + (x % (hi - lo + 1));
}

// --- scenarios ----------------------------------------------------------------

/// N clients arrive `gap` ms apart (each after the previous one got its first
/// event, so the arrival order is known), spread over the servers, hold
/// hold_min..hold_max ms after the grant. Checks the cap from the clients'
/// own timestamps and from status, FIFO, everyone granted, nothing left over.
async function fifo() {
  const n = num('clients', 60);
  const cap = num('cap', 3);
  const gap = num('gap', 5);
  const holdMin = num('hold_min', 50);
  const holdMax = num('hold_max', 150);
  const slack = num('order_slack', 25);
  const clients = [];
  let inFlight = 0;
  let maxInFlight = 0;
  let maxStatusInUse = 0;
  let statusViolations = 0;
  let polling = true;
  const poller = (async () => {
    while (polling) {
      const ss = await Promise.all(urls.map(status));
      for (const s of ss) {
        if (!s) continue;
        maxStatusInUse = Math.max(maxStatusInUse, s.in_use);
        if (s.in_use > cap) statusViolations++;
      }
      await sleep(20);
    }
  })();

  const t0 = now();
  const done = [];
  for (let i = 0; i < n; i++) {
    const base = urls[i % urls.length];
    const c = { i, base, start: 0, firstEvent: 0, granted: null, released: null, rejected: null, positions: [] };
    clients.push(c);
    const target = t0 + i * gap;
    if (now() < target) await sleep(target - now());
    let firstEvent;
    const first = new Promise((r) => (firstEvent = r));
    c.start = now();
    done.push(
      new Promise((resolve) => {
        const req = sseAcquire(base, '', {
          event(name, data) {
            if (name !== 'comment' && !c.firstEvent) {
              c.firstEvent = now();
              firstEvent();
            }
            if (name === 'queued') {
              if (c.granted !== null) check(false, `client ${i}: queued event after granted`);
              c.positions.push(data.position);
            } else if (name === 'granted') {
              c.granted = now();
              c.waited_ms = data.waited_ms;
              inFlight++;
              maxInFlight = Math.max(maxInFlight, inFlight);
              setTimeout(() => {
                inFlight--;
                c.released = now();
                req.destroy();
                resolve();
              }, holdOf(i, holdMin, holdMax));
            } else if (name === 'rejected') {
              c.rejected = data;
            }
          },
          end(why) {
            if (c.granted === null) {
              c.ended = why;
              firstEvent();
              resolve();
            }
          },
        });
      }),
    );
    // Bounded: the next client starts only once this one is known to the server.
    await Promise.race([first, sleep(10000)]);
  }
  const allDone = await Promise.race([Promise.all(done).then(() => true), sleep(num('timeout_ms', 60000)).then(() => false)]);
  polling = false;
  await poller;
  check(allDone, 'not every client finished in time');

  const granted = clients.filter((c) => c.granted !== null);
  check(granted.length === n, `granted ${granted.length} of ${n}; others: ${JSON.stringify(clients.filter((c) => c.granted === null).map((c) => ({ i: c.i, rejected: c.rejected, ended: c.ended })))}`);
  // The clients' own view of the cap: [granted, released] intervals.
  const evs = [];
  for (const c of granted) {
    evs.push([c.granted, 1], [c.released ?? Infinity, -1]);
  }
  evs.sort((a, b) => a[0] - b[0] || a[1] - b[1]);
  let cur = 0;
  let peak = 0;
  for (const [, d] of evs) {
    cur += d;
    peak = Math.max(peak, cur);
  }
  check(peak <= cap, `clients saw ${peak} permits at once (cap ${cap})`);
  check(maxInFlight <= cap, `in flight peaked at ${maxInFlight} (cap ${cap})`);
  check(statusViolations === 0, `status reported in_use above ${cap} ${statusViolations} times (max ${maxStatusInUse})`);
  // FIFO: nobody is granted (more than `slack` ms) before someone who arrived earlier.
  let inversions = 0;
  let worst = 0;
  for (const a of granted) {
    for (const b of granted) {
      if (a.i < b.i && b.granted + slack < a.granted) {
        inversions++;
        worst = Math.max(worst, a.granted - b.granted);
      }
    }
  }
  check(inversions === 0, `${inversions} grants out of arrival order (worst by ${worst.toFixed(1)} ms)`);
  const byGrant = [...granted].sort((a, b) => a.granted - b.granted).map((c) => c.i);
  const queuedClients = clients.filter((c) => c.positions.length > 0).length;
  const after = await waitFor((ss) => ss.every((s) => s.in_use === 0 && s.queued === 0 && s.holders.length === 0 && s.queue.length === 0), 8000, 'in_use 0 and queued 0 on every instance');
  Object.assign(summary, {
    clients: n,
    granted: granted.length,
    peak_clients: peak,
    peak_status_in_use: maxStatusInUse,
    queued_clients: queuedClients,
    inversions,
    grant_order_head: byGrant.slice(0, 12),
    max_waited_ms: Math.max(...granted.map((c) => c.waited_ms ?? 0)),
    elapsed_ms: Math.round(now() - t0),
    after: after?.map(brief),
  });
  check(queuedClients > 0, 'nobody had to queue: the test did not exercise the queue');
}

/// More clients than the cap can serve within max_wait: the late ones must be
/// rejected with reason timeout near their deadline.
async function timeout() {
  const n = num('clients', 20);
  const maxWait = num('max_wait_ms', 300);
  const hold = num('hold', 100);
  const late = num('late_ms', 2000); // generous bound: a bug (no deadline) breaks it
  const clients = [];
  const done = [];
  const t0 = now();
  for (let i = 0; i < n; i++) {
    const c = { i, start: now(), granted: null, rejected: null };
    clients.push(c);
    done.push(
      new Promise((resolve) => {
        const req = sseAcquire(urls[i % urls.length], `?max_wait_ms=${maxWait}`, {
          event(name, data) {
            if (name === 'granted') {
              c.granted = now();
              setTimeout(() => {
                req.destroy();
                resolve();
              }, hold);
            } else if (name === 'rejected') {
              c.rejected = { ...data, at: now() - c.start };
            }
          },
          end(why) {
            c.end = why;
            if (c.granted === null) resolve();
          },
        });
      }),
    );
    await sleep(2);
  }
  await Promise.race([Promise.all(done), sleep(30000)]);
  const granted = clients.filter((c) => c.granted !== null);
  const rejected = clients.filter((c) => c.rejected !== null);
  check(granted.length + rejected.length === n, `${n - granted.length - rejected.length} clients neither granted nor rejected: ${JSON.stringify(clients.filter((c) => !c.granted && !c.rejected))}`);
  check(rejected.length > 0, 'nobody timed out: the test did not exercise max_wait');
  for (const c of rejected) {
    check(c.rejected.reason === 'timeout', `client ${c.i} rejected with ${c.rejected.reason}, expected timeout`);
    check(c.rejected.at >= maxWait - 5, `client ${c.i} rejected after ${c.rejected.at.toFixed(0)} ms, before its ${maxWait} ms deadline`);
    check(c.rejected.at <= maxWait + late, `client ${c.i} rejected after ${c.rejected.at.toFixed(0)} ms, long after its ${maxWait} ms deadline`);
    check(typeof c.rejected.message === 'string' && c.rejected.message.length > 0, `client ${c.i}: rejection without a message`);
    check(c.end === 'end' || c.end === 'close', `client ${c.i}: stream did not end after the rejection (${c.end})`);
  }
  const after = await waitFor((ss) => ss.every((s) => s.in_use === 0 && s.queued === 0 && s.holders.length === 0 && s.queue.length === 0), 8000, 'nothing leaked (in_use 0, queued 0)');
  const ats = rejected.map((c) => c.rejected.at);
  Object.assign(summary, {
    clients: n,
    granted: granted.length,
    rejected: rejected.length,
    reject_at_ms_min: Math.round(Math.min(...ats)),
    reject_at_ms_max: Math.round(Math.max(...ats)),
    elapsed_ms: Math.round(now() - t0),
    after: after?.map(brief),
  });
}

/// Holders and waiters disconnect; queue and holders stay exact.
async function disconnect() {
  const cap = num('cap', 2);
  const waiters = num('waiters', 4);
  const clients = [];
  const open = (i) => {
    const c = { i, events: [], granted: false, end: null };
    c.req = sseAcquire(urls[i % urls.length], `?tenant=client-${i}`, {
      event(name, data) {
        c.events.push([name, data]);
        if (name === 'granted') c.granted = true;
      },
      end(why) {
        c.end = why;
      },
    });
    clients.push(c);
    return c;
  };
  const until = async (pred, ms, what) => {
    const deadline = now() + ms;
    while (now() < deadline) {
      if (pred()) return true;
      await sleep(10);
    }
    return check(false, `${what} not within ${ms} ms`);
  };
  const expect = (inUse, queued, what) =>
    waitFor(
      (ss) =>
        everyLists(ss, 'holders', inUse) &&
        everyLists(ss, 'queue', queued) &&
        ss.every((s) => s.in_use === inUse && s.queued === queued),
      8000,
      `${what}: in_use ${inUse}, queued ${queued}`,
    );
  // cap holders, then the waiters, one after the other (known order).
  for (let i = 0; i < cap; i++) {
    const c = open(i);
    await until(() => c.granted, 5000, `holder ${i} granted`);
  }
  for (let i = cap; i < cap + waiters; i++) {
    const c = open(i);
    await until(() => c.events.some(([n]) => n === 'queued'), 5000, `waiter ${i} queued`);
  }
  await expect(cap, waiters, 'all in');
  // The second waiter leaves while queued: one fewer in the queue, nobody granted.
  const w2 = clients[cap + 1];
  w2.req.destroy();
  await expect(cap, waiters - 1, 'after a queued client left');
  check(clients.filter((c) => c.granted).length === cap, 'a grant happened when a waiter left');
  // The waiter behind it moves up (position 2). The Redis backend reports an
  // upper bound (distance from the head by arrival sequence), which a gap in
  // the middle does not lower: --exact_positions 0 skips this check there.
  const w3 = clients[cap + 2];
  if (num('exact_positions', 1))
    await until(() => w3.events.some(([n, d]) => n === 'queued' && d.position === 2), 5000, 'third waiter told position 2');
  // A holder leaves: the first waiter is granted (FIFO), the rest stay queued.
  clients[0].req.destroy();
  const w1 = clients[cap];
  await until(() => w1.granted, 5000, 'first waiter granted after a holder left');
  check(!w3.granted, 'third waiter granted before its turn');
  await expect(cap, waiters - 2, 'after a holder left');
  // Names on the status page of every instance: the queue holds exactly the
  // remaining waiters' tenants, the holders the holders' (whichever instance
  // each client went through).
  const ss = await Promise.all(urls.map(status));
  const expected = clients.slice(cap + 2).map((c) => `client-${c.i}`).sort();
  const expectedHolders = [...clients.slice(1, cap), clients[cap]].map((c) => `client-${c.i}`).sort();
  for (const [k, s] of ss.entries()) {
    const tenants = s.queue.map((q) => q.tenant).sort();
    check(JSON.stringify(tenants) === JSON.stringify(expected), `instance ${k}: queue tenants ${tenants} != ${expected}`);
    const holders = s.holders.map((h) => h.tenant).sort();
    check(JSON.stringify(holders) === JSON.stringify(expectedHolders), `instance ${k}: holder tenants ${holders} != ${expectedHolders}`);
  }
  // Everyone leaves, waiters first (a holder leaving first would hand its
  // permit to a waiter that is about to leave, which is a grant, not a cancel).
  for (const c of [...clients].reverse()) {
    c.req.destroy();
    if (c.i >= cap + 2) await waitFor((ss) => everyLists(ss, 'queue', c.i - cap - 2), 5000, `waiter ${c.i} gone`);
  }
  const after = await expect(0, 0, 'after everyone left');
  const stats = await Promise.all(urls.map(status));
  const cancels = stats.reduce((a, s) => a + s.stats.cancels, 0);
  check(cancels === waiters - 1, `cancels ${cancels}, expected ${waiters - 1}`);
  Object.assign(summary, { cap, waiters, cancels, after: after?.map(brief) });
}

/// A raw socket exchange: sends `chunks` (with `delay` between them), returns
/// what came back and whether/when the server closed the socket.
function raw(base, chunks, { delay = 0, timeout = 8000 } = {}) {
  const u = new URL(base);
  return new Promise((resolve) => {
    const t0 = now();
    const sock = net.connect(Number(u.port), u.hostname);
    let data = '';
    let finished = false;
    const finish = (how) => {
      if (finished) return;
      finished = true;
      clearTimeout(timer);
      sock.destroy();
      resolve({ data, how, ms: now() - t0, status: Number((/^HTTP\/1\.1 (\d{3})/.exec(data) ?? [])[1] ?? 0) });
    };
    const timer = setTimeout(() => finish('timeout'), timeout);
    sock.on('data', (d) => (data += d.toString('latin1')));
    sock.on('end', () => finish('closed'));
    sock.on('close', () => finish('closed'));
    sock.on('error', () => finish('reset'));
    sock.on('connect', async () => {
      for (const c of chunks) {
        if (finished || sock.destroyed) break;
        sock.write(c);
        if (delay) await sleep(delay);
      }
    });
  });
}

/// Garbage, oversized, slow and hostile requests: each gets a 4xx or a closed
/// socket, and the server keeps serving.
async function hostile() {
  const base = urls[0];
  const results = {};
  const expectStatus = async (name, p, allowed) => {
    const r = await p;
    results[name] = r.status || r.how;
    check(allowed.includes(r.status) || (allowed.includes('closed') && r.status === 0 && r.how !== 'timeout'),
      `${name}: got ${r.status || r.how}, expected one of ${allowed}`);
    return r;
  };
  const acquire = `/v1/limiters/${limiter}/acquire`;
  await expectStatus('garbage', raw(base, ['\x00\x01\x02GARBAGE \xff\xfe\r\n\r\n']), [400, 'closed']);
  await expectStatus('not http', raw(base, ['hello there\r\n\r\n']), [400, 'closed']);
  await expectStatus('bad version', raw(base, ['GET / HTTP/9.9\r\n\r\n']), [400, 505, 'closed']);
  await expectStatus('huge header', raw(base, [`GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: ${'a'.repeat(64 * 1024)}\r\n\r\n`]), [431, 400, 'closed']);
  await expectStatus('many headers', raw(base, [`GET /healthz HTTP/1.1\r\nHost: x\r\n${Array.from({ length: 2000 }, (_, i) => `X-H${i}: v\r\n`).join('')}\r\n`]), [431, 400, 'closed']);
  await expectStatus('huge body', raw(base, [`POST ${acquire} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 10000000\r\n\r\n{"a":`]), [413, 'closed']);
  await expectStatus('bad content-length', raw(base, [`POST ${acquire} HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\n\r\n`]), [400, 'closed']);
  await expectStatus('bad chunking', raw(base, [`POST ${acquire} HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nZZZ\r\n`]), [400, 'closed']);
  // Slowloris: a header that never ends, one byte at a time. header_timeout_ms is 1000 in the test config.
  const slow = await raw(base, ['GET /healthz HTTP/1.1\r\n', ...Array.from({ length: 60 }, () => 'X')], { delay: 100, timeout: 8000 });
  results.slowloris = `${slow.status || slow.how} after ${Math.round(slow.ms)} ms`;
  check(slow.how !== 'timeout' && slow.ms < 5000, `slowloris: not cut off (${results.slowloris})`);
  check(slow.status === 408, `slowloris: want a 408 before the close, got ${results.slowloris}`);
  // Idle connection with nothing sent: closed after idle_timeout_ms (2000 in the test config).
  const idle = await raw(base, [], { timeout: 8000 });
  results.idle = `${idle.how} after ${Math.round(idle.ms)} ms`;
  check(idle.how !== 'timeout', `idle connection not closed (${results.idle})`);

  const j = async (name, method, path, body, headers, allowed, reason) => {
    const r = await request(base, method, path, { body, headers });
    results[name] = r.status;
    check(allowed.includes(r.status), `${name}: status ${r.status} (${r.text?.trim()}), expected ${allowed}`);
    if (r.status >= 400 && r.status !== 405 && r.status < 500) {
      check(r.json?.error?.message?.length > 0, `${name}: 4xx without a JSON error message: ${r.text}`);
      if (reason) check(r.json?.error?.reason === reason, `${name}: reason ${r.json?.error?.reason}, expected ${reason}`);
    }
    return r;
  };
  await j('unknown limiter', 'POST', '/v1/limiters/nope/acquire', undefined, {}, [404], 'unknown_limiter');
  await j('bad limiter name', 'POST', '/v1/limiters/-bad!/acquire', undefined, {}, [400], 'bad_request');
  await j('dot segment', 'GET', '/v1/limiters/..', undefined, {}, [400]);
  await j('bad escape', 'GET', '/v1/limiters/%zz', undefined, {}, [400]);
  await j('negative max_wait', 'POST', `${acquire}?max_wait_ms=-1`, undefined, {}, [400], 'bad_request');
  await j('text max_wait', 'POST', `${acquire}?max_wait_ms=soon`, undefined, {}, [400], 'bad_request');
  await j('huge max_wait', 'POST', `${acquire}?max_wait_ms=99999999999999999999`, undefined, {}, [400], 'bad_request');
  await j('unknown param', 'POST', `${acquire}?bogus=1`, undefined, {}, [400], 'bad_request');
  await j('bad tenant', 'POST', `${acquire}?tenant=${'x'.repeat(300)}`, undefined, {}, [400], 'bad_request');
  await j('bad json', 'POST', acquire, '{"max_wait_ms":', { 'Content-Type': 'application/json' }, [400], 'bad_request');
  await j('json not object', 'POST', acquire, '[1,2,3]', { 'Content-Type': 'application/json' }, [400], 'bad_request');
  await j('json float', 'POST', acquire, '{"max_wait_ms":1.5}', { 'Content-Type': 'application/json' }, [400], 'bad_request');
  await j('deep json', 'POST', acquire, '['.repeat(5000), { 'Content-Type': 'application/json' }, [400], 'bad_request');
  await j('put no token', 'PUT', `/v1/limiters/${limiter}`, '{"max_concurrent":5}', {}, [401], 'unauthorized');
  await j('put bad token', 'PUT', `/v1/limiters/${limiter}`, '{"max_concurrent":5}', { Authorization: 'Bearer wrong' }, [401], 'unauthorized');
  await j('put bad value', 'PUT', `/v1/limiters/${limiter}`, '{"max_concurrent":0}', { Authorization: `Bearer ${opts.token}` }, [400], 'bad_request');
  await j('put unknown field', 'PUT', `/v1/limiters/${limiter}`, '{"max_concurrency":3}', { Authorization: `Bearer ${opts.token}` }, [400], 'bad_request');
  await j('wrong method', 'DELETE', `/v1/limiters/${limiter}`, undefined, {}, [405]);
  await j('unknown route', 'GET', '/nothing/here', undefined, {}, [404], 'not_found');
  await j('unknown permit', 'DELETE', '/v1/permits/lp-0000', undefined, {}, [404], 'unknown_permit');
  await j('renew unknown', 'POST', '/v1/permits/lp-0000/renew', undefined, {}, [404], 'unknown_permit');

  // Many connections at once beyond max_connections (the test config says 64): refused, not crashed.
  const conns = await Promise.all(Array.from({ length: 100 }, () => raw(base, [], { timeout: 1500 })));
  const refused = conns.filter((r) => r.status === 503 || r.how === 'closed' || r.how === 'reset').length;
  results.connection_flood = `${refused} of 100 refused`;
  check(refused >= 100 - 64, `connection flood: only ${refused} of 100 refused (cap 64)`);

  // Still serving, nothing held. The flood's 64 accepted connections close
  // when the client gives up on them; the server may take a moment (a
  // sanitized build on a loaded machine) to see every close, so a
  // connection-limit 503 is retried for up to 5 s.
  let health = await request(base, 'GET', '/healthz');
  for (let i = 0; i < 50 && health.status === 503 && health.text.includes('too_many_connections'); ++i) {
    await sleep(100);
    health = await request(base, 'GET', '/healthz');
  }
  check(health.status === 200 && health.json?.status === 'ok', `healthz after the abuse: ${health.status} ${health.text}`);
  const ok = await request(base, 'POST', `${acquire}?max_wait_ms=1000`);
  check(ok.status === 200 && ok.json?.permit, `an ordinary acquire after the abuse: ${ok.status} ${ok.text}`);
  if (ok.json?.permit) await request(base, 'DELETE', `/v1/permits/${ok.json.permit}`);
  const s = await waitFor((ss) => ss.every((x) => x.in_use === 0 && x.queued === 0), 5000, 'nothing held after the abuse');
  Object.assign(summary, { results, after: s?.map(brief) });
}

/// The JSON long poll: grant with a lease, renew, DELETE, 429 + Retry-After,
/// lease expiry, and a client that disconnects while waiting.
async function longpoll() {
  const base = urls[0];
  const acquire = `/v1/limiters/${limiter}/acquire`;
  const a = await request(base, 'POST', acquire, { body: JSON.stringify({ tenant: 'lp-a', lease_ms: 5000 }), headers: { 'Content-Type': 'application/json' } });
  check(a.status === 200 && typeof a.json?.permit === 'string' && a.json.lease_ms === 5000 && typeof a.json.waited_ms === 'number', `grant: ${a.status} ${a.text}`);
  const b = await request(base, 'POST', `${acquire}?max_wait_ms=200`);
  check(b.status === 429 && b.json?.error?.reason === 'timeout' && Number(b.headers?.['retry-after']) >= 1, `busy: ${b.status} ${b.text} retry-after=${b.headers?.['retry-after']}`);
  const r = await request(base, 'POST', `/v1/permits/${a.json?.permit}/renew`);
  check(r.status === 200 && r.json?.lease_ms === 5000, `renew: ${r.status} ${r.text}`);
  // A waiter that hangs up while waiting is cancelled (not granted later, not left in the queue).
  const gone = http.request(`${base}${acquire}?max_wait_ms=10000`, { method: 'POST', agent: false });
  gone.on('error', () => {});
  gone.end();
  await waitFor((ss) => ss[0].queued === 1, 5000, 'long-poll waiter queued');
  gone.destroy();
  await waitFor((ss) => ss[0].queued === 0 && ss[0].in_use === 1, 5000, 'long-poll waiter cancelled on disconnect');
  const d = await request(base, 'DELETE', `/v1/permits/${a.json?.permit}`);
  check(d.status === 204, `delete: ${d.status}`);
  const d2 = await request(base, 'DELETE', `/v1/permits/${a.json?.permit}`);
  check(d2.status === 404, `delete again: ${d2.status}`);
  // A lease that runs out releases the permit.
  const e = await request(base, 'POST', `${acquire}?lease_ms=300`);
  check(e.status === 200 && e.json?.lease_ms === 300, `short lease: ${e.status} ${e.text}`);
  await waitFor((ss) => ss[0].in_use === 0, 5000, 'permit released when its lease ran out');
  const e2 = await request(base, 'POST', `/v1/permits/${e.json?.permit}/renew`);
  check(e2.status === 404, `renew after expiry: ${e2.status}`);
  // The SSE events feed and the metrics page.
  const ev = await new Promise((resolve) => {
    const req = http.request(`${base}/v1/events`, { agent: false }, (res) => {
      let text = '';
      res.on('data', (c) => {
        text += c;
        if (text.includes('\n\n')) {
          req.destroy();
          resolve(text);
        }
      });
    });
    req.on('error', () => resolve(''));
    req.setTimeout(5000, () => req.destroy());
    req.end();
  });
  check(ev.startsWith('event: snapshot\ndata: {"limiters":['), `events feed: ${ev.slice(0, 80)}`);
  const m = await request(base, 'GET', '/metrics');
  for (const series of ['fairgate_in_use{', 'fairgate_queued{', 'fairgate_grants_total{', 'fairgate_timeouts_total{', 'fairgate_cancels_total{', 'fairgate_rejections_total{', 'fairgate_wait_seconds_bucket{', 'fairgate_leases_expired_total 1']) {
    check(m.text?.includes(series), `metrics lack ${series}`);
  }
  // Admin: raise the cap (with the token), then read it back everywhere.
  const put = await request(base, 'PUT', `/v1/limiters/${limiter}`, { body: '{"max_concurrent":4,"max_wait_ms":1500}', headers: { Authorization: `Bearer ${opts.token}` } });
  check(put.status === 200 && put.json?.max_concurrent === 4 && put.json?.max_wait_ms === 1500, `put: ${put.status} ${put.text}`);
  await waitFor((ss) => ss.every((s) => s.max_concurrent === 4), 5000, 'new cap seen by every instance');
  const h = await request(base, 'GET', '/healthz');
  Object.assign(summary, { health: h.json });
}

/// Many queued SSE clients on one instance (S3): all must be queued, then all
/// cancelled cleanly.
async function many() {
  const n = num('clients', 5000);
  const base = urls[0];
  const clients = [];
  let queued = 0;
  let failed = 0;
  const t0 = now();
  for (let i = 0; i < n; i++) {
    const c = { queued: false };
    c.req = sseAcquire(base, '?max_wait_ms=600000', {
      event(name) {
        if (name === 'queued' && !c.queued) {
          c.queued = true;
          queued++;
        }
      },
      end() {
        if (!c.queued) failed++;
      },
    });
    clients.push(c);
    if (i % 200 === 199) await sleep(5);
  }
  const deadline = now() + num('timeout_ms', 60000);
  while (queued + failed < n - num('holders', 1) && now() < deadline) await sleep(50);
  const connectMs = now() - t0;
  const s = await status(base);
  check(s && s.queued >= n - num('holders', 1), `queued ${s?.queued} of ${n}`);
  check(failed === 0, `${failed} clients failed`);
  summary.connect_ms = Math.round(connectMs);
  summary.queued = s?.queued;
  summary.in_use = s?.in_use;
  // The harness reads RSS and threads now.
  console.log(`ready: ${JSON.stringify({ queued: s?.queued })}`);
  await sleep(num('hold_ms', 1500));
  for (const c of clients) c.req.destroy();
  const inUse = num('in_use_after', 0);
  const after = await waitFor((ss) => ss[0].queued === 0 && ss[0].in_use === inUse, 30000, 'every waiter cancelled');
  summary.cancels = (await status(base))?.stats?.cancels;
  check(summary.cancels === n, `cancels ${summary.cancels}, expected ${n}`);
  summary.after = after?.map(brief);
}

/// The per-client cap on waiting requests (S7): with `--client_cap K`, the
/// K+1st waiting request of one client gets 429 too_many_waiters; once one of
/// the K leaves, a new one is accepted again.
async function clientcap() {
  const k = num('client_cap', 3);
  const base = urls[0];
  const open = (tag) => {
    const c = { events: [], end: null };
    c.req = sseAcquire(base, `?tenant=${tag}`, {
      event(name, data) {
        c.events.push([name, data]);
      },
      end(why) {
        c.end = why;
      },
    });
    return c;
  };
  const until = async (pred, ms) => {
    const deadline = now() + ms;
    while (now() < deadline && !pred()) await sleep(10);
    return pred();
  };
  const holder = open('holder');
  check(await until(() => holder.events.some(([n]) => n === 'granted'), 5000), 'holder not granted');
  const waiters = [];
  for (let i = 0; i < k; i++) {
    const w = open(`w${i}`);
    waiters.push(w);
    check(await until(() => w.events.some(([n]) => n === 'queued'), 5000), `waiter ${i} not queued`);
  }
  const over = await request(base, 'POST', `/v1/limiters/${limiter}/acquire?max_wait_ms=5000`);
  check(over.status === 429 && over.json?.error?.reason === 'too_many_waiters', `waiter ${k + 1}: ${over.status} ${over.text}`);
  const sseOver = open('over');
  check(await until(() => sseOver.end !== null, 5000) && /^status 429/.test(sseOver.end), `SSE waiter ${k + 1}: ${sseOver.end}`);
  waiters[0].req.destroy();
  await waitFor((ss) => ss[0].queued === k - 1, 5000, 'a waiter left');
  const again = open('again');
  check(await until(() => again.events.some(([n]) => n === 'queued'), 5000), 'a new waiter was not accepted after one left');
  for (const c of [again, ...waiters, holder]) c.req.destroy();
  const after = await waitFor((ss) => ss[0].queued === 0 && ss[0].in_use === 0, 5000, 'nothing left');
  Object.assign(summary, { client_cap: k, refused_status: over.status, after: after?.map(brief) });
}

const scenarios = { fifo, timeout, disconnect, hostile, longpoll, many, clientcap };
if (!scenarios[scenario] || urls.length === 0) {
  console.error(`usage: node serve_client.mjs (${Object.keys(scenarios).join('|')}) --urls URL[,URL] --limiter NAME`);
  process.exit(2);
}
const hardStop = setTimeout(() => {
  console.log('FAIL: scenario did not finish within its hard limit');
  console.log(`summary: ${JSON.stringify(summary)}`);
  process.exit(1);
}, num('hard_limit_ms', 100000));
try {
  await scenarios[scenario]();
} catch (e) {
  check(false, `exception: ${e?.stack ?? e}`);
}
clearTimeout(hardStop);
console.log(`summary: ${JSON.stringify(summary)}`);
process.exit(failures.length ? 1 : 0);
