#!/usr/bin/env python3
"""A Switchyard webhook receiver that posts each notification to a chat.

Switchyard posts CloudEvents (JSON) to the webhooks in
`[[executor.notifications.webhooks]]`, signed with the webhook's secret:

    X-Switchyard-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256 of "<t>.<body>">

This receiver checks the signature (and that it is at most five minutes
old), drops repeats by the event's id (deliveries are at least once), and
posts a one-line message as `{"text": ...}` to CHAT_WEBHOOK_URL, the form
Slack, Mattermost and Rocket.Chat incoming webhooks take. A delivery it
could not pass on is answered 502, so Switchyard sends it again later.

    SWITCHYARD_WEBHOOK_SECRET_FILE=hook.secret \\
    CHAT_WEBHOOK_URL=https://hooks.slack.com/services/... \\
    python3 chat_relay.py --port 8099

Standard library only.
"""

import argparse
import hashlib
import hmac
import json
import os
import sys
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

TOLERANCE_SECS = 300


def verify(secret: bytes, header: str, body: bytes, now: float) -> bool:
    """Whether `header` signs `body` under `secret`, recently."""
    parts = dict(p.strip().split("=", 1) for p in header.split(",") if "=" in p)
    try:
        t = int(parts.get("t", ""))
    except ValueError:
        return False
    if abs(now - t) > TOLERANCE_SECS:
        return False
    want = hmac.new(secret, f"{t}.".encode() + body, hashlib.sha256).hexdigest()
    return hmac.compare_digest(want, parts.get("v1", ""))


def money(micro):
    return "—" if micro is None else f"${micro / 1_000_000:.6f}".rstrip("0").rstrip(".")


def message(event: dict) -> str:
    """One line for people, from the event's ids, states and amounts."""
    kind = event.get("type", "").removeprefix("dev.switchyard.")
    d = event.get("data") or {}
    job = d.get("job_id", event.get("subject", "?"))
    if kind == "approval.needed":
        return (f":raised_hand: Approval needed: job {job} (run {d.get('run_id')}) "
                f"submitted by {d.get('submitted_by')}, estimated {money(d.get('estimated_cost_micro_usd'))}")
    if kind == "budget.threshold":
        return (f":warning: Job {job} has spent {d.get('percent')}% of its budget "
                f"({money(d.get('spent_micro_usd'))} of {money(d.get('limit_micro_usd'))})")
    if kind in ("job.completed", "job.failed", "job.cancelled"):
        icon = {"job.completed": ":white_check_mark:", "job.failed": ":x:"}.get(kind, ":no_entry:")
        why = f" ({d['reason']})" if d.get("reason") else ""
        return f"{icon} Job {job} {d.get('state')}{why}, cost {money(d.get('cost_micro_usd'))}"
    return f"Switchyard: {kind} for {job}"


class Relay(BaseHTTPRequestHandler):
    seen = set()

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("content-length") or 0))
        sig = self.headers.get("x-switchyard-signature", "")
        if not verify(self.server.secret, sig, body, time.time()):
            return self.answer(401, "bad signature")
        try:
            event = json.loads(body)
        except ValueError:
            return self.answer(400, "not JSON")
        if event.get("id") in Relay.seen:
            return self.answer(204, "")
        post = urllib.request.Request(
            self.server.chat_url,
            data=json.dumps({"text": message(event)}).encode(),
            headers={"content-type": "application/json"},
            method="POST",
        )
        try:
            with urllib.request.urlopen(post, timeout=10) as r:
                r.read()
        except Exception as e:  # the chat is down: let Switchyard try again
            return self.answer(502, f"chat: {e}")
        Relay.seen.add(event.get("id"))
        self.answer(204, "")

    def answer(self, code, text):
        self.send_response(code)
        self.send_header("content-length", str(len(text.encode())))
        self.end_headers()
        self.wfile.write(text.encode())

    def log_message(self, fmt, *args):
        sys.stderr.write("chat_relay: " + fmt % args + "\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--port", type=int, default=8099, help="0 picks a free one")
    args = ap.parse_args()
    with open(os.environ["SWITCHYARD_WEBHOOK_SECRET_FILE"], "rb") as f:
        secret = f.read().strip()
    server = ThreadingHTTPServer(("127.0.0.1", args.port), Relay)
    server.secret = secret
    server.chat_url = os.environ["CHAT_WEBHOOK_URL"]
    print(f"listening http://127.0.0.1:{server.server_address[1]}/", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
