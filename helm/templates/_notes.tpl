{{/* What `helm install` prints (NOTES.txt); a named template so tests can render it too. */}}
{{- define "kafka-share-proxy.notes" -}}
{{- $fullname := include "kafka-share-proxy.fullname" . -}}
{{- $advertised := include "kafka-share-proxy.advertisedHost" . -}}
kafka-share-proxy {{ .Chart.AppVersion }} ({{ .Values.mode }} mode) in front of {{ join "," .Values.upstream.bootstrapServers }}.

{{- if .Values.scaleOut.enabled }}
SCALE-OUT: {{ int .Values.replicaCount }} proxy pods (StatefulSet {{ $fullname }}) share this cluster's share groups; each
is advertised as <pod>.{{ $fullname }}-pods.{{ .Release.Namespace }}.svc. Share-group administration across pods is
not built yet (docs/scale-out.md). Do not install this chart twice against one cluster.
{{- else }}
ONE proxy per Kafka cluster: two proxies over the same state topic would both own the share
state (several need scaleOut.enabled). Do not install this chart twice against one cluster.
{{- end }}
{{- if include "kafka-share-proxy.sidecar" . }}

Sidecar mode: no Deployment was rendered. Add the proxy to your pod (helm/README.md, "Sidecar mode"):

  kubectl -n {{ .Release.Namespace }} get configmap {{ $fullname }}-sidecar -o jsonpath='{.data.container\.yaml}'
  kubectl -n {{ .Release.Namespace }} get configmap {{ $fullname }}-sidecar -o jsonpath='{.data.volumes\.yaml}'

or, from a parent chart: include "kafka-share-proxy.container" / "kafka-share-proxy.volumes".
Applications in that pod connect to {{ $advertised }}:{{ int .Values.proxy.port }}.
{{- if include "kafka-share-proxy.loopback" . }}
Kafka traffic stays inside the pod ({{ include "kafka-share-proxy.listenHost" . }}); /metrics, /healthz and /readyz are served
on {{ include "kafka-share-proxy.metricsHost" . }}:{{ int .Values.proxy.metricsPort }} (the pod IP), where the kubelet probes them.
{{- if include "kafka-share-proxy.hasService" . }}
Service {{ $fullname }} selects the pods by sidecar.podSelector and carries the metrics port only.
{{- end }}
{{- end }}
{{- else }}

Clients connect to {{ $advertised }}:{{ int .Values.proxy.port }} (bootstrap); broker N is advertised as
{{ $advertised }}:{{ include "kafka-share-proxy.brokerPortBase" . }}+N (node ids {{ join ", " .Values.proxy.brokerNodeIds }} have Service ports).

  kubectl -n {{ .Release.Namespace }} rollout status {{ if .Values.scaleOut.enabled }}statefulset{{ else }}deployment{{ end }}/{{ $fullname }}
  kubectl -n {{ .Release.Namespace }} port-forward deployment/{{ $fullname }} {{ int .Values.proxy.metricsPort }}
  curl -s localhost:{{ int .Values.proxy.metricsPort }}/readyz    # 200 once the share state is replayed
{{- end }}
{{- if .Values.listener.tls.existingSecret }}

Listeners serve TLS from Secret {{ .Values.listener.tls.existingSecret }}; its certificate must name {{ $advertised }}.
{{- end }}

{{- end }}
