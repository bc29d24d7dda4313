#!/usr/bin/env bash
# Build released aws-node-termination-handler (NTH) from the Go module proxy for
# `make bench-peers`, into ~/.cache/reclaimd/nth-<version>/node-termination-handler
# (RECLAIMD_CACHE overrides the root). Built only when missing; prints the binary's path last.
#
# `go install .../cmd@v1.25.6` does not work here: it asks the proxy for the module's version
# list, which the proxy refuses. A tiny tools module that requires the pinned version and builds
# the main package inside it does (see ../../../../shared/research/nth-peer-bench.md).
#
# Usage: build.sh [VERSION]   (default v1.25.6; tags v2.* are another code line)
set -euo pipefail
LOG_TAG=nth
source "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"

NTH_VERSION=${1:-${NTH_VERSION:-v1.25.6}}
NTH_MODULE=github.com/aws/aws-node-termination-handler
if [[ $# -gt 1 || ! $NTH_VERSION =~ ^v1\.[0-9]+\.[0-9]+$ ]]; then
    # Bad input: one line, exit 2 (the house rule for every entry point).
    printf '[nth] error: usage: build.sh [v1.x.y]; got %s\n' "'$*'" >&2
    exit 2
fi
command -v go >/dev/null || die "go is not on PATH (try PATH=/usr/local/go/bin:\$PATH)"

NTH_DIR=$CACHE_DIR/nth-$NTH_VERSION
NTH_BIN=$NTH_DIR/node-termination-handler
if [[ -x $NTH_BIN ]]; then
    say "nth $NTH_VERSION: cached ($NTH_BIN)" >&2
    echo "$NTH_BIN"
    exit 0
fi

build_nth() {
    local out=$1 src=$1/src
    mkdir -p "$src"
    sed "s#@NTH_VERSION@#$NTH_VERSION#g" "$LOCAL_DIR/nth/go.mod.in" >"$src/go.mod"
    (cd "$src" && GOFLAGS=-mod=mod CGO_ENABLED=0 nice -n 10 go build -trimpath \
        -o "$out/node-termination-handler" "$NTH_MODULE/cmd")
}

mkdir -p "$CACHE_DIR/logs"
exec 9>"$CACHE_DIR/.nth.lock"
flock 9
if [[ ! -x $NTH_BIN ]]; then
    # Progress goes to stderr so stdout carries only the path (callers read it).
    {
        say "nth $NTH_VERSION: building into $NTH_DIR (log: $CACHE_DIR/logs/nth.log; ~3 min cold)"
        rm -rf "$NTH_DIR.partial"
        mkdir -p "$NTH_DIR.partial"
        run_long "nth build" "$CACHE_DIR/logs/nth.log" build_nth "$NTH_DIR.partial"
        mv "$NTH_DIR.partial" "$NTH_DIR"
    } >&2
fi
echo "$NTH_BIN"
