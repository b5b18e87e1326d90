{{/*
Names, labels and the derived settings every template shares. The named templates a parent chart
uses in sidecar mode (kafka-share-proxy.container, kafka-share-proxy.volumes) are in _pod.tpl; the
rendered proxy.toml is in _config.tpl.
*/}}

{{- define "kafka-share-proxy.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "kafka-share-proxy.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "kafka-share-proxy.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "kafka-share-proxy.selectorLabels" -}}
app.kubernetes.io/name: {{ include "kafka-share-proxy.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "kafka-share-proxy.labels" -}}
helm.sh/chart: {{ include "kafka-share-proxy.chart" . }}
{{ include "kafka-share-proxy.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/component: proxy
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{- define "kafka-share-proxy.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "kafka-share-proxy.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "kafka-share-proxy.image" -}}
{{- $image := .Values.image }}
{{- if $image.digest }}
{{- printf "%s@%s" $image.repository $image.digest }}
{{- else }}
{{- printf "%s:%s" $image.repository (default .Chart.AppVersion $image.tag | toString) }}
{{- end }}
{{- end }}

{{- define "kafka-share-proxy.sidecar" -}}
{{- if eq .Values.mode "sidecar" }}true{{ end }}
{{- end }}

{{/* The address the Kafka listeners bind: explicit, else by mode. */}}
{{- define "kafka-share-proxy.listenHost" -}}
{{- if .Values.proxy.listenHost }}
{{- .Values.proxy.listenHost }}
{{- else if include "kafka-share-proxy.sidecar" . }}
{{- "127.0.0.1" }}
{{- else }}
{{- "0.0.0.0" }}
{{- end }}
{{- end }}

{{/* "true" when the address given is a loopback address, which nothing outside the pod reaches. */}}
{{- define "kafka-share-proxy.isLoopback" -}}
{{- if or (hasPrefix "127." .) (eq . "localhost") (eq . "::1") }}true{{ end }}
{{- end }}

{{/* "true" when the Kafka listeners bind loopback (a sidecar's default): the pod's own containers only. */}}
{{- define "kafka-share-proxy.loopback" -}}
{{- include "kafka-share-proxy.isLoopback" (include "kafka-share-proxy.listenHost" .) }}
{{- end }}

{{/*
The address the metrics/health server binds (`metrics-host`): explicit, else 0.0.0.0 in both
modes, so the kubelet's httpGet probes and Prometheus reach it on the pod IP even when the Kafka
listeners of a sidecar stay on 127.0.0.1.
*/}}
{{- define "kafka-share-proxy.metricsHost" -}}
{{- default "0.0.0.0" .Values.proxy.metricsHost }}
{{- end }}

{{- define "kafka-share-proxy.advertisedHost" -}}
{{- if .Values.proxy.advertisedHost }}
{{- .Values.proxy.advertisedHost }}
{{- else if include "kafka-share-proxy.sidecar" . }}
{{- "127.0.0.1" }}
{{- else }}
{{- printf "%s.%s.svc" (include "kafka-share-proxy.fullname" .) .Release.Namespace }}
{{- end }}
{{- end }}

{{/* Broker N listens on brokerPortBase + N; the proxy's own default is the bootstrap port + 1. */}}
{{- define "kafka-share-proxy.brokerPortBase" -}}
{{- if kindIs "invalid" .Values.proxy.brokerPortBase }}
{{- add1 (int .Values.proxy.port) }}
{{- else }}
{{- int .Values.proxy.brokerPortBase }}
{{- end }}
{{- end }}

{{/* Port names: a sidecar's are prefixed, since port names must be unique within the host pod. */}}
{{- define "kafka-share-proxy.portPrefix" -}}
{{- if include "kafka-share-proxy.sidecar" . }}ksp-{{ end }}
{{- end }}

{{- define "kafka-share-proxy.secretsDir" -}}
/var/run/secrets/kafka-share-proxy
{{- end }}

{{/* Whether a Service is rendered: standalone with service.enabled, sidecar with a podSelector. */}}
{{- define "kafka-share-proxy.hasService" -}}
{{- if include "kafka-share-proxy.sidecar" . }}
{{- if .Values.sidecar.podSelector }}true{{ end }}
{{- else if .Values.service.enabled }}true{{ end }}
{{- end }}

{{/* The Service's (and NOTES') ports: a list of {name, port} dicts, bootstrap first. */}}
{{- define "kafka-share-proxy.kafkaPorts" -}}
{{- $base := int (include "kafka-share-proxy.brokerPortBase" .) }}
{{- $ports := list (dict "name" "kafka" "port" (int .Values.proxy.port)) }}
{{- range .Values.proxy.brokerNodeIds }}
{{- $ports = append $ports (dict "name" (printf "broker-%d" (int .)) "port" (add $base (int .))) }}
{{- end }}
{{- toJson $ports }}
{{- end }}
