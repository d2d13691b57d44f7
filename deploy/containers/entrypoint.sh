#!/bin/sh
# Entrypoint of every UPF role image: `upf-entrypoint <console-script> [args...]`.
# It prepares two things from the environment, then execs the console script
# (exec replaces this shell, so signals reach the Python process directly).
set -eu

if [ "$#" -eq 0 ]; then
    echo "upf-entrypoint: usage: upf-entrypoint <console-script> [args...]" >&2
    exit 64
fi

# 1. FoundationDB cluster file. Compose passes the connection string in FDB_CLUSTER_FILE_CONTENTS (the same
#    convention as the official FoundationDB image), because a role container has no file of its own to mount:
#    write it where FDB_CLUSTER_FILE points (default /var/lib/upf/fdb.cluster, in the home this non-root user
#    owns), creating its directory. The client library may rewrite the file when coordinators change, so the
#    directory must stay writable. A path the user cannot write stops the container with one line saying so,
#    not a shell error.
if [ -n "${FDB_CLUSTER_FILE_CONTENTS:-}" ]; then
    FDB_CLUSTER_FILE="${FDB_CLUSTER_FILE:-/var/lib/upf/fdb.cluster}"
    if ! { mkdir -p -- "$(dirname -- "$FDB_CLUSTER_FILE")" \
            && printf '%s\n' "$FDB_CLUSTER_FILE_CONTENTS" > "$FDB_CLUSTER_FILE"; } 2>/dev/null; then
        echo "upf-entrypoint: cannot write FDB_CLUSTER_FILE=$FDB_CLUSTER_FILE as uid $(id -u): point it at a directory that user can write (the image's /var/lib/upf/fdb.cluster) or mount one there" >&2
        exit 1
    fi
    export FDB_CLUSTER_FILE
fi

# 2. Node identity. A pusher's UPF_NODE_ID owns its inbox, bells and affinity records, so it must survive a
#    restart and differ between replicas. When it is not set explicitly, derive it from the container's
#    hostname: a container keeps its hostname across restarts, and every replica of `--scale pusher=3` has
#    its own. The role name is prefixed so ids read well in logs ("pusher-3f2a9c1b7d4e"). A recreated
#    container is a new node; the janitor sweeps the old node's records once its liveness lapses, and
#    nothing is lost because affinity is soft state and messages live in the durable queue.
if [ -z "${UPF_NODE_ID:-}" ]; then
    role="${1##*/}"
    role="${role#upf-}"
    UPF_NODE_ID="$(printf '%s-%s' "$role" "$(uname -n)" | tr -c 'A-Za-z0-9._\n-' '-' | cut -c1-64)"
    export UPF_NODE_ID
fi

exec "$@"
