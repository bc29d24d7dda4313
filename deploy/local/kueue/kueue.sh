# shellcheck shell=bash disable=SC2034  # sourced by install.sh and stack.sh (after lib.sh)
# Kueue's controller manager in the local stack: how it is built, configured and wired.
#
# Built with `go install sigs.k8s.io/kueue/cmd/kueue@$KUEUE_VERSION` (its go.mod has no replace
# directives, so no tools module is needed) into ~/.cache/reclaimd/kueue-<version>/, with the
# release's webhook manifests and CRD conversion patches next to it.
#
# Run as a plain process against the local apiserver, with what a Deployment would give it:
#   - identity: a client certificate in system:masters (the local stack does not install
#     Kueue's ClusterRoles; a real install binds them to its service account);
#   - webhooks: served on 127.0.0.1:19443 and registered with clientConfig.url pointing there
#     (render.py), for Kueue's own types and batch/job only;
#   - certificates: Kueue's internal cert management stays on, as in a real install, but it
#     finds everything already valid: the Secret kueue-system/kueue-webhook-server-cert holds
#     the stack's Kueue CA and a serving cert (SANs: the Service name the rotator checks, and
#     127.0.0.1, which the apiserver dials), and the same cert is on disk in webhook.certDir,
#     where a Deployment would mount the Secret. So the rotator neither rotates nor waits;
#   - conversion: the CRDs get the conversion webhook Kueue's kustomization adds (v1beta1 <->
#     v1beta2), which the rotator also insists on finding;
#   - scope: it manages only namespaces labelled reclaimd.io/kueue=managed. Tests and drills
#     share this cluster, and some write Workloads by hand, status included, to play Kueue's
#     part; a real Kueue reconciling those (their LocalQueue does not exist) would rewrite the
#     status under them. So its Job integration is limited to those namespaces
#     (managedJobsNamespaceSelector), and a ValidatingAdmissionPolicy refuses its own writes to
#     Workloads anywhere else (it logs the refusals and backs off);
#   - leader election off (one replica), visibility API server off (it would need an
#     APIService and a Service), health on 127.0.0.1:18081, metrics on 127.0.0.1:18443.

KUEUE_CTRL_DIR=$CACHE_DIR/kueue-$KUEUE_VERSION
KUEUE_NS=kueue-system
KUEUE_WEBHOOK=https://127.0.0.1:19443
KUEUE_HEALTH=http://127.0.0.1:18081
KUEUE_METRICS=127.0.0.1:18443
KUEUE_SECRET=kueue-webhook-server-cert
# The rotator checks the serving cert for <webhookServiceName>.<namespace>.svc, and the CA for
# its own name (cert-controller: CAName "kueue-ca" must be a SAN of the CA certificate).
KUEUE_SERVICE_DNS=kueue-webhook-service.$KUEUE_NS.svc
KUEUE_RENDER=$LOCAL_DIR/kueue/render.py
KUEUE_USER=kueue # the CN of its client certificate (stack.sh LEAVES)
KUEUE_SCOPE_LABEL=reclaimd.io/kueue
KUEUE_SCOPE_VALUE=managed

# --- install.sh ------------------------------------------------------------------------------

build_kueue() {
    GOBIN=$1 nice -n 10 go install \
        -ldflags "-X sigs.k8s.io/kueue/pkg/version.GitVersion=$KUEUE_VERSION" \
        "sigs.k8s.io/kueue/cmd/kueue@$KUEUE_VERSION"
    local src
    src=$(module_dir "sigs.k8s.io/kueue@$KUEUE_VERSION")/config/components
    mkdir -p "$1/manifests"
    cp "$src/webhook/manifests.yaml" "$1/manifests/webhooks.yaml"
    cp "$src/crd/kustomization.yaml" "$1/manifests/crd-kustomization.yaml"
    cp -r "$src/crd/patches" "$1/manifests/"
    chmod -R u+w "$1/manifests"
}

# --- stack.sh --------------------------------------------------------------------------------

kueue_ready() { [[ $(curl -fsS --max-time 3 "$KUEUE_HEALTH/readyz" 2>/dev/null) == ok ]]; }

# kueue_pki: the Kueue CA (RSA, PKCS#1: the rotator parses the CA key only in that form) and
# the webhook serving cert. Created once, never replaced, like the rest of the stack's PKI.
kueue_pki() {
    if [[ ! -f $PKI/kueue-ca.crt ]]; then
        openssl genrsa -traditional -out "$PKI/kueue-ca.key" 2048 2>/dev/null
        openssl req -x509 -new -key "$PKI/kueue-ca.key" -subj "/O=kueue/CN=kueue-ca" -days 3650 \
            -addext "basicConstraints=critical,CA:TRUE" \
            -addext "keyUsage=critical,keyCertSign,cRLSign,digitalSignature,keyEncipherment" \
            -addext "subjectAltName=DNS:kueue-ca" \
            -out "$PKI/kueue-ca.crt" 2>/dev/null
        say "pki: created kueue-ca"
    fi
    if [[ ! -f $PKI/kueue-webhook.crt ]]; then
        issue kueue-ca kueue-webhook "/CN=$KUEUE_SERVICE_DNS" serverAuth \
            "DNS:$KUEUE_SERVICE_DNS,IP:127.0.0.1"
        say "pki: created kueue-webhook"
    fi
}

# kapply PATH BODYFILE: server-side apply of one object (JSON is apply-patch YAML).
kapply() {
    kcurl -o /dev/null -X PATCH -H 'Content-Type: application/apply-patch+yaml' \
        --data-binary "@$2" "$API$1?fieldManager=reclaimd-stack-kueue&force=true"
}

# kueue_prepare: everything Kueue expects to find before it starts (see the header).
kueue_prepare() {
    local state=$STACK_DIR/kueue
    mkdir -p "$state/certs" "$state/manifests"
    kueue_pki
    cp "$PKI/kueue-webhook.crt" "$state/certs/tls.crt"
    cp "$PKI/kueue-webhook.key" "$state/certs/tls.key"
    chmod 600 "$state/certs/tls.key"
    cat >"$state/config.yaml" <<EOF
apiVersion: config.kueue.x-k8s.io/v1beta2
kind: Configuration
namespace: $KUEUE_NS
health:
  healthProbeBindAddress: ${KUEUE_HEALTH#http://}
metrics:
  bindAddress: $KUEUE_METRICS
webhook:
  host: 127.0.0.1
  port: ${KUEUE_WEBHOOK##*:}
  certDir: $state/certs
leaderElection:
  leaderElect: false
internalCertManagement:
  enable: true
  webhookServiceName: ${KUEUE_SERVICE_DNS%%.*}
  webhookSecretName: $KUEUE_SECRET
clientConnection:
  qps: 50
  burst: 100
integrations:
  frameworks: ["batch/job"]
managedJobsNamespaceSelector:
  matchLabels: {$KUEUE_SCOPE_LABEL: $KUEUE_SCOPE_VALUE}
featureGates:
  VisibilityOnDemand: false
EOF
    "$REPO_DIR/.venv/bin/python" "$KUEUE_RENDER" --manifests "$KUEUE_CTRL_DIR/manifests" \
        --ca "$PKI/kueue-ca.crt" --url "$KUEUE_WEBHOOK" --out "$state/manifests" ||
        die "rendering Kueue's webhook manifests failed"

    local tmp=$state/manifests/objects
    mkdir -p "$tmp"
    printf '{"apiVersion":"v1","kind":"Namespace","metadata":{"name":"%s"}}' "$KUEUE_NS" \
        >"$tmp/namespace.json"
    printf '{"apiVersion":"v1","kind":"Secret","metadata":{"name":"%s","namespace":"%s"},"type":"Opaque","data":{"ca.crt":"%s","ca.key":"%s","tls.crt":"%s","tls.key":"%s"}}' \
        "$KUEUE_SECRET" "$KUEUE_NS" "$(base64 -w0 <"$PKI/kueue-ca.crt")" \
        "$(base64 -w0 <"$PKI/kueue-ca.key")" "$(base64 -w0 <"$PKI/kueue-webhook.crt")" \
        "$(base64 -w0 <"$PKI/kueue-webhook.key")" >"$tmp/secret.json"
    chmod 600 "$tmp/secret.json"
    kapply "/api/v1/namespaces/$KUEUE_NS" "$tmp/namespace.json" ||
        die "creating namespace $KUEUE_NS failed"
    kapply "/api/v1/namespaces/$KUEUE_NS/secrets/$KUEUE_SECRET" "$tmp/secret.json" ||
        die "writing secret $KUEUE_NS/$KUEUE_SECRET failed"
    kueue_scope "$tmp"
    local f name
    for f in "$state"/manifests/crd-*.json; do
        name=$(basename "$f" .json)
        name=${name#crd-}
        kapply "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/$name" "$f" ||
            die "adding the conversion webhook to CRD $name failed"
    done
}

# kueue_scope DIR: the admission policy that keeps Kueue's hands off Workloads outside the
# namespaces that opted in (see the header).
kueue_scope() {
    local name=reclaimd-local-kueue-scope
    cat >"$1/scope-policy.yaml" <<EOF
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicy
metadata: {name: $name}
spec:
  failurePolicy: Fail
  matchConstraints:
    resourceRules:
    - apiGroups: [kueue.x-k8s.io]
      apiVersions: ["*"]
      operations: [CREATE, UPDATE, DELETE]
      resources: [workloads, workloads/status]
    namespaceSelector:
      matchExpressions:
      - {key: $KUEUE_SCOPE_LABEL, operator: NotIn, values: [$KUEUE_SCOPE_VALUE]}
  matchConditions:
  - name: kueue-itself
    expression: request.userInfo.username == "$KUEUE_USER"
  validations:
  - expression: "false"
    reason: Forbidden
    message: the local stack's Kueue manages only namespaces labelled $KUEUE_SCOPE_LABEL=$KUEUE_SCOPE_VALUE
EOF
    cat >"$1/scope-binding.yaml" <<EOF
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicyBinding
metadata: {name: $name}
spec:
  policyName: $name
  validationActions: [Deny]
EOF
    kapply "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies/$name" \
        "$1/scope-policy.yaml" || die "applying the Kueue scope policy failed"
    kapply "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicybindings/$name" \
        "$1/scope-binding.yaml" || die "binding the Kueue scope policy failed"
}

# kueue_register_webhooks: once Kueue answers, route admission to it (idempotent). Done after
# readiness so that no create is refused while Kueue starts.
kueue_register_webhooks() {
    local state=$STACK_DIR/kueue/manifests
    [[ -f $state/mutatingwebhookconfiguration.json ]] || kueue_prepare
    kapply /apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/kueue-mutating-webhook-configuration \
        "$state/mutatingwebhookconfiguration.json" || die "registering Kueue's mutating webhooks failed"
    kapply /apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations/kueue-validating-webhook-configuration \
        "$state/validatingwebhookconfiguration.json" || die "registering Kueue's validating webhooks failed"
}
