// fairgate — a client for the fairgate admission server (`fairgate serve`),
// for Node >= 18 (global fetch), Deno and Bun. No dependencies.
//
// Invariant: a Permit owns one open SSE response, and the server holds the
// permit exactly as long as that response is open. Every way out of acquire()
// that does not hand out a Permit aborts the request (the server then cancels
// the wait, or releases a grant that raced the abort), so an exception, an
// AbortSignal or a callback that throws never strands a permit.
// The wire contract: docs/serve.md and docs/openapi.yaml in the fairgate repository.

export const REJECT_REASONS = Object.freeze(['timeout', 'queue_full', 'disabled', 'unavailable', 'too_many_waiters']);

const asyncDispose = Symbol.asyncDispose ?? Symbol.for('nodejs.asyncDispose');
const dispose = Symbol.dispose ?? Symbol.for('nodejs.dispose');
const VERSION = '0.1.0';

/** Base class of every error this package throws. */
export class FairgateError extends Error {
  constructor(reason, message, status = 0, options) {
    super(message ? `${reason}: ${message}` : reason, options);
    this.name = 'FairgateError';
    this.reason = reason;
    this.status = status;
    this.detail = message ?? '';
  }
}

/** The server decided: no permit (reason timeout, queue_full, disabled, unavailable, too_many_waiters). */
export class Rejected extends FairgateError {
  constructor(reason, message, { status = 0, waitedMs = 0, ticket = null, retryAfterMs = null } = {}) {
    super(reason, message, status);
    this.name = 'Rejected';
    this.waitedMs = waitedMs;
    this.ticket = ticket;
    this.retryAfterMs = retryAfterMs;
  }
}

/** The server refused the request itself: bad parameter (400), unknown limiter or permit (404), 401, ... */
export class ApiError extends FairgateError {
  constructor(reason, message, status) {
    super(reason, message, status);
    this.name = 'ApiError';
  }
}

/** The server could not be reached, or the stream broke before a decision. */
export class ConnectionFailed extends FairgateError {
  constructor(message, options) {
    super('connection', message, 0, options);
    this.name = 'ConnectionFailed';
  }
}

function errorFromResponse(status, text, retryAfter) {
  let reason = 'http_error';
  let message = text.trim().slice(0, 200);
  try {
    const err = JSON.parse(text)?.error;
    if (err && typeof err === 'object') {
      reason = String(err.reason ?? err.code ?? reason);
      message = String(err.message ?? '');
    }
  } catch {}
  if (REJECT_REASONS.includes(reason) || status === 429) {
    const s = Number.parseInt(retryAfter ?? '', 10);
    return new Rejected(reason, message, { status, retryAfterMs: Number.isFinite(s) ? s * 1000 : null });
  }
  return new ApiError(reason, message || `HTTP ${status}`, status);
}

function checkMs(name, v) {
  if (v === undefined || v === null) return undefined;
  if (typeof v !== 'number' || !Number.isFinite(v) || v < 0) throw new TypeError(`${name}: expected milliseconds >= 0, got ${v}`);
  return Math.round(v);
}

function acquireQuery({ maxWaitMs, tenant, weight, leaseMs } = {}) {
  const q = new URLSearchParams();
  const wait = checkMs('maxWaitMs', maxWaitMs);
  if (wait !== undefined) q.set('max_wait_ms', String(wait));
  if (tenant !== undefined && tenant !== null) {
    if (typeof tenant !== 'string') throw new TypeError('tenant: expected a string');
    q.set('tenant', tenant);
  }
  if (weight !== undefined && weight !== null) {
    if (!Number.isInteger(weight)) throw new TypeError('weight: expected an integer');
    q.set('weight', String(weight));
  }
  const lease = checkMs('leaseMs', leaseMs);
  if (lease !== undefined) q.set('lease_ms', String(lease));
  const s = q.toString();
  return s ? `?${s}` : '';
}

/** Reads an SSE body: yields {event, data} per dispatched event; comments are skipped. */
async function* sseEvents(body) {
  const reader = body.getReader();
  const decoder = new TextDecoder();
  let buf = '';
  let event = '';
  let data = [];
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      buf += decoder.decode(value, { stream: true });
      let nl;
      while ((nl = buf.indexOf('\n')) >= 0) {
        const line = buf.slice(0, nl).replace(/\r$/, '');
        buf = buf.slice(nl + 1);
        if (line === '') {
          if (event || data.length) yield { event: event || 'message', data: data.join('\n') };
          event = '';
          data = [];
        } else if (!line.startsWith(':')) {
          const colon = line.indexOf(':');
          const field = colon < 0 ? line : line.slice(0, colon);
          let value = colon < 0 ? '' : line.slice(colon + 1);
          if (value.startsWith(' ')) value = value.slice(1);
          if (field === 'event') event = value;
          else if (field === 'data') data.push(value);
        }
      }
    }
  } finally {
    reader.releaseLock?.();
  }
}

function describe(e) {
  const c = e?.cause;
  return c?.code ?? c?.errors?.[0]?.code ?? c?.message ?? e?.message ?? String(e);
}

function parseJson(text) {
  try {
    return text ? JSON.parse(text) : null;
  } catch {
    return null;
  }
}

/**
 * A granted permit, held while its stream is open. `release()` (idempotent),
 * `await using permit = await fg.acquire(...)`, or abort the signal given to
 * acquire(). `signal` aborts when the permit ends (released or lost): pass it
 * to the work the permit guards.
 */
export class Permit {
  #controller;
  #events;
  #released = false;
  #lost = false;
  #ended;
  #unlink;

  constructor(limiter, data, controller, events, onLost, userSignal) {
    this.limiter = limiter;
    this.id = String(data?.permit ?? '');
    this.ticket = data?.ticket ?? null;
    this.waitedMs = Number(data?.waited_ms ?? 0);
    this.grantedAt = performance.now();
    this.#controller = controller;
    this.#events = events;
    this.signal = controller.signal;
    // The caller's signal, once granted, releases the permit.
    if (userSignal) {
      const onAbort = () => void this.release();
      userSignal.addEventListener('abort', onAbort, { once: true });
      this.#unlink = () => userSignal.removeEventListener('abort', onAbort);
    }
    this.#ended = this.#watch(onLost);
  }

  async #watch(onLost) {
    try {
      for await (const _ of this.#events) {
        // keep-alives are comments; nothing else is expected after the grant
      }
    } catch {}
    if (this.#released) return;
    this.#lost = true;
    this.#unlink?.();
    this.#controller.abort(new ConnectionFailed('the server ended the stream while the permit was held'));
    try {
      await onLost?.(this);
    } catch (e) {
      queueMicrotask(() => {
        throw e;
      });
    }
  }

  /** True once release() was called. */
  get released() {
    return this.#released;
  }

  /** True when the server ended the stream while the permit was held. */
  get lost() {
    return this.#lost;
  }

  /** Gives the permit back (closes the stream). Safe to call again. */
  async release() {
    if (this.#released || this.#lost) {
      this.#released = true;
      return;
    }
    this.#released = true;
    this.#unlink?.();
    this.#controller.abort(new DOMException('permit released', 'AbortError'));
    await this.#ended;
  }

  async [asyncDispose]() {
    await this.release();
  }

  [dispose]() {
    void this.release();
  }

  toString() {
    return `Permit(${this.limiter}/${this.id}, ${this.#released ? 'released' : this.#lost ? 'lost' : 'held'})`;
  }
}

/** A JSON permit (long poll): held until release() or until its lease runs out unless renew()ed. */
export class Lease {
  #client;
  #released = false;
  constructor(client, limiter, data) {
    this.#client = client;
    this.limiter = limiter;
    this.id = String(data.permit);
    this.leaseMs = Number(data.lease_ms);
    this.waitedMs = Number(data.waited_ms);
  }
  async renew() {
    const body = await this.#client._call('POST', `/v1/permits/${encodeURIComponent(this.id)}/renew`);
    this.leaseMs = Number(body.lease_ms);
    return this.leaseMs;
  }
  async release() {
    if (this.#released) return true;
    this.#released = true;
    try {
      await this.#client._call('DELETE', `/v1/permits/${encodeURIComponent(this.id)}`);
      return true;
    } catch (e) {
      if (e instanceof ApiError && e.status === 404) return false;
      throw e;
    }
  }
  async [asyncDispose]() {
    await this.release();
  }
}

/** A fairgate server. `timeoutMs` bounds every call that does not wait in a queue. */
export class Fairgate {
  #base;
  constructor(url = 'http://127.0.0.1:8080', { timeoutMs = 10000, adminToken, fetch: fetchImpl } = {}) {
    const u = new URL(url);
    if (u.protocol !== 'http:' && u.protocol !== 'https:') throw new TypeError(`url: ${url} is not http(s)://HOST[:PORT]`);
    this.#base = u.href.replace(/\/+$/, '');
    this.url = this.#base;
    this.timeoutMs = timeoutMs;
    this.adminToken = adminToken;
    this.fetch = fetchImpl ?? globalThis.fetch;
    if (typeof this.fetch !== 'function') throw new TypeError('no fetch: Node >= 18 is required (or pass options.fetch)');
  }

  /**
   * Waits in the limiter's queue and resolves with the granted Permit.
   * options: maxWaitMs, tenant, weight, signal (aborts the wait; once granted,
   * releases the permit), onQueued({position, queued, estimatedWaitMs, ticket}), onLost(permit).
   * Rejects with Rejected (reason), ApiError, ConnectionFailed, or the signal's reason.
   */
  async acquire(limiter, options = {}) {
    const { signal, onQueued, onLost } = options;
    signal?.throwIfAborted();
    const url = `${this.#base}/v1/limiters/${encodeURIComponent(limiter)}/acquire${acquireQuery(options)}`;
    const controller = new AbortController();
    const onAbort = () => controller.abort(signal.reason);
    signal?.addEventListener('abort', onAbort, { once: true });
    const unlink = () => signal?.removeEventListener('abort', onAbort);
    let events;
    try {
      let res;
      // The event-stream header comes at once: a server that does not send it within timeoutMs is stuck.
      const headerTimer = setTimeout(
        () => controller.abort(new ConnectionFailed(`${this.#base}: no answer within ${this.timeoutMs} ms`)),
        this.timeoutMs,
      );
      try {
        res = await this.fetch(url, {
          method: 'POST',
          headers: { accept: 'text/event-stream', 'user-agent': `fairgate-node/${VERSION}` },
          signal: controller.signal,
          cache: 'no-store',
        });
      } catch (e) {
        if (controller.signal.aborted) throw controller.signal.reason;
        throw new ConnectionFailed(`${this.#base}: ${describe(e)}`, { cause: e });
      } finally {
        clearTimeout(headerTimer);
      }
      if (res.status !== 200 || !(res.headers.get('content-type') ?? '').startsWith('text/event-stream')) {
        const text = await res.text();
        throw errorFromResponse(res.status, text, res.headers.get('retry-after'));
      }
      events = sseEvents(res.body);
      for (;;) {
        let next;
        try {
          next = await events.next();
        } catch (e) {
          if (controller.signal.aborted) throw controller.signal.reason;
          throw new ConnectionFailed(`${this.#base}: the stream broke while waiting: ${e?.message ?? e}`, { cause: e });
        }
        if (next.done) throw new ConnectionFailed(`${this.#base}: the server ended the stream before a decision`);
        const { event, data } = next.value;
        const d = parseJson(data) ?? {};
        if (event === 'queued') {
          await onQueued?.({
            position: d.position,
            queued: d.queued,
            estimatedWaitMs: d.estimated_wait_ms ?? null,
            ticket: d.ticket ?? null,
          });
        } else if (event === 'granted') {
          if (signal?.aborted) throw signal.reason;
          unlink();
          return new Permit(limiter, d, controller, events, onLost, signal);
        } else if (event === 'rejected') {
          throw new Rejected(String(d.reason ?? 'unavailable'), String(d.message ?? ''), {
            status: 200,
            waitedMs: Number(d.waited_ms ?? 0),
            ticket: d.ticket ?? null,
          });
        }
      }
    } catch (e) {
      unlink();
      controller.abort(e); // cancels the wait on the server, or releases a grant that raced this exit
      throw e;
    }
  }

  /** Runs fn(permit) while holding a permit; releases when fn settles (also when it throws). */
  async run(limiter, fn, options = {}) {
    const permit = await this.acquire(limiter, options);
    try {
      return await fn(permit);
    } finally {
      await permit.release();
    }
  }

  /** The JSON long poll: resolves with a Lease held until release() or until leaseMs runs out. */
  async acquireLease(limiter, options = {}) {
    const path = `/v1/limiters/${encodeURIComponent(limiter)}/acquire${acquireQuery(options)}`;
    const body = await this._call('POST', path, { signal: options.signal, wait: true });
    return new Lease(this, limiter, body);
  }

  /** GET /v1/limiters → the limiters' settings and counts. */
  async limiters() {
    return (await this._call('GET', '/v1/limiters')).limiters ?? [];
  }

  /** GET /v1/limiters/NAME → one limiter with holders and queue. */
  async limiter(name) {
    return this._call('GET', `/v1/limiters/${encodeURIComponent(name)}`);
  }

  /** PUT /v1/limiters/NAME (admin token): max_concurrent, max_wait_ms, max_queue, enabled, tenant_fairness, max_per_tenant. */
  async configure(name, changes, { token } = {}) {
    const t = token ?? this.adminToken;
    return this._call('PUT', `/v1/limiters/${encodeURIComponent(name)}`, {
      body: changes,
      headers: t ? { authorization: `Bearer ${t}` } : {},
    });
  }

  /**
   * POST /v1/ratelimit/RULE: takes `cost` units for `key`. Resolves with the
   * decision either way ({allowed, remaining, reset_ms, retry_after_ms, decision?, reason?});
   * bad input rejects with ApiError.
   */
  async rateLimit(rule, key, { cost = 1 } = {}) {
    return this._call('POST', `/v1/ratelimit/${encodeURIComponent(rule)}`, { body: { key, cost }, accept: [200, 429] });
  }

  /** POST /v1/ratelimit/RULE/refund: gives back unused units of an allowed decision; resolves with the units that came back. */
  async refund(rule, key, decision, amount) {
    const r = await this._call('POST', `/v1/ratelimit/${encodeURIComponent(rule)}/refund`, {
      body: { key, decision, amount },
    });
    return r.refunded ?? 0;
  }

  /** GET /v1/ratelimit → every rate-limit rule with this instance's counters. */
  async rateRules() {
    return (await this._call('GET', '/v1/ratelimit')).rules ?? [];
  }

  /** GET /healthz (also its body when the server answers 503). */
  async health() {
    return this._call('GET', '/healthz', { accept: [200, 503] });
  }

  async _call(method, path, { body, headers = {}, signal, wait = false, accept = [200, 204] } = {}) {
    const signals = [signal].filter(Boolean);
    if (!wait) signals.push(AbortSignal.timeout(this.timeoutMs));
    const combined = signals.length === 0 ? undefined : signals.length === 1 ? signals[0] : anySignal(signals);
    let res;
    let text;
    try {
      res = await this.fetch(this.#base + path, {
        method,
        headers: {
          accept: 'application/json',
          'user-agent': `fairgate-node/${VERSION}`,
          ...(body !== undefined ? { 'content-type': 'application/json' } : {}),
          ...headers,
        },
        body: body !== undefined ? JSON.stringify(body) : undefined,
        signal: combined,
        cache: 'no-store',
      });
      text = await res.text();
    } catch (e) {
      if (signal?.aborted) throw signal.reason;
      throw new ConnectionFailed(`${this.#base}: ${describe(e)}`, { cause: e });
    }
    if (!accept.includes(res.status)) throw errorFromResponse(res.status, text, res.headers.get('retry-after'));
    return parseJson(text) ?? {};
  }
}

function anySignal(signals) {
  if (AbortSignal.any) return AbortSignal.any(signals);
  const c = new AbortController();
  for (const s of signals) {
    if (s.aborted) {
      c.abort(s.reason);
      break;
    }
    s.addEventListener('abort', () => c.abort(s.reason), { once: true });
  }
  return c.signal;
}

export default Fairgate;
