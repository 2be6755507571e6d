#!/usr/bin/env bash
# Install the real OAuth 2.1 / OpenID Connect server the identity tests run
# against (tests/src/idp.rs): Keycloak's Quarkus distribution from Maven
# Central, pinned by version and checksum, built once for the tests'
# configuration, with a seeded database and, on Java 25, an AOT cache.
#
#   tests/idp/install.sh    # idempotent: a second run does nothing
#
# Installs into
#   ${BINDERY_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/bindery}/keycloak/<version>/
# where the tests look for it (or set BINDERY_KEYCLOAK to such a directory).
# Needs Java 21 or newer: $JAVA_HOME, else the newest JDK in /usr/lib/jvm,
# else `java` on PATH. See tests/idp/README.md.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
who=idp/install.sh

version=26.7.3
url="https://repo1.maven.org/maven2/org/keycloak/keycloak-quarkus-dist/$version/keycloak-quarkus-dist-$version.zip"
sha256=27a6535553c3cdcd083872ba40629efafb3475e3b758e0c6f691395561dd0f1f
# Build-time options (`kc.sh build`): the database is an H2 file in each
# instance's home, /health on the management port. Standard token exchange
# (RFC 8693, `token-exchange-standard:v2`) is on by default since 26.2.
build_options=(--db=dev-file --health-enabled=true)

cache="${BINDERY_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/bindery}"
dest="$cache/keycloak/$version"

# The Java: the first of $JAVA_HOME, /usr/lib/jvm's JDKs (newest first)
# and PATH's whose major version is at least 21.
java_major() {
    "$1/bin/java" -XshowSettings:properties -version 2>&1 \
        | sed -n 's/^ *java\.specification\.version = \([0-9]*\).*/\1/p'
}
candidates=()
[[ -n "${JAVA_HOME:-}" ]] && candidates+=("$JAVA_HOME")
while IFS= read -r dir; do candidates+=("$dir"); done \
    < <(find /usr/lib/jvm -mindepth 1 -maxdepth 1 -type d 2>/dev/null | sort -rV)
if command -v java >/dev/null; then
    candidates+=("$(dirname "$(dirname "$(readlink -f "$(command -v java)")")")")
fi
java_home=
for candidate in "${candidates[@]}"; do
    if [[ -x "$candidate/bin/java" ]]; then
        major="$(java_major "$candidate")"
        if [[ -n "$major" ]] && ((major >= 21)); then
            java_home="$candidate"
            break
        fi
    fi
done
if [[ -z "$java_home" ]]; then
    echo "$who: Keycloak $version needs Java 21 or newer; none found (JAVA_HOME, /usr/lib/jvm," \
        "PATH). Install one (Debian 13: apt-get install openjdk-21-jre-headless; Debian 12:" \
        "Eclipse Temurin 21 or 25 from packages.adoptium.net; 25 starts Keycloak faster)" \
        "or set JAVA_HOME to it." >&2
    exit 1
fi
java_version="$("$java_home/bin/java" -version 2>&1 | head -n1)"

stamp="$dest/.installed"
want="keycloak $version sha256 $sha256 build ${build_options[*]} java $java_home $java_version scripts $(cat "$here/install.sh" "$here/run.sh" | sha256sum | cut -c1-16)"
if [[ -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then
    exit 0
fi

started=$SECONDS
echo "$who: installing Keycloak $version with $java_version into $dest (3 to 6 minutes on 2 cores; see tests/idp/README.md)"
rm -rf "$dest"
mkdir -p "$dest"
work="$(mktemp -d "$dest/.work.XXXXXX")"
trap 'rm -rf "$work"' EXIT

zip="$work/keycloak.zip"
curl --fail --silent --show-error --location --retry 3 --output "$zip" "$url"
if ! echo "$sha256  $zip" | sha256sum --check --status; then
    echo "$who: $url does not have the pinned sha256 $sha256 (got $(sha256sum "$zip" | cut -d' ' -f1))" >&2
    exit 1
fi
unzip -q "$zip" -d "$work"
rm "$zip"
mv "$work/keycloak-$version" "$dest/keycloak"
echo "$java_home" >"$dest/java-home"

JAVA_HOME="$java_home" "$dest/keycloak/bin/kc.sh" build "${build_options[@]}" >"$work/build.log" 2>&1 \
    || { cat "$work/build.log" >&2; echo "$who: kc.sh build failed" >&2; exit 1; }
echo "$who: built for the tests' configuration ($((SECONDS - started)) s)"

# One start in a throwaway home: Liquibase makes the schema and Keycloak the
# master realm (most of a first start's time); its database is the seed
# each instance starts from. Keycloak bootstraps an administrator only as
# it makes the master realm, so the seed has one: the service account
# client `bindery-admin`, whose secret (made here, for this install only)
# the harness reads from seed/admin-client-secret. On Java 25 the same run
# trains an AOT cache of the classes it loaded (JEP 483, 514), which the
# tests' JVMs map.
free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}
port="$(free_port)"
management="$(free_port)"
mkdir -p "$dest/seed"
secret_file="$dest/seed/admin-client-secret"
(umask 077 && head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$secret_file")
aot=
if (($(java_major "$java_home") >= 25)); then
    aot="$work/keycloak.aot"
fi
KC_BOOTSTRAP_ADMIN_CLIENT_ID=bindery-admin KC_BOOTSTRAP_ADMIN_CLIENT_SECRET="$(cat "$secret_file")" \
    BINDERY_KEYCLOAK_AOT_OUTPUT="$aot" "$here/run.sh" "$dest" "$work/home" \
    --http-port="$port" --http-management-port="$management" >"$work/seed.log" 2>&1 &
pid=$!
ready=
for _ in $(seq 1 1800); do
    if curl --silent --fail --output /dev/null "http://127.0.0.1:$management/health/ready"; then
        ready=1
        break
    fi
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
done
if [[ -z "$ready" ]]; then
    kill "$pid" 2>/dev/null || true
    tail -n 50 "$work/seed.log" >&2
    echo "$who: the seeding start of Keycloak did not become ready" >&2
    exit 1
fi
# SIGTERM: an orderly stop, which closes the database and writes the AOT cache.
kill -TERM "$pid"
wait "$pid" || true
cp "$work/home/data/h2/keycloakdb.mv.db" "$dest/seed/"
if [[ -n "$aot" ]]; then
    if [[ -f "$aot" ]]; then
        mv "$aot" "$dest/keycloak.aot"
    else
        echo "$who: warning: no AOT cache written (the tests start without it)" >&2
    fi
fi
echo "$want" >"$stamp"
echo "$who: Keycloak $version installed in $((SECONDS - started)) s"
