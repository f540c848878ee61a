// seed.js — the seed design (ragent's FairDistributedRateLimiter on Redisson),
// rebuilt small and faithfully as the "before" row. Deliberately NOT improved:
//
//  - acquire: write the entry liveness marker (SET PX maxWait + 5 s), INCR the
//    sequence, ZADD the request to the queue scored by it, then try at once;
//  - tryAcquireIfReady: availablePermits() (Lua, one round trip); if > 0, the
//    claim script over the head window (maxRank = available, + slack 16) of
//    live entries, which returns the original score; then a separate
//    RPermitExpirableSemaphore.tryAcquire(wait 0, lease) rebuilt in Lua; on a
//    miss re-write the marker and re-queue with the ORIGINAL score, publish;
//    on a hit publish, then grant;
//  - waiting: a fixed-rate 200 ms poller per ticket, plus a Pub/Sub broadcast
//    ("permit_changed") on every release / grant / re-queue / removal, after
//    which the per-process PollNotifier (firing flag + pending counter) runs
//    EVERY local poller once (if availablePermits() > 0), coalescing bursts;
//  - Ticket state machine PENDING -> GRANTED | TIMED_OUT | CANCELLED (one
//    exit), idempotent cleanup (ZREM, DEL marker, release a non-granted
//    permit, publish if something changed). The wait deadline is checked by
//    the poller, so a timeout is noticed on a poll tick (<= 200 ms late).
//  - a permit is leased for 30 s (the seed's `lease-seconds: 30`): a crashed
//    holder's permit comes back only when the lease runs out.
// Times passed to the semaphore scripts are the client's Date.now(), as
// Redisson does.
'use strict';

const crypto = require('node:crypto');
const Redis = require('ioredis');
const { nowNs, redisOptions } = require('./common');

const POLL_INTERVAL_MS = 200; // rag.rate-limit.global.poll-interval-ms
const LEASE_MS = 30000; // rag.rate-limit.global.lease-seconds: 30
const ENTRY_TTL_BUFFER_MS = 5000; // FairDistributedRateLimiter.ENTRY_TTL_BUFFER_MILLIS
const NON_EXPIRABLE_TIMEOUT = '922337203685477';

// queue_claim_atomic.lua, as the seed describes it (ZRANGE head window +
// slack, EXISTS per member, ZREM zombies, claim when live rank < maxRank).
const CLAIM_LUA = `
local queueKey = KEYS[1]
local requestId = ARGV[1]
local maxRank = tonumber(ARGV[2])
local entryPrefix = ARGV[3]
local slack = 16
local headEntries = redis.call('ZRANGE', queueKey, 0, maxRank + slack - 1)
local liveRank = -1
local liveCount = 0
for i = 1, #headEntries do
  local member = headEntries[i]
  if redis.call('EXISTS', entryPrefix .. member) == 1 then
    if member == requestId then liveRank = liveCount end
    liveCount = liveCount + 1
  else
    redis.call('ZREM', queueKey, member)
  end
end
if liveRank < 0 or liveRank >= maxRank then return {0} end
local score = redis.call('ZSCORE', queueKey, requestId)
redis.call('ZREM', queueKey, requestId)
redis.call('DEL', entryPrefix .. requestId)
return {1, score}
`;

// Redisson RPermitExpirableSemaphore, rebuilt: KEYS[1] = permits available
// (string), KEYS[2] = leased permit ids scored by lease expiry (zset),
// KEYS[3] = the semaphore's own channel.
const SEM_TRY_SET_PERMITS = `
local value = redis.call('get', KEYS[1])
if value == false then
  redis.call('set', KEYS[1], ARGV[1])
  redis.call('publish', KEYS[3], ARGV[1])
  return 1
end
return 0
`;
const SEM_AVAILABLE = `
local expiredIds = redis.call('zrangebyscore', KEYS[2], 0, ARGV[1], 'limit', 0, -1)
if #expiredIds > 0 then
  redis.call('zrem', KEYS[2], unpack(expiredIds))
  local value = redis.call('incrby', KEYS[1], #expiredIds)
  if tonumber(value) > 0 then redis.call('publish', KEYS[3], value) end
  return value
end
local value = redis.call('get', KEYS[1])
if value == false then return 0 end
return value
`;
// ARGV: permits, lease expiry (ms), permit id, now (ms), non-expirable marker
const SEM_TRY_ACQUIRE = `
local expiredIds = redis.call('zrangebyscore', KEYS[2], 0, ARGV[4], 'limit', 0, ARGV[1])
if #expiredIds > 0 then
  redis.call('zrem', KEYS[2], unpack(expiredIds))
  local value = redis.call('incrby', KEYS[1], #expiredIds)
  if tonumber(value) > 0 then redis.call('publish', KEYS[3], value) end
end
local value = redis.call('get', KEYS[1])
if value ~= false and tonumber(value) >= tonumber(ARGV[1]) then
  redis.call('decrby', KEYS[1], ARGV[1])
  redis.call('zadd', KEYS[2], ARGV[2], ARGV[3])
  local ttl = redis.call('pttl', KEYS[1])
  if ttl > 0 then redis.call('pexpire', KEYS[2], ttl) end
  return ARGV[3]
end
local v = redis.call('zrange', KEYS[2], 0, 0, 'WITHSCORES')
if v[1] ~= nil and v[2] ~= ARGV[5] then return ':' .. tostring(v[2]) end
return nil
`;
// ARGV: permit id, permits, now (ms)
const SEM_RELEASE = `
local expire = redis.call('zscore', KEYS[2], ARGV[1])
local removed = redis.call('zrem', KEYS[2], ARGV[1])
if tonumber(removed) ~= 1 then return 0 end
local value = redis.call('incrby', KEYS[1], ARGV[2])
redis.call('publish', KEYS[3], value)
if tonumber(expire) <= tonumber(ARGV[3]) then return 0 end
return 1
`;

const PENDING = 'PENDING';
const GRANTED = 'GRANTED';
const TIMED_OUT = 'TIMED_OUT';
const CANCELLED = 'CANCELLED';

class SeedLimiter {
  constructor(opts, ctx) {
    this.opts = opts;
    this.ctx = ctx;
    const base = `${opts.prefix}:{${opts.limiter}}:seed:`;
    this.semaphoreKey = `${base}semaphore`;
    this.semaphoreTimeoutKey = `${base}semaphore:timeout`;
    this.semaphoreChannel = `redisson_sc:{${base}semaphore}`;
    this.queueKey = `${base}queue`;
    this.queueSeqKey = `${base}queue:seq`;
    this.notifyTopic = `${base}queue:notify`;
    this.entryPrefix = `${base}entry:`;
    this.pollers = new Map(); // PollNotifier: requestId -> poller
    this.firing = false;
    this.pendingNotifications = 0;
    this.tickets = new Set();
    this.held = [];
  }

  async init() {
    const o = { ...redisOptions(this.opts.redis), lazyConnect: true, enableOfflineQueue: true };
    this.redis = new Redis(o);
    this.sub = new Redis(o);
    this.redis.on('error', () => {});
    this.sub.on('error', () => {});
    this.redis.defineCommand('seedClaim', { numberOfKeys: 1, lua: CLAIM_LUA });
    this.redis.defineCommand('semTrySetPermits', { numberOfKeys: 3, lua: SEM_TRY_SET_PERMITS });
    this.redis.defineCommand('semAvailable', { numberOfKeys: 3, lua: SEM_AVAILABLE });
    this.redis.defineCommand('semTryAcquire', { numberOfKeys: 3, lua: SEM_TRY_ACQUIRE });
    this.redis.defineCommand('semRelease', { numberOfKeys: 3, lua: SEM_RELEASE });
    await Promise.all([this.redis.connect(), this.sub.connect()]);
    // start(): trySetPermits once, then subscribe the notify topic.
    await this.redis.semTrySetPermits(
      this.semaphoreKey,
      this.semaphoreTimeoutKey,
      this.semaphoreChannel,
      this.opts.maxConcurrent,
    );
    this.sub.on('message', () => this.fire());
    await this.sub.subscribe(this.notifyTopic);
  }

  semKeys() {
    return [this.semaphoreKey, this.semaphoreTimeoutKey, this.semaphoreChannel];
  }

  // ---- Redis operations -------------------------------------------------

  async availablePermits() {
    return Number(await this.redis.semAvailable(...this.semKeys(), Date.now()));
  }

  async tryAcquirePermit() {
    const id = crypto.randomBytes(16).toString('hex');
    const now = Date.now();
    const r = await this.redis.semTryAcquire(...this.semKeys(), 1, now + LEASE_MS, id, now, NON_EXPIRABLE_TIMEOUT);
    return r && !String(r).startsWith(':') ? String(r) : null;
  }

  async releasePermitQuietly(permitId) {
    try {
      await this.redis.semRelease(...this.semKeys(), permitId, 1, Date.now());
    } catch (e) {
      // the permit may have expired
    }
  }

  async publishQueueNotify() {
    await this.redis.publish(this.notifyTopic, 'permit_changed');
  }

  async setEntryMarker(requestId, remainingMs) {
    const ttl = Math.max(remainingMs, 1) + ENTRY_TTL_BUFFER_MS;
    try {
      await this.redis.set(this.entryPrefix + requestId, '1', 'PX', ttl);
    } catch (e) {
      // logged at debug level in the seed
    }
  }

  async deleteEntryMarker(requestId) {
    try {
      await this.redis.del(this.entryPrefix + requestId);
    } catch (e) {
      // logged at debug level in the seed
    }
  }

  async claimIfReady(requestId, available) {
    const r = await this.redis.seedClaim(this.queueKey, requestId, available, this.entryPrefix);
    if (!r || Number(r[0]) !== 1) return -1;
    return r.length >= 2 && r[1] != null ? Number(r[1]) : Number(await this.redis.incr(this.queueSeqKey));
  }

  // ---- the limiter ------------------------------------------------------

  /** FairDistributedRateLimiter.acquire: resolves with the ticket's exit. */
  acquire(maxWaitMs, onQueued) {
    const requestId = `${this.opts.instance}-${crypto.randomBytes(8).toString('hex')}`;
    let settle;
    const done = new Promise((resolve) => {
      settle = resolve;
    });
    const ticket = {
      requestId,
      deadline: Date.now() + maxWaitMs,
      state: PENDING,
      permitRef: null,
      timer: null,
      scheduled: false,
      seq: 0,
      done,
      settle,
    };
    this.tickets.add(ticket);
    done.then(() => this.tickets.delete(ticket));
    (async () => {
      // The marker goes first, else a concurrent claim would take the new entry for a zombie.
      await this.setEntryMarker(requestId, maxWaitMs);
      ticket.seq = Number(await this.redis.incr(this.queueSeqKey));
      await this.redis.zadd(this.queueKey, ticket.seq, requestId);
      if (await this.tryAcquireIfReady(ticket)) return;
      if (ticket.state !== PENDING) return;
      onQueued(ticket);
      this.scheduleQueuePoll(ticket);
    })().catch((e) => {
      if (ticket.state === PENDING) {
        ticket.state = CANCELLED;
        ticket.settle({ outcome: 'rejected', reason: `error: ${e.message}` });
      }
    });
    return ticket;
  }

  async tryAcquireIfReady(ticket) {
    if (ticket.state !== PENDING) return false;
    const avail = await this.availablePermits();
    if (avail <= 0) return false;
    const claimedScore = await this.claimIfReady(ticket.requestId, avail);
    if (claimedScore < 0) return false;
    const permitId = await this.tryAcquirePermit();
    if (permitId === null) {
      // At the head but no permit: back into the queue with the ORIGINAL score.
      await this.setEntryMarker(ticket.requestId, Math.max(1, ticket.deadline - Date.now()));
      await this.redis.zadd(this.queueKey, claimedScore, ticket.requestId);
      await this.publishQueueNotify();
      if (ticket.state !== PENDING) {
        await this.redis.zrem(this.queueKey, ticket.requestId);
        await this.deleteEntryMarker(ticket.requestId);
      }
      return false;
    }
    if (ticket.state !== PENDING) {
      await this.releasePermitQuietly(permitId);
      await this.publishQueueNotify();
      return false;
    }
    await this.publishQueueNotify();
    return this.grant(ticket, permitId);
  }

  grant(ticket, permitId) {
    ticket.permitRef = permitId;
    if (ticket.state !== PENDING) {
      if (ticket.permitRef === permitId) {
        ticket.permitRef = null;
        this.releasePermitQuietly(permitId).then(() => this.publishQueueNotify());
      }
      return false;
    }
    ticket.state = GRANTED;
    this.pollers.delete(ticket.requestId);
    this.cancelFuture(ticket);
    ticket.settle({ outcome: 'granted', permitId });
    return true;
  }

  /** Releases the ticket's permit (the `finally` of the granted work). */
  async releaseHeldPermit(ticket) {
    const pid = ticket.permitRef;
    ticket.permitRef = null;
    if (pid !== null) {
      await this.releasePermitQuietly(pid);
      await this.publishQueueNotify();
    }
  }

  timeout(ticket) {
    if (ticket.state !== PENDING) return;
    ticket.state = TIMED_OUT;
    ticket.settle({ outcome: 'timed_out', reason: 'timeout', cleanup: this.cleanup(ticket) });
  }

  cancel(ticket) {
    if (ticket.state === PENDING) ticket.state = CANCELLED;
    const cleaning = this.cleanup(ticket);
    if (ticket.state === CANCELLED) ticket.settle({ outcome: 'cancelled', reason: 'cancelled', cleanup: cleaning });
    return cleaning;
  }

  async cleanup(ticket) {
    let removed = false;
    try {
      removed = (await this.redis.zrem(this.queueKey, ticket.requestId)) > 0;
    } catch (e) {
      // debug log in the seed
    }
    await this.deleteEntryMarker(ticket.requestId);
    let releasedPermit = false;
    if (ticket.state !== GRANTED) {
      const pid = ticket.permitRef;
      ticket.permitRef = null;
      if (pid !== null) {
        await this.releasePermitQuietly(pid);
        releasedPermit = true;
      }
    }
    if (removed || releasedPermit) await this.publishQueueNotify();
    this.pollers.delete(ticket.requestId);
    this.cancelFuture(ticket);
  }

  cancelFuture(ticket) {
    ticket.scheduled = false;
    if (ticket.timer) clearTimeout(ticket.timer);
    ticket.timer = null;
  }

  scheduleQueuePoll(ticket) {
    const interval = Math.max(50, POLL_INTERVAL_MS);
    const poller = async () => {
      if (ticket.state !== PENDING) {
        this.pollers.delete(ticket.requestId);
        this.cancelFuture(ticket);
        return;
      }
      if (Date.now() > ticket.deadline) {
        this.timeout(ticket);
        return;
      }
      await this.tryAcquireIfReady(ticket);
    };
    // scheduleAtFixedRate(poller, interval, interval): runs of one ticket never overlap.
    ticket.scheduled = true;
    let due = Date.now() + interval;
    const tick = async () => {
      ticket.timer = null;
      if (!ticket.scheduled) return;
      try {
        await poller();
      } catch (e) {
        // a failed poll is retried on the next tick
      }
      if (!ticket.scheduled) return;
      due += interval;
      ticket.timer = setTimeout(tick, Math.max(0, due - Date.now()));
    };
    ticket.timer = setTimeout(tick, interval);
    this.pollers.set(ticket.requestId, poller);
  }

  /** PollNotifier.fire: coalesced "run every local poller once". */
  fire() {
    this.pendingNotifications++;
    if (this.firing) return;
    this.firing = true;
    (async () => {
      do {
        this.pendingNotifications = 0;
        try {
          if ((await this.availablePermits()) <= 0) break;
          for (const poller of [...this.pollers.values()]) {
            try {
              await poller();
            } catch (e) {
              // debug log in the seed
            }
          }
        } catch (e) {
          break;
        } finally {
          this.firing = false;
        }
      } while (this.pendingNotifications > 0 && !this.firing && (this.firing = true));
    })();
  }

  // ---- the peer interface -----------------------------------------------

  async run(req) {
    const ticket = this.acquire(req.maxWaitMs, () => this.ctx.queued(req));
    req.ticket = ticket;
    const result = await ticket.done;
    req.seq = ticket.seq || undefined;
    if (result.outcome !== 'granted') {
      req.outcome = result.outcome;
      req.reason = result.reason;
      if (result.cleanup) await result.cleanup;
      return;
    }
    req.grant = nowNs();
    req.outcome = 'granted';
    await this.ctx.work(req.holdMs);
    req.release = nowNs();
    await this.releaseHeldPermit(ticket);
  }

  async hold(n) {
    const tickets = [];
    for (let k = 0; k < n; k++) tickets.push(this.acquire(60000, () => {}));
    const results = await Promise.all(tickets.map((t) => t.done));
    const bad = results.find((r) => r.outcome !== 'granted');
    this.held.push(...tickets.filter((t, k) => results[k].outcome === 'granted'));
    if (bad) throw new Error(`not granted: ${bad.outcome}`);
  }

  async releaseHeld() {
    const held = this.held.splice(0);
    await Promise.all(held.map((t) => this.releaseHeldPermit(t)));
  }

  async close(live) {
    await Promise.all([...this.tickets].filter((t) => t.state === PENDING).map((t) => this.cancel(t)));
    await this.releaseHeld();
    await this.ctx.settled(live, 3000);
    await this.sub.quit().catch(() => {});
    await this.redis.quit().catch(() => {});
  }
}

module.exports.create = (opts, ctx) => {
  const limiter = new SeedLimiter(opts, ctx);
  return {
    init: () => limiter.init(),
    run: (req) => limiter.run(req),
    cancel: (req) => req.ticket && limiter.cancel(req.ticket),
    hold: (n) => limiter.hold(n),
    releaseHeld: () => limiter.releaseHeld(),
    close: (live) => limiter.close(live),
  };
};
