// common.js — what every peer shares: the command counter, the clock, the
// JSON lines, a seeded random source and small helpers.
'use strict';

// Count every Redis command this process writes, on every connection of every
// library (all of them use this one ioredis): Command.prototype.toWritable is
// called exactly once per command written to a socket (plain commands,
// pipelines, EVALSHA and its EVAL fallback, SUBSCRIBE, the connect handshake).
// Commands parked in ioredis' offline queue are counted when they are written.
const Command = require('ioredis/built/Command').default;
let commandsSent = 0;
const toWritable = Command.prototype.toWritable;
Command.prototype.toWritable = function countedToWritable(...args) {
  commandsSent++;
  return toWritable.apply(this, args);
};
const commands = () => commandsSent;

/** CLOCK_MONOTONIC nanoseconds (what std::chrono::steady_clock reads on Linux). */
const nowNs = () => process.hrtime.bigint();

/** One JSON object per line; BigInt values are written as plain integers. */
function line(fields) {
  const parts = [];
  for (const [k, v] of Object.entries(fields)) {
    if (v === undefined) continue;
    parts.push(`${JSON.stringify(k)}:${typeof v === 'bigint' ? v.toString() : JSON.stringify(v)}`);
  }
  process.stdout.write(`{${parts.join(',')}}\n`);
}

/** A small seeded generator (splitmix64 folded to doubles in [0, 1)). */
function rng(seed) {
  let s = BigInt.asUintN(64, BigInt(seed) * 0x9e3779b97f4a7c15n + 1n);
  return () => {
    s = BigInt.asUintN(64, s + 0x9e3779b97f4a7c15n);
    let z = s;
    z = BigInt.asUintN(64, (z ^ (z >> 30n)) * 0xbf58476d1ce4e5b9n);
    z = BigInt.asUintN(64, (z ^ (z >> 27n)) * 0x94d049bb133111ebn);
    z = z ^ (z >> 31n);
    return Number(z >> 11n) / 2 ** 53;
  };
}

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

/** A promise with its resolve/reject exposed. */
function deferred() {
  let resolve, reject;
  const promise = new Promise((res, rej) => {
    resolve = res;
    reject = rej;
  });
  return { promise, resolve, reject };
}

/** ioredis options from a redis:// URL (host, port, user, password, db). */
function redisOptions(url) {
  const u = new URL(url);
  if (u.protocol !== 'redis:') throw new Error(`--redis: ${url}: only redis:// URLs are supported`);
  const o = { host: u.hostname || '127.0.0.1', port: Number(u.port || 6379) };
  if (u.username) o.username = decodeURIComponent(u.username);
  if (u.password) o.password = decodeURIComponent(u.password);
  const db = u.pathname.replace(/^\//, '');
  if (db) o.db = Number(db);
  return o;
}

module.exports = { commands, nowNs, line, rng, sleep, deferred, redisOptions };
