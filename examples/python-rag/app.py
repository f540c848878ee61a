"""A small streaming RAG-style chat endpoint that holds a fairgate permit per answer.

    python3 examples/python-rag/app.py --fairgate http://127.0.0.1:8080 --limiter chat
    curl -N localhost:8000/chat -H 'content-type: application/json' -H 'x-user-id: alice' \
         -d '{"question":"What is fairgate?","conversationId":"c-1"}'

Standard library only (plus the fairgate client: `pip install ./clients/python`,
or run it from the repository). Each answer is a Server-Sent Events stream in
the seeds' event vocabulary:

    QUEUE   {"position":2,"queued":5,"estimatedWaitMs":1800}   while waiting (fairgate's addition)
    META    {"conversationId":"c-1","taskId":"t-17"}          once admitted, or when rejected
    MESSAGE {"type":"response","delta":"fairgate "}           the answer, token by token
    REJECT  {"type":"response","delta":"The system is busy, please try again later","reason":"timeout"}
    FINISH  {"messageId":"t-17","title":null}
    DONE    [DONE]

A rejection is META / REJECT / FINISH / DONE: a chat UI written for the seed
design shows "busy" without a change. The answer comes from an
OpenAI-compatible model server (--llm URL, e.g. `fairgate mock-llm`), or from
a built-in generator. The permit is held while the answer streams and released
when it ends, when the model fails, or when the browser goes away (the next
write fails); a browser that leaves while queued is noticed at its next QUEUE
event.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import sys
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Iterator, Optional

try:
    import fairgate
except ImportError:  # run from the repository without installing the client
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "clients", "python", "src"))
    import fairgate

BUSY = "The system is busy, please try again later"


def sse(name: str, data) -> bytes:
    text = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)
    return f"event: {name}\ndata: {text}\n\n".encode()


def builtin_answer(question: str, token_ms: int) -> Iterator[str]:
    """Stands in for retrieval + generation: a few words, one at a time."""
    words = (
        f"You asked: {question!r}. fairgate kept this answer in a fair queue and held one of the "
        "limiter's permits while it was written, so the model never runs more answers than it can."
    ).split()
    for w in words:
        time.sleep(token_ms / 1000.0)
        yield w + " "


def llm_answer(llm: str, question: str) -> Iterator[str]:
    """Streams a chat completion from an OpenAI-compatible server."""
    u = urllib.parse.urlsplit(llm)
    conn = http.client.HTTPConnection(u.hostname, u.port or 80, timeout=300)
    body = {"model": "default", "stream": True, "messages": [{"role": "user", "content": question}]}
    try:
        conn.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
        resp = conn.getresponse()
        if resp.status != 200:
            raise RuntimeError(f"model server answered {resp.status}")
        for raw in resp:
            line = raw.decode().strip()
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                return
            for choice in json.loads(data).get("choices", []):
                delta = choice.get("delta", {}).get("content")
                if delta:
                    yield delta
    finally:
        conn.close()


class ChatHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "python-rag-example"

    def log_message(self, fmt: str, *args) -> None:  # quiet; the server prints one line per answer
        pass

    def do_GET(self) -> None:
        if self.path == "/healthz":
            self._plain(200, "ok\n")
        else:
            self._plain(404, "POST /chat with {\"question\": ...}\n")

    def do_POST(self) -> None:
        if self.path != "/chat":
            return self._plain(404, "POST /chat\n")
        try:
            length = int(self.headers.get("Content-Length", "0"))
            req = json.loads(self.rfile.read(length) or b"{}")
            question = str(req["question"])
        except (ValueError, KeyError, TypeError):
            return self._plain(400, 'expected a JSON body {"question": "...", "conversationId": "..."}\n')
        conversation = req.get("conversationId")
        tenant = self.headers.get("X-User-Id") or None
        opts = self.server.opts  # type: ignore[attr-defined]

        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-store")
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True

        def on_queued(q: fairgate.QueueStatus) -> None:
            eta = None if q.estimated_wait is None else int(q.estimated_wait * 1000)
            # A failed write (the browser left) raises here, which gives up the wait.
            self._write(sse("QUEUE", {"position": q.position, "queued": q.queued, "estimatedWaitMs": eta}))

        outcome = "?"
        started = time.monotonic()
        try:
            with opts.client.acquire(opts.limiter, tenant=tenant, max_wait=opts.max_wait, on_queued=on_queued) as permit:
                task = permit.ticket or permit.id
                self._write(sse("META", {"conversationId": conversation, "taskId": task}))
                tokens = llm_answer(opts.llm, question) if opts.llm else builtin_answer(question, opts.token_ms)
                for delta in tokens:
                    self._write(sse("MESSAGE", {"type": "response", "delta": delta}))
                self._write(sse("FINISH", {"messageId": task, "title": None}))
                self._write(sse("DONE", "[DONE]"))
                outcome = f"answered (waited {permit.waited:.2f}s)"
        except fairgate.Rejected as e:
            task = e.ticket or "rejected"
            self._try_write(
                sse("META", {"conversationId": conversation, "taskId": task})
                + sse("REJECT", {"type": "response", "delta": BUSY, "reason": e.reason})
                + sse("FINISH", {"messageId": task, "title": None})
                + sse("DONE", "[DONE]")
            )
            outcome = f"rejected: {e.reason}"
        except (BrokenPipeError, ConnectionResetError):
            outcome = "client went away (permit released)"
        except fairgate.FairgateError as e:  # fairgate unreachable, unknown limiter, ...
            self._try_write(sse("ERROR", {"message": str(e)}) + sse("DONE", "[DONE]"))
            outcome = f"error: {e}"
        except Exception as e:  # the model failed: the permit was released on the way out
            self._try_write(sse("ERROR", {"message": f"answer failed: {e}"}) + sse("DONE", "[DONE]"))
            outcome = f"error: {e}"
        print(f"python-rag: {self.client_address[0]} tenant={tenant} {outcome} in {time.monotonic() - started:.2f}s",
              flush=True)

    def _write(self, data: bytes) -> None:
        self.wfile.write(data)
        self.wfile.flush()

    def _try_write(self, data: bytes) -> None:
        try:
            self._write(data)
        except OSError:
            pass

    def _plain(self, status: int, text: str) -> None:
        body = text.encode()
        self.send_response(status)
        self.send_header("Content-Type", "text/plain; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--listen", default="127.0.0.1:8000", help="HOST:PORT (port 0: any free port)")
    ap.add_argument("--fairgate", default="http://127.0.0.1:8080", help="fairgate serve's URL")
    ap.add_argument("--limiter", default="chat")
    ap.add_argument("--max-wait", type=float, default=None, help="seconds (default: the limiter's)")
    ap.add_argument("--llm", default=None, help="OpenAI-compatible server URL (default: built-in answers)")
    ap.add_argument("--token-ms", type=int, default=40, help="built-in answers: ms per word")
    opts = ap.parse_args()
    host, _, port = opts.listen.rpartition(":")
    opts.client = fairgate.Client(opts.fairgate)
    server = ThreadingHTTPServer((host, int(port)), ChatHandler)
    server.daemon_threads = True
    server.opts = opts  # type: ignore[attr-defined]
    print(f"python-rag: listening on http://{host}:{server.server_address[1]} "
          f"(fairgate {opts.fairgate}, limiter {opts.limiter})", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


if __name__ == "__main__":
    main()
