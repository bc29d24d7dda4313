# shellcheck shell=bash disable=SC2034  # variables here are used by the scripts that source it
# Shared helpers for install.sh and stack.sh (sourced, not run).
#
# Output contract: one progress line per step on stdout, errors as a single line on stderr that
# names the log file to read. Long commands run with their output in a log file and a heartbeat
# line every HEARTBEAT_SECS so a slow build on a busy 2-core machine never looks hung.

LOCAL_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO_DIR=$(cd "$LOCAL_DIR/../.." && pwd)
CACHE_DIR=${RECLAIMD_CACHE:-$HOME/.cache/reclaimd}
STACK_DIR=${RECLAIMD_STACK_DIR:-$REPO_DIR/.stack}
HEARTBEAT_SECS=${HEARTBEAT_SECS:-30}

# shellcheck source=versions.env
source "$LOCAL_DIR/versions.env"

say() { printf '[%s] %s\n' "${LOG_TAG:-local}" "$*"; }
die() { printf '[%s] error: %s\n' "${LOG_TAG:-local}" "$*" >&2; exit 1; }

fmt_secs() {
    local s=$1
    if ((s >= 60)); then printf '%dm%02ds' $((s / 60)) $((s % 60)); else printf '%ds' "$s"; fi
}

# run_long LABEL LOGFILE CMD...: run CMD with output to LOGFILE, print a heartbeat while it
# runs, and fail with one line naming the log (plus its tail, which is usually the reason).
run_long() {
    local label=$1 logfile=$2
    shift 2
    mkdir -p "$(dirname "$logfile")"
    local start=$SECONDS
    "$@" >"$logfile" 2>&1 &
    local pid=$! rc=0 next=$HEARTBEAT_SECS
    while kill -0 "$pid" 2>/dev/null; do
        sleep 1
        if ((SECONDS - start >= next)); then
            say "  ... $label: $(fmt_secs $((SECONDS - start))) elapsed"
            next=$((next + HEARTBEAT_SECS))
        fi
    done
    wait "$pid" || rc=$?
    if ((rc != 0)); then
        tail -n 15 "$logfile" >&2 || true
        die "$label failed (exit $rc) after $(fmt_secs $((SECONDS - start))); log: $logfile"
    fi
    say "  $label: done in $(fmt_secs $((SECONDS - start)))"
}

# module_dir MODULE@VERSION: where the Go module cache holds that module's source (downloads it
# if needed); used to take config files (kwok stages, Kueue CRDs) from the pinned release.
module_dir() {
    local json
    json=$(cd "$CACHE_DIR" && go mod download -json "$1") ||
        die "go mod download $1 failed"
    sed -n 's/^[[:space:]]*"Dir": "\(.*\)",\{0,1\}$/\1/p' <<<"$json"
}

# Where each pinned component lives; one directory per component and version, so a version bump
# installs next to the old one instead of over it.
K8S_DIR=$CACHE_DIR/k8s-$K8S_VERSION
ETCD_DIR=$CACHE_DIR/etcd-$ETCD_VERSION
KWOK_DIR=$CACHE_DIR/kwok-$KWOK_VERSION
AEMM_DIR=$CACHE_DIR/aemm-$AEMM_VERSION
# -tools: the jar set includes kafka-tools (AclCommand); a cache without it is not reused.
KAFKA_DIR=$CACHE_DIR/kafka-$KAFKA_VERSION-tools
KUEUE_DIR=$CACHE_DIR/kueue-crds-$KUEUE_VERSION
PUBSUB_EMULATOR=${PUBSUB_EMULATOR:-}
MOTO_SERVER=$REPO_DIR/.venv/bin/moto_server

# pubsub_emulator_bin: the emulator launcher inside the preinstalled Cloud SDK. It is run
# directly rather than through `gcloud beta emulators pubsub start` so that the PID stack.sh
# records is the emulator itself (the launcher execs java) and not a Python wrapper around it.
pubsub_emulator_bin() {
    if [[ -n $PUBSUB_EMULATOR ]]; then echo "$PUBSUB_EMULATOR"; return; fi
    local gcloud sdk
    gcloud=$(command -v gcloud) || return 1
    sdk=$(cd "$(dirname "$(readlink -f "$gcloud")")/.." && pwd)
    [[ -x $sdk/platform/pubsub-emulator/bin/cloud-pubsub-emulator ]] || return 1
    echo "$sdk/platform/pubsub-emulator/bin/cloud-pubsub-emulator"
}
