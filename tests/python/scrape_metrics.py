"""Scrapes a Switchyard /metrics endpoint and parses it with the Prometheus
project's own Python parser (prometheus_client.parser), so the exposition is
checked by a real third-party reader, not by our own code.

usage: scrape_metrics.py URL TOKEN   (TOKEN may be empty: no credential)
prints: {"status": HTTP status, "families": {name: {"type", "samples"}}}
"""

import json
import sys
import urllib.error
import urllib.request

from prometheus_client.parser import text_string_to_metric_families


def main() -> None:
    url, token = sys.argv[1], sys.argv[2]
    req = urllib.request.Request(url)
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            status, body = resp.status, resp.read().decode()
            content_type = resp.headers.get("Content-Type", "")
    except urllib.error.HTTPError as e:
        print(json.dumps({"status": e.code, "families": {}}))
        return
    assert content_type.startswith("text/plain; version=0.0.4"), content_type
    families = {}
    for f in text_string_to_metric_families(body):
        families[f.name] = {
            "type": f.type,
            "samples": [
                {"name": s.name, "labels": s.labels, "value": s.value} for s in f.samples
            ],
        }
    print(json.dumps({"status": status, "families": families}))


if __name__ == "__main__":
    main()
