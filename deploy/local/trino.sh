#!/usr/bin/env bash
# A single-node Trino (Athena's engine) on 127.0.0.1, for running reclaimd/report/report.sql
# over Parquet files where they lie (tests/unit/test_report_trino.py, make bench-report).
#
#   deploy/local/trino.sh install   fetch trino-server from Maven Central (mvn), unpack it under
#                                   ~/.cache/reclaimd/trino-<version>/ (once)
#   deploy/local/trino.sh up        install if needed, start it (idempotent), wait until ready
#   deploy/local/trino.sh down      stop what `up` started
#   deploy/local/trino.sh url       print its address
#
# Catalog `hive`: a file metastore under .stack/trino/ and Trino's native local file system
# rooted at /, so an external table's location is `local:///absolute/path/to/dir`.
# Trino >= 470 needs Java 24+: TRINO_JAVA_HOME, else /usr/lib/jvm/temurin-25-jdk-amd64.
set -euo pipefail
LOG_TAG=trino
# shellcheck source=lib.sh
source "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/lib.sh"

TRINO_VERSION=${TRINO_VERSION:-476}
TRINO_PORT=${TRINO_PORT:-18480}
TRINO_DIR=$CACHE_DIR/trino-$TRINO_VERSION
RUN_DIR=$STACK_DIR/trino
BUILD_LOGS=$CACHE_DIR/logs

java_home() {
    local j=${TRINO_JAVA_HOME:-/usr/lib/jvm/temurin-25-jdk-amd64}
    [[ -x $j/bin/java ]] || die "no Java 24+ at $j (set TRINO_JAVA_HOME); Trino $TRINO_VERSION needs it"
    printf '%s' "$j"
}

fetch_and_unpack() {
    local tarball=$HOME/.m2/repository/io/trino/trino-server/$TRINO_VERSION/trino-server-$TRINO_VERSION.tar.gz
    if [[ ! -f $tarball ]]; then
        mvn -q -B dependency:get -Dartifact="io.trino:trino-server:$TRINO_VERSION:tar.gz" \
            -Dtransitive=false
    fi
    [[ -f $tarball ]] || die "maven did not fetch trino-server-$TRINO_VERSION.tar.gz"
    rm -rf "$TRINO_DIR.partial"
    mkdir -p "$TRINO_DIR.partial"
    tar xzf "$tarball" -C "$TRINO_DIR.partial" --strip-components=1
    mv "$TRINO_DIR.partial" "$TRINO_DIR"
}

install() {
    if [[ -x $TRINO_DIR/bin/launcher ]]; then
        return
    fi
    command -v mvn >/dev/null || die "mvn is not on PATH (Maven fetches trino-server)"
    say "trino-server $TRINO_VERSION: fetching from Maven Central (about 800 MB, once)"
    run_long "trino-server $TRINO_VERSION" "$BUILD_LOGS/trino-$TRINO_VERSION.log" fetch_and_unpack
}

write_etc() {
    local etc=$RUN_DIR/etc
    mkdir -p "$etc/catalog" "$RUN_DIR/data" "$RUN_DIR/metastore"
    cat >"$etc/node.properties" <<EOF
node.environment=reclaimd
node.id=reclaimd-local
node.data-dir=$RUN_DIR/data
node.bind-ip=127.0.0.1
node.internal-address=127.0.0.1
EOF
    cat >"$etc/config.properties" <<EOF
coordinator=true
node-scheduler.include-coordinator=true
http-server.http.port=$TRINO_PORT
discovery.uri=http://127.0.0.1:$TRINO_PORT
query.max-memory=2GB
query.max-memory-per-node=2GB
EOF
    cat >"$etc/jvm.config" <<EOF
-server
-Xmx${TRINO_HEAP:-3G}
-XX:+UseG1GC
-XX:G1HeapRegionSize=32M
-XX:+ExplicitGCInvokesConcurrent
-XX:+ExitOnOutOfMemoryError
-XX:+HeapDumpOnOutOfMemoryError
-XX:-OmitStackTraceInFastThrow
-XX:ReservedCodeCacheSize=256M
-XX:PerMethodRecompilationCutoff=10000
-XX:PerBytecodeRecompilationCutoff=10000
-Djdk.attach.allowAttachSelf=true
-Djdk.nio.maxCachedBufferSize=2000000
-Dfile.encoding=UTF-8
--enable-native-access=ALL-UNNAMED
EOF
    cat >"$etc/log.properties" <<EOF
io.trino=WARN
EOF
    cat >"$etc/catalog/hive.properties" <<EOF
connector.name=hive
hive.metastore=file
hive.metastore.catalog.dir=local://$RUN_DIR/metastore
fs.native-local.enabled=true
local.location=/
hive.parquet.use-column-names=true
EOF
}

url() { printf 'http://127.0.0.1:%s\n' "$TRINO_PORT"; }

ready() {
    python3 - "$(url)" <<'EOF'
import json, sys, urllib.request
try:
    with urllib.request.urlopen(sys.argv[1] + "/v1/info", timeout=2) as r:
        sys.exit(0 if json.load(r).get("starting") is False else 1)
except Exception:
    sys.exit(1)
EOF
}

launcher() {
    JAVA_HOME=$(java_home) PATH=$(java_home)/bin:$PATH "$TRINO_DIR/bin/launcher" "$@" \
        --etc-dir="$RUN_DIR/etc" --data-dir="$RUN_DIR/data" --pid-file="$RUN_DIR/trino.pid" \
        --launcher-log-file="$RUN_DIR/launcher.log" --server-log-file="$RUN_DIR/server.log"
}

up() {
    install
    if ready; then
        say "trino $TRINO_VERSION: up at $(url)"
        return
    fi
    write_etc
    launcher start >/dev/null
    local start=$SECONDS
    until ready; do
        if ! launcher status >/dev/null 2>&1; then
            tail -n 20 "$RUN_DIR/server.log" "$RUN_DIR/launcher.log" >&2 2>/dev/null || true
            die "trino exited while starting; logs: $RUN_DIR/server.log"
        fi
        ((SECONDS - start < 180)) || die "trino not ready after 180 s; log: $RUN_DIR/server.log"
        sleep 1
    done
    say "trino $TRINO_VERSION: up at $(url) in $(fmt_secs $((SECONDS - start)))"
}

down() {
    [[ -d $RUN_DIR/etc ]] || return 0
    launcher stop >/dev/null 2>&1 || true
    say "trino: stopped"
}

case ${1:-up} in
install) install ;;
up) up ;;
down) down ;;
url) url ;;
*) die "usage: $0 install|up|down|url" ;;
esac
