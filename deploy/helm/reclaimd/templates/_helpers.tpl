{{/* The release's full name: the release name if it already says reclaimd. */}}
{{- define "reclaimd.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "reclaimd.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "reclaimd.labels" -}}
app.kubernetes.io/name: {{ include "reclaimd.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* Selector labels of every reclaimd pod (controller and agent): the NetworkPolicies use them. */}}
{{- define "reclaimd.selectorLabels" -}}
app.kubernetes.io/name: {{ include "reclaimd.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* Labels of every reclaimd pod for its cloud identity: AKS Workload Identity injects its
token only into pods labelled azure.workload.identity/use. */}}
{{- define "reclaimd.identityLabels" -}}
{{- if .Values.serviceAccount.azureClientId -}}
azure.workload.identity/use: "true"
{{- end -}}
{{- end -}}

{{- define "reclaimd.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "reclaimd.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "reclaimd.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{/* The settings both workloads share: the user's config over what the chart must decide. */}}
{{- define "reclaimd.baseConfig" -}}
{{- $_ := required "config.cluster_name is required: this cluster's name, written on every ledger row and the peer group's (e.g. --set config.cluster_name=prod-us-east-2)" .Values.config.cluster_name -}}
{{- $chart := dict "lease_namespace" .Release.Namespace "metrics_port" (int .Values.metricsPort) "peer_probe" (dict "port" (int .Values.peerProbePort)) "ledger" (dict "outbox_path" "/var/lib/reclaimd/outbox.sqlite") -}}
{{- $cfg := mustMergeOverwrite (deepCopy .Values.config) $chart -}}
{{- if .Values.checkpointIdentity.enabled -}}
{{- $_ := set $cfg "checkpoint" (mustMergeOverwrite (deepCopy (default dict $cfg.checkpoint)) (dict "identity_token_file" "/var/run/secrets/reclaimd.io/checkpoint/token")) -}}
{{- end -}}
{{- if ne .Values.kafka.securityProtocol "PLAINTEXT" -}}
{{- $cfg = mustMergeOverwrite $cfg (fromYaml (include "reclaimd.kafkaSection" .)) -}}
{{- end -}}
{{- /* A slot per replica for a slotted source (Pub/Sub: a subscription each, which
deploy/gcp/main.tf makes var.replicas of), unless config.<source>.slots says otherwise (1:
one shared by every replica). */ -}}
{{- range $k := (fromJson (include "reclaimd.sources" .)).slotted -}}
{{- $section := deepCopy (default dict (get $cfg $k)) -}}
{{- if not (hasKey $section "slots") -}}
{{- $_ := set $section "slots" (int $.Values.controller.replicas) -}}
{{- end -}}
{{- $_ := set $cfg $k $section -}}
{{- end -}}
{{- toYaml $cfg -}}
{{- end -}}

{{/* The source registry as the chart sees it (files/sources.json, written from
the folders under handlers/ by deploy/helm/gen_sources.py). */}}
{{- define "reclaimd.sources" -}}
{{- .Files.Get "files/sources.json" -}}
{{- end -}}

{{/* The agent: every source off, then its nodeAgent.config, then its own source on. */}}
{{- define "reclaimd.agentConfig" -}}
{{- $cfg := fromYaml (include "reclaimd.baseConfig" .) -}}
{{- $registry := fromJson (include "reclaimd.sources" .) -}}
{{- range $k := $registry.sources -}}
{{- $_ := set $cfg $k (mustMergeOverwrite (deepCopy (default dict (get $cfg $k))) (dict "enabled" false)) -}}
{{- end -}}
{{- $cfg = mustMergeOverwrite $cfg (deepCopy .Values.nodeAgent.config) -}}
{{- $src := (get $registry.agents .Values.nodeAgent.source).section -}}
{{- $_ := set $cfg $src (mustMergeOverwrite (deepCopy (get $cfg $src)) (dict "enabled" true)) -}}
{{- toYaml $cfg -}}
{{- end -}}

{{/* Pod spec parts both workloads share. */}}
{{- define "reclaimd.env" -}}
# The address the peer probe names in the holder Lease (peer_probe.advertise).
- name: POD_IP
  valueFrom:
    fieldRef:
      fieldPath: status.podIP
{{- range $name, $ref := .Values.secretEnv }}
- name: {{ $name }}
  valueFrom:
    secretKeyRef:
      name: {{ $ref.secretName }}
      key: {{ $ref.key }}
{{- end }}
{{- end -}}

{{- define "reclaimd.envFrom" -}}
{{- range .Values.secretEnvFrom }}
- secretRef:
    name: {{ . }}
{{- end }}
{{- end -}}

{{- define "reclaimd.args" -}}
- run
- --config=/etc/reclaimd/config.yaml
- --log-level={{ .Values.logLevel }}
{{- if .Values.dryRun }}
- --dry-run
{{- end }}
{{- end -}}

{{- define "reclaimd.probes" -}}
startupProbe:
  httpGet:
    path: /healthz
    port: metrics
  periodSeconds: 2
  failureThreshold: 30
livenessProbe:
  httpGet:
    path: /healthz
    port: metrics
  periodSeconds: 10
  timeoutSeconds: 3
  failureThreshold: 3
readinessProbe:
  httpGet:
    path: /readyz
    port: metrics
  periodSeconds: 5
  timeoutSeconds: 3
  failureThreshold: 2
{{- end -}}

{{/* The drill (a game day, `helm test`): its own name, so no selector of the controller's
(NetworkPolicy, PDB, Service, anti-affinity: name=reclaimd) ever picks its pod. */}}
{{- define "reclaimd.drillName" -}}
{{- printf "%s-drill" (include "reclaimd.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "reclaimd.drillSelectorLabels" -}}
app.kubernetes.io/name: {{ include "reclaimd.name" . }}-drill
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: drill
{{- end -}}

{{- define "reclaimd.drillLabels" -}}
{{ include "reclaimd.drillSelectorLabels" . }}
app.kubernetes.io/part-of: {{ include "reclaimd.name" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* The probes' namespace, where the drill makes its stand-in gangs (and may delete pods). */}}
{{- define "reclaimd.drillNamespace" -}}
{{- $ns := default (include "reclaimd.drillName" .) .Values.drill.namespace -}}
{{- if eq $ns .Release.Namespace -}}
{{- fail "drill.namespace must not be the release namespace: the drill creates and deletes pods there" -}}
{{- end -}}
{{- $ns -}}
{{- end -}}
