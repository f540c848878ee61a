"""A Python fairgate client driven over stdin/stdout by coordinator.py.

    python3 puppet.py sync|async URL[,URL...]     commands on stdin, events on stdout
    python3 puppet.py sigint-wait|sigint-hold URL LIMITER

Commands (one JSON object per line): acquire {id, limiter, url?, max_wait_ms?,
tenant?, lease?}, release {id}, raise {id}, abort {id}, run {id, limiter, url?,
hold_ms, rounds}, exit. Events (one JSON object per line, "t" = CLOCK_MONOTONIC
in ns, comparable across processes): queued, granted, rejected, error,
released {how}, cancelled, lost, done. The client under test is the fairgate
package in clients/python/src (PYTHONPATH).
"""

from __future__ import annotations

import asyncio
import json
import queue
import random
import sys
import threading
import time

import fairgate

_out_lock = threading.Lock()


def emit(ev: str, id: str, **fields) -> None:
    fields.update(ev=ev, id=id, t=time.monotonic_ns())
    line = json.dumps(fields)
    with _out_lock:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


class Boom(Exception):
    pass


def error_fields(e: BaseException) -> dict:
    if isinstance(e, fairgate.FairgateError):
        return {"kind": type(e).__name__, "reason": e.reason, "status": e.status,
                "waited": getattr(e, "waited", None), "retry_after": getattr(e, "retry_after", None)}
    return {"kind": type(e).__name__, "reason": repr(e), "status": 0}


# --- sync: one thread per client ----------------------------------------------
def sync_main(urls: list) -> None:
    clients = {u: fairgate.Client(u) for u in urls}
    orders: dict = {}

    def client_for(cmd):
        url = cmd.get("url") or urls[0]
        return clients.setdefault(url, fairgate.Client(url, timeout=3))

    def acquire(cmd):
        id = cmd["id"]
        c = client_for(cmd)
        try:
            if cmd.get("lease"):
                with c.acquire_lease(cmd["limiter"], max_wait=_s(cmd.get("max_wait_ms")), tenant=cmd.get("tenant")) as lease:
                    emit("granted", id, permit=lease.id, lease=lease.lease)
                    how = orders[id].get()
                emit("released", id, how=how)
                return
            with c.acquire(
                cmd["limiter"],
                max_wait=_s(cmd.get("max_wait_ms")),
                tenant=cmd.get("tenant"),
                on_queued=lambda q: emit("queued", id, position=q.position, queued=q.queued, eta=q.estimated_wait),
                on_lost=lambda p: emit("lost", id, permit=p.id),
            ) as permit:
                emit("granted", id, permit=permit.id, waited=permit.waited)
                how = orders[id].get()
                if how == "raise":
                    raise Boom()
            emit("released", id, how="release", released=permit.released)
        except Boom:
            emit("released", id, how="exception", released=permit.released)
        except fairgate.Rejected as e:
            emit("rejected", id, **error_fields(e))
        except BaseException as e:
            emit("error", id, **error_fields(e))

    def run(cmd):
        id = cmd["id"]
        c = client_for(cmd)
        for r in range(cmd.get("rounds", 1)):
            try:
                with c.acquire(cmd["limiter"], max_wait=_s(cmd.get("max_wait_ms"))) as permit:
                    emit("granted", id, round=r, permit=permit.id)
                    time.sleep(random.uniform(cmd["hold_ms"][0], cmd["hold_ms"][1]) / 1000.0)
                    emit("released", id, round=r, how="release")
            except BaseException as e:
                emit("error", id, round=r, **error_fields(e))
        emit("done", id)

    threads = []
    for line in sys.stdin:
        cmd = json.loads(line)
        op = cmd["cmd"]
        if op == "exit":
            break
        if op in ("acquire", "run"):
            orders[cmd["id"]] = queue.Queue()
            t = threading.Thread(target=acquire if op == "acquire" else run, args=(cmd,), daemon=True)
            t.start()
            threads.append(t)
        elif op in ("release", "raise"):
            orders[cmd["id"]].put(op)
        else:
            emit("error", cmd.get("id", "?"), kind="usage", reason=f"sync puppet cannot {op}", status=0)
    for q in orders.values():  # exit: whatever is still held is released
        q.put("release")
    for t in threads:
        t.join(30)


def _s(ms):
    return None if ms is None else ms / 1000.0


# --- asyncio: one task per client -------------------------------------------------
async def async_main(urls: list) -> None:
    clients = {u: fairgate.AsyncClient(u) for u in urls}
    tasks: dict = {}
    orders: dict = {}

    async def acquire(cmd):
        id = cmd["id"]
        c = clients.setdefault(cmd.get("url") or urls[0], fairgate.AsyncClient(cmd.get("url") or urls[0], timeout=3))
        try:
            if cmd.get("lease"):
                lease = await c.acquire_lease(cmd["limiter"], max_wait=_s(cmd.get("max_wait_ms")), tenant=cmd.get("tenant"))
                async with lease:
                    emit("granted", id, permit=lease.id, lease=lease.lease)
                    how = await orders[id].get()
                emit("released", id, how=how)
                return
            async with c.acquire(
                cmd["limiter"],
                max_wait=_s(cmd.get("max_wait_ms")),
                tenant=cmd.get("tenant"),
                on_queued=lambda q: emit("queued", id, position=q.position, queued=q.queued, eta=q.estimated_wait),
                on_lost=lambda p: emit("lost", id, permit=p.id),
            ) as permit:
                emit("granted", id, permit=permit.id, waited=permit.waited)
                how = await orders[id].get()
                if how == "raise":
                    raise Boom()
            emit("released", id, how="release", released=permit.released)
        except Boom:
            emit("released", id, how="exception", released=permit.released)
        except asyncio.CancelledError:
            emit("cancelled", id)
        except fairgate.Rejected as e:
            emit("rejected", id, **error_fields(e))
        except BaseException as e:
            emit("error", id, **error_fields(e))

    async def run(cmd):
        id = cmd["id"]
        c = clients.setdefault(cmd.get("url") or urls[0], fairgate.AsyncClient(cmd.get("url") or urls[0], timeout=3))
        for r in range(cmd.get("rounds", 1)):
            try:
                permit = await c.acquire(cmd["limiter"], max_wait=_s(cmd.get("max_wait_ms")))
                async with permit:
                    emit("granted", id, round=r, permit=permit.id)
                    await asyncio.sleep(random.uniform(cmd["hold_ms"][0], cmd["hold_ms"][1]) / 1000.0)
                    emit("released", id, round=r, how="release")
            except BaseException as e:
                emit("error", id, round=r, **error_fields(e))
        emit("done", id)

    loop = asyncio.get_running_loop()
    lines: asyncio.Queue = asyncio.Queue()
    threading.Thread(target=lambda: [loop.call_soon_threadsafe(lines.put_nowait, l) for l in sys.stdin]
                     + [loop.call_soon_threadsafe(lines.put_nowait, None)], daemon=True).start()
    while True:
        line = await lines.get()
        if line is None:
            break
        cmd = json.loads(line)
        op = cmd["cmd"]
        if op == "exit":
            break
        if op in ("acquire", "run"):
            orders[cmd["id"]] = asyncio.Queue()
            tasks[cmd["id"]] = asyncio.ensure_future(acquire(cmd) if op == "acquire" else run(cmd))
        elif op in ("release", "raise"):
            orders[cmd["id"]].put_nowait(op)
        elif op == "abort":
            tasks[cmd["id"]].cancel()
    for q in orders.values():  # exit: whatever is still held is released
        q.put_nowait("release")
    if tasks:
        await asyncio.wait(list(tasks.values()), timeout=30)


# --- KeyboardInterrupt in the main thread ---------------------------------------
def sigint_main(mode: str, url: str, limiter: str) -> None:
    """KeyboardInterrupt in the main thread, while waiting or inside the with
    block. The process then stays alive (until stdin closes) and keeps the
    traceback, as an error reporter would: the permit must be released by the
    client, not by the process ending or the garbage collector."""
    client = fairgate.Client(url)
    kept = None
    try:
        if mode == "sigint-wait":
            client.acquire(limiter, on_queued=lambda q: emit("queued", "main", position=q.position))
            emit("granted", "main")
        else:
            with client.acquire(limiter) as permit:
                emit("granted", "main", permit=permit.id)
                time.sleep(120)
    except KeyboardInterrupt:
        kept = sys.exc_info()
        emit("interrupted", "main")
    for _ in sys.stdin:
        pass
    del kept


def main() -> None:
    mode = sys.argv[1]
    if mode == "sync":
        sync_main(sys.argv[2].split(","))
    elif mode == "async":
        asyncio.run(async_main(sys.argv[2].split(",")))
    elif mode.startswith("sigint-"):
        sigint_main(mode, sys.argv[2], sys.argv[3])
    else:
        sys.exit(f"usage: puppet.py sync|async|sigint-wait|sigint-hold URL ...")


if __name__ == "__main__":
    main()
