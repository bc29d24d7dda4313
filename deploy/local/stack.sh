#!/usr/bin/env bash
# The real local stack for demos and e2e tests: up | down | status.
#
# Every server runs as a plain process on 127.0.0.1 with a fixed port, its state under
# <repo>/.stack/ (data, logs, PID files, PKI, kubeconfigs; gitignored):
#
#   etcd 12379/12380 -> kube-apiserver 16443 (TLS, RBAC+Node) -> kube-controller-manager 16257,
#   kwok 16247 (fake nodes and pods); Kafka 19092/19093 (KRaft); moto 15000 (SQS, S3,
#   EventBridge); Pub/Sub emulator 18085; EC2 metadata mock 11338; Kueue CRDs applied;
#   kube-scheduler 16259; Kueue 19443 (webhooks) / 18081 (health), see kueue/kueue.sh;
#   OpenTelemetry Collector 14317 (OTLP gRPC) / 14318 (OTLP HTTP), spans to .stack/otelcol/.
#
# up      installs what is missing (install.sh), starts what does not answer its readiness
#         check (anything that answers is left alone), waits for each with a timeout, applies
#         the Kueue CRDs, writes .stack/stack.env and prints the table. Idempotent.
# down    stops only what up started: by PID file, after checking the PID's command line is
#         still ours; TERM to its process group, KILL after a timeout. Data is kept.
# status  the same table with up/down per component; exit 1 if anything is down.
# stop C | start C | restart C
#         one component (the fault drills' outages): stop it as down does, start it as up does
#         and wait until it is ready.
set -euo pipefail
LOG_TAG=stack
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
# shellcheck source=tools/otelcol/otelcol.sh
source "$LOCAL_DIR/tools/otelcol/otelcol.sh"
# shellcheck source=kueue/kueue.sh
source "$LOCAL_DIR/kueue/kueue.sh"
# shellcheck source=pubsub/pubsub_emulator.sh
source "$LOCAL_DIR/pubsub/pubsub_emulator.sh"

API=https://127.0.0.1:16443
PKI=$STACK_DIR/pki
RUN=$STACK_DIR/run
LOGS=$STACK_DIR/logs
DATA=$STACK_DIR/data
KCFG=$STACK_DIR/kubeconfig
PROCESSES=(etcd kube-apiserver kube-controller-manager kube-scheduler kwok kueue kafka moto pubsub-emulator imds-mock otelcol)
STOP_TIMEOUT=20

# ---------------------------------------------------------------------------------------------
# Per-component facts. Each function takes the component name and answers for it.

comp_version() {
    case $1 in
    etcd) echo "$ETCD_VERSION" ;;
    kube-apiserver | kube-controller-manager | kube-scheduler) echo "$K8S_VERSION" ;;
    kwok) echo "$KWOK_VERSION" ;;
    kafka) echo "$KAFKA_VERSION" ;;
    moto)
        local d
        d=$(compgen -G "$REPO_DIR/.venv/lib/python3*/site-packages/moto-*.dist-info" | head -n 1)
        d=${d##*/moto-}
        echo "${d%.dist-info}"
        ;;
    pubsub-emulator) pubsub_jar_version ;;
    imds-mock) echo "$AEMM_VERSION" ;;
    kueue-crds | kueue) echo "$KUEUE_VERSION" ;;
    otelcol) echo "$OTELCOL_VERSION" ;;
    esac
}

comp_addr() {
    case $1 in
    etcd) echo "http://127.0.0.1:12379" ;;
    kube-apiserver) echo "$API" ;;
    kube-controller-manager) echo "https://127.0.0.1:16257" ;;
    kube-scheduler) echo "https://127.0.0.1:16259" ;;
    kueue) echo "$KUEUE_WEBHOOK" ;;
    kwok) echo "http://127.0.0.1:16247" ;;
    kafka) echo "127.0.0.1:19092" ;;
    moto) echo "http://127.0.0.1:15000" ;;
    pubsub-emulator) echo "127.0.0.1:18085" ;;
    imds-mock) echo "http://127.0.0.1:11338" ;;
    otelcol) echo "$OTELCOL_GRPC" ;;
    kueue-crds) echo "(in kube-apiserver)" ;;
    esac
}

comp_timeout() {
    case $1 in
    kube-apiserver | kafka | kueue) echo 180 ;;
    *) echo 90 ;;
    esac
}

# A non-curl user agent: the apiserver pretty-prints JSON for curl, which the greps below
# would not match.
kcurl() { curl -fsS --max-time 5 -A reclaimd-stack --cacert "$PKI/ca.crt" --cert "$PKI/admin.crt" --key "$PKI/admin.key" "$@"; }

comp_ready() {
    case $1 in
    etcd) curl -fsS --max-time 3 http://127.0.0.1:12379/health 2>/dev/null | grep -q '"health":"true"' ;;
    kube-apiserver) [[ -f $PKI/admin.crt ]] && [[ $(kcurl "$API/readyz" 2>/dev/null) == ok ]] ;;
    kube-controller-manager) [[ $(curl -fsSk --max-time 3 https://127.0.0.1:16257/healthz 2>/dev/null) == ok ]] ;;
    kube-scheduler) [[ $(curl -fsSk --max-time 3 https://127.0.0.1:16259/healthz 2>/dev/null) == ok ]] ;;
    kueue) kueue_ready ;;
    kwok) curl -fsS --max-time 3 -o /dev/null http://127.0.0.1:16247/healthz 2>/dev/null ;;
    kafka) [[ -x $REPO_DIR/.venv/bin/python ]] &&
        "$REPO_DIR/.venv/bin/python" "$LOCAL_DIR/kafka_ready.py" 127.0.0.1:19092 2>/dev/null ;;
    # /moto-api/config: a GET of two settings, the same size however much moto holds
    # (/moto-api/data.json dumps every resource ever created and outgrew the 3 s limit).
    moto) curl -fsS --max-time 3 http://127.0.0.1:15000/moto-api/config 2>/dev/null | grep -q '"batch"' ;;
    pubsub-emulator) [[ $(curl -fsS --max-time 3 http://127.0.0.1:18085/ 2>/dev/null) == Ok* ]] ;;
    imds-mock)
        local token
        token=$(curl -fsS --max-time 3 -X PUT -H 'X-aws-ec2-metadata-token-ttl-seconds: 60' \
            http://127.0.0.1:11338/latest/api/token 2>/dev/null) &&
            curl -fsS --max-time 3 -o /dev/null -H "X-aws-ec2-metadata-token: $token" \
                http://127.0.0.1:11338/latest/meta-data/instance-id 2>/dev/null
        ;;
    kueue-crds) kueue_crds_established ;;
    otelcol) otelcol_ready ;;
    esac
}

# comp_cmd NAME: fill CMD with the command line that starts NAME.
comp_cmd() {
    case $1 in
    etcd)
        # --unsafe-no-fsync: this is throwaway test state on a shared disk; fsync stalls would
        # show up as apiserver latency in tests, and a host crash losing the cluster is fine.
        CMD=("$ETCD_DIR/etcd" --name=reclaimd-local --data-dir="$DATA/etcd"
            --listen-client-urls=http://127.0.0.1:12379
            --advertise-client-urls=http://127.0.0.1:12379
            --listen-peer-urls=http://127.0.0.1:12380
            --initial-advertise-peer-urls=http://127.0.0.1:12380
            --initial-cluster=reclaimd-local=http://127.0.0.1:12380
            --unsafe-no-fsync --log-level=warn)
        ;;
    kube-apiserver)
        # No kubelets and a loopback address: the endpoint reconciler would only fail to
        # publish 127.0.0.1 as the kubernetes Service endpoint, so it is off.
        # shellcheck disable=SC2054  # commas inside flag values (Node,RBAC), not separators
        CMD=("$K8S_DIR/kube-apiserver"
            --etcd-servers=http://127.0.0.1:12379
            --bind-address=127.0.0.1 --advertise-address=127.0.0.1 --secure-port=16443
            --cert-dir="$STACK_DIR/apiserver"
            --tls-cert-file="$PKI/apiserver.crt" --tls-private-key-file="$PKI/apiserver.key"
            --client-ca-file="$PKI/ca.crt"
            --requestheader-client-ca-file="$PKI/front-proxy-ca.crt"
            --requestheader-allowed-names=front-proxy-client
            --requestheader-username-headers=X-Remote-User
            --requestheader-group-headers=X-Remote-Group
            --requestheader-extra-headers-prefix=X-Remote-Extra-
            --proxy-client-cert-file="$PKI/front-proxy-client.crt"
            --proxy-client-key-file="$PKI/front-proxy-client.key"
            --authorization-mode=Node,RBAC
            --enable-admission-plugins=NodeRestriction
            --service-account-issuer=https://kubernetes.default.svc.cluster.local
            --service-account-key-file="$PKI/sa.pub"
            --service-account-signing-key-file="$PKI/sa.key"
            --service-cluster-ip-range=10.96.0.0/16
            --endpoint-reconciler-type=none
            --profiling=false)
        ;;
    kube-controller-manager)
        # Its own identity (system:kube-controller-manager) and per-controller service
        # accounts, as in a real cluster, so RBAC mistakes in tests look like production ones.
        CMD=("$K8S_DIR/kube-controller-manager"
            --kubeconfig="$KCFG/kube-controller-manager.kubeconfig"
            --authentication-kubeconfig="$KCFG/kube-controller-manager.kubeconfig"
            --authorization-kubeconfig="$KCFG/kube-controller-manager.kubeconfig"
            --bind-address=127.0.0.1 --secure-port=16257
            --cert-dir="$STACK_DIR/kube-controller-manager"
            --use-service-account-credentials=true
            --service-account-private-key-file="$PKI/sa.key"
            --root-ca-file="$PKI/ca.crt"
            --cluster-signing-cert-file="$PKI/ca.crt" --cluster-signing-key-file="$PKI/ca.key"
            --leader-elect=false
            --flex-volume-plugin-dir="$STACK_DIR/kube-controller-manager/flexvolume"
            --controllers="$KCM_CONTROLLERS"
            --profiling=false)
        ;;
    kube-scheduler)
        # Binds the pods of Jobs that Kueue admits; the fleet's own pods name their node.
        CMD=("$K8S_DIR/kube-scheduler"
            --kubeconfig="$KCFG/kube-scheduler.kubeconfig"
            --authentication-kubeconfig="$KCFG/kube-scheduler.kubeconfig"
            --authorization-kubeconfig="$KCFG/kube-scheduler.kubeconfig"
            --bind-address=127.0.0.1 --secure-port=16259
            --cert-dir="$STACK_DIR/kube-scheduler"
            --leader-elect=false --profiling=false)
        ;;
    kueue)
        CMD=("$KUEUE_CTRL_DIR/kueue" --config="$STACK_DIR/kueue/config.yaml"
            --kubeconfig="$KCFG/kueue.kubeconfig")
        ;;
    kwok)
        CMD=("$KWOK_DIR/kwok" --kubeconfig="$KCFG/kwok.kubeconfig"
            --manage-all-nodes=false
            --manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake
            --node-lease-duration-seconds=40
            --cidr=10.244.0.0/16 --node-ip=10.0.0.1
            --server-address=127.0.0.1:16247
            --config="$KWOK_DIR/stages.yaml" --config="$LOCAL_DIR/kwok-options.yaml"
            -v=WARN)  # at INFO it logs every pod patch: a storm's CPU went to its log
        ;;
    kafka)
        CMD=(java -Xms128m -Xmx512m -XX:+UseG1GC -XX:MaxGCPauseMillis=20
            -Djava.awt.headless=true
            -Dlog4j2.configurationFile="$LOCAL_DIR/kafka/log4j2.properties"
            -Dkafka.logs.dir="$LOGS"
            -cp "$KAFKA_DIR/libs/*" kafka.Kafka "$STACK_DIR/kafka/server.properties")
        ;;
    moto)
        CMD=("$MOTO_SERVER" -H 127.0.0.1 -p 15000)
        ;;
    pubsub-emulator) pubsub_emulator_cmd ;; # its jar with a consistent grpc-java first
    imds-mock)
        # IMDSv2 only, as hardened nodes run it: reclaimd must fetch a session token first.
        # The rebalance recommendation keeps one noticeTime, as EC2's does (the mock's own
        # default is the time of each request: a new notice every second).
        CMD=(env "AEMM_SPOT_REBALANCE_REC_TIME=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
            "$AEMM_DIR/ec2-metadata-mock" --hostname 127.0.0.1 --port 11338 --imdsv2)
        ;;
    otelcol)
        CMD=("$OTELCOL_BIN" --config="$OTELCOL_STATE/config.yaml")
        ;;
    esac
}

# Controllers that have nothing to do without kubelets or a cloud provider stay off; the rest
# (disruption for PDB status, garbage collector, namespace, node lifecycle, ...) run.
KCM_CONTROLLERS="*"

# comp_match NAME: a string the running process's command line must contain to count as ours.
comp_match() {
    case $1 in
    kafka) echo "$STACK_DIR/kafka/server.properties" ;;
    moto) echo "$MOTO_SERVER -H 127.0.0.1 -p 15000" ;;
    pubsub-emulator) echo "cloud-pubsub-emulator" ;;
    imds-mock) echo "$AEMM_DIR/ec2-metadata-mock" ;; # started through env(1)
    *)
        comp_cmd "$1"
        echo "${CMD[0]}"
        ;;
    esac
}

# comp_prepare NAME: one-time setup before the first start.
comp_prepare() {
    case $1 in
    kafka) kafka_prepare ;;
    otelcol) otelcol_prepare ;;
    kueue) kueue_prepare ;;
    esac
}

# ---------------------------------------------------------------------------------------------
# PKI and kubeconfigs.

new_key() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1" 2>/dev/null; }

make_ca() {
    openssl req -x509 -new -key "$PKI/$1.key" -subj "$2" -days 3650 \
        -addext "basicConstraints=critical,CA:TRUE" \
        -addext "keyUsage=critical,keyCertSign,cRLSign,digitalSignature" \
        -out "$PKI/$1.crt" 2>/dev/null
}

# issue CA NAME SUBJECT EKU [SAN]: a leaf certificate signed by CA.
issue() {
    local ca=$1 name=$2 subject=$3 eku=$4 san=${5:-}
    new_key "$PKI/$name.key"
    openssl req -new -key "$PKI/$name.key" -subj "$subject" -out "$PKI/$name.csr" 2>/dev/null
    {
        echo "basicConstraints=critical,CA:FALSE"
        echo "keyUsage=critical,digitalSignature"
        echo "extendedKeyUsage=$eku"
        echo "subjectKeyIdentifier=hash"
        echo "authorityKeyIdentifier=keyid"
        [[ -z $san ]] || echo "subjectAltName=$san"
    } >"$PKI/$name.ext"
    openssl x509 -req -in "$PKI/$name.csr" -CA "$PKI/$ca.crt" -CAkey "$PKI/$ca.key" \
        -set_serial "0x$(openssl rand -hex 16)" -days 3650 -extfile "$PKI/$name.ext" \
        -out "$PKI/$name.crt.tmp" 2>/dev/null
    mv "$PKI/$name.crt.tmp" "$PKI/$name.crt"
    rm -f "$PKI/$name.csr" "$PKI/$name.ext"
}

write_kubeconfig() {
    local file=$1 user=$2
    local tmp=$file.tmp
    cat >"$tmp" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: reclaimd-local
  cluster:
    server: $API
    certificate-authority-data: $(base64 -w0 <"$PKI/ca.crt")
users:
- name: $user
  user:
    client-certificate-data: $(base64 -w0 <"$PKI/$user.crt")
    client-key-data: $(base64 -w0 <"$PKI/$user.key")
contexts:
- name: $user@reclaimd-local
  context:
    cluster: reclaimd-local
    user: $user
current-context: $user@reclaimd-local
EOF
    chmod 600 "$tmp"
    mv "$tmp" "$file"
}

# ensure_pki: create whatever is missing, file by file, and never replace what exists: other
# people's kubeconfigs and issued service-account tokens stay valid across `up`s.
ensure_pki() {
    mkdir -p "$PKI" "$KCFG"
    chmod 700 "$PKI"
    local made=()
    if [[ ! -f $PKI/ca.crt ]]; then
        new_key "$PKI/ca.key"
        make_ca ca "/CN=reclaimd-local-ca"
        made+=(ca)
    fi
    # The aggregation layer's CA: the apiserver publishes it in extension-apiserver-authentication
    # and the controller manager's delegated authentication refuses to start without it.
    if [[ ! -f $PKI/front-proxy-ca.crt ]]; then
        new_key "$PKI/front-proxy-ca.key"
        make_ca front-proxy-ca "/CN=reclaimd-local-front-proxy-ca"
        made+=(front-proxy-ca)
    fi
    local leaf
    for leaf in "${LEAVES[@]}"; do
        local name=${leaf%%|*} rest=${leaf#*|}
        local subject=${rest%%|*} rest2=${rest#*|}
        local eku=${rest2%%|*} san=${rest2#*|}
        [[ $san == "$rest2" ]] && san=""
        if [[ ! -f $PKI/$name.crt ]]; then
            local ca=ca
            [[ $name == front-proxy-client ]] && ca=front-proxy-ca
            issue "$ca" "$name" "$subject" "$eku" "$san"
            made+=("$name")
        fi
    done
    if [[ ! -f $PKI/sa.pub ]]; then
        openssl genpkey -algorithm RSA -pkeyopt rsa_keygen_bits:2048 -out "$PKI/sa.key" 2>/dev/null
        openssl pkey -in "$PKI/sa.key" -pubout -out "$PKI/sa.pub" 2>/dev/null
        made+=(service-account-key)
    fi
    [[ -f $STACK_DIR/admin.kubeconfig ]] || write_kubeconfig "$STACK_DIR/admin.kubeconfig" admin
    [[ -f $STACK_DIR/reclaimd.kubeconfig ]] || write_kubeconfig "$STACK_DIR/reclaimd.kubeconfig" reclaimd
    local u
    for u in kube-controller-manager kube-scheduler kwok kueue; do
        [[ -f $KCFG/$u.kubeconfig ]] || write_kubeconfig "$KCFG/$u.kubeconfig" "$u"
    done
    ((${#made[@]} == 0)) || say "pki: created ${made[*]} in ${PKI#"$REPO_DIR"/}"
}

# name|subject|extended key usage|subject alt names
LEAVES=(
    "apiserver|/CN=kube-apiserver|serverAuth|IP:127.0.0.1,IP:10.96.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local"
    "admin|/O=system:masters/CN=reclaimd-admin|clientAuth"
    # No group: later work binds a least-privilege ClusterRole to user "reclaimd".
    "reclaimd|/CN=reclaimd|clientAuth"
    "kube-controller-manager|/CN=system:kube-controller-manager|clientAuth"
    "kube-scheduler|/CN=system:kube-scheduler|clientAuth"
    # kwok plays every kubelet at once, so it cannot use one node's identity.
    "kwok|/O=system:masters/CN=kwok|clientAuth"
    # The local stack does not install Kueue's ClusterRoles: its controller runs as a master.
    "kueue|/O=system:masters/CN=kueue|clientAuth"
    "front-proxy-client|/CN=front-proxy-client|clientAuth"
)

KAFKA_PKI=$STACK_DIR/kafka/pki
# Bumped when what the storage format holds changes (now: reclaimd's SCRAM credentials): a
# data directory formatted otherwise is formatted again (the stack's Kafka data is test data).
KAFKA_FORMAT=secured-1

kafka_prepare() {
    mkdir -p "$STACK_DIR/kafka" "$DATA/kafka"
    "$REPO_DIR/.venv/bin/python" "$LOCAL_DIR/kafka/pki.py" "$KAFKA_PKI" >/dev/null ||
        die "kafka: could not make its certificates ($KAFKA_PKI)"
    sed -e "s#@DATA_DIR@#$DATA/kafka#" -e "s#@PKI_DIR@#$KAFKA_PKI#" \
        "$LOCAL_DIR/kafka/server.properties.in" >"$STACK_DIR/kafka/server.properties"
    # The format's marker names the password it holds (its hash): new credentials, new format.
    local password marker
    password=$(cat "$KAFKA_PKI/reclaimd.password")
    marker="$KAFKA_FORMAT $(printf %s "$password" | sha256sum | cut -c1-16)"
    if [[ -f $DATA/kafka/meta.properties ]]; then
        [[ $(cat "$DATA/kafka/.format" 2>/dev/null) == "$marker" ]] && return
        say "kafka: $DATA/kafka was formatted without reclaimd's current credentials; formatting again"
        rm -rf "$DATA/kafka"
        mkdir -p "$DATA/kafka"
    fi
    # A KRaft cluster id is 16 random bytes, base64url without padding (it may start with "-":
    # hence --cluster-id=, not -t ID).
    local id
    id=$(openssl rand 16 | base64 | tr '+/' '-_' | tr -d '=')
    say "kafka: formatting $DATA/kafka (cluster id $id; SCRAM user reclaimd)"
    java -cp "$KAFKA_DIR/libs/*" -Dlog4j2.configurationFile="$LOCAL_DIR/kafka/log4j2.properties" \
        kafka.tools.StorageTool format --cluster-id="$id" -c "$STACK_DIR/kafka/server.properties" \
        --add-scram "SCRAM-SHA-512=[name=reclaimd,password=$password]" \
        --add-scram "SCRAM-SHA-256=[name=reclaimd,password=$password]" \
        >>"$LOGS/kafka.log" 2>&1 || die "kafka storage format failed; log: $LOGS/kafka.log"
    echo "$marker" >"$DATA/kafka/.format"
}

# reclaimd's ACLs, as a least-privilege KafkaUser or MSK IAM policy would give it: write and
# read its ledger topics (the adoption scan and the report read them back), read the notices
# topics, its consumer groups and transactional ids; nothing else. Kept in the metadata log:
# added once per formatted data directory (the marker).
kafka_acls() {
    [[ -f $DATA/kafka/.acls ]] && return
    local acl=(java -cp "$KAFKA_DIR/libs/*" -Dlog4j2.configurationFile="$LOCAL_DIR/kafka/log4j2.properties"
        org.apache.kafka.tools.AclCommand --bootstrap-server 127.0.0.1:19092 --add
        --allow-principal User:reclaimd --resource-pattern-type prefixed)
    local topic
    for topic in reclaimd.restart-waste reclaimd.allocation; do
        "${acl[@]}" --operation Write --operation Read --operation Describe --topic "$topic" \
            >>"$LOGS/kafka-acls.log" 2>&1 || die "kafka: ACLs on $topic failed; log: $LOGS/kafka-acls.log"
    done
    "${acl[@]}" --operation Read --operation Describe --topic reclaimd.notices \
        --group reclaimd >>"$LOGS/kafka-acls.log" 2>&1 ||
        die "kafka: ACLs on the notices topic failed; log: $LOGS/kafka-acls.log"
    "${acl[@]}" --operation Write --operation Describe --transactional-id reclaimd-ledger- \
        >>"$LOGS/kafka-acls.log" 2>&1 ||
        die "kafka: ACLs on transactional ids failed; log: $LOGS/kafka-acls.log"
    touch "$DATA/kafka/.acls"
    say "kafka: ACLs for User:reclaimd added"
}

# ---------------------------------------------------------------------------------------------
# Kueue CRDs: server-side apply (client-side apply would not fit the Workload schema in the
# last-applied annotation), then wait until the apiserver serves them.

crd_names() {
    local f base
    for f in "$KUEUE_DIR"/*.yaml; do
        base=$(basename "$f" .yaml) # <group>_<plural>.yaml, as controller-gen names them
        echo "${base#*_}.${base%%_*} $f"
    done
}

kueue_crds_established() {
    [[ -f $PKI/admin.crt ]] || return 1
    local name _f
    while read -r name _f; do
        kcurl "$API/apis/apiextensions.k8s.io/v1/customresourcedefinitions/$name" 2>/dev/null |
            grep -q '"type":"Established","status":"True"' || return 1
    done < <(crd_names)
}

apply_kueue_crds() {
    if kueue_crds_established; then return; fi
    local name f
    while read -r name f; do
        sed '/^---$/d' "$f" | kcurl -o /dev/null -X PATCH \
            -H 'Content-Type: application/apply-patch+yaml' --data-binary @- \
            "$API/apis/apiextensions.k8s.io/v1/customresourcedefinitions/$name?fieldManager=reclaimd-stack&force=true" ||
            die "applying CRD $name failed (from $f)"
    done < <(crd_names)
    local deadline=$((SECONDS + 60))
    until kueue_crds_established; do
        ((SECONDS < deadline)) || die "Kueue CRDs not established after 60s; log: $LOGS/kube-apiserver.log"
        sleep 1
    done
    say "kueue-crds: $(crd_names | wc -l) CRDs established"
}

# ---------------------------------------------------------------------------------------------
# Processes.

pidfile() { echo "$RUN/$1.pid"; }

# our_pid NAME: print the PID from NAME's PID file if that process is alive and still ours.
our_pid() {
    local f pid cmdline match
    f=$(pidfile "$1")
    [[ -f $f ]] || return 1
    pid=$(<"$f")
    [[ $pid =~ ^[0-9]+$ ]] && [[ -r /proc/$pid/cmdline ]] || return 1
    cmdline=$(tr '\0' ' ' <"/proc/$pid/cmdline")
    match=$(comp_match "$1")
    [[ $cmdline == *"$match"* ]] || return 1
    echo "$pid"
}

start_process() {
    local name=$1
    comp_prepare "$name"
    comp_cmd "$name"
    printf '\n==== %s: stack.sh starting %s ====\n' "$(date -u +%FT%TZ)" "$name" >>"$LOGS/$name.log"
    # setsid: its own session and process group, so it outlives the shell that started it
    # (make, pytest) and `down` can signal the whole group.
    # 8>&-: the server must not inherit the stack lock, or it would hold it for its lifetime.
    setsid "${CMD[@]}" >>"$LOGS/$name.log" 2>&1 </dev/null 8>&- &
    local pid=$! match i
    echo "$pid" >"$(pidfile "$name")"
    # Until it execs, the child is a fork of this shell with our command line: our_pid would
    # read it as gone (a fresh machine's `make test` died on "kube-apiserver exited while
    # starting" with the server running). Wait for the exec, or for the child to end.
    match=$(comp_match "$name")
    for ((i = 0; i < 100; i++)); do
        [[ -r /proc/$pid/cmdline ]] || break
        [[ $(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null) == *"$match"* ]] && break
        sleep 0.05
    done
}

# ensure NAME: start NAME unless it answers or our process for it is already starting.
ensure() {
    local name=$1
    if comp_ready "$name"; then
        STARTED[$name]=already
        return
    fi
    if our_pid "$name" >/dev/null; then
        STARTED[$name]=starting
        return
    fi
    start_process "$name"
    STARTED[$name]=started
    STARTED_AT[$name]=$SECONDS
}

await() {
    local name=$1 timeout start=$SECONDS
    timeout=$(comp_timeout "$name")
    until comp_ready "$name"; do
        if [[ ${STARTED[$name]} != already ]] && ! our_pid "$name" >/dev/null; then
            die "$name exited while starting; log: $LOGS/$name.log"
        fi
        ((SECONDS - start < timeout)) || die "$name not ready after ${timeout}s; log: $LOGS/$name.log"
        sleep 1
    done
    case ${STARTED[$name]} in
    already) say "$name: already up" ;;
    started) say "$name: ready $(fmt_secs $((SECONDS - STARTED_AT[$name]))) after its start" ;;
    *) say "$name: ready (was already starting)" ;;
    esac
}

stop_process() {
    local name=$1 pid f
    f=$(pidfile "$name")
    [[ -f $f ]] || return 0
    if ! pid=$(our_pid "$name"); then
        say "$name: stale PID file (process gone or PID reused); removing it"
        rm -f "$f"
        return
    fi
    # Signal the group only when the process still leads it (setsid made it so).
    local target=$pid
    [[ $(ps -o pgid= -p "$pid" | tr -d ' ') == "$pid" ]] && target=-$pid
    kill -TERM -- "$target" 2>/dev/null || true
    local deadline=$((SECONDS + STOP_TIMEOUT))
    while kill -0 "$pid" 2>/dev/null && ((SECONDS < deadline)); do sleep 0.5; done
    if kill -0 "$pid" 2>/dev/null; then
        say "$name: still running after ${STOP_TIMEOUT}s; sending KILL"
        kill -KILL -- "$target" 2>/dev/null || true
    fi
    rm -f "$f"
    say "$name: stopped (pid $pid)"
}

write_env() {
    local tmp=$STACK_DIR/stack.env.tmp
    {
        echo "# Written by deploy/local/stack.sh up. KEY=VALUE lines: source it, or parse it."
        echo "STACK_DIR=$STACK_DIR"
        echo "KUBECONFIG=$STACK_DIR/admin.kubeconfig"
        echo "RECLAIMD_KUBECONFIG=$STACK_DIR/reclaimd.kubeconfig"
        echo "KUBE_APISERVER=$API"
        echo "KAFKA_BOOTSTRAP=127.0.0.1:19092"
        # The production-like listeners (deploy/local/kafka/server.properties.in) and what a
        # client of each needs: user reclaimd's password file, the CA, its certificate.
        echo "KAFKA_SASL_SSL_BOOTSTRAP=127.0.0.1:19096"
        echo "KAFKA_SSL_BOOTSTRAP=127.0.0.1:19094"
        echo "KAFKA_PKI_DIR=$KAFKA_PKI"
        echo "AWS_ENDPOINT_URL=http://127.0.0.1:15000"
        echo "AWS_ACCESS_KEY_ID=testing"
        echo "AWS_SECRET_ACCESS_KEY=testing"
        echo "AWS_DEFAULT_REGION=us-east-1"
        echo "PUBSUB_EMULATOR_HOST=127.0.0.1:18085"
        echo "PUBSUB_PROJECT_ID=reclaimd-local"
        echo "IMDS_URL=http://127.0.0.1:11338"
        echo "OTELCOL_GRPC_ENDPOINT=$OTELCOL_GRPC"
        echo "OTELCOL_HTTP_ENDPOINT=$OTELCOL_HTTP"
        echo "OTELCOL_SPANS_FILE=$OTELCOL_SPANS"
        grep -E '^[A-Z0-9_]+=' "$LOCAL_DIR/versions.env"
        echo "MOTO_VERSION=$(comp_version moto)"
        echo "PUBSUB_EMULATOR_VERSION=$(comp_version pubsub-emulator)"
    } >"$tmp"
    mv "$tmp" "$STACK_DIR/stack.env"
}

# table: print component, version, address, PID, state, log; return 1 if anything is down.
table() {
    local fmt='%-24s %-9s %-25s %-8s %-5s %s\n' name pid state down=0
    # shellcheck disable=SC2059
    printf "$fmt" COMPONENT VERSION ADDRESS PID STATE LOG
    for name in "${PROCESSES[@]}" kueue-crds; do
        pid=$(our_pid "$name" 2>/dev/null) || pid=-
        if comp_ready "$name"; then state=up; else state=down down=1; fi
        local log=$LOGS/$name.log
        [[ $name == kueue-crds ]] && log=$LOGS/kube-apiserver.log
        # shellcheck disable=SC2059
        printf "$fmt" "$name" "$(comp_version "$name")" "$(comp_addr "$name")" "$pid" "$state" \
            "${log#"$REPO_DIR"/}"
    done
    return "$down"
}

lock() {
    mkdir -p "$STACK_DIR"
    exec 8>"$STACK_DIR/.lock"
    if ! flock -n 8; then
        say "another stack.sh up/down is running; waiting for it"
        flock 8
    fi
}

cmd_up() {
    lock
    "$LOCAL_DIR/install.sh"
    local start=$SECONDS
    mkdir -p "$RUN" "$LOGS" "$DATA" "$KCFG"
    ensure_pki
    declare -gA STARTED=() STARTED_AT=()
    # Dependency order, but independent servers start together to overlap their JVM warm-up.
    local name
    for name in etcd kafka moto pubsub-emulator imds-mock otelcol; do ensure "$name"; done
    await etcd
    ensure kube-apiserver
    await kube-apiserver
    apply_kueue_crds
    for name in kube-controller-manager kube-scheduler kwok kueue; do ensure "$name"; done
    for name in kube-controller-manager kube-scheduler kwok kueue kafka moto pubsub-emulator imds-mock otelcol; do await "$name"; done
    kueue_register_webhooks
    kafka_acls
    write_env
    say "stack up in $(fmt_secs $((SECONDS - start))); env: ${STACK_DIR#"$REPO_DIR"/}/stack.env"
    table
}

cmd_down() {
    lock
    local i
    for ((i = ${#PROCESSES[@]} - 1; i >= 0; i--)); do stop_process "${PROCESSES[i]}"; done
    local name
    for name in "${PROCESSES[@]}"; do
        if comp_ready "$name"; then say "$name: still answering but not started by stack.sh; left alone"; fi
    done
}

# One component, for the fault drills (chaos/drill/faults.py): stop it, start it and wait
# until it answers its readiness check, or both. Only a server of the list, only ours.
one_component() {
    local name=$1 p
    for p in "${PROCESSES[@]}"; do [[ $p == "$name" ]] && return 0; done
    echo "stack.sh: no component '$name' (one of: ${PROCESSES[*]})" >&2
    exit 2
}

cmd_start_one() {
    declare -gA STARTED=() STARTED_AT=()
    ensure "$1"
    await "$1"
    # A restarted apiserver serves the Kueue CRDs from etcd; wait until it does again.
    if [[ $1 == kube-apiserver ]]; then apply_kueue_crds; fi
    if [[ $1 == kafka ]]; then kafka_acls; fi
}

case ${1:-} in
up) cmd_up ;;
down) cmd_down ;;
status) table ;;
stop | start | restart)
    [[ $# -eq 2 ]] || {
        echo "usage: $0 $1 COMPONENT" >&2
        exit 2
    }
    one_component "$2"
    # On SIGTERM kube-apiserver keeps serving its open watches until they end (it outlived the
    # 20 s here): a drill's restart is meant to be a short outage, so it gets 3 s, then KILL
    # (etcd keeps the data either way).
    [[ $2 == kube-apiserver && $1 != start ]] && STOP_TIMEOUT=3
    lock
    mkdir -p "$RUN" "$LOGS"
    [[ $1 == start ]] || stop_process "$2"
    [[ $1 == stop ]] || cmd_start_one "$2"
    ;;
*)
    echo "usage: $0 up|down|status|stop C|start C|restart C" >&2
    exit 2
    ;;
esac
