#!/usr/bin/env bash
# Install the third-party MCP servers the sidecar's MCP toolbox tests run
# (sidecar/tests/mcp.rs): `@modelcontextprotocol/server-everything`, the
# MCP project's reference server, from npm.
#
#   tests/mcp/install-mcp-servers.sh     # idempotent: a second run does nothing
#
# package.json pins the version and package-lock.json every dependency (with
# their integrity hashes), so `npm ci` installs exactly that tree into
# tests/mcp/node_modules (gitignored), where the tests look for it.
set -euo pipefail
cd "$(dirname "$0")"

entry="node_modules/@modelcontextprotocol/server-everything/dist/index.js"
stamp="node_modules/.installed-from"
want="$(sha256sum package-lock.json | cut -d' ' -f1)"

if [[ -f "$entry" && -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then
    exit 0
fi
for tool in node npm; do
    command -v "$tool" >/dev/null || { echo "install-mcp-servers.sh: $tool (Node.js 20 or newer) is needed" >&2; exit 1; }
done
npm ci --silent --no-audit --no-fund --ignore-scripts
echo "$want" >"$stamp"
echo "MCP test servers installed in $(pwd)/node_modules (server-everything $(node -p 'require("./node_modules/@modelcontextprotocol/server-everything/package.json").version'))"
