"""Checks docs/openapi.yaml against a running `fairgate serve` (ctest -L clients,
started by clients_test.cpp with the limiters and the route below).

    python3 openapi_check.py --url URL --token ADMIN_TOKEN
    server config: [limiters.oa] max_concurrent = 1; [limiters.oa-off] enabled = false,
    when_disabled = "reject"; [ratelimit.oa-rl] gcra, rate 2 per 600000 ms; a [[route]] /v1/chat/completions (limiter oa, tenant_header
    x-user-id) to an upstream that is not running.

The document: OpenAPI 3.1, every $ref resolves, every path parameter is
declared, operationIds are unique, every schema is valid JSON Schema 2020-12.
The server: every operation is called (each documented path answers, and never
with `not_found`); every status it answers must be documented for that
operation (or be a protocol error under `default`), with the documented media
type, a body that validates against the schema and the documented headers;
SSE events must be documented in `x-sse-events` and validate; a wrong method
on each path is a 405 whose Allow lists exactly the documented methods (and HEAD
where a GET reads).
Needs Debian's python3-yaml and python3-jsonschema. Prints "FAIL: ..." per
failed check; exits 1 when one failed.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import re
import sys
import urllib.parse
from typing import Any, Dict, List, Optional, Tuple

import jsonschema
import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
DOC = os.path.join(HERE, "..", "..", "docs", "openapi.yaml")
METHODS = ["get", "put", "post", "delete", "patch", "head", "options"]
# What `default` (ProtocolError) covers: these statuses with these reasons, nothing else.
PROTOCOL = {400: "bad_request", 404: "not_found", 405: "method_not_allowed", 408: "request_timeout",
            413: "body_too_large", 431: "header_too_large", 503: "too_many_connections"}
failures: List[str] = []
observed: Dict[str, set] = {}


def check(ok: bool, what: str) -> bool:
    if not ok:
        failures.append(what)
        print(f"FAIL: {what}", flush=True)
    return ok


class Doc:
    def __init__(self, path: str) -> None:
        with open(path) as f:
            self.d = yaml.safe_load(f)

    def resolve(self, node: Any) -> Any:
        while isinstance(node, dict) and "$ref" in node and len(node) == 1:
            node = self.pointer(node["$ref"])
        return node

    def pointer(self, ref: str) -> Any:
        if not ref.startswith("#/"):
            raise KeyError(ref)
        node = self.d
        for part in ref[2:].split("/"):
            node = node[part.replace("~1", "/").replace("~0", "~")]
        return node

    def validator(self, schema: Dict[str, Any]) -> jsonschema.Draft202012Validator:
        # The whole document is the resource, so '#/components/schemas/X' resolves.
        resolver = jsonschema.RefResolver(base_uri="", referrer=self.d)
        return jsonschema.Draft202012Validator(schema, resolver=resolver)

    def operations(self):
        for path, item in self.d["paths"].items():
            for method in METHODS:
                if method in item:
                    yield path, method, item[method]


# --- the document itself ------------------------------------------------------------
def check_document(doc: Doc) -> None:
    d = doc.d
    check(str(d.get("openapi", "")).startswith("3.1."), f"openapi: {d.get('openapi')}, expected 3.1.x")

    def walk(node: Any, where: str) -> None:
        if isinstance(node, dict):
            if "$ref" in node:
                try:
                    doc.pointer(node["$ref"])
                except KeyError:
                    check(False, f"{where}: $ref {node['$ref']} does not resolve")
            for k, v in node.items():
                walk(v, f"{where}/{k}")
        elif isinstance(node, list):
            for i, v in enumerate(node):
                walk(v, f"{where}/{i}")

    walk(d, "#")
    ids = set()
    for path, method, op in doc.operations():
        where = f"{method.upper()} {path}"
        check("operationId" in op and op["operationId"] not in ids, f"{where}: missing or duplicate operationId")
        ids.add(op.get("operationId"))
        check(bool(op.get("responses")), f"{where}: no responses")
        params = [doc.resolve(p) for p in d["paths"][path].get("parameters", []) + op.get("parameters", [])]
        declared = {p["name"] for p in params if p.get("in") == "path" and p.get("required")}
        for name in re.findall(r"{(\w+)}", path):
            check(name in declared, f"{where}: path parameter {{{name}}} is not declared (in: path, required)")
    for name, schema in d["components"]["schemas"].items():
        try:
            jsonschema.Draft202012Validator.check_schema(schema)
        except jsonschema.SchemaError as e:
            check(False, f"components.schemas.{name}: not valid JSON Schema 2020-12: {e.message}")


# --- the running server ---------------------------------------------------------------
class Client:
    def __init__(self, url: str) -> None:
        u = urllib.parse.urlsplit(url)
        self.host, self.port = u.hostname, u.port

    def request(self, method: str, target: str, body: Optional[Any] = None, headers: Optional[Dict[str, str]] = None,
                sse_until: Tuple[str, ...] = ()) -> Tuple[int, Dict[str, str], Any]:
        conn = http.client.HTTPConnection(self.host, self.port, timeout=15)
        h = dict(headers or {})
        data = None
        if body is not None:
            data = body if isinstance(body, (bytes, str)) else json.dumps(body)
            h.setdefault("Content-Type", "application/json")
        conn.request(method, target, data, h)
        resp = conn.getresponse()
        headers_out = {k.lower(): v for k, v in resp.getheaders()}
        if headers_out.get("content-type", "").startswith("text/event-stream"):
            events, name, lines = [], None, []
            while True:
                raw = resp.readline()
                if not raw:
                    break
                line = raw.decode().rstrip("\r\n")
                if line.startswith("event:"):
                    name = line[6:].strip()
                elif line.startswith("data:"):
                    lines.append(line[5:].lstrip())
                elif line == "" and lines:
                    events.append((name or "message", "\n".join(lines)))
                    name, lines = None, []
                    if events[-1][0] in sse_until:
                        break
            resp.close()
            conn.close()
            return resp.status, headers_out, events
        text = resp.read().decode()
        conn.close()
        return resp.status, headers_out, text


def expect(doc: Doc, client: Client, op_id: str, method: str, target: str, want: int, **kw) -> Tuple[int, Dict[str, str], Any]:
    """Calls the server; checks the answer against operation `op_id` and that the status is `want`."""
    path, m, op = next((p, m, o) for p, m, o in doc.operations() if o["operationId"] == op_id)
    status, headers, body = client.request(method, target, **kw)
    where = f"{method} {target} ({op_id})"
    check(status == want, f"{where}: status {status}, expected {want}; body {str(body)[:200]}")
    observed.setdefault(op_id, set()).add(status)
    responses = op["responses"]
    spec = responses.get(str(status))
    protocol = False
    if spec is None:
        check("default" in responses, f"{where}: status {status} is not documented")
        spec = responses.get("default", {})
        protocol = not op.get("x-fairgate-gateway")
    spec = doc.resolve(spec)
    for name, h in (spec.get("headers") or {}).items():
        h = doc.resolve(h)
        if name.lower() == "allow" and status != 405:
            continue
        value = headers.get(name.lower())
        if value is None and h.get("required") is False:
            continue  # documented as sometimes absent (its description says when)
        if check(value is not None, f"{where}: documented header {name} missing"):
            errs = list(doc.validator(h.get("schema", {})).iter_errors(value))
            check(not errs, f"{where}: header {name}: {value!r}: {errs[:1]}")
    content = spec.get("content")
    if not content:
        check(status == 204 or not body, f"{where}: a body where none is documented: {str(body)[:100]}")
        return status, headers, body
    ctype = headers.get("content-type", "").split(";")[0].strip()
    media = content.get(ctype)
    if not check(media is not None, f"{where}: content type {ctype!r} not documented ({list(content)})"):
        return status, headers, body
    if ctype == "text/event-stream":
        known = media.get("x-sse-events", {})
        for name, data in body:
            schema = known.get(name)
            if not check(schema is not None, f"{where}: SSE event {name!r} is not documented"):
                continue
            value = data if data == "[DONE]" else json.loads(data)
            errs = list(doc.validator(schema).iter_errors(value))
            check(not errs, f"{where}: event {name} {data[:120]}: {errs[0].message if errs else ''}")
    elif ctype == "application/json":
        try:
            value = json.loads(body)
        except ValueError:
            check(False, f"{where}: not JSON: {body[:100]!r}")
            return status, headers, body
        errs = list(doc.validator(media.get("schema", {})).iter_errors(value))
        check(not errs, f"{where}: body {body[:200]}: {errs[0].message if errs else ''} at {list(errs[0].absolute_path) if errs else ''}")
        if isinstance(value, dict) and isinstance(value.get("error"), dict):
            reason = value["error"].get("reason")
            check(reason != "not_found", f"{where}: a documented route answered not_found")
            if protocol:
                check(PROTOCOL.get(status) == reason,
                      f"{where}: {status} {reason} is not documented (only protocol errors fall under default)")
    return status, headers, body


def check_server(doc: Doc, client: Client, token: str) -> None:
    sse = {"Accept": "text/event-stream"}
    js = {"Accept": "application/json"}
    auth = {"Authorization": f"Bearer {token}"}
    # Admission: JSON long poll, lease, renew, release.
    _, _, body = expect(doc, client, "acquire", "POST", "/v1/limiters/oa/acquire?lease_ms=5000&tenant=u-1", 200, headers=js)
    permit = json.loads(body)["permit"] if body else "x"
    expect(doc, client, "renewPermit", "POST", f"/v1/permits/{permit}/renew", 200)
    expect(doc, client, "acquire", "POST", "/v1/limiters/oa/acquire?max_wait_ms=100", 429, headers=js)
    _, _, events = expect(doc, client, "acquire", "POST", "/v1/limiters/oa/acquire?max_wait_ms=200", 200, headers=sse,
                          sse_until=("granted", "rejected"))
    check([n for n, _ in events] == ["queued", "rejected"], f"SSE while held: {events}")
    expect(doc, client, "getLimiter", "GET", "/v1/limiters/oa", 200)  # with a holder
    expect(doc, client, "releasePermit", "DELETE", f"/v1/permits/{permit}", 204)
    expect(doc, client, "releasePermit", "DELETE", f"/v1/permits/{permit}", 404)
    expect(doc, client, "renewPermit", "POST", f"/v1/permits/{permit}/renew", 404)
    _, _, events = expect(doc, client, "acquire", "POST", "/v1/limiters/oa/acquire", 200, headers=sse,
                          sse_until=("granted", "rejected"))
    check([n for n, _ in events] == ["granted"], f"SSE when free: {events}")
    _, _, body = expect(doc, client, "acquire", "POST", "/v1/limiters/oa/acquire", 200, headers=js,
                        body={"max_wait_ms": 1000, "lease_ms": 500, "tenant": None, "weight": 2})
    if body:
        expect(doc, client, "releasePermit", "DELETE", f"/v1/permits/{json.loads(body)['permit']}", 204)
    for bad in ("max_wait_ms=-1", "bogus=1", "tenant=no%20spaces", "weight=0", "lease_ms=5"):
        expect(doc, client, "acquire", "POST", f"/v1/limiters/oa/acquire?{bad}", 400, headers=js)
    expect(doc, client, "acquire", "POST", "/v1/limiters/oa/acquire", 400, headers=js, body="[1]")
    expect(doc, client, "acquire", "POST", "/v1/limiters/nope/acquire", 404, headers=js)
    expect(doc, client, "acquire", "POST", "/v1/limiters/oa-off/acquire", 503, headers=js)
    _, _, events = expect(doc, client, "acquire", "POST", "/v1/limiters/oa-off/acquire", 200, headers=sse,
                          sse_until=("granted", "rejected"))
    check([n for n, _ in events] == ["rejected"], f"SSE on a disabled limiter: {events}")
    # Browser access: the GET acquire (an event stream whatever Accept says), a foreign page's acquire.
    _, _, events = expect(doc, client, "acquireStream", "GET", "/v1/limiters/oa-off/acquire?tenant=u-3", 200,
                          headers=js, sse_until=("granted", "rejected"))
    check([n for n, _ in events] == ["rejected"], f"GET acquire on a disabled limiter: {events}")
    expect(doc, client, "acquireStream", "GET", "/v1/limiters/oa/acquire?lease_ms=1000", 400)
    expect(doc, client, "acquireStream", "GET", "/v1/limiters/nope/acquire", 404)
    foreign = {"Origin": "http://foreign.example"}
    expect(doc, client, "acquireStream", "GET", "/v1/limiters/oa/acquire", 403, headers=foreign)
    expect(doc, client, "acquire", "POST", "/v1/limiters/oa/acquire", 403, headers={**foreign, **js})
    # This document, served by the server.
    _, _, text = expect(doc, client, "openApiYaml", "GET", "/openapi.yaml", 200)
    check(text.startswith("openapi: 3.1"), "GET /openapi.yaml starts with 'openapi: 3.1'")
    _, _, text = expect(doc, client, "openApiJson", "GET", "/openapi.json", 200)
    check(json.loads(text) == doc.d if text else False, "GET /openapi.json is docs/openapi.yaml as JSON")
    # The dashboard page (its behaviour: tests/browser/dashboard_test.mjs).
    _, _, text = expect(doc, client, "dashboard", "GET", "/dashboard", 200)
    check("<title>fairgate dashboard</title>" in (text or ""), "GET /dashboard is the dashboard page")
    # Status and admin.
    expect(doc, client, "listLimiters", "GET", "/v1/limiters", 200)
    expect(doc, client, "getLimiter", "GET", "/v1/limiters/nope", 404)
    expect(doc, client, "configureLimiter", "PUT", "/v1/limiters/oa", 401, body={"max_queue": 10})
    expect(doc, client, "configureLimiter", "PUT", "/v1/limiters/oa", 401, body={"max_queue": 10},
           headers={"Authorization": "Bearer wrong"})
    expect(doc, client, "configureLimiter", "PUT", "/v1/limiters/oa", 400, body={"max_concurent": 2}, headers=auth)
    expect(doc, client, "configureLimiter", "PUT", "/v1/limiters/oa", 400, body={"max_concurrent": 0}, headers=auth)
    expect(doc, client, "configureLimiter", "PUT", "/v1/limiters/nope", 404, body={"max_queue": 1}, headers=auth)
    expect(doc, client, "configureLimiter", "PUT", "/v1/limiters/oa", 200, body={"max_queue": None}, headers=auth)
    _, _, events = expect(doc, client, "limiterEvents", "GET", "/v1/events", 200, sse_until=("snapshot",))
    check(events and events[0][0] == "snapshot", f"/v1/events: {events[:1]}")
    expect(doc, client, "health", "GET", "/healthz", 200)
    _, _, text = expect(doc, client, "metrics", "GET", "/metrics", 200)
    check("fairgate_in_use" in text, "/metrics has fairgate_in_use")
    # Rate limits: a bucket of 2 that does not refill during the check.
    expect(doc, client, "listRateRules", "GET", "/v1/ratelimit", 200)
    expect(doc, client, "getRateRule", "GET", "/v1/ratelimit/oa-rl", 200)
    expect(doc, client, "getRateRule", "GET", "/v1/ratelimit/nope", 404)
    _, _, body = expect(doc, client, "checkRateLimit", "POST", "/v1/ratelimit/oa-rl", 200, body={"key": "k"})
    decision = json.loads(body).get("decision", "")
    expect(doc, client, "checkRateLimit", "POST", "/v1/ratelimit/oa-rl", 200, body={"key": "k"})
    expect(doc, client, "checkRateLimit", "POST", "/v1/ratelimit/oa-rl", 429, body={"key": "k"})
    expect(doc, client, "checkRateLimit", "POST", "/v1/ratelimit/oa-rl", 429, body={"key": "k2", "cost": 3})
    expect(doc, client, "checkRateLimit", "POST", "/v1/ratelimit/oa-rl", 400, body={"key": "k", "cost": 0})
    expect(doc, client, "checkRateLimit", "POST", "/v1/ratelimit/nope", 404, body={"key": "k"})
    expect(doc, client, "refundRateLimit", "POST", "/v1/ratelimit/oa-rl/refund", 200,
           body={"key": "k", "decision": decision, "amount": 1})
    expect(doc, client, "refundRateLimit", "POST", "/v1/ratelimit/oa-rl/refund", 400, body={"key": "k"})
    expect(doc, client, "refundRateLimit", "POST", "/v1/ratelimit/nope/refund", 404,
           body={"key": "k", "decision": decision, "amount": 1})
    expect(doc, client, "configureRateRule", "PUT", "/v1/ratelimit/oa-rl", 401, body={"rate": 3})
    expect(doc, client, "configureRateRule", "PUT", "/v1/ratelimit/oa-rl", 400, body={"rate": 0}, headers=auth)
    expect(doc, client, "configureRateRule", "PUT", "/v1/ratelimit/nope", 404, body={"rate": 3}, headers=auth)
    expect(doc, client, "configureRateRule", "PUT", "/v1/ratelimit/oa-rl", 200, body={"rate": 3}, headers=auth)
    # Gateway (its upstream is not running).
    chat = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    expect(doc, client, "gatewayRoute", "POST", "/v1/chat/completions", 502, body=chat)
    expect(doc, client, "gatewayRoute", "POST", "/v1/chat/completions", 400, body=chat,
           headers={"X-User-Id": "has spaces"})
    # A wrong method on each documented path: 405, Allow = exactly the documented methods.
    concrete = {"{name}": "oa", "{permit}": "lp-0", "{rule}": "oa-rl"}
    for path, item in doc.d["paths"].items():
        documented = [m.upper() for m in METHODS if m in item]
        if "GET" in documented and not path.endswith("/acquire"):
            documented.append("HEAD")  # answered on every reading path (info.description)
        documented = sorted(documented)
        if any(item[m].get("x-fairgate-gateway") for m in METHODS if m in item):
            continue  # a gateway route proxies every method to its upstream
        target = path
        for k, v in concrete.items():
            target = target.replace(k, v)
        wrong = "PATCH"
        status, headers, body = client.request(wrong, target)
        allow = sorted(x.strip() for x in headers.get("allow", "").split(",") if x.strip())
        check(status == 405 and allow == documented,
              f"{wrong} {path}: {status} Allow {allow}, the document has {documented}")
        err = (json.loads(body) if body else {}).get("error", {})
        check(err.get("reason") == "method_not_allowed", f"{wrong} {path}: body {body[:100]}")
    # An undocumented path is a 404 not_found (the default protocol error).
    status, _, body = client.request("GET", "/v1/nothing-here")
    check(status == 404 and json.loads(body)["error"]["reason"] == "not_found", f"GET /v1/nothing-here: {status} {body}")
    # Every operation was exercised.
    for path, method, op in doc.operations():
        check(op["operationId"] in observed, f"{method.upper()} {path} ({op['operationId']}) was never called")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", required=True)
    ap.add_argument("--token", required=True)
    ap.add_argument("--doc", default=DOC)
    a = ap.parse_args()
    doc = Doc(a.doc)
    check_document(doc)
    check_server(doc, Client(a.url), a.token)
    unobserved = {}
    for path, method, op in doc.operations():
        missing = sorted(set(op["responses"]) - {"default"} - {str(s) for s in observed.get(op["operationId"], ())})
        if missing:
            unobserved[op["operationId"]] = missing
    print("openapi: statuses observed: " + json.dumps({k: sorted(v) for k, v in observed.items()}))
    print("openapi: documented, not provoked here: " + json.dumps(unobserved))
    print(f"openapi: {'ok' if not failures else f'{len(failures)} failed'}")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
