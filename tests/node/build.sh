#!/usr/bin/env bash
# Build the Go binaries of the tests' real node (tests/src/node.rs): the
# kubelet, kube-proxy and kube-scheduler of the same Kubernetes release as the
# control plane (../control-plane/kubernetes/go.mod, the one wrapper module),
# CoreDNS with the plugins a cluster's DNS uses (./coredns) and kube-router as
# the NetworkPolicy enforcer (./kube-router), each an ordinary `go build` of a
# pinned Go module, built as ../control-plane/build.sh builds its three.
#
#   tests/node/build.sh    # idempotent: a second run builds nothing
#
# Installs into
#   ${BINDERY_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/bindery}/node/<k8s-version>/
# (see ../control-plane/README.md, "The node's binaries").
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"

who=node/build.sh
# shellcheck source=../control-plane/go-build.sh
source "$here/../control-plane/go-build.sh"

# The versions are the ones the go.mod files require: one place to bump each.
kubernetes_mod="$here/../control-plane/kubernetes"
k8s_version="$(required k8s.io/kubernetes "$kubernetes_mod/go.mod")"
coredns_version="$(required github.com/coredns/coredns "$here/coredns/go.mod")"
kube_router_version="$(required github.com/cloudnativelabs/kube-router/v2 "$here/kube-router/go.mod")"
if [[ ! "$k8s_version" =~ ^v1\.[0-9]+\.[0-9]+$ || -z "$coredns_version" || -z "$kube_router_version" ]]; then
    echo "$who: ../control-plane/kubernetes/go.mod must require k8s.io/kubernetes v1.Y.Z," \
        "coredns/go.mod github.com/coredns/coredns and kube-router/go.mod" \
        "github.com/cloudnativelabs/kube-router/v2" >&2
    exit 1
fi

cache="${BINDERY_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/bindery}"
dest="$cache/node/$k8s_version"
stamp="$dest/.built-from"
binaries=(kubelet kube-proxy kube-scheduler coredns kube-router)
# The versions, and what else decides the binaries: our modules' files and
# these scripts (an edit to coredns/main.go rebuilds; the Go cache keeps it short).
sources="$(cat "$kubernetes_mod"/go.{mod,sum} "$here"/coredns/{go.mod,go.sum,main.go} \
    "$here"/kube-router/go.{mod,sum} "$here/build.sh" "$here/../control-plane/go-build.sh" \
    | sha256sum | cut -c1-16)"
want="kubernetes $k8s_version coredns $coredns_version kube-router $kube_router_version sources $sources"
built() {
    local b
    for b in "${binaries[@]}"; do [[ -x "$dest/$b" ]] || return 1; done
    [[ -f "$stamp" && "$(cat "$stamp")" == "$want" ]]
}
built && exit 0

k8s_ldflags="$(k8s_ldflags "$k8s_version")"
# What `coredns -version` and `kube-router --version` print, as their own
# Makefiles set it.
coredns_ldflags="-X github.com/coredns/coredns/coremain.gitTag=$coredns_version"
kube_router_ldflags="-X github.com/cloudnativelabs/kube-router/v2/pkg/version.Version=$kube_router_version"
kube_router_ldflags+=" -X github.com/cloudnativelabs/kube-router/v2/pkg/version.BuildDate=$(date -u +%Y-%m-%dT%H:%M:%SZ)"

mkdir -p "$dest"
echo "$who: building Kubernetes $k8s_version's node, CoreDNS $coredns_version and kube-router" \
    "$kube_router_version with $("$go" env GOVERSION) into $dest (a first build takes a while;" \
    "see tests/control-plane/README.md)"
rm -f "$stamp"

for b in kubelet kube-proxy kube-scheduler; do
    go_step "$b" "$kubernetes_mod" "$dest" -ldflags "-s -w $k8s_ldflags" "k8s.io/kubernetes/cmd/$b"
done
go_step coredns "$here/coredns" "$dest" -ldflags "-s -w $coredns_ldflags" .
go_step kube-router "$here/kube-router" "$dest" -ldflags "-s -w $kube_router_ldflags" \
    github.com/cloudnativelabs/kube-router/v2/cmd/kube-router

for b in kubelet kube-proxy kube-scheduler; do "$dest/$b" --version; done
"$dest/coredns" -version
"$dest/kube-router" --version
echo "$want" >"$stamp"
