#!/usr/bin/env bash
# Build or download every component of the local stack into
# ~/.cache/reclaimd/<component>-<version>/ (RECLAIMD_CACHE overrides the root).
#
# Idempotent: a component whose directory exists is skipped. Each one is assembled in
# <dir>.partial and renamed into place only when complete, so an interrupted run never leaves
# something that looks installed. A lock serialises concurrent runs (two engineers typing
# `make stack-up` at once would otherwise both start the 6-minute Kubernetes build).
#
# Everything comes from pinned sources reachable here: Go modules through the Go proxy, Kafka
# jars and the Pub/Sub emulator's grpc-java jars from Maven Central. Versions: versions.env.
set -euo pipefail
LOG_TAG=install
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
# shellcheck source=kueue/kueue.sh
source "$LOCAL_DIR/kueue/kueue.sh"
# shellcheck source=tools/otelcol/otelcol.sh
source "$LOCAL_DIR/tools/otelcol/otelcol.sh"
# shellcheck source=pubsub/pubsub_emulator.sh
source "$LOCAL_DIR/pubsub/pubsub_emulator.sh"

BUILD_LOGS=$CACHE_DIR/logs

# require_pin MODULE VERSION: tools/k8s/go.mod must build the version versions.env names.
require_pin() {
    local found
    found=$(sed -n "s#^[[:space:]]*\(require \)\{0,1\}$1 \(v[^[:space:]]*\).*#\2#p" \
        "$LOCAL_DIR/tools/k8s/go.mod" | head -n 1)
    [[ $found == "$2" ]] ||
        die "tools/k8s/go.mod has $1 ${found:-missing}, versions.env says $2; update one of them"
}

# install_dir NAME VERSION DIR BUILDER: unless DIR exists, run BUILDER TMPDIR (logged, with a
# heartbeat) and move the result into place.
install_dir() {
    local name=$1 version=$2 dir=$3 builder=$4
    if [[ -d $dir ]]; then
        say "$name $version: cached ($dir)"
        return
    fi
    say "$name $version: installing into $dir (log: $BUILD_LOGS/$name.log)"
    rm -rf "$dir.partial"
    mkdir -p "$dir.partial"
    run_long "$name" "$BUILD_LOGS/$name.log" "$builder" "$dir.partial"
    mv "$dir.partial" "$dir"
}

k8s_ldflags() {
    # What Kubernetes' own build stamps in (hack/lib/version.sh), so /version reports the real
    # release instead of v0.0.0-master; it only changes the link step, not the package cache.
    local minor=${K8S_VERSION#v*.}
    minor=${minor%%.*}
    local major=${K8S_VERSION#v}
    major=${major%%.*}
    local pkg flags=""
    for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
        flags+=" -X $pkg.gitVersion=$K8S_VERSION -X $pkg.gitMajor=$major"
        flags+=" -X $pkg.gitMinor=$minor -X $pkg.gitTreeState=clean"
    done
    echo "$flags"
}

build_k8s() {
    # One `go build` for the three so their shared packages compile once.
    (cd "$LOCAL_DIR/tools/k8s" && nice -n 10 go build -ldflags "$(k8s_ldflags)" -o "$1/" \
        k8s.io/kubernetes/cmd/kube-apiserver \
        k8s.io/kubernetes/cmd/kube-controller-manager \
        k8s.io/kubernetes/cmd/kube-scheduler)
}

build_etcd() {
    (cd "$LOCAL_DIR/tools/k8s" && nice -n 10 go build -o "$1/etcd" ./etcd)
}

build_kwok() {
    GOBIN=$1 nice -n 10 go install "sigs.k8s.io/kwok/cmd/kwok@$KWOK_VERSION"
    # The kwok binary (unlike kwokctl) has no built-in stages: hand it the release's default
    # lifecycle: nodes become Ready and keep a Lease, bound pods go Running, pods that are
    # evicted or deleted terminate.
    local src
    src=$(module_dir "sigs.k8s.io/kwok@$KWOK_VERSION")/kustomize/stage
    local f
    for f in node/fast/node-initialize.yaml node/heartbeat-with-lease/node-heartbeat-with-lease.yaml \
        pod/fast/pod-ready.yaml pod/fast/pod-complete.yaml pod/fast/pod-delete.yaml; do
        [[ -f $src/$f ]] || die "kwok $KWOK_VERSION has no stage $f"
        printf -- '---\n' >>"$1/stages.yaml"
        grep -v '^---$' "$src/$f" >>"$1/stages.yaml"
    done
}

build_aemm() {
    GOBIN=$1 nice -n 10 go install \
        "github.com/aws/amazon-ec2-metadata-mock/cmd/ec2-metadata-mock@$AEMM_VERSION"
}

build_kafka() {
    mvn -q -B -f "$LOCAL_DIR/kafka/pom.xml" dependency:copy-dependencies \
        -Dkafka.version="$KAFKA_VERSION" -Dlog4j2.version="$LOG4J2_VERSION" \
        -DincludeScope=runtime -DoutputDirectory="$1/libs"
    [[ -f $1/libs/kafka_$KAFKA_SCALA_VERSION-$KAFKA_VERSION.jar ]] ||
        die "maven did not fetch kafka_$KAFKA_SCALA_VERSION-$KAFKA_VERSION.jar"
}

copy_kueue_crds() {
    local src
    src=$(module_dir "sigs.k8s.io/kueue@$KUEUE_VERSION")/config/components/crd/bases
    compgen -G "$src/*.yaml" >/dev/null || die "no CRDs under $src"
    cp "$src"/*.yaml "$1/"
    chmod u+w "$1"/*.yaml
}

# Headless Chromium renders the post-mortem page in a test (tests/unit/test_postmortem.py).
ensure_chromium() {
    if command -v chromium >/dev/null; then
        say "chromium: $(command -v chromium)"
        return
    fi
    command -v apt-get >/dev/null || die "chromium is missing (a test renders a page with it)"
    run_long chromium "$BUILD_LOGS/chromium.log" env DEBIAN_FRONTEND=noninteractive \
        sh -c 'apt-get update -q && apt-get install -y -q chromium'
}

main() {
    command -v go >/dev/null || die "go is not on PATH (need Go >= 1.26 for kwok $KWOK_VERSION)"
    command -v mvn >/dev/null || die "mvn is not on PATH (Maven fetches the Kafka jars)"
    command -v java >/dev/null || die "java is not on PATH (Kafka and the Pub/Sub emulator need it)"
    command -v openssl >/dev/null || die "openssl is not on PATH (stack.sh makes the cluster PKI)"
    local java_major
    java_major=$(java -XshowSettings:properties -version 2>&1 |
        sed -n 's/^ *java.specification.version = \([0-9]*\).*/\1/p')
    ((${java_major:-0} >= JAVA_MIN_MAJOR)) ||
        die "java ${java_major:-unknown} is too old; Kafka $KAFKA_VERSION needs Java >= $JAVA_MIN_MAJOR"
    require_pin k8s.io/kubernetes "$K8S_VERSION"
    require_pin go.etcd.io/etcd/server/v3 "$ETCD_VERSION"

    mkdir -p "$CACHE_DIR" "$BUILD_LOGS"
    exec 9>"$CACHE_DIR/.install.lock"
    if ! flock -n 9; then
        say "another install.sh is running; waiting for it"
        flock 9
    fi
    local start=$SECONDS

    install_dir kubernetes "$K8S_VERSION" "$K8S_DIR" build_k8s
    install_dir etcd "$ETCD_VERSION" "$ETCD_DIR" build_etcd
    install_dir kwok "$KWOK_VERSION" "$KWOK_DIR" build_kwok
    install_dir ec2-metadata-mock "$AEMM_VERSION" "$AEMM_DIR" build_aemm
    install_dir kafka "$KAFKA_VERSION" "$KAFKA_DIR" build_kafka
    install_dir kueue-crds "$KUEUE_VERSION" "$KUEUE_DIR" copy_kueue_crds
    install_dir kueue "$KUEUE_VERSION" "$KUEUE_CTRL_DIR" build_kueue
    otelcol_check
    install_dir otelcol "$OTELCOL_VERSION" "$OTELCOL_DIR" build_otelcol
    ensure_chromium

    [[ -x $MOTO_SERVER ]] || die "$MOTO_SERVER missing; run 'make venv' first"
    say "moto: $("$REPO_DIR/.venv/bin/python" -c 'import moto; print(moto.__version__)') (venv)"
    pubsub_grpc_check
    install_dir pubsub-grpc "$PUBSUB_GRPC_VERSION" "$PUBSUB_GRPC_DIR" build_pubsub_grpc
    pubsub_grpc_list
    say "all components ready in $(fmt_secs $((SECONDS - start)))"
}

main "$@"
