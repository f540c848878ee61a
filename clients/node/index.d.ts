// Type declarations of the fairgate Node client (index.js).

/** Reasons the server gives when it decides not to grant. */
export type RejectReason = 'timeout' | 'queue_full' | 'would_time_out' | 'disabled' | 'unavailable' | 'too_many_waiters';
export declare const REJECT_REASONS: readonly RejectReason[];

/** Where a waiting request stands: position 1 is next in line. */
export interface QueueStatus {
  position: number;
  queued: number;
  /** The server's estimate of the remaining wait, when it has one. */
  estimatedWaitMs: number | null;
  ticket: string | null;
}

export interface AcquireOptions {
  /** Longest wait in the queue (default: the limiter's max_wait). */
  maxWaitMs?: number;
  /** 1..128 characters of [A-Za-z0-9._:@-]: the tenant for fairness and status. */
  tenant?: string;
  /** 1..1000: the tenant's share under tenant_fairness. */
  weight?: number;
  /** Aborting it cancels the wait; once granted, it releases the permit. */
  signal?: AbortSignal;
  /** Called when the request has to wait and whenever its position changes; throw to give up. */
  onQueued?: (status: QueueStatus) => void | Promise<void>;
  /** Called once when the server ends the stream while the permit is held. */
  onLost?: (permit: Permit) => void | Promise<void>;
}

export interface LeaseOptions {
  maxWaitMs?: number;
  tenant?: string;
  weight?: number;
  /** How long the permit is held unless renewed (default: the server's lease_ms). */
  leaseMs?: number;
  signal?: AbortSignal;
}

export interface ClientOptions {
  /** Bounds every call that does not wait in a queue (default 10000). */
  timeoutMs?: number;
  /** Bearer token for configure(). */
  adminToken?: string;
  /** A fetch implementation (default: globalThis.fetch). */
  fetch?: typeof fetch;
}

/** Base class of every error this package throws. */
export declare class FairgateError extends Error {
  /** The server's reason ("bad_request", "unknown_limiter", "timeout", ...) or "connection". */
  readonly reason: string;
  /** HTTP status (0 when there was no HTTP answer; 200 for a rejection inside an event stream). */
  readonly status: number;
  readonly detail: string;
}

/** The server decided: no permit for this request. */
export declare class Rejected extends FairgateError {
  readonly reason: RejectReason | string;
  readonly waitedMs: number;
  readonly ticket: string | null;
  /** The server's Retry-After, when it gave one. */
  readonly retryAfterMs: number | null;
}

/** The server refused the request itself (400, 401, 404, ...). */
export declare class ApiError extends FairgateError {}

/** The server could not be reached, or the stream broke before a decision. */
export declare class ConnectionFailed extends FairgateError {}

/** A granted permit, held while its stream is open. */
export declare class Permit implements AsyncDisposable {
  readonly limiter: string;
  readonly id: string;
  readonly ticket: string | null;
  readonly waitedMs: number;
  /** performance.now() when the grant arrived. */
  readonly grantedAt: number;
  /** Aborts when the permit ends (released or lost). */
  readonly signal: AbortSignal;
  readonly released: boolean;
  /** True when the server ended the stream while the permit was held. */
  readonly lost: boolean;
  /** Gives the permit back. Safe to call again. */
  release(): Promise<void>;
  [Symbol.asyncDispose](): Promise<void>;
}

/** A JSON permit (long poll). */
export declare class Lease implements AsyncDisposable {
  readonly limiter: string;
  readonly id: string;
  leaseMs: number;
  readonly waitedMs: number;
  /** Restarts the lease; resolves with its length. */
  renew(): Promise<number>;
  /** Gives the permit back; false when the server no longer had it. */
  release(): Promise<boolean>;
  [Symbol.asyncDispose](): Promise<void>;
}

export interface LimiterStatus {
  name: string;
  max_concurrent: number;
  in_use: number;
  queued: number;
  max_wait_ms: number;
  max_queue: number | null;
  enabled: boolean;
  when_disabled: 'pass_through' | 'reject';
  backend: 'memory' | 'redis';
  degraded: boolean;
  tenant_fairness: boolean;
  max_per_tenant: number | null;
  estimated_wait_ms: number | null;
  stats: { acquires: number; grants: number; timeouts: number; cancels: number; rejections: number; releases: number };
  [key: string]: unknown;
}

/** One page of the holders and of the queue of every instance (`offset`/`limit`), with the totals. */
export interface LimiterDetail extends LimiterStatus {
  /** Oldest grant first; `instance` is '' on the memory backend. */
  holders: { permit: string; tenant: string; held_ms: number; instance: string }[];
  /** In queue order. */
  queue: { ticket: string; tenant: string; position: number; waited_ms: number; instance: string }[];
  offset: number;
  limit: number;
  holders_total: number;
  queue_total: number;
  /** Redis only: the instances alive. */
  instances?: string[];
}

export interface Health {
  status: 'ok' | 'degraded' | 'stopping';
  redis: 'up' | 'down' | 'none';
  backend: string;
  degraded_limiters?: number;
  /** With rate-limit rules: degraded while the rate limiter's last Redis call failed. */
  ratelimit?: 'ok' | 'degraded';
}

export interface SettingsChange {
  max_concurrent?: number;
  max_wait_ms?: number;
  max_queue?: number | null;
  enabled?: boolean;
  tenant_fairness?: boolean;
  max_per_tenant?: number | null;
}

export declare class Fairgate {
  constructor(url?: string, options?: ClientOptions);
  readonly url: string;
  timeoutMs: number;
  adminToken: string | undefined;
  /** Waits in the limiter's queue; resolves with the granted permit. */
  acquire(limiter: string, options?: AcquireOptions): Promise<Permit>;
  /** Holds a permit while fn runs; releases when it settles. */
  run<T>(limiter: string, fn: (permit: Permit) => T | Promise<T>, options?: AcquireOptions): Promise<T>;
  acquireLease(limiter: string, options?: LeaseOptions): Promise<Lease>;
  limiters(): Promise<LimiterStatus[]>;
  limiter(name: string): Promise<LimiterDetail>;
  configure(name: string, changes: SettingsChange, options?: { token?: string }): Promise<LimiterStatus>;
  health(): Promise<Health>;
  /** POST /v1/ratelimit/RULE: the decision, allowed (200) or refused (429). */
  rateLimit(rule: string, key: string, options?: { cost?: number }): Promise<RateDecision>;
  /** POST /v1/ratelimit/RULE/refund: the units that came back. */
  refund(rule: string, key: string, decision: string, amount: number): Promise<number>;
  /** GET /v1/ratelimit. */
  rateRules(): Promise<RateRule[]>;
}

export default Fairgate;

/** One rate-limit decision (docs/ratelimit.md, "In fairgate serve"). */
export interface RateDecision {
  allowed: boolean;
  rule: string;
  key: string;
  cost: number;
  limit: number;
  remaining: number;
  reset_ms: number;
  /** Refused: when the same cost would pass; -1 = never. 0 when allowed. */
  retry_after_ms: number;
  source: 'store' | 'local_layer' | 'degraded';
  /** Allowed: names the decision for refund(). */
  decision?: string;
  reason?: 'rate_limited' | 'cost_exceeds_capacity' | 'unavailable';
  message?: string;
}

export interface RateRule {
  name: string;
  algorithm: 'fixed_window' | 'sliding_log' | 'sliding_window' | 'token_bucket' | 'gcra';
  rate: number;
  period_ms: number;
  burst: number;
  limit: number;
  on_redis_down: 'local' | 'open' | 'closed';
  local_divisor: number;
  stats?: {
    allowed: number;
    refused: number;
    local_refusals: number;
    store_errors: number;
    degraded: number;
    refunded: number;
    store_calls: number;
  };
}
