#!/usr/bin/env bash
# Build the real Kubernetes control plane the operator's tests run against
# (tests/src/control_plane.rs): kube-apiserver and kube-controller-manager of
# the release ./kubernetes/go.mod requires, and the etcd ./etcd/go.mod
# requires, each an ordinary `go build` of a pinned Go module.
#
#   tests/control-plane/build.sh    # idempotent: a second run builds nothing
#
# Installs into
#   ${BINDERY_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/bindery}/control-plane/<k8s-version>/
# where the tests look for them (or set BINDERY_CONTROL_PLANE to a directory
# holding the three binaries). Go's module and build caches stay where `go env`
# puts them, so after a change of version only what changed is compiled.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"

who=control-plane/build.sh
# shellcheck source=go-build.sh
source "$here/go-build.sh"

# The versions are the ones the two go.mod files require: one place to bump.
k8s_version="$(required k8s.io/kubernetes "$here/kubernetes/go.mod")"
etcd_version="$(required go.etcd.io/etcd/server/v3 "$here/etcd/go.mod")"
if [[ ! "$k8s_version" =~ ^v1\.[0-9]+\.[0-9]+$ || -z "$etcd_version" ]]; then
    echo "$who: kubernetes/go.mod must require k8s.io/kubernetes v1.Y.Z" \
        "and etcd/go.mod go.etcd.io/etcd/server/v3" >&2
    exit 1
fi

cache="${BINDERY_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/bindery}"
dest="$cache/control-plane/$k8s_version"
stamp="$dest/.built-from"
want="kubernetes $k8s_version etcd $etcd_version"
if [[ -x "$dest/kube-apiserver" && -x "$dest/kube-controller-manager" && -x "$dest/etcd" \
    && -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then
    exit 0
fi

ldflags="$(k8s_ldflags "$k8s_version")"

mkdir -p "$dest"
echo "$who: building Kubernetes $k8s_version and etcd $etcd_version" \
    "with $("$go" env GOVERSION) into $dest (a first build takes a while; see tests/control-plane/README.md)"
rm -f "$stamp"

go_step etcd "$here/etcd" "$dest" -ldflags "-s -w" .
go_step kube-apiserver "$here/kubernetes" "$dest" -ldflags "-s -w $ldflags" k8s.io/kubernetes/cmd/kube-apiserver
go_step kube-controller-manager "$here/kubernetes" "$dest" -ldflags "-s -w $ldflags" k8s.io/kubernetes/cmd/kube-controller-manager

"$dest/kube-apiserver" --version
echo "$want" >"$stamp"
