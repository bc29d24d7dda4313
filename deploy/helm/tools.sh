#!/usr/bin/env bash
# helm for the chart tests, built from the Go module proxy like the rest of the stack, into
# ~/.cache/reclaimd/helm-<version>/; plus the prometheus-operator CRDs (ServiceMonitor,
# PodMonitor) so the optional monitors can be applied to the local apiserver. Idempotent.
set -euo pipefail
LOG_TAG=helm-tools
source "$(dirname "${BASH_SOURCE[0]}")/../local/lib.sh"

HELM_DIR=$CACHE_DIR/helm-$HELM_VERSION
PROM_CRD_DIR=$CACHE_DIR/prometheus-operator-crds-$PROM_OPERATOR_VERSION

install_one() {
    local name=$1 dir=$2 builder=$3
    if [[ -d $dir ]]; then
        say "$name: cached ($dir)"
        return
    fi
    rm -rf "$dir.partial"
    mkdir -p "$dir.partial"
    run_long "$name" "$CACHE_DIR/logs/$name.log" "$builder" "$dir.partial"
    mv "$dir.partial" "$dir"
}

build_helm() {
    GOBIN=$1 nice -n 10 go install "helm.sh/helm/v3/cmd/helm@$HELM_VERSION"
}

copy_prom_crds() {
    local src
    src=$(module_dir "github.com/prometheus-operator/prometheus-operator@$PROM_OPERATOR_VERSION")
    src=$src/example/prometheus-operator-crd
    local f
    for f in monitoring.coreos.com_servicemonitors.yaml monitoring.coreos.com_podmonitors.yaml; do
        [[ -f $src/$f ]] || die "prometheus-operator $PROM_OPERATOR_VERSION has no $f"
        cp "$src/$f" "$1/"
    done
    chmod u+w "$1"/*.yaml
}

command -v go >/dev/null || die "go is not on PATH (helm is built from the Go module proxy)"
mkdir -p "$CACHE_DIR/logs"
install_one helm "$HELM_DIR" build_helm
install_one prometheus-operator-crds "$PROM_CRD_DIR" copy_prom_crds
