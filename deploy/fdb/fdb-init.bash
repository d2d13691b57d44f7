#!/usr/bin/env bash
# One-shot: create the UPF database in a fresh FoundationDB cluster, then wait until it is available.
# Safe to rerun (compose runs it on every `up`): it configures only when `status json` reports
# `unreadable_configuration` (no database yet), and treats "Database already exists" as success, so a
# persisted data volume is never reconfigured. Runs in the official foundationdb image (fdbcli, jq).
#
# Environment:
#   FDB_CLUSTER_FILE_CONTENTS  connection string, e.g. docker:docker@10.89.73.10:4500 (required)
#   UPF_FDB_CONFIGURE          what `configure new` gets: "single memory" (default) or "single ssd", ...
#   UPF_FDB_INIT_TIMEOUT_SECS  how long to wait for the coordinators and the database (default 120)
set -euo pipefail

configure="${UPF_FDB_CONFIGURE:-single memory}"
deadline=$(( $(date +%s) + ${UPF_FDB_INIT_TIMEOUT_SECS:-120} ))
cluster_file="${FDB_CLUSTER_FILE:-/tmp/fdb-init.cluster}"
if [[ -n "${FDB_CLUSTER_FILE_CONTENTS:-}" ]]; then
    printf '%s\n' "$FDB_CLUSTER_FILE_CONTENTS" > "$cluster_file"
elif [[ ! -s "$cluster_file" ]]; then
    echo "fdb-init: set FDB_CLUSTER_FILE_CONTENTS (or FDB_CLUSTER_FILE to an existing cluster file)" >&2
    exit 2
fi

log() { echo "fdb-init: $*" >&2; }

# `status json` always exits 0 unless --timeout expires, so decide from its content, never its exit code.
status_json() {
    fdbcli -C "$cluster_file" --exec 'status json' --timeout 10 2>/dev/null || true
}

past_deadline() { (( $(date +%s) >= deadline )); }

log "waiting for the cluster described by $(cat "$cluster_file")"
attempted=0
while :; do
    status="$(status_json)"
    if jq -e '.client.database_status.available == true' >/dev/null 2>&1 <<<"$status"; then
        log "database available"
        exit 0
    fi
    if (( ! attempted )) &&
        jq -e '[.cluster.messages[]?.name] | index("unreadable_configuration") != null' >/dev/null 2>&1 <<<"$status"; then
        attempted=1
        log "no database yet: configure new $configure"
        if output="$(fdbcli -C "$cluster_file" --exec "configure new $configure" --timeout 60 2>&1)"; then
            log "configured"
        elif grep -q "Database already exists" <<<"$output"; then
            # Created by another run (or a human) after our status read: exactly what we wanted.
            log "database already exists"
        else
            printf '%s\n' "$output" >&2
            exit 1
        fi
    fi
    if past_deadline; then
        log "database not available in time; last status:"
        printf '%s\n' "$status" >&2
        exit 1
    fi
    sleep 1
done
