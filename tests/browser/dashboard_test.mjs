// tests/browser/dashboard_test.mjs — GET /dashboard in a real headless Chromium
// against a real `fairgate serve`, while this script drives load with SSE
// acquires (ctest -L browser).
//
//   node --experimental-websocket dashboard_test.mjs --fairgate BIN --chromium BIN [--screenshot OUT.png] [--slow 1]
//
// What it checks, from the page's DOM (data-limiter / data-field attributes,
// the holders and queue tables) against what the server says:
//  1. idle: every limiter drawn, 0 in use, 0 queued;
//  2. 2 holders + 3 waiters: in use 2 / 2 and queued 3 within ~1 s of the
//     server having them, the holders and the queue listed with their tenants;
//  3. a holder leaves: the first waiter takes its seat (still 2 in use, 2 queued);
//  4. admin: a wrong token is refused (401 shown, nothing changed); with the
//     right one a cap of 4 set from the page applies (the server reports 4 and
//     the two waiters get their seats), and Disable/Enable work;
//  5. 150 waiters: the queue table lists 100 and counts the rest;
//  and the rate-limit rules with this instance's counters (3 allowed, 2 refused), a shadow
//  rule marked as such (its "refused" is what it would have refused).
// --screenshot writes a PNG of the page under load (docs/dashboard.png is one).
// Exits 0 when every check passed, 1 otherwise, 77 (skipped) without Chromium
// unless FAIRGATE_REQUIRE_BROWSER=1.
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';

import { args, Browser, check, log, requireChromium, run, start, stop, tempDir, waitFor } from './harness.mjs';

const TOKEN = 'dashboard-test-token';
// How soon the page must follow the server: a snapshot every 200 ms, the detail once a second.
const FOLLOW_MS = (args.slow === '1' ? 3 : 1) * 1500;

async function fairgate() {
  const dir = tempDir('fairgate-dashboard-');
  const config = join(dir, 'fairgate.toml');
  writeFileSync(config, `[server]
events_interval_ms = 200
max_connections = 2000

[limiters.chat]
max_concurrent = 2
max_wait_ms = 120000
max_queue = 1000

[limiters.export]
max_concurrent = 1
max_wait_ms = 60000

[ratelimit.per-user]
algorithm = "fixed_window"
rate = 3
period_ms = 600000

[ratelimit.trial]
algorithm = "fixed_window"
rate = 1
period_ms = 600000
mode = "shadow"
`);
  const { child, match } = await start(args.fairgate,
    ['serve', '--config', config, '--listen', '127.0.0.1:0', '--admin-token', TOKEN],
    /listening on (http:\/\/127\.0\.0\.1:\d+)/, 'fairgate serve');
  return { child, url: match };
}

/** An SSE acquire held open; `until(text)` waits for the stream to contain it; `close()` lets go. */
async function acquire(url, limiter, tenant) {
  const abort = new AbortController();
  const res = await fetch(`${url}/v1/limiters/${limiter}/acquire?tenant=${tenant}`, {
    method: 'POST', headers: { Accept: 'text/event-stream' }, signal: abort.signal,
  });
  const reader = res.body.getReader();
  let text = '';
  let reading = null;
  return {
    tenant,
    until: (needle) => waitFor(`${tenant}: ${needle}`, async () => {
      if (text.includes(needle)) return true;
      reading ??= reader.read().then(({ value, done }) => {
        reading = null;
        if (done) throw new Error(`${tenant}: the stream ended`);
        text += new TextDecoder().decode(value);
      });
      await Promise.race([reading, new Promise((r) => setTimeout(r, 50))]);
      return text.includes(needle);
    }),
    close: () => abort.abort(),
  };
}

const status = async (url, name = 'chat') => (await fetch(`${url}/v1/limiters/${name}`)).json();

async function main() {
  requireChromium('dashboard test');
  const server = await fairgate();
  const browser = await Browser.launch(args.chromium);
  const held = [];
  try {
    const page = await browser.open(`${server.url}/dashboard`, "document.querySelector('[data-limiter=chat]')");
    const field = (limiter, name) =>
      page.eval(`document.querySelector('[data-limiter=${limiter}] [data-field=${name}]')?.textContent`);
    const counts = async () => ({ in_use: await field('chat', 'in_use'), max: await field('chat', 'max_concurrent'),
      queued: await field('chat', 'queued') });
    const table = (id) => page.eval(`[...document.querySelectorAll('#${id} tr')].map((r) => r.textContent.trim())`);
    /** Waits until the page shows `want` (in_use/max/queued as text); how long it took. */
    const follows = async (what, want) => {
      const t = Date.now();
      let seen;
      await waitFor(`the page to show ${what}`, async () => {
        seen = await counts();
        return Object.entries(want).every(([k, v]) => seen[k] === String(v));
      }).catch(() => {});
      const ms = Date.now() - t;
      check(Object.entries(want).every(([k, v]) => seen[k] === String(v)) && ms <= FOLLOW_MS,
        `${what}: the page shows ${JSON.stringify(seen)} after ${ms} ms (bound ${FOLLOW_MS} ms)`);
    };

    // 1. Idle.
    check((await page.eval("document.getElementById('conn').dataset.state")) === 'live' ||
      await waitFor('live', async () => (await page.eval("document.getElementById('conn').dataset.state")) === 'live'),
    'the page is live (connected to /v1/events)');
    await follows('idle chat', { in_use: 0, max: 2, queued: 0 });
    check((await field('export', 'max_concurrent')) === '1', 'every limiter is drawn (export, cap 1)');
    check((await page.eval("document.querySelector('[data-limiter=chat]').getAttribute('aria-selected')")) === 'true',
      'the first limiter is selected');

    // Rate-limit rules: 5 calls on a rule of 3 per window, 3 allowed and 2 refused, as the page shows.
    const codes = [];
    for (let i = 0; i < 5; ++i) {
      const r = await fetch(`${server.url}/v1/ratelimit/per-user`, {
        method: 'POST', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify({ key: 'u1' }),
      });
      codes.push(r.status);
    }
    check(codes.join() === '200,200,200,429,429', `the rule allowed 3 of 5: ${codes.join()}`);
    const ruleField = (name) => page.eval(`document.querySelector('[data-rule=per-user] [data-field=${name}]')?.textContent`);
    await waitFor('the rule on the page', async () => (await ruleField('allowed')) === '3' && (await ruleField('refused')) === '2')
      .then(() => check(true, 'the rate-limit rule is listed with 3 allowed, 2 refused'),
        async () => check(false, `the rule row: allowed ${await ruleField('allowed')}, refused ${await ruleField('refused')}`));
    check((await ruleField('mode')) === undefined, 'an enforcing rule carries no shadow mark');
    // A shadow rule of 1: both calls pass, the second counted as "would have refused", marked so on the page.
    const trial = [];
    for (let i = 0; i < 2; ++i) {
      const r = await fetch(`${server.url}/v1/ratelimit/trial`, {
        method: 'POST', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify({ key: 'u1' }),
      });
      trial.push(r.status);
    }
    check(trial.join() === '200,200', `the shadow rule let both through: ${trial.join()}`);
    const trialField = (name) => page.eval(`document.querySelector('[data-rule=trial] [data-field=${name}]')?.textContent`);
    await waitFor('the shadow rule on the page', async () => (await trialField('refused')) === '1')
      .then(async () => check((await trialField('mode')) === 'shadow', 'the shadow rule is marked shadow on the page'),
        async () => check(false, `the shadow rule row: refused ${await trialField('refused')}, mode ${await trialField('mode')}`));

    // 2. Two hold, three wait.
    for (const tenant of ['alice', 'bob']) {
      const a = await acquire(server.url, 'chat', tenant);
      held.push(a);
      await a.until('event: granted');
    }
    for (const tenant of ['carol', 'dave', 'erin']) {
      const a = await acquire(server.url, 'chat', tenant);
      held.push(a);
      await a.until('event: queued');
    }
    let st = await status(server.url);
    check(st.in_use === 2 && st.queued === 3, `server: 2 in use, 3 queued (${st.in_use}, ${st.queued})`);
    await follows('2 holders and 3 waiters', { in_use: 2, max: 2, queued: 3 });
    const t2 = Date.now();
    await waitFor('the holders and the queue listed', async () => {
      const h = await table('holders'), q = await table('queue');
      return h.length === 2 && q.length === 3;
    }).catch(() => {});
    const holders = await table('holders'), queue = await table('queue');
    check(holders.length === 2 && holders.some((r) => r.includes('alice')) && holders.some((r) => r.includes('bob')),
      `holders listed with tenants after ${Date.now() - t2} ms: ${JSON.stringify(holders)}`);
    check(queue.length === 3 && queue[0].startsWith('1') && queue[0].includes('carol') && queue[2].includes('erin'),
      `queue listed in order: ${JSON.stringify(queue)}`);
    const tenants = await table('tenants');
    check(tenants.length === 5, `one tenant row each: ${JSON.stringify(tenants)}`);

    if (args.screenshot) {
      await new Promise((r) => setTimeout(r, 1200));  // a few chart points
      writeFileSync(args.screenshot, await page.screenshot());
      log(`screenshot: ${args.screenshot}`);
    }

    // 3. A holder leaves: carol takes the seat.
    held.shift().close();
    await held[1].until('event: granted');
    await follows('a holder left, the first waiter seated', { in_use: 2, queued: 2 });
    await waitFor('carol among the holders', async () => (await table('holders')).some((r) => r.includes('carol')))
      .then(() => check(true, 'carol (first in the queue) now holds'), () => check(false, 'carol now holds'));

    // 4. Admin actions from the page.
    const apply = async (token, cap) => {
      await page.eval(`(() => {
        document.getElementById('token').value = ${JSON.stringify(token)};
        document.getElementById('cap').value = ${JSON.stringify(String(cap))};
        document.getElementById('apply').click();
        return true;
      })()`);
      await waitFor('the admin result', async () =>
        ['ok', 'error'].includes(await page.eval("document.getElementById('admin-result').dataset.state")));
      return page.eval("[document.getElementById('admin-result').dataset.state, document.getElementById('admin-result').textContent]");
    };
    const [badState, badText] = await apply('wrong-token', 4);
    st = await status(server.url);
    check(badState === 'error' && badText.startsWith('401') && st.max_concurrent === 2,
      `a wrong token is refused: "${badText}", cap still ${st.max_concurrent}`);
    const [okState, okText] = await apply(TOKEN, 4);
    st = await status(server.url);
    check(okState === 'ok' && st.max_concurrent === 4, `cap 4 set from the page: "${okText}", server says ${st.max_concurrent}`);
    await held[2].until('event: granted');
    await held[3].until('event: granted');
    await follows('the new cap', { in_use: 4, max: 4, queued: 0 });
    await page.eval("document.getElementById('toggle').click(), true");
    await waitFor('disabled', async () => (await status(server.url)).enabled === false);
    await waitFor('the page shows it disabled', async () =>
      (await page.eval("document.querySelector('[data-limiter=chat] .state').textContent")) === 'disabled')
      .then(() => check(true, 'Disable from the page: the server and the page say disabled'),
        () => check(false, 'the page shows disabled'));
    await page.eval("document.getElementById('toggle').click(), true");
    await waitFor('enabled again', async () => (await status(server.url)).enabled === true)
      .then(() => check(true, 'Enable from the page'), () => check(false, 'Enable from the page'));

    // 5. Many waiters: 100 listed, the rest counted.
    for (const a of held.splice(0)) a.close();
    await waitFor('chat empty', async () => (await status(server.url)).in_use === 0);
    await apply(TOKEN, 1);
    for (let i = 0; i < 151; ++i) held.push(await acquire(server.url, 'chat', `t${i % 7}`));
    await waitFor('150 queued at the server', async () => (await status(server.url)).queued === 150, 60000);
    await follows('150 waiters', { in_use: 1, queued: 150 });
    await waitFor('the queue table aggregated', async () => {
      const q = await table('queue');
      return q.length === 101 && q[100].includes('50 more');
    }).catch(() => {});
    const rows = await table('queue');
    check(rows.length === 101 && rows[100].includes('50 more'), `queue: 100 rows and "${rows[100]}"`);
    // The tenants and the wait chart count every waiter, not the 100 rows drawn: t1..t3 wait 22
    // each, the others 21 (150 = the waiters i = 1..150 of tenant t(i % 7)).
    const cells = () => page.eval("[...document.querySelectorAll('#tenants tr')].map((r) => [...r.cells].map((c) => c.textContent))");
    const waiting = (t) => Object.fromEntries(t.map((r) => [r[0], Number(r[2])]));
    await waitFor('the tenants count every waiter', async () => waiting(await cells()).t3 === 22).catch(() => {});
    const byTenant = waiting(await cells());
    check(byTenant.t0 === 21 && byTenant.t1 === 22 && byTenant.t3 === 22 && byTenant.t6 === 21,
      `tenants count all 150 waiters: ${JSON.stringify(byTenant)}`);
    const charted = await page.eval("[...document.querySelectorAll('#wait-hist > div')].reduce((n, d) => n + Number(d.lastElementChild.textContent), 0)");
    check(charted === 150, `the wait chart counts all 150 waiters: ${charted}`);
    // A detail the server cannot give (here a limiter it does not have: 404) leaves no rows from
    // before, which would look live.
    await page.eval("selected = 'no-such-limiter', pollDetail(), true");
    await waitFor('the lists say unavailable', async () => (await table('queue'))[0] === 'unavailable').catch(() => {});
    const after = [await table('holders'), await table('queue'), await table('tenants')];
    check(after.every((t) => t.length === 1 && t[0] === 'unavailable'), `old rows cleared: ${JSON.stringify(after.map((t) => t.slice(0, 2)))}`);
    await page.close();
  } finally {
    for (const a of held) a.close();
    await browser.close();
    const code = await stop(server.child, 'fairgate serve');
    check(code === 0, `fairgate serve exits 0 on SIGTERM (got ${code})`);
  }
}

await run('dashboard', main);
