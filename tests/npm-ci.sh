#!/usr/bin/env bash
# Install the npm packages of one test directory exactly as its lockfile
# says, once:
#
#   tests/npm-ci.sh DIR     # idempotent: a second run does nothing
#
# DIR/package.json pins the versions and DIR/package-lock.json every
# dependency (with their integrity hashes); `npm ci` installs exactly that
# tree into DIR/node_modules (gitignored), without running install scripts.
# A stamp there records which lockfile it came from.
set -euo pipefail
cd "$1"

stamp="node_modules/.installed-from"
want="$(sha256sum package-lock.json | cut -d' ' -f1)"

if [[ -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then
    exit 0
fi
for tool in node npm; do
    command -v "$tool" >/dev/null || { echo "npm-ci.sh: $tool (Node.js 20 or newer) is needed for $1" >&2; exit 1; }
done
npm ci --silent --no-audit --no-fund --ignore-scripts
echo "$want" >"$stamp"
echo "npm packages installed in $(pwd)/node_modules: $(node -p 'Object.entries(require("./package.json").dependencies).map(([n, v]) => n + " " + v).join(", ")')"
