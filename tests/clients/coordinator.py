"""Drives the Python (sync, asyncio) and Node fairgate clients against running
`fairgate serve` processes and checks what they see (ctest -L clients; started
by clients_test.cpp, which owns the servers).

    python3 coordinator.py SCENARIO --urls URL[,URL] --limiter NAME [--node NODE] [--exact-positions 0|1]

Scenarios: fifo, cap, release, reasons, shutdown. Each client is a puppet
process (puppet.py sync | async, puppet.mjs) that acquires, holds and releases
on command and reports every event with a CLOCK_MONOTONIC timestamp, so the
judgement uses the clients' own clocks (overlap of holds, grant order) and the
server's status (GET /v1/limiters/NAME). Prints "FAIL: ..." per failed check
and one "summary: {...}" line; exits 1 when a check failed. "ACTION sigterm"
asks clients_test.cpp to SIGTERM the server (shutdown scenario). Every wait is
bounded; only processes this script started are signalled.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections import deque
from typing import Any, Callable, Dict, List, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
SLOW = float(os.environ.get("FAIRGATE_CLIENTS_SLOW", "1"))  # sanitizer builds: wider bounds

failures: List[str] = []
summary: Dict[str, Any] = {}


def check(ok: bool, message: str) -> bool:
    if not ok:
        failures.append(message)
        print(f"FAIL: {message}", flush=True)
    return ok


def log(message: str) -> None:
    print(message, flush=True)


ALL_PUPPETS: List["Puppet"] = []


class Puppet:
    """One client process; its events are collected by a reader thread."""

    def __init__(self, kind: str, urls: List[str], node: str, name: str, extra: Optional[List[str]] = None) -> None:
        env = dict(os.environ, PYTHONPATH=os.path.join(REPO, "clients", "python", "src"), PYTHONUNBUFFERED="1")
        if kind == "node":
            argv = [node, os.path.join(HERE, "puppet.mjs"), ",".join(urls)]
        elif kind in ("sync", "async"):
            argv = [sys.executable, os.path.join(HERE, "puppet.py"), kind, ",".join(urls)]
        else:  # sigint-wait / sigint-hold
            argv = [sys.executable, os.path.join(HERE, "puppet.py"), kind] + (extra or [])
        self.kind = kind
        self.name = name
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     env=env, text=True, bufsize=1)
        ALL_PUPPETS.append(self)
        self.events: List[Dict[str, Any]] = []
        self.cond = threading.Condition()
        self.stray: List[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            line = line.strip()
            try:
                ev = json.loads(line)
            except ValueError:
                self.stray.append(line)
                log(f"  [{self.name}] {line}")
                continue
            ev["who"] = self.name
            with self.cond:
                self.events.append(ev)
                self.cond.notify_all()
        with self.cond:
            self.events.append({"ev": "exit", "id": "*", "who": self.name})
            self.cond.notify_all()

    def send(self, cmd: str, **fields: Any) -> None:
        fields["cmd"] = cmd
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(json.dumps(fields) + "\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, ValueError):
            check(False, f"{self.name}: cannot send {cmd}: the client process is gone")

    def wait(self, pred: Callable[[Dict[str, Any]], bool], timeout: float, what: str) -> Optional[Dict[str, Any]]:
        deadline = time.monotonic() + timeout * SLOW
        with self.cond:
            while True:
                for ev in self.events:
                    if pred(ev):
                        return ev
                left = deadline - time.monotonic()
                if left <= 0:
                    check(False, f"{self.name}: no {what} within {timeout * SLOW:.1f}s; events: {self.events[-6:]}")
                    return None
                self.cond.wait(left)

    def event(self, ev: str, id: str, timeout: float = 10) -> Optional[Dict[str, Any]]:
        """The first `ev` for `id` — or None (a failed check) when the client ended that request otherwise."""
        # Events that end a request (or the process) other than the one wanted; a grant
        # also rules out a later 'queued'.
        final = {"error", "rejected", "cancelled", "released", "exit"} | ({"granted"} if ev == "queued" else set())
        final.discard(ev)
        got = self.wait(lambda e: e["id"] in (id, "*") and (e["ev"] == ev or e["ev"] in final), timeout, f"'{ev}' for {id}")
        if got is not None and got["ev"] != ev:
            check(False, f"{self.name} {id}: expected '{ev}', got {got}")
            return None
        return got

    def has(self, ev: str, id: str) -> bool:
        with self.cond:
            return any(e["ev"] == ev and e["id"] == id for e in self.events)

    def finish(self) -> None:
        """'exit', then end of input: the client releases what it holds and exits."""
        if self.proc.poll() is None:
            self.send("exit")
        if self.proc.stdin:
            try:
                self.proc.stdin.close()
            except OSError:
                pass
        try:
            self.proc.wait(15 * SLOW)
        except subprocess.TimeoutExpired:
            check(False, f"{self.name}: did not exit after 'exit'")
            self.kill()

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        if sig == signal.SIGKILL:
            self.proc.wait(10)


def status(url: str, limiter: str) -> Optional[Dict[str, Any]]:
    try:
        with urllib.request.urlopen(f"{url}/v1/limiters/{limiter}", timeout=5) as r:
            return json.loads(r.read())
    except (OSError, ValueError):
        return None


def wait_status(urls: List[str], limiter: str, pred: Callable[[Dict[str, Any]], bool], what: str,
                timeout: float = 10) -> bool:
    """Every instance's status must satisfy pred (with Redis, in_use/queued are
    cluster-wide as of the last heartbeat: wait for them)."""
    deadline = time.monotonic() + timeout * SLOW
    last = None
    while time.monotonic() < deadline:
        last = [status(u, limiter) for u in urls]
        if all(s is not None and pred(s) for s in last):
            return True
        time.sleep(0.05)
    seen = [None if s is None else {"in_use": s["in_use"], "queued": s["queued"]} for s in (last or [])]
    return check(False, f"status of {limiter}: {what} not reached within {timeout * SLOW:.0f}s: {seen}")


def idle(s: Dict[str, Any]) -> bool:
    return s["in_use"] == 0 and s["queued"] == 0


MODES = ["sync", "async", "node"]


# --- fifo: grants in arrival order across both languages ------------------------
def scenario_fifo(a: argparse.Namespace) -> None:
    urls, limiter, cap = a.urls, a.limiter, 3
    P = {m: Puppet(m, urls, a.node, m) for m in MODES}
    holders = deque()
    for i, m in enumerate(MODES):
        id = f"h{i}"
        P[m].send("acquire", id=id, limiter=limiter, url=urls[i % len(urls)])
        if P[m].event("granted", id):
            holders.append((m, id))
    check(len(holders) == cap, f"the first {cap} acquires must be granted at once")
    wait_status(urls, limiter, lambda s: s["in_use"] == cap, f"in_use == {cap}")
    arrival = []
    for i in range(a.waiters):
        m, id = MODES[i % 3], f"w{i}"
        P[m].send("acquire", id=id, limiter=limiter, url=urls[(i + 1) % len(urls)])
        ev = P[m].event("queued", id)  # the server has queued it: the next one arrives after it
        if ev is None or ev["ev"] != "queued":
            check(False, f"{m} {id}: expected to be queued, got {ev}")
            continue
        if a.exact_positions:
            check(ev["position"] == i + 1, f"{m} {id}: position {ev['position']}, expected {i + 1}")
        arrival.append((m, id))
    order = []
    for k in range(len(arrival)):
        m, id = holders.popleft()
        P[m].send("release", id=id)
        P[m].event("released", id)
        # Exactly one seat was freed: the longest waiter, whichever language, must get it.
        deadline = time.monotonic() + 10 * SLOW
        got = None
        while got is None and time.monotonic() < deadline:
            for wm, wid in arrival:
                if (wm, wid) not in order and P[wm].has("granted", wid):
                    got = (wm, wid)
                    break
            time.sleep(0.005)
        if not check(got is not None, f"no waiter was granted after release #{k + 1}"):
            break
        order.append(got)
        holders.append(got)
        check(got == arrival[k], f"grant #{k + 1} went to {got}, expected {arrival[k]} (arrival order)")
        s = status(urls[0], limiter)
        check(s is not None and s["in_use"] <= cap, f"in_use {s and s['in_use']} above the cap {cap}")
    for m, id in holders:
        P[m].send("release", id=id)
        P[m].event("released", id)
    for p in P.values():
        p.finish()
    wait_status(urls, limiter, idle, "in_use 0, queued 0")
    summary.update(arrival=[f"{m}:{i}" for m, i in arrival], grants=[f"{m}:{i}" for m, i in order])


# --- cap: never more than N holders, by the clients' clocks and by status --------
def scenario_cap(a: argparse.Namespace) -> None:
    urls, limiter, cap = a.urls, a.limiter, 3
    per_mode, rounds = a.clients, a.rounds
    P = {m: Puppet(m, urls, a.node, m) for m in MODES}
    seen = {"in_use": 0, "holders": 0, "polls": 0}
    stop = threading.Event()

    def poll() -> None:
        while not stop.is_set():
            for u in urls:
                s = status(u, limiter)
                if s:
                    seen["polls"] += 1
                    seen["in_use"] = max(seen["in_use"], s["in_use"])
                    seen["holders"] = max(seen["holders"], len(s.get("holders", [])))
            time.sleep(0.02)

    poller = threading.Thread(target=poll, daemon=True)
    poller.start()
    started = time.monotonic()
    for m in MODES:
        for j in range(per_mode):
            P[m].send("run", id=f"{m}-{j}", limiter=limiter, url=urls[j % len(urls)], hold_ms=[20, 60],
                      rounds=rounds, max_wait_ms=120000)
    for m in MODES:
        for j in range(per_mode):
            P[m].wait(lambda e, id=f"{m}-{j}": e["id"] == id and e["ev"] in ("done", "exit"), 90, f"done of {m}-{j}")
    elapsed = time.monotonic() - started
    stop.set()
    poller.join()
    points = []
    grants = errors = 0
    for p in P.values():
        opened: Dict[Any, int] = {}
        for e in p.events:
            key = (e["id"], e.get("round"))
            if e["ev"] == "granted":
                grants += 1
                opened[key] = e["t"]
                points.append((e["t"], 1))
            elif e["ev"] == "released" and key in opened:
                points.append((e["t"], -1))
            elif e["ev"] == "error":
                errors += 1
                check(False, f"{p.name} {e['id']}: {e}")
    points.sort(key=lambda x: (x[0], x[1]))  # a release before a grant at the same instant
    now = peak = 0
    for _, d in points:
        now += d
        peak = max(peak, now)
    for p in P.values():
        p.finish()
    expected = len(MODES) * per_mode * rounds
    check(grants == expected, f"{grants} grants, expected {expected}")
    check(errors == 0, f"{errors} errors")
    check(peak <= cap, f"{peak} holders at once by the clients' clocks, cap {cap}")
    check(peak >= 2, f"peak {peak}: the clients never overlapped, the test did not contend")
    check(seen["in_use"] <= cap, f"status showed in_use {seen['in_use']} above the cap {cap}")
    check(seen["holders"] <= cap, f"status showed {seen['holders']} holders above the cap {cap}")
    check(seen["polls"] > 0, "status was never read")
    wait_status(urls, limiter, idle, "in_use 0, queued 0")
    summary.update(grants=grants, peak_by_clients=peak, peak_in_use_by_status=seen["in_use"],
                   status_polls=seen["polls"], seconds=round(elapsed, 2))


# --- release: exception, abort/cancel, kill -9, SIGINT -------------------------------
def scenario_release(a: argparse.Namespace) -> None:
    urls, limiter = a.urls, a.limiter  # max_concurrent = 1
    u0, u1 = urls[0], urls[-1]
    P = {m: Puppet(m, urls, a.node, m) for m in MODES}
    n = [0]

    def hold(m: str, url: str = u0) -> str:
        n[0] += 1
        id = f"x{n[0]}"
        P[m].send("acquire", id=id, limiter=limiter, url=url)
        ev = P[m].event("granted", id)
        check(ev is not None and ev["ev"] == "granted", f"{m} {id}: expected a grant, got {ev}")
        return id

    def queue_up(m: str, url: str = u1) -> str:
        n[0] += 1
        id = f"x{n[0]}"
        P[m].send("acquire", id=id, limiter=limiter, url=url)
        ev = P[m].event("queued", id)
        check(ev is not None and ev["ev"] == "queued", f"{m} {id}: expected to be queued, got {ev}")
        return id

    def handed_over(what: str, wm: str, wid: str) -> None:
        ev = P[wm].event("granted", wid)
        check(ev is not None and ev["ev"] == "granted", f"{what}: the waiter ({wm}) was not granted: {ev}")
        P[wm].send("release", id=wid)
        P[wm].event("released", wid)
        wait_status(urls, limiter, idle, f"{what}: idle afterwards")

    results = {}
    # An exception inside the block releases the permit; the next waiter (another language) gets it.
    for hm, wm in (("sync", "async"), ("async", "node"), ("node", "sync")):
        hid = hold(hm)
        wid = queue_up(wm)
        P[hm].send("raise", id=hid)
        ev = P[hm].event("released", hid)
        check(ev is not None and ev.get("how") == "exception", f"{hm}: no release on exception: {ev}")
        handed_over(f"{hm} exception", wm, wid)
        results[f"{hm}_exception"] = "released"
    # Cancelled while holding (asyncio task cancel; Node AbortSignal).
    for hm, wm in (("async", "node"), ("node", "async")):
        hid = hold(hm)
        wid = queue_up(wm)
        P[hm].send("abort", id=hid)
        ev = P[hm].event("cancelled", hid)
        check(ev is not None, f"{hm}: abort while holding was not reported")
        handed_over(f"{hm} abort while holding", wm, wid)
        results[f"{hm}_abort_holding"] = "released"
    # Cancelled while waiting: the queue empties, the holder is untouched.
    hid = hold("sync")
    w1, w2 = queue_up("async"), queue_up("node")
    wait_status(urls, limiter, lambda s: s["queued"] == 2, "2 queued")
    P["async"].send("abort", id=w1)
    P["node"].send("abort", id=w2)
    check(P["async"].event("cancelled", w1) is not None, "async: cancel while waiting not reported")
    check(P["node"].event("cancelled", w2) is not None, "node: abort while waiting not reported")
    wait_status(urls, limiter, lambda s: s["queued"] == 0 and s["in_use"] == 1, "queued 0 after aborts, in_use 1")
    P["sync"].send("release", id=hid)
    P["sync"].event("released", hid)
    wait_status(urls, limiter, idle, "idle after the aborts")
    results["abort_waiting"] = "cancelled"

    # kill -9 of a client process that holds, then of one that waits.
    for victim_kind, wm in (("sync", "node"), ("node", "async")):
        victim = Puppet(victim_kind, urls, a.node, f"victim-{victim_kind}")
        victim.send("acquire", id="v", limiter=limiter, url=u0)
        check(victim.event("granted", "v") is not None, f"victim {victim_kind}: not granted")
        wid = queue_up(wm)
        victim.kill(signal.SIGKILL)
        handed_over(f"kill -9 of a {victim_kind} holder", wm, wid)
        results[f"{victim_kind}_kill_holding"] = "released"
    for victim_kind in ("async", "node"):
        hid = hold("sync")
        victim = Puppet(victim_kind, urls, a.node, f"victim-{victim_kind}")
        victim.send("acquire", id="v", limiter=limiter, url=u1)
        check(victim.event("queued", "v") is not None, f"victim {victim_kind}: not queued")
        victim.kill(signal.SIGKILL)
        wait_status(urls, limiter, lambda s: s["queued"] == 0, f"queued 0 after kill -9 of a waiting {victim_kind}")
        P["sync"].send("release", id=hid)
        P["sync"].event("released", hid)
        wait_status(urls, limiter, idle, "idle")
        results[f"{victim_kind}_kill_waiting"] = "cancelled"

    # KeyboardInterrupt (SIGINT) in the main thread: while waiting, and inside the with block.
    hid = hold("node")
    w = Puppet("sigint-wait", urls, a.node, "sigint-wait", [u1, limiter])
    check(w.event("queued", "main") is not None, "sigint-wait: not queued")
    w.kill(signal.SIGINT)
    check(w.event("interrupted", "main") is not None, "sigint-wait: KeyboardInterrupt not seen")
    wait_status(urls, limiter, lambda s: s["queued"] == 0, "queued 0 after KeyboardInterrupt while waiting")
    P["node"].send("release", id=hid)
    P["node"].event("released", hid)
    h = Puppet("sigint-hold", urls, a.node, "sigint-hold", [u0, limiter])
    check(h.event("granted", "main") is not None, "sigint-hold: not granted")
    wid = queue_up("async")
    h.kill(signal.SIGINT)
    check(h.event("interrupted", "main") is not None, "sigint-hold: KeyboardInterrupt not seen")
    handed_over("KeyboardInterrupt inside the with block", "async", wid)
    results["sigint"] = "released"
    for p in (w, h):
        p.finish()
    for p in P.values():
        p.finish()
    wait_status(urls, limiter, idle, "in_use 0, queued 0 at the end")
    summary.update(results)


# --- reasons: every rejection mapped, in every client ------------------------------
def scenario_reasons(a: argparse.Namespace) -> None:
    url, pre = a.urls[0], a.limiter  # PRE-tmo (1), PRE-full (1, max_queue 1), PRE-off (disabled, reject)
    P = {m: Puppet(m, a.urls, a.node, m) for m in MODES}
    table = {}
    P["sync"].send("acquire", id="tmo-holder", limiter=f"{pre}-tmo")
    P["sync"].event("granted", "tmo-holder")
    P["sync"].send("acquire", id="full-holder", limiter=f"{pre}-full")
    P["sync"].event("granted", "full-holder")
    P["sync"].send("acquire", id="full-waiter", limiter=f"{pre}-full")
    P["sync"].event("queued", "full-waiter")

    def expect(m: str, id: str, ev: str, reason: str, status: Optional[int] = None, **cmd: Any) -> Dict[str, Any]:
        P[m].send("acquire", id=id, **cmd)
        got = P[m].event(ev, id, timeout=10) or {}
        ok = got.get("ev") == ev and got.get("reason") == reason and (status is None or got.get("status") == status)
        check(ok, f"{m} {id}: expected {ev} {reason} {status or ''}, got {got}")
        table[f"{m}:{id}"] = f"{got.get('kind')}:{got.get('reason')}:{got.get('status')}"
        return got

    for m in MODES:
        e = expect(m, "timeout", "rejected", "timeout", limiter=f"{pre}-tmo", max_wait_ms=300)
        check((e.get("waited") or 0) >= 0.25, f"{m}: timeout after {e.get('waited')}s, asked 0.3s")
        e = expect(m, "lease-timeout", "rejected", "timeout", 429, limiter=f"{pre}-tmo", max_wait_ms=200, lease=True)
        check((e.get("retry_after") or 0) >= 1, f"{m}: a long-poll timeout carries Retry-After: {e}")
        expect(m, "queue_full", "rejected", "queue_full", limiter=f"{pre}-full")
        expect(m, "disabled", "rejected", "disabled", limiter=f"{pre}-off")
        expect(m, "unknown", "error", "unknown_limiter", 404, limiter=f"{pre}-nope")
        expect(m, "bad-tenant", "error", "bad_request", 400, limiter=f"{pre}-tmo", tenant="no spaces allowed")
        expect(m, "unreachable", "error", "connection", 0, limiter="chat", url=a.dead_url)
        got = P[m].events
        check(all(e["ev"] != "granted" or e["id"] in ("tmo-holder", "full-holder") for e in got),
              f"{m}: a rejected request was granted")
    for id in ("tmo-holder", "full-holder"):
        P["sync"].send("release", id=id)
        P["sync"].event("released", id)
    P["sync"].event("granted", "full-waiter")
    P["sync"].send("release", id="full-waiter")
    P["sync"].event("released", "full-waiter")
    for p in P.values():
        p.finish()
    for name in ("tmo", "full", "off"):
        wait_status([url], f"{pre}-{name}", idle, f"{pre}-{name} idle")
    summary.update(reasons=table)


# --- shutdown: waiters hear 'unavailable', the holder learns its permit is lost ------
def scenario_shutdown(a: argparse.Namespace) -> None:
    url, limiter = a.urls[0], a.limiter  # max_concurrent 1; the server has max_waiters_per_client = 3
    P = {m: Puppet(m, a.urls, a.node, m) for m in MODES}
    P["async"].send("acquire", id="holder", limiter=limiter)
    P["async"].event("granted", "holder")
    waiters = [("sync", "w1"), ("node", "w2"), ("async", "w3")]
    for m, id in waiters:
        P[m].send("acquire", id=id, limiter=limiter)
        P[m].event("queued", id)
    for m in MODES:  # a 4th waiting request from this address is refused
        P[m].send("acquire", id="over", limiter=limiter)
        got = P[m].event("rejected", "over") or {}
        check(got.get("reason") == "too_many_waiters" and got.get("status") == 429,
              f"{m}: expected too_many_waiters 429, got {got}")
    log("ACTION sigterm")
    for m, id in waiters:
        got = P[m].event("rejected", id, timeout=20) or {}
        check(got.get("reason") == "unavailable", f"{m} {id}: expected unavailable at shutdown, got {got}")
    check(P["async"].wait(lambda e: e["id"] == "holder" and e["ev"] == "lost", 20, "lost") is not None,
          "the holder was not told its permit was lost")
    for p in P.values():
        p.finish()
    summary.update(shutdown="waiters unavailable, holder lost")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("scenario", choices=["fifo", "cap", "release", "reasons", "shutdown"])
    ap.add_argument("--urls", required=True, type=lambda s: s.split(","))
    ap.add_argument("--limiter", required=True)
    ap.add_argument("--node", default="node")
    ap.add_argument("--exact-positions", type=int, default=1)
    ap.add_argument("--waiters", type=int, default=9)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dead-url", default="http://127.0.0.1:9")
    a = ap.parse_args()
    started = time.monotonic()
    try:
        globals()[f"scenario_{a.scenario}"](a)
    except Exception as e:  # a bug in the test itself must fail, not hang
        import traceback

        traceback.print_exc()
        check(False, f"coordinator crashed: {e!r}")
    finally:
        for p in ALL_PUPPETS:  # only the processes this script started
            if p.proc.poll() is None:
                p.proc.kill()
                p.proc.wait(10)
    summary.update(scenario=a.scenario, failures=len(failures), total_s=round(time.monotonic() - started, 2))
    print("summary: " + json.dumps(summary), flush=True)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
