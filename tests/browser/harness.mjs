// tests/browser/harness.mjs — what the browser tests share: flags, checks with
// a log, bounded waits, child processes (only those started here are
// signalled), and a headless Chromium driven over the DevTools protocol (no
// npm packages; needs `node --experimental-websocket`).
import { spawn } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

/** --name value pairs of the command line. */
export const args = Object.fromEntries(
  process.argv.slice(2).reduce((acc, a, i, all) => (a.startsWith('--') ? [...acc, [a.slice(2), all[i + 1]]] : acc), []),
);
export const LIMIT_MS = Number(process.env.FAIRGATE_BROWSER_TEST_LIMIT_MS || 20000);
const failures = [];
const children = [];
const dirs = [];
const t0 = Date.now();
export const log = (line) => console.log(`[${((Date.now() - t0) / 1000).toFixed(2)}s] ${line}`);
export const check = (ok, what) => {
  if (!ok) failures.push(what);
  log(`${ok ? 'ok  ' : 'FAIL'} ${what}`);
  return ok;
};
export const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

/** A temporary directory, removed when the test ends. */
export function tempDir(prefix) {
  const dir = mkdtempSync(join(tmpdir(), prefix));
  dirs.push(dir);
  return dir;
}

/** Polls `fn` until it returns something truthy (returned), or throws after `limit` ms. */
export async function waitFor(what, fn, limit = LIMIT_MS) {
  const deadline = Date.now() + limit;
  let last;
  for (;;) {
    last = await fn();
    if (last) return last;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await sleep(25);
  }
}

// --- processes -------------------------------------------------------------------
/** Starts `cmd`; resolves once its output matches `pattern`, with the first group. */
export function start(cmd, argv, pattern, what, stream = 'stdout') {
  const child = spawn(cmd, argv, { stdio: ['ignore', 'pipe', 'pipe'] });
  children.push(child);
  let text = '';
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`${what} did not start: ${text.slice(-500)}`)), LIMIT_MS);
    const onData = (d) => {
      text += d;
      const m = text.match(pattern);
      if (m) {
        clearTimeout(timer);
        resolve({ child, match: m[1] });
      }
    };
    child.stdout.on('data', onData);
    child.stderr.on('data', stream === 'stderr' ? onData : (d) => (text += d));
    child.on('exit', (code) => reject(new Error(`${what} exited (${code}): ${text.slice(-500)}`)));
  });
}

/** SIGTERM, then SIGKILL after LIMIT_MS; the exit code (-1: had to be killed). */
export async function stop(child, what) {
  if (child.exitCode !== null || child.signalCode !== null) return child.exitCode;
  const exited = new Promise((r) => child.once('exit', (code, sig) => r(code ?? 128)));
  child.kill('SIGTERM');
  const code = await Promise.race([exited, sleep(LIMIT_MS).then(() => -1)]);
  if (code === -1) {
    child.kill('SIGKILL');
    log(`${what} did not stop on SIGTERM`);
  }
  return code;
}

// --- Chromium over the DevTools protocol -------------------------------------------
export class Browser {
  static async launch(bin) {
    const dir = tempDir('fairgate-chromium-');
    const { child, match } = await start(bin, [
      '--headless', '--no-sandbox', '--disable-gpu', '--disable-background-networking', '--no-first-run',
      '--no-default-browser-check', '--disable-extensions', '--remote-debugging-port=0', `--user-data-dir=${dir}`,
      '--window-size=1280,900', 'about:blank',
    ], /DevTools listening on (ws:\/\/\S+)/, 'chromium', 'stderr');
    const b = new Browser(child);
    await b.connect(match);
    return b;
  }

  constructor(child) {
    this.child = child;
    this.nextId = 1;
    this.pending = new Map();
  }

  connect(url) {
    this.ws = new WebSocket(url);
    this.ws.onmessage = (e) => {
      const msg = JSON.parse(e.data);
      const p = msg.id && this.pending.get(msg.id);
      if (!p) return;
      this.pending.delete(msg.id);
      if (msg.error) p.reject(new Error(`${p.method}: ${JSON.stringify(msg.error)}`));
      else p.resolve(msg.result);
    };
    return new Promise((resolve, reject) => {
      this.ws.onopen = resolve;
      this.ws.onerror = () => reject(new Error('cannot connect to the DevTools socket'));
    });
  }

  send(method, params = {}, sessionId = undefined) {
    const id = this.nextId++;
    this.ws.send(JSON.stringify({ id, method, params, ...(sessionId ? { sessionId } : {}) }));
    return new Promise((resolve, reject) => {
      this.pending.set(id, { resolve, reject, method });
      setTimeout(() => {
        if (this.pending.delete(id)) reject(new Error(`${method}: no answer`));
      }, LIMIT_MS);
    });
  }

  /** Opens `url` in a new tab; resolves once the page is loaded and `ready` (an expression) is true. */
  async open(url, ready) {
    const { targetId } = await this.send('Target.createTarget', { url });
    const { sessionId } = await this.send('Target.attachToTarget', { targetId, flatten: true });
    const page = {
      targetId,
      eval: async (expression) => {
        const r = await this.send('Runtime.evaluate', { expression, returnByValue: true, awaitPromise: true }, sessionId);
        if (r.exceptionDetails) throw new Error(`${expression}: ${JSON.stringify(r.exceptionDetails).slice(0, 300)}`);
        return r.result.value;
      },
      /** A PNG of the page as it is drawn now (a Buffer). */
      screenshot: async () => {
        const { data } = await this.send('Page.captureScreenshot', { format: 'png' }, sessionId);
        return Buffer.from(data, 'base64');
      },
      close: () => this.send('Target.closeTarget', { targetId }),
    };
    await waitFor('the page to load', () =>
      page.eval(`document.readyState === 'complete' && !!(${ready})`).catch(() => false));
    return page;
  }

  close() {
    try { this.ws.close(); } catch { /* already closed */ }
    return stop(this.child, 'chromium');
  }
}

/** Exits 77 (skipped) without Chromium, unless FAIRGATE_REQUIRE_BROWSER=1 makes that a failure. */
export function requireChromium(what) {
  if (args.chromium) return;
  if (process.env.FAIRGATE_REQUIRE_BROWSER === '1') throw new Error('chromium not found (scripts/setup.sh installs it)');
  console.log(`${what} skipped: chromium not found`);
  process.exit(77);
}

/** Runs `main` under a watchdog, cleans up, prints the verdict and exits 0 or 1. */
export async function run(what, main, limitMs = 120000) {
  const watchdog = setTimeout(() => {
    console.log(`FAIL: the ${what} test did not finish within ${limitMs / 1000} s`);
    for (const c of children) c.kill('SIGKILL');
    process.exit(1);
  }, limitMs);
  try {
    await main();
  } catch (e) {
    failures.push(String(e && e.stack || e));
    console.log(`FAIL: ${e && e.stack || e}`);
  }
  clearTimeout(watchdog);
  for (const c of children) if (c.exitCode === null && c.signalCode === null) c.kill('SIGKILL');
  for (const d of dirs) rmSync(d, { recursive: true, force: true });
  console.log(failures.length ? `${what}: ${failures.length} failed` : `${what}: ok`);
  process.exit(failures.length ? 1 : 0);
}
