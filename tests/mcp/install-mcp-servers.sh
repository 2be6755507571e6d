#!/usr/bin/env bash
# Install the third-party MCP servers the sidecar's MCP toolbox tests run
# (sidecar/tests/it/mcp.rs): `@modelcontextprotocol/server-everything`, the
# MCP project's reference server, from npm, pinned by package-lock.json, into
# tests/mcp/node_modules, where the tests look for it.
#
#   tests/mcp/install-mcp-servers.sh     # idempotent: a second run does nothing
set -euo pipefail
exec "$(dirname "$0")/../npm-ci.sh" "$(dirname "$0")"
