// tests/browser/browser_test.mjs — examples/browser/index.html in a real
// headless Chromium against real `fairgate serve` processes (ctest -L browser).
//
//   node --experimental-websocket browser_test.mjs --fairgate BIN --page index.html --chromium BIN
//
// The page is served by a tiny static server on its own loopback port, so it
// is on another origin than fairgate. Chromium is driven over the DevTools
// protocol (no npm packages). What it checks, from the page's own state
// (#state[data-state]) and the server's status:
//  1. cors_origins lists the page's origin; the only permit is held by another
//     client: the page goes queued, then granted when that client lets go
//     (and the server shows the page's tenant as the holder); closing the page
//     releases the permit (in_use back to 0). Another page: granted, "Done" →
//     released, in_use 0.
//  2. A server without cors_origins: the page ends in `error`, and the server
//     saw no acquire at all (a foreign page takes no place and no permit).
// Exits 0 when every check passed, 1 otherwise, 77 (skipped) without Chromium
// unless FAIRGATE_REQUIRE_BROWSER=1. Only processes it started are signalled.
import { readFileSync, writeFileSync } from 'node:fs';
import { createServer } from 'node:http';
import { join } from 'node:path';

import { args, Browser, check, log, requireChromium, run, start, stop, tempDir, waitFor } from './harness.mjs';

async function fairgate(corsOrigins) {
  const dir = tempDir('fairgate-browser-');
  const config = join(dir, 'fairgate.toml');
  let text = '[limiters.chat]\nmax_concurrent = 1\nmax_wait_ms = 20000\n';
  if (corsOrigins) text += `[server]\ncors_origins = ${JSON.stringify(corsOrigins)}\n`;
  writeFileSync(config, text);
  const { child, match } = await start(args.fairgate, ['serve', '--config', config, '--listen', '127.0.0.1:0'],
    /listening on (http:\/\/127\.0\.0\.1:\d+)/, 'fairgate serve');
  return { child, url: match };
}

async function status(url) {
  const res = await fetch(`${url}/v1/limiters/chat`);
  return res.json();
}

/** Opens the example page and records every state it goes through (window.__states). */
async function openPage(browser, url) {
  const page = await browser.open(url, "document.getElementById('ask')");
  await page.eval(`(() => {
    const el = document.getElementById('state');
    window.__states = [el.dataset.state];
    new MutationObserver(() => {
      if (window.__states[window.__states.length - 1] !== el.dataset.state) window.__states.push(el.dataset.state);
    }).observe(el, { attributes: true });
    return true;
  })()`);
  return page;
}

const stateOf = (page) => page.eval("document.getElementById('state').dataset.state");
const statesOf = (page) => page.eval('window.__states');

// --- the scenarios ---------------------------------------------------------------
async function main() {
  requireChromium('browser test');
  const html = readFileSync(args.page);
  const statics = createServer((req, res) => {
    const path = req.url.split('?')[0];
    if (path === '/' || path === '/index.html') {
      res.writeHead(200, { 'Content-Type': 'text/html; charset=utf-8', 'Cache-Control': 'no-store' });
      res.end(html);
    } else {
      res.writeHead(404).end();
    }
  });
  await new Promise((r) => statics.listen(0, '127.0.0.1', r));
  const pageOrigin = `http://127.0.0.1:${statics.address().port}`;
  const allowed = await fairgate([pageOrigin]);
  const closed = await fairgate(null);
  log(`page at ${pageOrigin}; fairgate with cors_origins at ${allowed.url}, without at ${closed.url}`);
  const browser = await Browser.launch(args.chromium);
  const pageUrl = (server, tenant) =>
    `${pageOrigin}/?fairgate=${encodeURIComponent(server)}&limiter=chat&tenant=${tenant}&maxwait=20000`;

  try {
    // 1. Another client holds the only permit (no Origin: a server-side client).
    const holder = new AbortController();
    const held = await fetch(`${allowed.url}/v1/limiters/chat/acquire?tenant=holder`, {
      method: 'POST', headers: { Accept: 'text/event-stream' }, signal: holder.signal,
    });
    const reader = held.body.getReader();
    let heldText = '';
    await waitFor('the holder to be granted', async () => {
      const { value, done } = await reader.read();
      if (done) throw new Error('the holder stream ended');
      heldText += new TextDecoder().decode(value);
      return heldText.includes('event: granted');
    });

    const page = await openPage(browser, pageUrl(allowed.url, 'browser-page'));
    check((await stateOf(page)) === 'idle', 'the page starts idle');
    const clicked = Date.now();
    await page.eval("document.getElementById('ask').click(), true");
    await waitFor('the page to be queued', async () => (await stateOf(page)) === 'queued');
    log(`page queued ${Date.now() - clicked} ms after the click`);
    let st = await status(allowed.url);
    check(st.in_use === 1 && st.queued === 1 && st.queue?.[0]?.tenant === 'browser-page',
      `server: the holder in use, the page queued (in_use ${st.in_use}, queued ${st.queued}, queue ${JSON.stringify(st.queue)})`);
    check(/position 1 of 1/.test(await page.eval("document.getElementById('state').textContent")),
      'the page shows its position (1 of 1)');

    const letGo = Date.now();
    holder.abort();
    await waitFor('the page to be granted', async () => (await stateOf(page)) === 'granted');
    log(`page granted ${Date.now() - letGo} ms after the holder let go`);
    st = await status(allowed.url);
    check(st.in_use === 1 && st.queued === 0 && st.holders?.[0]?.tenant === 'browser-page',
      `server: the page holds the permit (in_use ${st.in_use}, holders ${JSON.stringify(st.holders)})`);
    const states = await statesOf(page);
    const qi = states.indexOf('queued');
    const gi = states.indexOf('granted');
    check(qi >= 0 && gi > qi && !states.includes('error') && !states.includes('rejected'),
      `page states in order: ${states.join(' → ')}`);

    const closing = Date.now();
    await page.close();
    await waitFor('in_use 0 after the page closed', async () => {
      const s = await status(allowed.url);
      return s.in_use === 0 && s.queued === 0;
    });
    log(`permit released ${Date.now() - closing} ms after the page closed`);
    check(true, 'closing the page released the permit (in_use 0, queued 0)');

    // "Done" releases too.
    const page2 = await openPage(browser, pageUrl(allowed.url, 'browser-done'));
    await page2.eval("document.getElementById('ask').click(), true");
    await waitFor('the second page to be granted', async () => (await stateOf(page2)) === 'granted');
    st = await status(allowed.url);
    check(st.in_use === 1 && st.holders?.[0]?.tenant === 'browser-done', 'a free permit is granted at once');
    await page2.eval("document.getElementById('done').click(), true");
    check((await stateOf(page2)) === 'released', 'Done → released');
    await waitFor('in_use 0 after Done', async () => (await status(allowed.url)).in_use === 0);
    check(true, 'Done released the permit (in_use 0)');
    await page2.close();

    // 2. Without cors_origins, the page cannot acquire and the server takes nothing.
    const before = (await status(closed.url)).stats.acquires;
    const page3 = await openPage(browser, pageUrl(closed.url, 'browser-refused'));
    await page3.eval("document.getElementById('ask').click(), true");
    await waitFor('the refused page to end', async () => ['error', 'rejected', 'granted'].includes(await stateOf(page3)));
    const refused = await statesOf(page3);
    check((await stateOf(page3)) === 'error' && !refused.includes('queued') && !refused.includes('granted'),
      `without cors_origins the page ends in error: ${refused.join(' → ')}`);
    st = await status(closed.url);
    check(st.in_use === 0 && st.queued === 0 && st.stats.acquires === before,
      `without cors_origins the server saw no acquire (acquires ${before} → ${st.stats.acquires}, in_use ${st.in_use})`);
    await page3.close();
  } finally {
    await browser.close();
    for (const [what, s] of [['with cors_origins', allowed], ['without', closed]]) {
      const code = await stop(s.child, 'fairgate serve');
      check(code === 0, `fairgate serve (${what}) exits 0 on SIGTERM (got ${code})`);
    }
    statics.close();
  }
}

await run('browser', main);
