#!/usr/bin/env bash
# Build Bindery's two images and the images the tests run beside them,
# without Docker, and push them all into a registry's storage directory
# that the tests serve with Debian's docker-registry (tests/images/README.md
# says what, from what, how, and what it costs).
#
#   tests/images/build.sh    # idempotent: a second run with nothing changed does nothing
#
# 1. the release binaries (cargo, honouring CARGO_TARGET_DIR);
# 2. the base images from Debian's packages (mmdebstrap), made once per
#    recipe: the Debian slim of sidecar/Dockerfile and the distroless-like
#    base of operator/Dockerfile, under the names those Dockerfiles use;
# 3. operator/Dockerfile and sidecar/Dockerfile, unchanged, with buildah:
#    the named context `build` (the release binaries in out/) stands in
#    for their cargo stage, which never runs;
# 4. the images the tests need besides ours (Dockerfiles here): the pause
#    image from Kubernetes' own pause.c, curl for the tenant chart's
#    `helm test`, PostgreSQL;
# 5. every image pushed to a docker-registry on loopback (a port chosen at
#    run time) whose storage is
#      ${BINDERY_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/bindery}/images/registry/
#    under the path a containerd registry mirror asks for (ghcr.io/a/b:t is
#    a/b:t), listed with digests in images/registry.list.
# The images also stay in buildah's storage under their names.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
cd "$root"

cache="${BINDERY_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/bindery}/images"
registry_dir="$cache/registry"
target="${CARGO_TARGET_DIR:-$root/target}"
[[ "$target" == /* ]] || target="$root/$target"
export CARGO_TARGET_DIR="$target" CARGO_INCREMENTAL=0

# Messages go to the terminal's stderr (fd 3) even from a step whose output
# goes to its log.
exec 3>&2
say() { echo "images/build.sh: $*" >&3; }
die() { say "$*"; exit 1; }

go="$(command -v go || true)"
[[ -n "$go" || ! -x /usr/local/go/bin/go ]] || go=/usr/local/go/bin/go
for tool in cargo buildah mmdebstrap docker-registry gcc curl flock "${go:-go}"; do
    command -v "$tool" >/dev/null || die "$tool is missing: as root, apt-get install" \
        "buildah mmdebstrap docker-registry gcc libc6-dev curl (Go: https://go.dev/dl/)"
done
[[ "$(id -u)" -eq 0 ]] || die "run as root: mmdebstrap --mode=root and buildah's storage" \
    "in /var/lib/containers (rootless buildah needs subuid ranges this script does not set up)"

# --- What is built, under which names (one place each) ---------------------

# The chart's appVersion is the images' default tag.
version="$(awk '$1 == "appVersion:" { v = $2; gsub(/["\047]/, "", v); print v }' \
    charts/bindery-operator/Chart.yaml)"
[[ -n "$version" ]] || die "charts/bindery-operator/Chart.yaml has no appVersion"
# The base each Dockerfile's final stage starts FROM.
final_from() { awk 'toupper($1) == "FROM" { f = $2 } END { print f }' "$1"; }
# The tenant chart's `helm test` image.
test_image="$(awk '/^test:/ { t = 1 } t && $1 == "image:" { gsub(/"/, "", $2); print $2; exit }' \
    charts/bindery-tenant/values.yaml)"
[[ -n "$test_image" ]] || die "charts/bindery-tenant/values.yaml has no test.image"

# Kubernetes' own pause.c and the kubelet's default sandbox tag, from the
# release tests/control-plane/kubernetes/go.mod requires (the module cache
# holds its whole tree).
k8s_module="$(cd tests/control-plane/kubernetes \
    && GOFLAGS=-mod=readonly GOTOOLCHAIN=local "$go" mod download -json k8s.io/kubernetes)"
k8s_dir="$(sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p' <<<"$k8s_module")"
k8s_version="$(sed -n 's/^[[:space:]]*"Version": "\(.*\)",$/\1/p' <<<"$k8s_module")"
pause_c="$k8s_dir/build/pause/linux/pause.c"
pause_tag="$(sed -n 's/^[[:space:]]*defaultPodSandboxImageVersion[[:space:]]*=[[:space:]]*"\(.*\)"$/\1/p' \
    "$k8s_dir/cmd/kubelet/app/options/container_runtime.go" 2>/dev/null || true)"
[[ -f "$pause_c" && -n "$pause_tag" ]] \
    || die "no build/pause/linux/pause.c or kubelet default sandbox tag in k8s.io/kubernetes $k8s_version ($k8s_dir)"

# A name as containers/image spells it in full: debian:12 is
# docker.io/library/debian:12.
full_name() {
    local first="${1%%/*}"
    if [[ "$1" != */* ]]; then
        echo "docker.io/library/$1"
    elif [[ "$first" == *.* || "$first" == *:* || "$first" == localhost ]]; then
        echo "$1"
    else
        echo "docker.io/$1"
    fi
}
# The path a containerd registry mirror asks the mirror for: the name
# without its registry (ghcr.io/bindery-dev/x:1 is bindery-dev/x:1).
mirror_path() { local n; n="$(full_name "$1")"; echo "${n#*/}"; }

debian="$(full_name "$(final_from sidecar/Dockerfile)")"
distroless="$(full_name "$(final_from operator/Dockerfile)")"
operator="ghcr.io/bindery-dev/bindery-operator:$version"
sidecar="ghcr.io/bindery-dev/bindery-sidecar:$version"
pause="registry.k8s.io/pause:$pause_tag"
curl_image="$(full_name "$test_image")"
postgres="bindery.test/postgres:15"
images=("$debian" "$distroless" "$operator" "$sidecar" "$pause" "$curl_image" "$postgres")

# One storage holds every registry's images by path alone: two names with
# the same path would overwrite each other.
declare -A owner=()
for name in "${images[@]}"; do
    path="$(mirror_path "$name")"
    [[ -z "${owner[$path]:-}" ]] || die "$name and ${owner[$path]} are both $path in the registry"
    owner[$path]="$name"
done

# --- Timing ---------------------------------------------------------------

now_us() { echo "${EPOCHREALTIME/./}"; }
run_start="$(now_us)"
elapsed() { # since microseconds $1, as seconds with one decimal
    local us=$(($(now_us) - $1))
    printf '%d.%d s' $((us / 1000000)) $((us / 100000 % 10))
}
logs="$cache/logs"
timed() { # step name, command...: runs it with its output in logs/<name>.log
    local name="$1" start rc
    shift
    start="$(now_us)"
    mkdir -p "$logs"
    # A subshell with errexit of its own: in `if`/`||` bash would ignore
    # errexit inside the step's functions.
    set +e
    (set -e; "$@") >"$logs/$name.log" 2>&1
    rc=$?
    set -e
    if ((rc != 0)); then
        tail -n 30 "$logs/$name.log" >&2
        die "$name failed (whole log: $logs/$name.log)"
    fi
    say "$name: $(elapsed "$start")"
}

# --- 1. The release binaries ---------------------------------------------

# One run at a time: a second waits, then finds everything up to date.
mkdir -p "$cache"
exec 9>"$cache/.lock"
flock 9

# cargo's own output shows: a first release build is long (fat LTO).
release_bins=(bindery-operator bindery-sidecar)
start="$(now_us)"
CARGO_PROFILE_RELEASE_STRIP=symbols cargo build --release --locked \
    -p bindery-sidecar -p bindery-operator --bin bindery-sidecar --bin bindery-operator
say "binaries: $(elapsed "$start")"

# Everything that goes into the images, hashed (contents, not paths): a
# second run with the same inputs stops here.
inputs() {
    echo "$version $k8s_version ${images[*]}"
    b2sum "${release_bins[@]/#/$target/release/}" operator/Dockerfile sidecar/Dockerfile \
        "$pause_c" "$here/build.sh" "$here"/*/* | cut -d' ' -f1
}
stamp="$cache/.built-from"
want="$(inputs | b2sum)"
if [[ -f "$stamp" && "$(<"$stamp")" == "$want" && -f "$cache/registry.list" && -d "$registry_dir/docker" ]] \
    && buildah inspect --type image --format '{{.FromImageID}}' "$distroless" >/dev/null 2>&1; then
    say "up to date ($cache/registry.list): $(elapsed "$run_start")"
    exit 0
fi
rm -f "$stamp"
image_id() { buildah inspect --type image --format '{{.FromImageID}}' "$1" 2>/dev/null || true; }
# The images our names point at now, to drop them once replaced.
old_ids=()
for name in "${images[@]}"; do
    old_ids+=("$(image_id "$name")")
done

# --- 2. The base images, from Debian's packages ---------------------------

sources=(
    "deb http://deb.debian.org/debian bookworm main"
    "deb http://deb.debian.org/debian bookworm-updates main"
    "deb http://deb.debian.org/debian-security bookworm-security main"
)
# Like Debian's slim images: Essential + apt, merged /usr, no
# recommends, no documentation or translations; apt inside points at the
# same mirrors, so a Dockerfile's `RUN apt-get install` works. (The hooks'
# $1, the root, is mmdebstrap's to expand.)
# shellcheck disable=SC2016
slim_args=(
    --variant=minbase --hook-dir=/usr/share/mmdebstrap/hooks/merged-usr
    --aptopt='APT::Install-Recommends "false"'
    --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-include=/usr/share/doc/*/copyright'
    --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/info/*'
    --dpkgopt='path-exclude=/usr/share/locale/*' --dpkgopt='path-include=/usr/share/locale/locale.alias'
    # Not the building machine's name and resolver: the runtime gives its own.
    --customize-hook='echo localhost >"$1/etc/hostname"; : >"$1/etc/resolv.conf"'
    # What Debian's images set for apt: no .debs or package caches left
    # behind by `apt-get install` (Dockerfiles remove only the lists), no
    # translations, compressed indexes.
    --customize-hook='cd "$1/etc/apt/apt.conf.d"
clean="rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"
printf "%s\n" "DPkg::Post-Invoke { \"$clean\"; };" "APT::Update::Post-Invoke { \"$clean\"; };" \
    "Dir::Cache::pkgcache \"\";" "Dir::Cache::srcpkgcache \"\";" >docker-clean
printf "%s\n" "Acquire::Languages \"none\";" >docker-no-languages
printf "%s\n" "Acquire::GzipIndexes \"true\";" >docker-gzip-indexes
rm -f "$1"/var/cache/apt/*.bin'
)
# Like distroless' cc-debian12: glibc, libgcc, OpenSSL's library and the CA
# certificates, no shell and no package manager. mmdebstrap extracts them
# (and what they depend on; the debs stay for finish_distroless to sort).
distroless_packages=(libc6 libgcc-s1 libssl3 ca-certificates)
distroless_args=(--variant=extract --include="$(IFS=,; echo "${distroless_packages[*]}")"
    --skip=cleanup/apt/cache)

# What distroless' nonroot has that no package gives (its build writes
# these; extract runs no maintainer script and no customize hook): the
# users and groups, the nonroot home, a world-writable /tmp, nsswitch.conf
# and the CA bundle update-ca-certificates would make. What only the
# dependencies brought (debconf's Perl, the openssl command) goes, and so
# do apt's and dpkg's setup, the device nodes and the docs but licences.
finish_distroless() { # rootfs
    local r="$1" deb pkg
    for deb in "$r"/var/cache/apt/archives/*.deb; do
        pkg="$(dpkg-deb --field "$deb" Package)"
        [[ " ${distroless_packages[*]} gcc-12-base " != *" $pkg "* ]] || continue
        dpkg-deb --fsys-tarfile "$deb" | tar -t | grep -v '/$' | sed "s|^\./|$r/|" \
            | xargs -r -d '\n' rm -f
    done
    rm -rf "${r:?}"/{var/cache/apt,var/lib/apt,var/lib/dpkg,etc/apt,etc/dpkg,etc/debconf.conf} \
        "${r:?}"/etc/{fstab,hostname,resolv.conf} "${r:?}"/dev/* \
        "${r:?}"/usr/share/{man,lintian,pixmaps,perl5,debconf} "${r:?}"/usr/sbin/update-ca-certificates
    find "$r/usr/share/doc" -type f ! -name copyright -delete
    find "$r" -depth -type d -empty ! -path "$r/dev" -delete
    cat >"$r/etc/passwd" <<'PASSWD'
root:x:0:0:root:/root:/sbin/nologin
nobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin
nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin
PASSWD
    cat >"$r/etc/group" <<'GROUP'
root:x:0:
nobody:x:65534:
tty:x:5:
staff:x:50:
nonroot:x:65532:
GROUP
    cat >"$r/etc/nsswitch.conf" <<'NSS'
passwd:         files
group:          files
shadow:         files
gshadow:        files
hosts:          files dns
networks:       files
protocols:      db files
services:       db files
ethers:         db files
rpc:            db files
NSS
    install -d -m 0700 "$r/root"
    install -d -m 0700 -o 65532 -g 65532 "$r/home/nonroot"
    install -d -m 1777 "$r/tmp"
    install -d -m 0755 "$r/dev" "$r/proc" "$r/sys" "$r/etc/ssl/certs"
    find "$r/usr/share/ca-certificates" -name '*.crt' -print0 | sort -z | xargs -0 cat \
        >"$r/etc/ssl/certs/ca-certificates.crt"
    [[ -s "$r/etc/ssl/certs/ca-certificates.crt" && -e "$r/lib64/ld-linux-x86-64.so.2" ]]
}

bases="$cache/base"
# A base's tarball, made once per recipe (the arguments and, for the
# distroless one, finish_distroless): base key, mmdebstrap arguments...
make_base() {
    local key="$1" recipe
    shift
    recipe="$(printf '%s\n' "$@" "${sources[@]}"
        [[ "$key" != distroless ]] || declare -f finish_distroless)"
    if [[ -f "$bases/$key.tar" && "$(cat "$bases/$key.recipe" 2>/dev/null)" == "$recipe" ]]; then
        return 0
    fi
    mkdir -p "$bases"
    rm -f "$bases/$key.tar" "$bases/$key.recipe" "$bases/$key.image"
    if [[ "$key" == distroless ]]; then
        local tree="$bases/$key.tree"
        rm -rf "$tree"
        mmdebstrap --mode=root --format=directory "$@" bookworm "$tree" "${sources[@]}"
        finish_distroless "$tree"
        tar --numeric-owner --sort=name -C "$tree" -cf "$bases/$key.tar.new" .
        rm -rf "$tree"
    else
        mmdebstrap --mode=root --format=tar "$@" bookworm "$bases/$key.tar.new" "${sources[@]}"
    fi
    mv "$bases/$key.tar.new" "$bases/$key.tar"
    printf '%s\n' "$recipe" >"$bases/$key.recipe"
}
# The tarball as an image in buildah's storage, imported again only when
# the tarball or the image changed: base key, image name, buildah config
# arguments...
import_base() {
    local key="$1" name="$2" tar_sum id ctr
    shift 2
    tar_sum="$(sha256sum <"$bases/$key.tar")"
    id="$(image_id "$name")"
    if [[ -n "$id" && "$(cat "$bases/$key.image" 2>/dev/null)" == "$tar_sum $id" ]]; then
        return 0
    fi
    ctr="$(buildah from --pull=never scratch)"
    # (The step runs in a subshell of its own: this trap is the step's; the
    # id is expanded now, the local is gone by then.)
    # shellcheck disable=SC2064
    trap "buildah rm $ctr >/dev/null 2>&1 || true" EXIT
    buildah add --quiet "$ctr" "$bases/$key.tar" /
    buildah config "$@" "$ctr"
    buildah commit --quiet --rm --iidfile "$bases/$key.iid" "$ctr" "$name"
    id="$(<"$bases/$key.iid")"
    echo "$tar_sum ${id#sha256:}" >"$bases/$key.image"
}
path_env=PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
timed base-debian make_base debian "${slim_args[@]}"
timed base-debian-import import_base debian "$debian" --env "$path_env" --cmd '["bash"]'
timed base-distroless make_base distroless "${distroless_args[@]}"
timed base-distroless-import import_base distroless "$distroless" --env "$path_env" \
    --env SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt --user 65532:65532 \
    --workingdir /home/nonroot

# --- 3. Bindery's images, from their Dockerfiles unchanged ----------------

# Layers are cached: a new binary rebuilds only what follows its COPY.
# --force-rm: a failed build leaves no container behind either.
bud=(buildah bud --isolation chroot --pull=never --layers --force-rm)
context="$cache/build-context"
rm -rf "$context"
mkdir -p "$context/out"
for bin in "${release_bins[@]}"; do
    # A hard link where it can (cargo replaces, never rewrites, its output).
    ln -f "$target/release/$bin" "$context/out/$bin" 2>/dev/null \
        || cp -f "$target/release/$bin" "$context/out/$bin"
done
# The repository root is the build context, as the Dockerfiles' headers
# say; the stage named `build` is the directory of binaries.
timed operator "${bud[@]}" --build-context "build=$context" -f operator/Dockerfile -t "$operator" .
timed sidecar "${bud[@]}" --build-context "build=$context" -f sidecar/Dockerfile -t "$sidecar" .

# --- 4. The images the tests need besides ours ----------------------------

build_pause() {
    local dir="$cache/pause-context"
    rm -rf "$dir"
    mkdir -p "$dir"
    # As build/pause/Makefile: -DVERSION=v<tag>-<revision>.
    gcc -Os -Wall -Werror -static -DVERSION="v$pause_tag-$k8s_version" -o "$dir/pause" "$pause_c"
    "${bud[@]}" -f "$here/pause/Dockerfile" -t "$pause" "$dir"
}
timed pause build_pause
timed curl "${bud[@]}" --build-arg "BASE=$debian" -f "$here/curl/Dockerfile" -t "$curl_image" "$here/curl"
timed postgres "${bud[@]}" --build-arg "BASE=$debian" -f "$here/postgres/Dockerfile" \
    -t "$postgres" "$here/postgres"

# --- 5. Into the registry's storage ---------------------------------------

# The registry's configuration, for this script and for the tests: its
# address comes from REGISTRY_HTTP_ADDR (127.0.0.1:0 picks a free port; the
# log says which).
config="$cache/registry.yml"
cat >"$config" <<EOF
# Written by tests/images/build.sh. Serve with
#   REGISTRY_HTTP_ADDR=127.0.0.1:PORT docker-registry serve $config
version: 0.1
log:
  level: info
  accesslog:
    disabled: true
storage:
  filesystem:
    rootdirectory: $registry_dir
http:
  addr: 127.0.0.1:0
EOF

stop_registry() {
    if [[ -n "${registry_pid:-}" ]]; then
        kill "$registry_pid" 2>/dev/null || true
        wait "$registry_pid" 2>/dev/null || true
        registry_pid=""
    fi
}
# Polls a condition every 50 ms for up to 30 s: what, command...
wait_for() {
    local what="$1" deadline=$((SECONDS + 30))
    shift
    until "$@"; do
        ((SECONDS < deadline)) || die "$what: not after 30 s (log: $logs/registry.log)"
        kill -0 "$registry_pid" 2>/dev/null || die "$what: docker-registry exited (log: $logs/registry.log)"
        sleep 0.05
    done
}
listening() { port="$(sed -n 's/.*listening on 127\.0\.0\.1:\([0-9]*\).*/\1/p' "$logs/registry.log")"; [[ -n "$port" ]]; }
answers() { curl -fsS -o /dev/null "http://127.0.0.1:$port/v2/" 2>/dev/null; }

push_all() {
    local list="$cache/registry.list.new" name path
    mkdir -p "$registry_dir"
    trap stop_registry EXIT
    REGISTRY_HTTP_ADDR=127.0.0.1:0 docker-registry serve "$config" >"$logs/registry.log" 2>&1 &
    registry_pid=$!
    wait_for "docker-registry listening" listening
    wait_for "docker-registry answering /v2/" answers
    {
        echo "# Written by tests/images/build.sh: image name, path in the registry ($registry_dir), manifest digest."
        for name in "${images[@]}"; do
            path="$(mirror_path "$name")"
            buildah push --quiet --tls-verify=false --digestfile "$cache/digest" \
                "$name" "docker://127.0.0.1:$port/$path" >&2
            printf '%s\t%s\t%s\n' "$name" "$path" "$(<"$cache/digest")"
        done
    } >"$list"
    rm -f "$cache/digest"
    stop_registry
    # What the tags no longer name (an earlier build) goes.
    docker-registry garbage-collect --delete-untagged "$config" >&2
    mv "$list" "$cache/registry.list"
}
timed push push_all

# The images our names pointed at before, when no name points at them now
# (buildah keeps one that a newer image still builds on).
for old in "${old_ids[@]}"; do
    [[ -n "$old" ]] || continue
    for name in "${images[@]}"; do
        [[ "$(image_id "$name")" != "$old" ]] || continue 2
    done
    buildah rmi "$old" >/dev/null 2>&1 || true
done

inputs | b2sum >"$stamp"
say "done in $(elapsed "$run_start"): $(du -sh "$registry_dir" | cut -f1) in $registry_dir;" \
    "images listed in $cache/registry.list"
