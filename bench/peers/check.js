#!/usr/bin/env node
// check.js — a small stand-in for `fairgate bench` to try the peer workers by
// hand: starts the instances, drives them like src/bench/driver.cpp does,
// checks the records (one per request, well-formed, cap never exceeded) and
// prints rough figures. Not the bench: `fairgate bench --system` is.
//
//   node check.js --system seed --redis redis://127.0.0.1:6379 --workload W2
//   node check.js --system bullmq --redis ... --workload W4 --waiters 1000 --duration-ms 3000
'use strict';

const { spawn } = require('node:child_process');
const path = require('node:path');
const Redis = require('ioredis');
const { redisOptions } = require('./common');

function args() {
  const o = { system: 'seed', redis: 'redis://127.0.0.1:6379', workload: 'W2', waiters: 0, durationMs: 0,
    cancelFraction: 0, timeoutFraction: 0, maxWaitMs: 0, instances: 0, seed: 1, records: '' };
  const a = process.argv.slice(2);
  for (let i = 0; i < a.length; i += 2) {
    const k = a[i].replace(/^--/, '').replace(/-([a-z])/g, (_, c) => c.toUpperCase());
    if (!(k in o)) throw new Error(`unknown flag ${a[i]}`);
    o[k] = typeof o[k] === 'number' ? Number(a[i + 1]) : a[i + 1];
  }
  return o;
}

function plan(o) {
  const p = { instances: 4, cap: 3, closed: false, requests: 0, clients: 0, spread: 0, holdMin: 0, holdMax: 0,
    duration: 0, maxWait: 30000, holders: 0, waiters: 0 };
  if (o.workload === 'W1') Object.assign(p, { instances: 2, requests: 5, holdMin: 300, holdMax: 300 });
  else if (o.workload === 'W2') Object.assign(p, { requests: 50, spread: 1000, holdMin: 20, holdMax: 80 });
  else if (o.workload === 'W3') {
    const waiters = o.waiters || 8;
    Object.assign(p, { cap: 8, closed: true, clients: Math.ceil((8 + waiters) / 4), duration: o.durationMs || 10000 });
  } else if (o.workload === 'W4') {
    p.waiters = o.waiters || 1000;
    Object.assign(p, { requests: Math.ceil(p.waiters / 4), holders: 3, duration: o.durationMs || 10000 });
    p.maxWait = p.duration + 120000;
  } else throw new Error('workload: W1..W4');
  if (o.instances) p.instances = o.instances;
  if (o.maxWaitMs) p.maxWait = o.maxWaitMs;
  return p;
}

class Child {
  constructor(argv, name) {
    this.name = name;
    this.lines = [];
    this.waiters = [];
    this.exited = false;
    this.proc = spawn(process.execPath, argv, { stdio: ['pipe', 'pipe', 'inherit'] });
    let buf = '';
    this.proc.stdout.setEncoding('utf8');
    this.proc.stdout.on('data', (d) => {
      buf += d;
      let nl;
      while ((nl = buf.indexOf('\n')) >= 0) {
        const text = buf.slice(0, nl);
        buf = buf.slice(nl + 1);
        let v;
        try {
          v = JSON.parse(text.replace(/"(arrive|grant|release|t)":(\d+)/g, '"$1":"$2"'));
        } catch (e) {
          throw new Error(`${name}: not JSON: ${text}`);
        }
        if (v.ev === 'error') throw new Error(`${name}: ${text}`);
        this.lines.push(v);
        this.waiters = this.waiters.filter((w) => !w());
      }
    });
    this.proc.on('exit', (code) => {
      this.exited = true;
      this.code = code;
      this.waiters = this.waiters.filter((w) => !w());
    });
  }
  send(text) {
    this.proc.stdin.write(`${text}\n`);
  }
  waitFor(ev, timeoutMs = 60000) {
    return new Promise((resolve, reject) => {
      const t = setTimeout(() => reject(new Error(`${this.name}: no '${ev}' after ${timeoutMs} ms`)), timeoutMs);
      const check = () => {
        const i = this.lines.findIndex((l) => l.ev === ev && !l.taken);
        if (i >= 0) {
          this.lines[i].taken = true;
          clearTimeout(t);
          resolve(this.lines[i]);
          return true;
        }
        if (this.exited) {
          clearTimeout(t);
          reject(new Error(`${this.name} exited (${this.code}) before '${ev}'`));
          return true;
        }
        return false;
      };
      if (!check()) this.waiters.push(check);
    });
  }
}

async function commandsRun(admin) {
  const info = await admin.info('commandstats');
  let total = 0;
  for (const m of info.matchAll(/cmdstat_([^:]+):calls=(\d+)/g)) if (m[1] !== 'info') total += Number(m[2]);
  return total;
}

const pct = (v, p) => (v.length ? v[Math.min(v.length, Math.max(1, Math.ceil(p * v.length))) - 1] : NaN);

async function main() {
  const o = args();
  const p = plan(o);
  const admin = new Redis(redisOptions(o.redis));
  const limiter = `${o.workload}-${process.pid}-${Date.now() % 100000}`;
  const children = [];
  for (let w = 0; w < p.instances; w++) {
    const argv = [path.join(__dirname, 'worker.js'), '--system', o.system, '--redis', o.redis, '--prefix', 'peers-check',
      '--limiter', limiter, '--instance', `c${w}`, '--max-concurrent', p.cap, '--heartbeat-ms', 1000, '--ttl-ms', 3000,
      '--command-timeout-ms', 1000, '--hold-min-ms', p.holdMin, '--hold-max-ms', p.holdMax, '--max-wait-ms', p.maxWait,
      '--seed', o.seed * 1000 + w];
    if (p.closed) argv.push('--clients', p.clients, '--duration-ms', p.duration);
    else argv.push('--requests', p.requests, '--spread-ms', p.spread);
    if (o.cancelFraction) argv.push('--cancel-fraction', o.cancelFraction);
    if (o.timeoutFraction) argv.push('--timeout-fraction', o.timeoutFraction);
    if (w === 0 && p.holders) argv.push('--holders', p.holders);
    children.push(new Child(argv.map(String), `w${w}`));
  }
  const t0 = Date.now();
  await Promise.all(children.map((c) => c.waitFor('ready', 30000)));
  console.log(`ready in ${Date.now() - t0} ms`);
  const mark = async () => {
    children.forEach((c) => c.send('mark'));
    const m = await Promise.all(children.map((c) => c.waitFor('mark')));
    return m.reduce((s, x) => s + x.commands, 0);
  };
  let extra = [];
  let redis0, client0;
  if (p.holders) {
    children[0].send('hold');
    const held = await children[0].waitFor('holding');
    children.forEach((c) => c.send('go'));
    await Promise.all(children.map((c) => c.waitFor('queued_all', 120000)));
    console.log(`all ${p.waiters} queued ${Date.now() - t0} ms`);
    await new Promise((r) => setTimeout(r, 1000));
    const ca = await mark();
    const ra = await commandsRun(admin);
    const ta = Date.now();
    await new Promise((r) => setTimeout(r, p.duration));
    const rb = await commandsRun(admin);
    const cb = await mark();
    const s = (Date.now() - ta) / 1000;
    console.log(`idle: redis ${((rb - ra) / s).toFixed(1)} cmds/s, client ${((cb - ca) / s).toFixed(1)} cmds/s`);
    redis0 = await commandsRun(admin);
    client0 = await mark();
    children[0].send('release');
    const rel = await children[0].waitFor('released');
    for (let k = 0; k < p.holders; k++) extra.push({ inst: 'holders', i: k, arrive: held.t, grant: held.t, release: rel.t, queued: false, outcome: 'granted' });
  } else {
    redis0 = await commandsRun(admin);
    client0 = await mark();
    children.forEach((c) => c.send('go'));
  }
  const done = await Promise.all(children.map((c) => c.waitFor('done', p.duration + p.maxWait + 60000)));
  const client1 = done.reduce((s, d) => s + d.commands, 0);
  const redis1 = await commandsRun(admin);
  children.forEach((c) => c.send('exit'));
  await Promise.all(children.map((c) => new Promise((r) => (c.exited ? r() : c.proc.on('exit', r)))));
  const codes = children.map((c) => c.code);

  // ---- checks ----
  const recs = children.flatMap((c) => c.lines.filter((l) => l.ev === 'req'));
  const problems = [];
  const seen = new Set();
  for (const r of recs) {
    const key = `${r.inst}#${r.i}`;
    if (seen.has(key)) problems.push(`duplicate record ${key}`);
    seen.add(key);
    for (const f of ['arrive', 'grant', 'release']) if (!/^\d+$/.test(r[f])) problems.push(`${key}: bad ${f}`);
    if (!['granted', 'timed_out', 'cancelled', 'rejected'].includes(r.outcome)) problems.push(`${key}: outcome ${r.outcome}`);
    if (r.outcome === 'granted' && (r.grant === '0' || r.release === '0')) problems.push(`${key}: granted without times`);
    if (r.outcome !== 'granted' && r.grant !== '0') problems.push(`${key}: ${r.outcome} with a grant`);
    if (r.outcome === 'timed_out' && BigInt(r.arrive) === 0n) problems.push(`${key}: no arrive`);
  }
  if (o.records) require('node:fs').writeFileSync(o.records, recs.map((r) => JSON.stringify(r)).join('\n') + '\n');
  const expected = p.closed ? null : p.requests * p.instances;
  if (expected !== null && recs.length !== expected) problems.push(`${recs.length} records, expected ${expected}`);
  const all = recs.concat(extra).map((r) => ({ ...r, arrive: BigInt(r.arrive), grant: BigInt(r.grant), release: BigInt(r.release) }));
  const ev = [];
  for (const r of all) if (r.grant) { ev.push([r.grant, 1]); if (r.release) ev.push([r.release, -1]); }
  ev.sort((a, b) => (a[0] < b[0] ? -1 : a[0] > b[0] ? 1 : a[1] - b[1]));
  let cur = 0, maxH = 0;
  for (const [, d] of ev) { cur += d; maxH = Math.max(maxH, cur); }
  if (maxH > p.cap) problems.push(`OVERSHOOT: ${maxH} holders > cap ${p.cap}`);
  const rels = all.filter((r) => r.release).map((r) => r.release).sort((a, b) => (a < b ? -1 : 1));
  const hand = [];
  for (const r of all) {
    if (!r.grant || !r.queued) continue;
    let lo = 0, hi = rels.length;
    while (lo < hi) { const m = (lo + hi) >> 1; if (rels[m] <= r.grant) lo = m + 1; else hi = m; }
    if (lo === 0) continue;
    const rel = rels[lo - 1];
    if (rel < r.arrive) continue;
    hand.push(Number(r.grant - rel) / 1e6);
  }
  hand.sort((a, b) => a - b);
  const grants = all.filter((r) => r.grant).length - p.holders;
  const outcomes = {};
  for (const r of recs) outcomes[r.outcome] = (outcomes[r.outcome] || 0) + 1;
  // FIFO inversions by the system's own sequence, > 2 ms apart
  const bySeq = all.filter((r) => r.grant && r.seq).sort((a, b) => a.seq - b.seq);
  let inv = 0;
  for (let x = 0; x < bySeq.length; x++) for (let y = x + 1; y < bySeq.length; y++) if (bySeq[y].grant + 2000000n < bySeq[x].grant) inv++;
  const keys = await admin.keys(`*${limiter}*`);
  console.log(JSON.stringify({
    system: o.system, workload: o.workload, records: recs.length, outcomes, max_holders: maxH,
    handoff_p50_ms: +pct(hand, 0.5).toFixed(3), handoff_p99_ms: +pct(hand, 0.99).toFixed(3), handoffs: hand.length,
    inversions_seq: bySeq.length ? inv : null,
    client_cmds_per_grant: +((client1 - client0) / grants).toFixed(2), redis_cmds_per_grant: +((redis1 - redis0) / grants).toFixed(2),
    exit_codes: codes, keys_left: keys.length,
  }));
  if (keys.length) console.log(`keys left: ${keys.slice(0, 12).join(' ')}${keys.length > 12 ? ' ...' : ''}`);
  if (problems.length) {
    console.log(`PROBLEMS:\n  ${problems.slice(0, 20).join('\n  ')}`);
    process.exitCode = 1;
  } else console.log('checks passed');
  await admin.quit();
}

main().catch((e) => {
  console.error(e.stack || e);
  process.exit(1);
});
