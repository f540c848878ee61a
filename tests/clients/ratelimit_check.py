"""The rate-limit calls of the Python client (sync and asyncio) against a running
`fairgate serve` with [ratelimit.cl] = gcra, rate 3 per 600000 ms (ctest -L clients).

    python3 ratelimit_check.py URL
Exits 1 with "FAIL: ..." lines when a check fails.
"""
import asyncio
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "clients", "python", "src"))
import fairgate  # noqa: E402

failures = []


def check(ok, what):
    if not ok:
        failures.append(what)
        print("FAIL: " + what)


def exercise(decide, refund, key):
    first = decide(key)
    check(first["allowed"] and first["remaining"] == 2 and first["decision"], f"{key} first: {first}")
    for want in (1, 0):
        d = decide(key)
        check(d["allowed"] and d["remaining"] == want, f"{key}: {d}")
    refused = decide(key)
    check(not refused["allowed"] and refused["retry_after_ms"] > 0 and refused["reason"] == "rate_limited",
          f"{key} refused: {refused}")
    check(refund(key, first["decision"], 1) == 1, f"{key}: refund of 1")
    again = decide(key)
    check(again["allowed"], f"{key} after the refund: {again}")


def main():
    url = sys.argv[1]
    client = fairgate.Client(url)
    exercise(lambda k: client.rate_limit("cl", k), lambda k, d, a: client.refund("cl", k, d, a), "py-sync")
    try:
        client.rate_limit("cl", "x", cost=0)
        check(False, "cost 0 must raise ApiError")
    except fairgate.ApiError as e:
        check(e.status == 400 and "cost" in str(e), f"cost 0: {e}")
    check(any(r["name"] == "cl" for r in client.rate_rules()), "rate_rules lists cl")

    async def run_async():
        c = fairgate.AsyncClient(url)
        results = {}

        async def go():
            d1 = await c.rate_limit("cl", "py-async")
            results["first"] = d1
            for _ in range(2):
                await c.rate_limit("cl", "py-async")
            results["refused"] = await c.rate_limit("cl", "py-async")
            results["refunded"] = await c.refund("cl", "py-async", d1["decision"], 1)
            results["again"] = await c.rate_limit("cl", "py-async")
            results["rules"] = await c.rate_rules()

        await go()
        return results

    r = asyncio.run(run_async())
    check(r["first"]["allowed"] and r["first"]["remaining"] == 2, f"async first: {r['first']}")
    check(not r["refused"]["allowed"], f"async refused: {r['refused']}")
    check(r["refunded"] == 1 and r["again"]["allowed"], f"async refund: {r['refunded']} {r['again']}")
    check(any(x["name"] == "cl" for x in r["rules"]), "async rate_rules lists cl")
    print("ratelimit python: " + ("ok" if not failures else f"{len(failures)} failed"))
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
