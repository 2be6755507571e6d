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

go="$(command -v go || true)"
[[ -n "$go" ]] || { [[ -x /usr/local/go/bin/go ]] && go=/usr/local/go/bin/go; }
if [[ -z "$go" ]]; then
    echo "control-plane/build.sh: Go 1.24 or newer is needed to build kube-apiserver and etcd" >&2
    echo "(https://go.dev/dl/); put \`go\` on PATH and run tests/setup.sh again" >&2
    exit 1
fi

# The versions are the ones the two go.mod files require: one place to bump.
required() { # module, go.mod: the version it requires (a `require` line or block)
    awk -v m="$1" '$1 == "require" && $2 == m { print $3 } $1 == m && $2 ~ /^v/ { print $2 }' "$2"
}
k8s_version="$(required k8s.io/kubernetes "$here/kubernetes/go.mod")"
etcd_version="$(required go.etcd.io/etcd/server/v3 "$here/etcd/go.mod")"
if [[ ! "$k8s_version" =~ ^v1\.([0-9]+)\.[0-9]+$ || -z "$etcd_version" ]]; then
    echo "control-plane/build.sh: kubernetes/go.mod must require k8s.io/kubernetes v1.Y.Z" \
        "and etcd/go.mod go.etcd.io/etcd/server/v3" >&2
    exit 1
fi
k8s_minor="${BASH_REMATCH[1]}"

cache="${BINDERY_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/bindery}"
dest="$cache/control-plane/$k8s_version"
stamp="$dest/.built-from"
want="kubernetes $k8s_version etcd $etcd_version"
if [[ -x "$dest/kube-apiserver" && -x "$dest/kube-controller-manager" && -x "$dest/etcd" \
    && -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then
    exit 0
fi

# Static binaries (as Kubernetes releases its servers), the go.sum files as
# committed, Go's own toolchain (no download of another one), two jobs: the
# machine's two cores are shared.
export CGO_ENABLED=0 GOFLAGS=-mod=readonly GOTOOLCHAIN=local
build=(build -trimpath -p 2)

# What `kubectl version` and the operator's discovery read: the same variables
# Kubernetes' hack/lib/version.sh sets, in component-base and client-go.
ldflags=""
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ldflags+=" -X $pkg.gitVersion=$k8s_version -X $pkg.gitMajor=1 -X $pkg.gitMinor=$k8s_minor"
    ldflags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
done

mkdir -p "$dest"
echo "control-plane/build.sh: building Kubernetes $k8s_version and etcd $etcd_version" \
    "with $("$go" env GOVERSION) into $dest (a first build takes a while; see tests/control-plane/README.md)"
rm -f "$stamp"

step() { # name, module dir, go build args...
    local name="$1" dir="$2" start=$SECONDS
    shift 2
    echo "control-plane/build.sh: $name..."
    (cd "$here/$dir" && "$go" "${build[@]}" -o "$dest/$name.new" "$@")
    mv -f "$dest/$name.new" "$dest/$name"
    echo "control-plane/build.sh: $name built in $((SECONDS - start)) s"
}
step etcd etcd -ldflags "-s -w" .
step kube-apiserver kubernetes -ldflags "-s -w $ldflags" k8s.io/kubernetes/cmd/kube-apiserver
step kube-controller-manager kubernetes -ldflags "-s -w $ldflags" k8s.io/kubernetes/cmd/kube-controller-manager

"$dest/kube-apiserver" --version
echo "$want" >"$stamp"
