#!/bin/sh
# Upstream's entrypoint: arguments that start with `-`, or are not a
# command, are curl's.
set -e
if [ "${1#-}" != "$1" ] || [ -z "$(command -v "$1")" ]; then
    set -- curl "$@"
fi
exec "$@"
