#!/bin/bash
# The official postgres image's contract, in short: on `postgres ...` with
# an empty PGDATA, initdb it (superuser POSTGRES_USER, default postgres,
# with POSTGRES_PASSWORD; scram-sha-256 from any address, trust on the
# local socket), make POSTGRES_DB (default: the user's name), then exec the
# server listening on all addresses. Writes nothing outside PGDATA and
# /var/run/postgresql (the root filesystem may be read-only).
set -euo pipefail

if [[ "${1:-}" == postgres && ! -s "$PGDATA/PG_VERSION" ]]; then
    if [[ -z "${POSTGRES_PASSWORD:-}" ]]; then
        echo "docker-entrypoint.sh: PGDATA ($PGDATA) is empty and POSTGRES_PASSWORD is unset:" \
            "set it (the superuser's password; clients authenticate with it)" >&2
        exit 1
    fi
    user="${POSTGRES_USER:-postgres}"
    db="${POSTGRES_DB:-$user}"
    mkdir -p "$PGDATA"
    chmod 0700 "$PGDATA"
    # The password through a pipe, never a file or the command line.
    initdb --username="$user" --pwfile=<(printf '%s\n' "$POSTGRES_PASSWORD") \
        --auth-local=trust --auth-host=scram-sha-256 \
        --encoding=UTF8 --locale=C.UTF-8 >/dev/null
    printf '%s\n' "host all all all scram-sha-256" >>"$PGDATA/pg_hba.conf"
    printf '%s\n' "listen_addresses = '*'" >>"$PGDATA/postgresql.conf"
    if [[ "$db" != postgres ]]; then
        # Single-user mode: no server, no socket, before the real start.
        printf 'CREATE DATABASE "%s";\n' "${db//\"/\"\"}" \
            | postgres --single -D "$PGDATA" postgres >/dev/null
    fi
    echo "docker-entrypoint.sh: initialised $PGDATA (user $user, database $db)" >&2
fi

exec "$@"
