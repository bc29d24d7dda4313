# shellcheck shell=bash disable=SC2034  # sourced by install.sh and stack.sh (after lib.sh)
# The OpenTelemetry Collector of the local stack: the e2e tests send reclaimd's spans to it over
# OTLP (gRPC and HTTP) and read them back from the file it writes.
#
# Built from this directory's Go module (the core OTLP receiver and a small exporter of ours
# that appends OTLP/JSON lines, see main.go) into ~/.cache/reclaimd/otelcol-<version>/. The
# collector modules in go.mod must be at OTELCOL_VERSION (versions.env); a build whose sources
# changed since is rebuilt (the sources' checksum is kept next to the binary).

OTELCOL_SRC=$LOCAL_DIR/tools/otelcol
OTELCOL_DIR=$CACHE_DIR/otelcol-$OTELCOL_VERSION
OTELCOL_BIN=$OTELCOL_DIR/reclaimd-otelcol
OTELCOL_GRPC=http://127.0.0.1:14317
OTELCOL_HTTP=http://127.0.0.1:14318
OTELCOL_STATE=$STACK_DIR/otelcol
OTELCOL_SPANS=$OTELCOL_STATE/spans.jsonl

# --- install.sh ------------------------------------------------------------------------------

otelcol_source_sum() {
    cat "$OTELCOL_SRC/go.mod" "$OTELCOL_SRC/go.sum" "$OTELCOL_SRC"/*.go | sha256sum | cut -c1-16
}

# otelcol_check: refuse a go.mod that disagrees with versions.env; drop a stale build.
otelcol_check() {
    local found
    found=$(sed -n 's#^[[:space:]]*go.opentelemetry.io/collector/otelcol \(v[^[:space:]]*\).*#\1#p' \
        "$OTELCOL_SRC/go.mod" | head -n 1)
    [[ $found == "$OTELCOL_VERSION" ]] ||
        die "tools/otelcol/go.mod has otelcol ${found:-missing}, versions.env says $OTELCOL_VERSION; update one of them"
    if [[ -d $OTELCOL_DIR && $(cat "$OTELCOL_DIR/source.sum" 2>/dev/null) != "$(otelcol_source_sum)" ]]; then
        say "otelcol: tools/otelcol changed since the cached build; rebuilding"
        rm -rf "$OTELCOL_DIR"
    fi
}

build_otelcol() {
    (cd "$OTELCOL_SRC" && nice -n 10 go build -trimpath \
        -ldflags "-X main.version=$OTELCOL_VERSION" -o "$1/reclaimd-otelcol" .)
    otelcol_source_sum >"$1/source.sum"
}

# --- stack.sh --------------------------------------------------------------------------------

# Ready when the HTTP receiver takes an (empty) export request; the exporter skips empty ones.
otelcol_ready() {
    curl -fsS --max-time 3 -o /dev/null -X POST -H 'Content-Type: application/json' -d '{}' \
        "$OTELCOL_HTTP/v1/traces" 2>/dev/null
}

otelcol_prepare() {
    mkdir -p "$OTELCOL_STATE"
    sed "s#@SPANS_FILE@#$OTELCOL_SPANS#" "$OTELCOL_SRC/config.yaml.in" >"$OTELCOL_STATE/config.yaml"
}
