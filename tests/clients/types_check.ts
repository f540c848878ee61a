// tests/clients/types_check.ts — the Node client as a TypeScript user writes it.
// `tsc` must accept it against clients/node/index.d.ts (strict), and the
// compiled program, run against a real `fairgate serve`, shows that
// `await using` releases the permit at the end of the block, also when the
// block throws.   usage (after tsc): node build/types_check.js URL LIMITER
import { Fairgate, Rejected, ApiError, type Permit, type QueueStatus, type LimiterDetail } from 'fairgate';

declare const process: { argv: string[]; exit(code: number): never };
declare function setTimeout(callback: () => void, ms: number): unknown;

const [url, limiter] = process.argv.slice(2);
const fg = new Fairgate(url, { timeoutMs: 5000 });
let failed = 0;
const check = (ok: boolean, what: string): void => {
  if (!ok) {
    failed++;
    console.log(`FAIL: ${what}`);
  }
};
const inUse = async (): Promise<number> => {
  const d: LimiterDetail = await fg.limiter(limiter);
  return d.in_use;
};
// A release closes the stream; the server sees it a moment later: the count
// once it reached 0, or as it stands after 10 s.
const settledInUse = async (): Promise<number> => {
  for (let i = 0; i < 500; i++) {
    const n = await inUse();
    if (n === 0) return 0;
    await new Promise<void>((resolve) => void setTimeout(resolve, 20));
  }
  return inUse();
};

// await using: released at the end of the block.
{
  await using permit = await fg.acquire(limiter, { maxWaitMs: 5000, tenant: 'ts-user' });
  const id: string = permit.id;
  check(id.length > 0, 'a permit has an id');
  check((await inUse()) === 1, 'held inside the block');
}
check((await settledInUse()) === 0, 'await using released the permit at the end of the block');

// ... and when the block throws.
let held: Permit | undefined;
try {
  await using permit = await fg.acquire(limiter);
  held = permit;
  throw new Error('boom');
} catch (e) {
  check((e as Error).message === 'boom', 'the exception comes through');
}
check(held?.released === true && (await settledInUse()) === 0, 'await using released the permit when the block threw');

// Queue feedback and a typed rejection.
const seen: QueueStatus[] = [];
const holder = await fg.acquire(limiter);
try {
  await fg.acquire(limiter, { maxWaitMs: 200, onQueued: (q) => void seen.push(q) });
  check(false, 'expected a timeout');
} catch (e) {
  check(e instanceof Rejected && e.reason === 'timeout', `expected Rejected timeout, got ${String(e)}`);
}
await holder.release();
check(seen.length > 0 && seen[0].position === 1, 'onQueued saw position 1');
try {
  await fg.acquire('no-such-limiter');
} catch (e) {
  check(e instanceof ApiError && e.status === 404, 'ApiError 404 for an unknown limiter');
}
const result: number = await fg.run(limiter, async (p: Permit) => p.waitedMs + 1);
check(result >= 1, 'run() returns the callback result');
console.log(failed === 0 ? 'types_check: ok' : `types_check: ${failed} failed`);
process.exit(failed === 0 ? 0 : 1);
