// The rate-limit calls of the Node client against a running `fairgate serve`
// with [ratelimit.cl] = gcra, rate 3 per 600000 ms (ctest -L clients).
//   node ratelimit_check.mjs URL      — exits 1 with "FAIL: ..." lines on a failed check.
import { Fairgate, ApiError } from '../../clients/node/index.js';

const failures = [];
const check = (ok, what) => {
  if (!ok) {
    failures.push(what);
    console.log(`FAIL: ${what}`);
  }
};

const fg = new Fairgate(process.argv[2]);
const first = await fg.rateLimit('cl', 'node');
check(first.allowed && first.remaining === 2 && first.decision, `first: ${JSON.stringify(first)}`);
for (const want of [1, 0]) {
  const d = await fg.rateLimit('cl', 'node');
  check(d.allowed && d.remaining === want, JSON.stringify(d));
}
const refused = await fg.rateLimit('cl', 'node');
check(!refused.allowed && refused.retry_after_ms > 0 && refused.reason === 'rate_limited', JSON.stringify(refused));
check((await fg.refund('cl', 'node', first.decision, 1)) === 1, 'refund of 1');
check((await fg.rateLimit('cl', 'node')).allowed, 'allowed after the refund');
try {
  await fg.rateLimit('cl', 'node', { cost: 1.5 });
  check(false, 'cost 1.5 must reject');
} catch (e) {
  check(e instanceof ApiError && e.status === 400, `cost 1.5: ${e}`);
}
check((await fg.rateRules()).some((r) => r.name === 'cl'), 'rateRules lists cl');
console.log(`ratelimit node: ${failures.length === 0 ? 'ok' : `${failures.length} failed`}`);
process.exit(failures.length === 0 ? 0 : 1);
