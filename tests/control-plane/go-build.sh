# shellcheck shell=bash
# Sourced by control-plane/build.sh and node/build.sh: how the tests build a
# pinned Go module's command, one definition for both. Needs $who (the
# script's name for its messages) set before sourcing; sets $go.

go="$(command -v go || true)"
[[ -n "$go" ]] || { [[ -x /usr/local/go/bin/go ]] && go=/usr/local/go/bin/go; }
if [[ -z "$go" ]]; then
    echo "$who: Go 1.24 or newer is needed to build the tests' Kubernetes binaries" >&2
    echo "(https://go.dev/dl/); put \`go\` on PATH and run tests/setup.sh again" >&2
    exit 1
fi

# Static binaries (as Kubernetes releases its servers), the go.sum files as
# committed, Go's own toolchain (no download of another one), two jobs: the
# machine's two cores are shared.
export CGO_ENABLED=0 GOFLAGS=-mod=readonly GOTOOLCHAIN=local
go_build=(build -trimpath -p 2)

required() { # module, go.mod: the version it requires (a `require` line or block)
    awk -v m="$1" '$1 == "require" && $2 == m { print $3 } $1 == m && $2 ~ /^v/ { print $2 }' "$2"
}

k8s_ldflags() { # v1.Y.Z: what `kubectl version` and discovery read, the same
    # variables Kubernetes' hack/lib/version.sh sets, in component-base and client-go
    local version="$1" minor flags="" pkg
    minor="$(cut -d. -f2 <<<"$version")"
    for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
        flags+=" -X $pkg.gitVersion=$version -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
        flags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
    done
    echo "$flags"
}

go_step() { # name, module dir, destination dir, go build args...: builds
    # <destination>/<name> atomically and prints the wall time it took
    local name="$1" dir="$2" dest="$3" start=$SECONDS
    shift 3
    echo "$who: $name..."
    (cd "$dir" && "$go" "${go_build[@]}" -o "$dest/$name.new" "$@")
    mv -f "$dest/$name.new" "$dest/$name"
    echo "$who: $name built in $((SECONDS - start)) s"
}
