#!/usr/bin/env bash
# helm for the chart tests, built from the Go module proxy like the rest of the stack, into
# ~/.cache/reclaimd/helm-<version>/; plus the prometheus-operator CRDs (ServiceMonitor,
# PodMonitor, PrometheusRule) so the optional monitors and alerts can be applied to the local
# apiserver; and promtool
# (~/.cache/reclaimd/promtool-<version>/), which checks and unit-tests the chart's alert rules.
# Idempotent.
set -euo pipefail
LOG_TAG=helm-tools
source "$(dirname "${BASH_SOURCE[0]}")/../local/lib.sh"

HELM_DIR=$CACHE_DIR/helm-$HELM_VERSION
# -rules: the set includes PrometheusRule; a cache without it is not reused.
PROM_CRD_DIR=$CACHE_DIR/prometheus-operator-crds-$PROM_OPERATOR_VERSION-rules
PROMTOOL_DIR=$CACHE_DIR/promtool-$PROMETHEUS_VERSION

install_one() {
    local name=$1 dir=$2 builder=$3
    if [[ -d $dir ]]; then
        say "$name: cached ($dir)"
        return
    fi
    say "$name: installing into $dir (log: $CACHE_DIR/logs/$name.log)"
    rm -rf "$dir.partial"
    mkdir -p "$dir.partial"
    run_long "$name" "$CACHE_DIR/logs/$name.log" "$builder" "$dir.partial"
    mv "$dir.partial" "$dir"
}

build_helm() {
    GOBIN=$1 nice -n 10 go install "helm.sh/helm/v3/cmd/helm@$HELM_VERSION"
}

build_promtool() {
    # Rules need no service discovery: remove_all_sd leaves every SD plugin (and the cloud SDKs
    # they bring) out of the build. The stamp is what `promtool --version` prints: module
    # v0.316.0 is Prometheus 3.16.0.
    local minor=${PROMETHEUS_VERSION#v0.}
    minor=${minor%%.*}
    local release=$((minor / 100)).$((minor % 100)).${PROMETHEUS_VERSION##*.}
    GOBIN=$1 nice -n 10 go install -tags remove_all_sd \
        -ldflags "-X github.com/prometheus/common/version.Version=$release" \
        "github.com/prometheus/prometheus/cmd/promtool@$PROMETHEUS_VERSION"
}

copy_prom_crds() {
    local src
    src=$(module_dir "github.com/prometheus-operator/prometheus-operator@$PROM_OPERATOR_VERSION")
    src=$src/example/prometheus-operator-crd
    local f
    for f in monitoring.coreos.com_servicemonitors.yaml monitoring.coreos.com_podmonitors.yaml \
        monitoring.coreos.com_prometheusrules.yaml; do
        [[ -f $src/$f ]] || die "prometheus-operator $PROM_OPERATOR_VERSION has no $f"
        cp "$src/$f" "$1/"
    done
    chmod u+w "$1"/*.yaml
}

command -v go >/dev/null || die "go is not on PATH (helm is built from the Go module proxy)"
mkdir -p "$CACHE_DIR/logs"
install_one helm "$HELM_DIR" build_helm
install_one prometheus-operator-crds "$PROM_CRD_DIR" copy_prom_crds
install_one promtool "$PROMTOOL_DIR" build_promtool
