#!/usr/bin/env bash
# Install the chat page's browser driver (sidecar/tests/chat_page.rs):
# playwright-core from npm, which drives Debian's chromium (tests/setup.sh
# installs it with apt; playwright's own browser downloads are never used).
#
#   tests/browser/install-playwright.sh     # idempotent: a second run does nothing
#
# package.json pins the version and package-lock.json the tree (with its
# integrity hash), so `npm ci` installs exactly that into
# tests/browser/node_modules (gitignored).
set -euo pipefail
cd "$(dirname "$0")"

entry="node_modules/playwright-core/package.json"
stamp="node_modules/.installed-from"
want="$(sha256sum package-lock.json | cut -d' ' -f1)"

if [[ -f "$entry" && -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then
    exit 0
fi
for tool in node npm; do
    command -v "$tool" >/dev/null || { echo "install-playwright.sh: $tool (Node.js 20 or newer) is needed" >&2; exit 1; }
done
npm ci --silent --no-audit --no-fund --ignore-scripts
echo "$want" >"$stamp"
echo "playwright-core $(node -p 'require("./node_modules/playwright-core/package.json").version') installed in $(pwd)/node_modules"
