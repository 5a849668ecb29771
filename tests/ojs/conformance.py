#!/usr/bin/env python3
"""Replays the public OJS conformance test cases (JSON data files) against a server.

The suite's own runner is a Go program; this one reads the same files (levels 0 and 1
and `ext-ai-agents`, format described in the suite's README) and needs only the Python
standard library:

    python3 tests/ojs/conformance.py --suite ../shared/ojs-conformance \
        --switchyard target/release/switchyard

With `--switchyard BIN` every test gets a fresh `switchyard dev` on a new data directory
(the reset between tests); with `--base-url URL [--token T]` the tests run against a
server already running, optionally POSTing to `--reset-url` before each test. The report
gives PASS/FAIL per test with the first failed assertion, a summary per level and the
conformant level (every test of that level and of the levels below passes). Exit status:
0 when every selected test passed, 1 otherwise, 2 on a usage error.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field

MISSING = object()
"""A JSONPath that selects nothing."""

TEMPLATE = re.compile(r"\{\{\s*([^{}]+?)\s*\}\}")
UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$", re.I)
UUID7 = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$", re.I)
RFC3339 = re.compile(r"^\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}:\d{2}(\.\d+)?([Zz]|[+-]\d{2}:\d{2})$")


# ----------------------------------------------------------------- JSONPath subset

def _tokens(path: str) -> list:
    """`$.a.b[0][*][?(@.k=='v')]` as a list of keys, indexes, '*' and filters."""
    if not path.startswith("$"):
        raise ValueError(f"JSONPath {path!r} does not start with $")
    out: list = []
    i, n = 1, len(path)
    while i < n:
        c = path[i]
        if c == ".":
            j = i + 1
            while j < n and path[j] not in ".[":
                j += 1
            if j == i + 1:
                raise ValueError(f"JSONPath {path!r}: empty key at {i}")
            out.append(path[i + 1:j])
            i = j
        elif c == "[":
            j = path.find("]", i)
            if path.startswith("[?(", i):
                j = path.find(")]", i) + 1
            if j <= i:
                raise ValueError(f"JSONPath {path!r}: unclosed [ at {i}")
            inner = path[i + 1:j]
            if inner == "*":
                out.append("*")
            elif inner.startswith("?(") and inner.endswith(")"):
                m = re.fullmatch(r"\?\(@\.([\w.]+)\s*==\s*(?:'([^']*)'|\"([^\"]*)\"|(-?\d+(?:\.\d+)?|true|false))\)", inner)
                if not m:
                    raise ValueError(f"JSONPath {path!r}: unsupported filter {inner!r}")
                lit = m.group(2) if m.group(2) is not None else m.group(3)
                if lit is None:
                    lit = json.loads(m.group(4))
                out.append(("filter", m.group(1), lit))
            elif re.fullmatch(r"-?\d+", inner):
                out.append(int(inner))
            else:
                out.append(inner.strip("'\""))
            i = j + 1
        else:
            raise ValueError(f"JSONPath {path!r}: unexpected {c!r} at {i}")
    return out


def select(doc, path: str):
    """The value `path` selects in `doc` ([*] gives a list), or MISSING."""
    values = [doc]
    spread = False
    for t in _tokens(path):
        nxt = []
        for v in values:
            if t == "*":
                if isinstance(v, list):
                    nxt.extend(v)
                elif isinstance(v, dict):
                    nxt.extend(v.values())
                spread = True
            elif isinstance(t, tuple):
                _, key, lit = t
                if isinstance(v, list):
                    hit = next((x for x in v if select(x, "$." + key) == lit), MISSING)
                    if hit is not MISSING:
                        nxt.append(hit)
            elif isinstance(t, int):
                if isinstance(v, list) and -len(v) <= t < len(v):
                    nxt.append(v[t])
            elif isinstance(v, dict) and t in v:
                nxt.append(v[t])
        values = nxt
    if spread:
        return values
    return values[0] if values else MISSING


# ----------------------------------------------------------------- templates

def lookup(ref: str, ctx: dict):
    """`steps.<id>.response.body.<path>` (or `captures.<name>`) in what ran so far."""
    parts = ref.split(".")
    if parts[0] == "captures" and len(parts) == 2:
        return ctx["captures"].get(parts[1], MISSING)
    if len(parts) < 4 or parts[0] != "steps" or parts[2] != "response":
        return MISSING
    resp = ctx["steps"].get(parts[1])
    if resp is None:
        return MISSING
    if parts[3] == "status" and len(parts) == 4:
        return resp.status
    if parts[3] == "headers" and len(parts) == 5:
        return resp.header(parts[4]) or MISSING
    if parts[3] != "body":
        return MISSING
    rest = ".".join(parts[4:])
    if not rest:
        return resp.body
    return select(resp.body, "$." + rest if not rest.startswith("[") else "$" + rest)


def fill_text(text: str, ctx: dict) -> str:
    """Textual replacement (paths): values as text; unresolvable ones stay as written."""

    def one(m):
        v = lookup(m.group(1), ctx)
        if v is MISSING:
            return m.group(0)
        return v if isinstance(v, str) else json.dumps(v)

    return TEMPLATE.sub(one, text)


def fill(value, ctx: dict):
    """Templates in a JSON value: a string that is one template becomes the value it
    names (objects and numbers included); templates inside longer strings become text,
    and so do templates in keys (JSONPath filters such as `$.jobs[?(@.id=='{{...}}')]`)."""
    if isinstance(value, str):
        m = TEMPLATE.fullmatch(value.strip())
        if m:
            v = lookup(m.group(1), ctx)
            return value if v is MISSING else v
        return fill_text(value, ctx)
    if isinstance(value, list):
        return [fill(v, ctx) for v in value]
    if isinstance(value, dict):
        return {fill_text(k, ctx): fill(v, ctx) for k, v in value.items()}
    return value


# ----------------------------------------------------------------- matchers

def _num(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _range(spec: str):
    m = re.fullmatch(r"range\(\s*(-?[\d.]+)\s*,\s*(-?[\d.]+)\s*\)", spec)
    return (float(m.group(1)), float(m.group(2))) if m else None


def _show(v) -> str:
    return "absent" if v is MISSING else json.dumps(v)[:200]


def _size_ok(expected, n: int) -> bool:
    if isinstance(expected, int):
        return n == expected
    if isinstance(expected, dict):
        return all(_compare(op, n, bound) for op, bound in expected.items())
    raise ValueError(f"unsupported $size {expected!r}")


def _compare(op: str, a, b) -> bool:
    if not (_num(a) and _num(b)):
        return False
    return {"$gte": a >= b, "$gt": a > b, "$lte": a <= b, "$lt": a < b, "$eq": a == b, "$ne": a != b}[op]


TYPES = {
    "string": lambda v: isinstance(v, str),
    "number": _num,
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
    "null": lambda v: v is None,
}


def match(expected, actual) -> str | None:
    """None when `actual` satisfies `expected`, else why not."""
    if isinstance(expected, str):
        return _match_str(expected, actual)
    if isinstance(expected, dict):
        if any(k.startswith("$") for k in expected) or set(expected) == {"range"}:
            return _match_ops(expected, actual)
        if not isinstance(actual, dict):
            return f"expected an object, got {_show(actual)}"
        for k, e in expected.items():
            why = match(e, actual.get(k, MISSING))
            if why:
                return f".{k}: {why}"
        return None
    if isinstance(expected, list):
        if not isinstance(actual, list) or len(actual) != len(expected):
            return f"expected {_show(expected)}, got {_show(actual)}"
        for i, (e, a) in enumerate(zip(expected, actual)):
            why = match(e, a)
            if why:
                return f"[{i}]: {why}"
        return None
    if isinstance(expected, bool) or expected is None:
        ok = actual is expected or (actual == expected and type(actual) is type(expected))
    elif _num(expected):
        ok = _num(actual) and actual == expected
    else:
        ok = actual == expected
    return None if ok else f"expected {_show(expected)}, got {_show(actual)}"


def _match_str(e: str, a) -> str | None:
    bad = f"expected {e!r}, got {_show(a)}"
    if e == "any":
        return None
    if e == "absent":
        return None if a is MISSING else bad
    if e == "exists":
        return None if a is not MISSING else bad
    if e.startswith("~") and re.fullmatch(r"~-?[\d.]+", e):
        n = float(e[1:])
        tol = max(abs(n) * 0.5, 100)
        return None if _num(a) and abs(a - n) <= tol else bad
    kind, _, rest = e.partition(":")
    if kind == "string" and rest:
        if not isinstance(a, str):
            return bad
        ok = {
            "uuidv7": lambda: bool(UUID7.match(a)),
            "uuid": lambda: bool(UUID.match(a)),
            "datetime": lambda: bool(RFC3339.match(a)),
            "nonempty": lambda: a != "",
        }.get(rest)
        if ok is not None:
            return None if ok() else bad
        if rest.startswith("contains:"):
            return None if rest[len("contains:"):] in a else bad
        m = re.fullmatch(r"pattern\((.*)\)", rest)
        if m:
            return None if re.search(m.group(1), a) else bad
    if kind == "number" and rest:
        if not _num(a):
            return bad
        if rest == "positive":
            return None if a > 0 else bad
        if rest == "non_negative":
            return None if a >= 0 else bad
        r = _range(rest)
        if r:
            return None if r[0] <= a <= r[1] else bad
    if kind == "array" and rest:
        if not isinstance(a, list):
            return bad
        if rest == "empty":
            return None if not a else bad
        if rest == "nonempty":
            return None if a else bad
        m = re.fullmatch(r"(length|min_length|max_length)(?::|\()\s*(\d+)\)?", rest)
        if m:
            n = int(m.group(2))
            ok = {"length": len(a) == n, "min_length": len(a) >= n, "max_length": len(a) <= n}[m.group(1)]
            return None if ok else bad
    if kind == "contains" and rest:
        if isinstance(a, str):
            return None if rest in a else bad
        if isinstance(a, list):
            return None if rest in a or any(isinstance(x, str) and rest in x for x in a) else bad
        return bad
    if kind in ("string", "number", "array") and rest:
        raise ValueError(f"unsupported matcher {e!r}")
    return None if a == e else bad


def _match_ops(e: dict, a) -> str | None:
    for op, arg in e.items():
        bad = f"expected {op} {_show(arg)}, got {_show(a)}"
        if op == "$exists":
            if (a is not MISSING) != bool(arg):
                return bad
        elif op == "$type":
            names = arg if isinstance(arg, list) else [arg]
            if a is MISSING or not any(TYPES[t](a) for t in names):
                return bad
        elif op == "$match":
            if not isinstance(a, str) or not re.search(arg, a):
                return bad
        elif op == "$in":
            if a is MISSING or not any(match(x, a) is None for x in arg):
                return bad
        elif op == "$size":
            if not isinstance(a, (list, dict, str)) or not _size_ok(arg, len(a)):
                return bad
        elif op in ("$gte", "$gt", "$lte", "$lt", "$eq", "$ne"):
            if not _compare(op, a, arg):
                return bad
        elif op == "$or":
            if all(match(x, a) is not None for x in arg):
                return bad
        elif op == "$empty":
            empty = a is MISSING or a in (None, "", [], {})
            if empty != bool(arg):
                return bad
        elif op == "range":
            lo, hi = arg.get("min", float("-inf")), arg.get("max", float("inf"))
            if not _num(a) or not lo <= a <= hi:
                return bad
        else:
            raise ValueError(f"unsupported operator {op!r}")
    return None


def match_status(expected, status: int) -> str | None:
    if isinstance(expected, int):
        ok = status == expected
    elif isinstance(expected, list):
        ok = status in expected
    elif isinstance(expected, dict) and "$in" in expected:
        ok = status in expected["$in"]
    elif isinstance(expected, str) and expected.startswith("one_of:"):
        ok = status in [int(x) for x in expected[len("one_of:"):].split(",")]
    elif isinstance(expected, str) and expected.startswith("number:"):
        return match(expected, status) and f"status {status}, expected {expected}"
    else:
        raise ValueError(f"unsupported status assertion {expected!r}")
    return None if ok else f"status {status}, expected {json.dumps(expected)}"


def match_body(assertions: dict, body) -> str | None:
    """Each `path: matcher`; a `$or` of alternative maps; `$empty` on the whole body."""
    for path, expected in assertions.items():
        if path == "$or":
            whys = [match_body(alt, body) for alt in expected]
            if all(whys):
                return "none of the $or alternatives held: " + "; ".join(whys)
            continue
        if path == "$empty":
            why = _match_ops({"$empty": expected}, body)
            if why:
                return f"body: {why}"
            continue
        why = match(expected, select(body, path) if body is not MISSING else MISSING)
        if why:
            return f"{path}: {why}"
    return None


# ----------------------------------------------------------------- HTTP

@dataclass
class Response:
    status: int
    headers: dict
    text: str
    body: object
    elapsed_ms: float

    def header(self, name: str):
        return self.headers.get(name.lower())


def send(base: str, method: str, path: str, headers: dict, data: bytes | None, timeout: float) -> Response:
    req = urllib.request.Request(base.rstrip("/") + path, data=data, method=method, headers=headers)
    start = time.monotonic()
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            status, hdrs, raw = r.status, r.headers, r.read()
    except urllib.error.HTTPError as e:
        status, hdrs, raw = e.code, e.headers, e.read()
    elapsed = (time.monotonic() - start) * 1000
    text = raw.decode("utf-8", "replace")
    try:
        body = json.loads(text) if text.strip() else MISSING
    except ValueError:
        body = MISSING
    return Response(status, {k.lower(): v for k, v in hdrs.items()}, text, body, elapsed)


# ----------------------------------------------------------------- running tests

@dataclass
class Result:
    test_id: str
    level: object
    name: str
    path: str
    failure: str | None = None
    seconds: float = 0.0


@dataclass
class Target:
    base_url: str
    token: str | None
    reset_url: str | None = None
    timeout: float = 30.0
    extra: dict = field(default_factory=dict)
    # OJS roles: the worker routes' token and the operator routes' token
    # (dead letter) when they differ from the producer's.
    worker_token: str | None = None
    operator_token: str | None = None

    def token_for(self, path: str) -> str | None:
        if self.worker_token and path.startswith("/ojs/v1/workers/"):
            return self.worker_token
        if self.operator_token and path.startswith("/ojs/v1/dead-letter"):
            return self.operator_token
        return self.token


class Failed(Exception):
    pass


def run_step(step: dict, ctx: dict, target: Target) -> None:
    sid = step.get("id", "?")
    if step.get("delay_ms"):
        time.sleep(step["delay_ms"] / 1000)
    action = step["action"].upper()
    assertions = step.get("assertions") or {}
    if action == "WAIT":
        time.sleep(step.get("duration_ms", 0) / 1000)
        return
    if action == "ASSERT":
        check_assert(sid, assertions, ctx)
        return
    headers = {k: fill_text(str(v), ctx) for k, v in (step.get("headers") or {}).items()}
    path = fill_text(step.get("path", "/"), ctx)
    token = target.token_for(path)
    if token and not any(k.lower() == "authorization" for k in headers):
        headers["Authorization"] = f"Bearer {token}"
    data = None
    if "raw_body" in step:
        data = fill_text(step["raw_body"], ctx).encode()
    elif "body" in step:
        data = json.dumps(fill(step["body"], ctx)).encode()
    if data is not None and not any(k.lower() == "content-type" for k in headers):
        headers["Content-Type"] = "application/openjobspec+json"
    try:
        resp = send(target.base_url, action, path, headers, data, target.timeout)
    except OSError as e:
        raise Failed(f"{sid}: {action} {path}: {e}") from None
    ctx["steps"][sid] = resp
    for name, p in (step.get("captures") or {}).items():
        ctx["captures"][name] = select(resp.body, p) if resp.body is not MISSING else MISSING
    check_response(sid, action, path, assertions, resp, ctx)


def check_response(sid: str, action: str, path: str, a: dict, resp: Response, ctx: dict) -> None:
    where = f"{sid} ({action} {path})"
    if "status" in a:
        why = match_status(fill(a["status"], ctx), resp.status)
        if why:
            raise Failed(f"{where}: {why}; body {resp.text[:300]}")
    if "status_in" in a:
        why = match_status(list(a["status_in"]), resp.status)
        if why:
            raise Failed(f"{where}: {why}")
    for name, expected in (a.get("headers") or {}).items():
        why = match(fill(expected, ctx), resp.header(name) or MISSING)
        if why:
            raise Failed(f"{where}: header {name}: {why}")
    if "body" in a:
        why = match_body(fill(a["body"], ctx), resp.body)
        if why:
            raise Failed(f"{where}: {why}; body {resp.text[:300]}")
    for p in a.get("body_absent") or []:
        if resp.body is not MISSING and select(resp.body, p) is not MISSING:
            raise Failed(f"{where}: {p} should be absent")
    for s in a.get("body_contains") or []:
        if fill_text(s, ctx) not in resp.text:
            raise Failed(f"{where}: body does not contain {s!r}")
    t = a.get("timing_ms")
    if t:
        ms = resp.elapsed_ms
        if "less_than" in t and not ms < t["less_than"]:
            raise Failed(f"{where}: took {ms:.0f} ms, expected < {t['less_than']}")
        if "greater_than" in t and not ms > t["greater_than"]:
            raise Failed(f"{where}: took {ms:.0f} ms, expected > {t['greater_than']}")
        if "approximate" in t and match(f"~{t['approximate']}", ms):
            raise Failed(f"{where}: took {ms:.0f} ms, expected about {t['approximate']}")


def check_assert(sid: str, a: dict, ctx: dict) -> None:
    claim = a.get("exclusive_claim")
    if claim:
        job = fill(claim["job_id"], ctx)
        fetches = [fill(f, ctx) for f in claim["fetches"]]
        if any(not isinstance(f, list) for f in fetches):
            raise Failed(f"{sid}: a fetch answered no jobs list: {_show(fetches)}")
        has = [f for f in fetches if any(isinstance(j, dict) and j.get("id") == job for j in f)]
        empty = [f for f in fetches if not f]
        if claim.get("exactly_one_has_job") and len(has) != 1:
            raise Failed(f"{sid}: {len(has)} fetches got job {job}, expected exactly one")
        if claim.get("exactly_one_empty") and len(empty) != 1:
            raise Failed(f"{sid}: {len(empty)} fetches were empty, expected exactly one")
    for left, right in (a.get("equality") or {}).items():
        ref = left[2:] if left.startswith("$.") else left
        lv = lookup(ref, ctx)
        rv = fill(right, ctx)
        if lv is MISSING or lv != rv:
            raise Failed(f"{sid}: {left} = {_show(lv)} differs from {_show(rv)}")


def groups(steps: list) -> list:
    """Steps in order, with each step and those `parallel_with` it in one group."""
    by_id = {s.get("id"): i for i, s in enumerate(steps)}
    partner: dict = {}
    for i, s in enumerate(steps):
        other = s.get("parallel_with")
        if other in by_id:
            a, b = sorted((i, by_id[other]))
            partner.setdefault(a, set()).add(b)
    out, taken = [], set()
    for i, s in enumerate(steps):
        if i in taken:
            continue
        g = [i] + sorted(partner.get(i, ()))
        taken.update(g)
        out.append([steps[j] for j in g])
    return out


def run_steps(steps: list, ctx: dict, target: Target) -> None:
    for g in groups(steps):
        if len(g) == 1:
            run_step(g[0], ctx, target)
            continue
        errors: list = []

        def one(step):
            try:
                run_step(step, ctx, target)
            except Failed as e:
                errors.append(str(e))

        threads = [threading.Thread(target=one, args=(s,)) for s in g]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise Failed(errors[0])


def run_test(test: dict, target: Target) -> str | None:
    ctx = {"steps": {}, "captures": {}}
    if target.reset_url:
        send(target.reset_url, "POST", "", {"Authorization": f"Bearer {target.token}"} if target.token else {}, b"", target.timeout)
    try:
        run_steps((test.get("setup") or {}).get("steps", []), ctx, target)
        run_steps(test["steps"], ctx, target)
        return None
    except Failed as e:
        return str(e)
    finally:
        try:
            run_steps((test.get("teardown") or {}).get("steps", []), ctx, target)
        except Failed:
            pass


# ----------------------------------------------------------------- a fresh server per test

class Server:
    """`switchyard dev` on a new data directory and ephemeral ports; stopped on exit."""

    def __init__(self, binary: str, config: str | None = None, timeout: float = 30.0):
        self.dir = tempfile.mkdtemp(prefix="ojs-conformance-")
        self.log = open(os.path.join(self.dir, "server.log"), "w")
        extra = ["--config", config] if config else []
        self.proc = subprocess.Popen(
            [binary, "dev", "--listen", "127.0.0.1:0", "--data-dir", os.path.join(self.dir, "data")] + extra,
            stdout=self.log, stderr=subprocess.STDOUT,
            env={**os.environ, "RUST_LOG": os.environ.get("RUST_LOG", "warn")},
        )
        deadline = time.monotonic() + timeout
        self.http = None
        while time.monotonic() < deadline and self.proc.poll() is None:
            with open(os.path.join(self.dir, "server.log")) as f:
                m = re.search(r"http=(127\.0\.0\.1:\d+)", f.read())
            if m:
                self.http = "http://" + m.group(1)
                break
            time.sleep(0.05)
        if not self.http:
            self.stop()
            raise RuntimeError(f"switchyard dev did not start; see {self.dir}/server.log")
        # OJS roles on the dev principals: alice produces (submitter), the
        # agents principal works the queues (agent role: task.work).
        with open(os.path.join(self.dir, "data", "credentials.json")) as f:
            principals = json.load(f)["principals"]
        self.token = principals["alice"]["token"]
        self.worker_token = principals["agents"]["token"]
        # The dead letter is an operator's (admin holds dead_letter.manage).
        self.operator_token = principals["admin"]["token"]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)


# ----------------------------------------------------------------- the suite

def load(suite: str, levels: set, only: str | None) -> list:
    tests = []
    for path in sorted(glob.glob(os.path.join(suite, "**", "*.json"), recursive=True)):
        rel = os.path.relpath(path, suite)
        group = rel.split(os.sep)[0]
        if group not in levels:
            continue
        with open(path) as f:
            t = json.load(f)
        if only and not re.search(only, t.get("test_id", "") + " " + rel):
            continue
        t["_path"], t["_group"] = rel, group
        tests.append(t)
    return tests


GROUPS = ["level-0-core", "level-1-reliable", "ext-ai-agents"]


def report(results: list, out, expected: dict | None = None) -> int:
    """Prints the summary per group and the conformant level; 0 when every
    test passed or failed as `expected` (test id -> why) says, 1 otherwise.
    An expected failure that passes is an error too: the list is stale."""
    expected = expected or {}
    unexpected = [r for r in results if bool(r.failure) != (r.test_id in expected)]
    by_group: dict = {}
    for r in results:
        by_group.setdefault(r.path.split(os.sep)[0], []).append(r)
    print(file=out)
    for g in GROUPS:
        rs = by_group.get(g, [])
        if rs:
            passed = sum(1 for r in rs if not r.failure)
            print(f"{g}: {passed}/{len(rs)} passed", file=out)
    level = -1
    for n, g in enumerate(GROUPS[:2]):
        rs = by_group.get(g)
        if rs is None or any(r.failure for r in rs):
            break
        level = n
    print("conformant level: " + (str(level) if level >= 0 else "none"), file=out)
    for r in results:
        if r.test_id in expected:
            state = "fails as expected" if r.failure else "PASSES but is listed as failing by design"
            print(f"{r.test_id}: {state}: {expected[r.test_id]}", file=out)
    return 0 if not unexpected else 1


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--suite", required=True, help="the directory of the conformance test cases")
    ap.add_argument("--switchyard", help="start this binary's `switchyard dev` afresh for every test")
    ap.add_argument("--base-url", help="a server already running (instead of --switchyard)")
    ap.add_argument("--token", help="bearer token for --base-url")
    ap.add_argument("--worker-token", help="bearer token for the worker routes with --base-url (default --token)")
    ap.add_argument("--operator-token", help="bearer token for the dead-letter routes with --base-url (default --token)")
    ap.add_argument("--config", help="configuration file for the started `switchyard dev`")
    ap.add_argument("--reset-url", help="POSTed before each test when using --base-url")
    ap.add_argument("--levels", default=",".join(GROUPS), help="comma-separated test groups")
    ap.add_argument("--only", help="a regular expression on test id and file path")
    ap.add_argument("--timeout", type=float, default=30.0, help="per request, seconds")
    ap.add_argument("--expect-fail", help="a JSON file of test id -> why it fails by design; "
                    "those failures do not fail the run (and a listed test that passes does)")
    args = ap.parse_args(argv)
    expected = {}
    if args.expect_fail:
        with open(args.expect_fail) as f:
            expected = {k: v for k, v in json.load(f).items() if not k.startswith("_")}
    if bool(args.switchyard) == bool(args.base_url):
        ap.error("give exactly one of --switchyard and --base-url")
    if not os.path.isdir(args.suite):
        print(f"no conformance test cases at {args.suite}", file=sys.stderr)
        return 2
    tests = load(args.suite, set(args.levels.split(",")), args.only)
    if not tests:
        print("no test selected", file=sys.stderr)
        return 2
    results = []
    for t in tests:
        started = time.monotonic()
        server = None
        try:
            if args.switchyard:
                server = Server(args.switchyard, args.config)
                target = Target(server.http, server.token, timeout=args.timeout,
                                worker_token=server.worker_token,
                                operator_token=server.operator_token)
            else:
                target = Target(args.base_url, args.token, args.reset_url, args.timeout,
                                worker_token=args.worker_token,
                                operator_token=args.operator_token)
            failure = run_test(t, target)
        except (RuntimeError, ValueError, OSError) as e:
            failure = f"could not run: {e}"
        finally:
            if server:
                server.stop()
        r = Result(t.get("test_id", "?"), t.get("level"), t.get("name", ""), t["_path"], failure,
                   time.monotonic() - started)
        results.append(r)
        mark = "PASS" if not failure else "FAIL"
        line = f"{mark} {r.test_id:<14} {r.path}"
        if failure:
            line += f"\n       {failure}"
        print(line, flush=True)
    return report(results, sys.stdout, expected)


if __name__ == "__main__":
    sys.exit(main())
