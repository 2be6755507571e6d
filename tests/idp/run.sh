#!/usr/bin/env bash
# Run one Keycloak from the install tests/idp/install.sh made, in a home
# directory of its own: Keycloak writes its database (H2, a copy of the
# install's seeded one), transaction logs and temporary files under its home,
# so each instance gets one and several run at once from one read-only
# install. The JVM replaces this shell (exec), so a parent-death signal set
# by the caller reaches Keycloak itself.
#
#   tests/idp/run.sh INSTALL HOME --http-port=N --http-management-port=M [options...]
#
# It serves plain HTTP on loopback only (the management port, /health, too),
# with a local cache (no cluster, no JGroups port).
# The command is kc.sh's (its JVM options, system properties and entry
# point) without its shell in between; install.sh seeds with this same
# script, so the AOT cache it trains matches the command the tests run.
set -euo pipefail
if (($# < 2)); then
    echo "usage: tests/idp/run.sh INSTALL HOME [keycloak start options...]" >&2
    exit 2
fi
install=$1 home=$2
shift 2
kc="$install/keycloak"
if [[ ! -f "$kc/lib/quarkus-run.jar" || ! -f "$install/java-home" ]]; then
    echo "tests/idp/run.sh: no Keycloak installed in $install: run tests/idp/install.sh" >&2
    exit 1
fi
java="$(cat "$install/java-home")/bin/java"

mkdir -p "$home/data/h2" "$home/data/tmp"
for dir in conf lib providers themes; do
    ln -sfn "$kc/$dir" "$home/$dir"
done
# The install's database: schema migrated, master realm made (about 20 s
# of a first start), no administrator (each instance bootstraps its own).
if [[ -f "$install/seed/keycloakdb.mv.db" && ! -f "$home/data/h2/keycloakdb.mv.db" ]]; then
    cp "$install/seed/keycloakdb.mv.db" "$home/data/h2/"
fi

aot=()
if [[ -n "${BINDERY_KEYCLOAK_AOT_OUTPUT:-}" ]]; then
    aot=("-XX:AOTCacheOutput=$BINDERY_KEYCLOAK_AOT_OUTPUT")
elif [[ -f "$install/keycloak.aot" ]]; then
    aot=("-XX:AOTCache=$install/keycloak.aot")
fi

exec "$java" "${aot[@]}" \
    -XX:MetaspaceSize=96M -XX:MaxMetaspaceSize=256m -XX:+ExitOnOutOfMemoryError -XX:+UseG1GC \
    -Xms64m -Xmx512m \
    -Dfile.encoding=UTF-8 -Dsun.stdout.encoding=UTF-8 -Dsun.err.encoding=UTF-8 \
    -Dstdout.encoding=UTF-8 -Dstderr.encoding=UTF-8 -Djava.security.egd=file:/dev/urandom \
    --add-opens=java.base/java.util=ALL-UNNAMED --add-opens=java.base/java.util.concurrent=ALL-UNNAMED \
    --add-opens=java.base/java.security=ALL-UNNAMED --add-opens=java.base/java.lang=ALL-UNNAMED \
    --enable-native-access=ALL-UNNAMED -Duser.language=en -Duser.country=US \
    -Djava.util.concurrent.ForkJoinPool.common.threadFactory=io.quarkus.bootstrap.forkjoin.QuarkusForkJoinWorkerThreadFactory \
    "-Dkc.home.dir=$home" "-Djboss.server.config.dir=$home/conf" "-Djava.io.tmpdir=$home/data/tmp" \
    -Djava.util.logging.manager=org.jboss.logmanager.LogManager -Dpicocli.disable.closures=true \
    -Dquarkus-log-max-startup-records=10000 \
    -cp "$kc/lib/quarkus-run.jar" io.quarkus.bootstrap.runner.QuarkusEntryPoint \
    start --optimized --http-enabled=true --http-host=127.0.0.1 --hostname-strict=false \
    --cache=local "$@"
