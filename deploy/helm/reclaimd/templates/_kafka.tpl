{{/* How the controller reaches Kafka (values `kafka`): the settings' kafka section, and the
Secrets it reads mounted as files under /etc/reclaimd/kafka. The password and keys are never in
the ConfigMap, the environment or the pod spec: only their Secret's name and key. */}}

{{- define "reclaimd.kafkaDir" -}}/etc/reclaimd/kafka{{- end -}}

{{/* The kafka section of config.yaml (merged over config.kafka, which may say the same). */}}
{{- define "reclaimd.kafkaConfig" -}}
{{- $k := .Values.kafka -}}
{{- $dir := include "reclaimd.kafkaDir" . -}}
{{- $out := dict "security_protocol" $k.securityProtocol -}}
{{- if has $k.securityProtocol (list "SSL" "SASL_SSL") -}}
{{- $tls := dict "check_hostname" $k.tls.checkHostname -}}
{{- if $k.tls.caSecret.name -}}{{- $_ := set $tls "ca_file" (printf "%s/ca/%s" $dir $k.tls.caSecret.key) -}}{{- end -}}
{{- if $k.tls.clientSecret.name -}}
{{- $_ := set $tls "cert_file" (printf "%s/client/%s" $dir $k.tls.clientSecret.certKey) -}}
{{- $_ := set $tls "key_file" (printf "%s/client/%s" $dir $k.tls.clientSecret.keyKey) -}}
{{- end -}}
{{- $_ := set $out "tls" $tls -}}
{{- end -}}
{{- if has $k.securityProtocol (list "SASL_PLAINTEXT" "SASL_SSL") -}}
{{- if eq $k.sasl.mechanism "OAUTHBEARER" -}}
{{- if not $k.sasl.mskIamRegion -}}{{- fail "kafka.sasl.mskIamRegion: required with OAUTHBEARER (Amazon MSK IAM)" -}}{{- end -}}
{{- $_ := set $out "sasl" (dict "mechanism" "OAUTHBEARER" "msk_iam_region" $k.sasl.mskIamRegion) -}}
{{- else -}}
{{- if not (and $k.sasl.username $k.sasl.passwordSecret.name) -}}{{- fail (printf "kafka.sasl: %s needs username and passwordSecret.name" $k.sasl.mechanism) -}}{{- end -}}
{{- $_ := set $out "sasl" (dict "mechanism" $k.sasl.mechanism "username" $k.sasl.username "password_file" (printf "%s/sasl/%s" $dir $k.sasl.passwordSecret.key)) -}}
{{- end -}}
{{- end -}}
{{- toYaml $out -}}
{{- end -}}

{{- define "reclaimd.kafkaSection" -}}
kafka:
  {{- include "reclaimd.kafkaConfig" . | nindent 2 }}
{{- end -}}

{{/* The Secrets as read-only files (0440: the pod's fsGroup reads them, nobody else). */}}
{{- define "reclaimd.kafkaVolumes" -}}
{{- $k := .Values.kafka -}}
{{- $tls := has $k.securityProtocol (list "SSL" "SASL_SSL") -}}
{{- $sasl := and (has $k.securityProtocol (list "SASL_PLAINTEXT" "SASL_SSL")) (ne $k.sasl.mechanism "OAUTHBEARER") -}}
{{- if and $tls $k.tls.caSecret.name }}
- name: kafka-ca
  secret:
    secretName: {{ $k.tls.caSecret.name }}
    defaultMode: 0440
    items:
      - key: {{ $k.tls.caSecret.key }}
        path: {{ $k.tls.caSecret.key }}
{{- end }}
{{- if and $tls $k.tls.clientSecret.name }}
- name: kafka-client
  secret:
    secretName: {{ $k.tls.clientSecret.name }}
    defaultMode: 0440
    items:
      - key: {{ $k.tls.clientSecret.certKey }}
        path: {{ $k.tls.clientSecret.certKey }}
      - key: {{ $k.tls.clientSecret.keyKey }}
        path: {{ $k.tls.clientSecret.keyKey }}
{{- end }}
{{- if and $sasl $k.sasl.passwordSecret.name }}
- name: kafka-sasl
  secret:
    secretName: {{ $k.sasl.passwordSecret.name }}
    defaultMode: 0440
    items:
      - key: {{ $k.sasl.passwordSecret.key }}
        path: {{ $k.sasl.passwordSecret.key }}
{{- end }}
{{- end -}}

{{- define "reclaimd.kafkaMounts" -}}
{{- $dir := include "reclaimd.kafkaDir" . -}}
{{- range $v := fromYamlArray (include "reclaimd.kafkaVolumes" . | default "[]") }}
- name: {{ $v.name }}
  mountPath: {{ $dir }}/{{ trimPrefix "kafka-" $v.name }}
  readOnly: true
{{- end }}
{{- end -}}
