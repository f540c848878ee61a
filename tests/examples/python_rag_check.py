"""Checks examples/python-rag/app.py against a running `fairgate serve`
(ctest -L examples, started by examples_test.cpp).

    python3 python_rag_check.py --fairgate URL --limiter NAME     (the limiter: max_concurrent = 1)

Starts app.py on a free port, then: an answer streams as META, MESSAGE...,
FINISH, DONE; a second request that cannot get the permit within max wait
hears QUEUE then the seeds' META / REJECT / FINISH / DONE; a browser that
leaves mid-answer releases the permit (fairgate's status); a bad body gets 400.
Prints "FAIL: ..." per failed check; exits 1 when one failed.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
APP = os.path.join(HERE, "..", "..", "examples", "python-rag", "app.py")
failures = []


def check(ok: bool, what: str) -> bool:
    if not ok:
        failures.append(what)
        print(f"FAIL: {what}", flush=True)
    return ok


def events(base: str, question: str, conversation=None, stop_after=None):
    """POST /chat; returns [(event, data)], reading until the stream ends (or stop_after events)."""
    u = urllib.parse.urlsplit(base)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=20)
    body = json.dumps({"question": question, "conversationId": conversation})
    conn.request("POST", "/chat", body, {"Content-Type": "application/json", "X-User-Id": "alice"})
    resp = conn.getresponse()
    check(resp.status == 200 and resp.getheader("Content-Type") == "text/event-stream", f"status {resp.status}")
    out, name = [], None
    for raw in resp:
        line = raw.decode().rstrip("\n")
        if line.startswith("event: "):
            name = line[7:]
        elif line.startswith("data: "):
            data = line[6:]
            out.append((name, data if data == "[DONE]" else json.loads(data)))
            if stop_after is not None and len(out) >= stop_after:
                resp.close()  # the browser goes away mid-answer (the response owns the socket)
                conn.close()
                return out
    conn.close()
    return out


def names(evs):
    return [n for n, _ in evs if n != "QUEUE"]


def status(fairgate: str, limiter: str):
    with urllib.request.urlopen(f"{fairgate}/v1/limiters/{limiter}", timeout=5) as r:
        return json.loads(r.read())


def wait_idle(fairgate: str, limiter: str, what: str) -> None:
    deadline = time.monotonic() + 10
    s = None
    while time.monotonic() < deadline:
        s = status(fairgate, limiter)
        if s["in_use"] == 0 and s["queued"] == 0:
            return
        time.sleep(0.05)
    check(False, f"{what}: in_use {s and s['in_use']}, queued {s and s['queued']}, expected 0/0")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--fairgate", required=True)
    ap.add_argument("--limiter", required=True)
    a = ap.parse_args()
    app = subprocess.Popen([sys.executable, APP, "--listen", "127.0.0.1:0", "--fairgate", a.fairgate,
                            "--limiter", a.limiter, "--max-wait", "0.5", "--token-ms", "40"],
                           stdout=subprocess.PIPE, text=True)
    try:
        line = app.stdout.readline()
        check("listening on http://" in line, f"app.py did not start: {line!r}")
        base = line.split("listening on ")[1].split()[0]
        threading.Thread(target=lambda: [print(l, end="", flush=True) for l in app.stdout], daemon=True).start()

        # One answer holds the permit for ~1.2 s; a second one waits 0.5 s and is told "busy".
        results = {}
        first = threading.Thread(target=lambda: results.update(a=events(base, "What is fairgate?", "c-1")))
        first.start()
        deadline = time.monotonic() + 10
        while status(a.fairgate, a.limiter)["in_use"] != 1 and time.monotonic() < deadline:
            time.sleep(0.02)
        b = events(base, "Me too?", "c-2")
        first.join(30)
        ans = results.get("a", [])
        check(names(ans)[:2] == ["META", "MESSAGE"] and names(ans)[-2:] == ["FINISH", "DONE"],
              f"answer sequence: {names(ans)}")
        check(ans and ans[0][1].get("conversationId") == "c-1", f"META carries the conversation: {ans[:1]}")
        text = "".join(d["delta"] for n, d in ans if n == "MESSAGE")
        check(text.startswith("You asked: 'What is fairgate?'"), f"answer text: {text[:60]!r}")
        check(b and b[0][0] == "QUEUE" and b[0][1]["position"] == 1, f"the second request first hears QUEUE: {b[:1]}")
        check(names(b) == ["META", "REJECT", "FINISH", "DONE"], f"rejection sequence: {names(b)}")
        reject = dict(b).get("REJECT", {})
        check(reject.get("delta") == "The system is busy, please try again later" and reject.get("reason") == "timeout",
              f"REJECT: {reject}")
        check(dict(b).get("DONE") == "[DONE]", "DONE carries [DONE]")
        wait_idle(a.fairgate, a.limiter, "after an answer and a rejection")

        # A browser that leaves mid-answer: the permit comes back, the next answer starts at once.
        gone = events(base, "Long question", stop_after=3)
        check(names(gone)[:1] == ["META"], f"left after {names(gone)}")
        wait_idle(a.fairgate, a.limiter, "after the browser left mid-answer")
        again = events(base, "Still there?")
        check(not any(n == "QUEUE" for n, _ in again) and names(again)[-1:] == ["DONE"], f"next answer: {names(again)}")

        # A bad body is a 400, and costs no permit.
        u = urllib.parse.urlsplit(base)
        conn = http.client.HTTPConnection(u.hostname, u.port, timeout=5)
        conn.request("POST", "/chat", "not json", {"Content-Type": "application/json"})
        check(conn.getresponse().status == 400, "a bad body is a 400")
        conn.close()
        wait_idle(a.fairgate, a.limiter, "at the end")
    finally:
        app.send_signal(signal.SIGINT)
        try:
            app.wait(10)
        except subprocess.TimeoutExpired:
            app.kill()
            check(False, "app.py did not stop on SIGINT")
    print(f"python-rag: {'ok' if not failures else f'{len(failures)} failed'}", flush=True)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
