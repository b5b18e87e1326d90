{{/*
The proxy container and its volumes, shared by the Deployment (standalone) and by parent charts
(sidecar): `{{ include "kafka-share-proxy.container" $ctx }}` under `containers:` and
`{{ include "kafka-share-proxy.volumes" $ctx }}` under `volumes:`, where $ctx has this chart's
Values, Release and Chart (helm/README.md, "Sidecar mode"). The <fullname>-sidecar ConfigMap holds
the same two snippets rendered, for copy and paste.
*/}}

{{/*
A probe on the metrics server: HTTP on the named metrics port. The metrics server binds
proxy.metricsHost (0.0.0.0 by default), which the kubelet reaches on the pod IP even when a
sidecar's Kafka listeners bind 127.0.0.1.
*/}}
{{- define "kafka-share-proxy.probe" -}}
{{- $ctx := .ctx }}
{{- $probe := .probe }}
httpGet:
  path: {{ .path }}
  port: {{ include "kafka-share-proxy.portPrefix" $ctx }}metrics
{{- if $probe.initialDelaySeconds }}
initialDelaySeconds: {{ int $probe.initialDelaySeconds }}
{{- end }}
periodSeconds: {{ int $probe.periodSeconds }}
timeoutSeconds: {{ int $probe.timeoutSeconds }}
failureThreshold: {{ int $probe.failureThreshold }}
{{- if $probe.successThreshold }}
successThreshold: {{ int $probe.successThreshold }}
{{- end }}
{{- end }}

{{- define "kafka-share-proxy.container" -}}
{{- include "kafka-share-proxy.validate" . }}
{{- $v := .Values }}
{{- $prefix := include "kafka-share-proxy.portPrefix" . }}
{{- $dir := include "kafka-share-proxy.secretsDir" . -}}
- name: kafka-share-proxy
  image: {{ include "kafka-share-proxy.image" . | quote }}
  imagePullPolicy: {{ $v.image.pullPolicy }}
  {{- with $v.extraArgs }}
  # Appended to the image's entrypoint, `share-proxy serve`.
  args:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- $scaleOut := and (hasKey $v "scaleOut") $v.scaleOut.enabled }}
  {{- if or $v.extraEnv $scaleOut }}
  env:
    {{- if $scaleOut }}
    # Scale-out: the pod's name is its instance id (its StatefulSet ordinal the slot), and its name in
    # the headless Service is where clients and the other instances reach it. The environment
    # overrides proxy.toml's shared advertised-host.
    - name: KSP_INSTANCE_ID
      valueFrom:
        fieldRef:
          fieldPath: metadata.name
    - name: KSP_ADVERTISED_HOST
      value: "$(KSP_INSTANCE_ID).{{ include "kafka-share-proxy.fullname" . }}-pods.{{ .Release.Namespace }}.svc"
    - name: KSP_OWNERSHIP_SESSION_TIMEOUT_MS
      value: {{ int $v.scaleOut.ownershipSessionTimeoutMs | quote }}
    {{- end }}
    {{- with $v.extraEnv }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  {{- end }}
  {{- with $v.extraEnvFrom }}
  envFrom:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  ports:
    {{- range (include "kafka-share-proxy.kafkaPorts" . | fromJsonArray) }}
    - name: {{ $prefix }}{{ .name }}
      containerPort: {{ int .port }}
      protocol: TCP
    {{- end }}
    - name: {{ $prefix }}metrics
      containerPort: {{ int $v.proxy.metricsPort }}
      protocol: TCP
  {{- if $v.startupProbe.enabled }}
  startupProbe:
    {{- include "kafka-share-proxy.probe" (dict "ctx" . "probe" $v.startupProbe "path" "/healthz") | trim | nindent 4 }}
  {{- end }}
  {{- if $v.livenessProbe.enabled }}
  livenessProbe:
    {{- include "kafka-share-proxy.probe" (dict "ctx" . "probe" $v.livenessProbe "path" "/healthz") | trim | nindent 4 }}
  {{- end }}
  {{- if $v.readinessProbe.enabled }}
  readinessProbe:
    {{- include "kafka-share-proxy.probe" (dict "ctx" . "probe" $v.readinessProbe "path" "/readyz") | trim | nindent 4 }}
  {{- end }}
  {{- with $v.resources }}
  resources:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with $v.containerSecurityContext }}
  securityContext:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  volumeMounts:
    # proxy.toml from the ConfigMap; the image reads /etc/kafka-share-proxy/proxy.toml.
    - name: ksp-config
      mountPath: /etc/kafka-share-proxy
      readOnly: true
    # The root filesystem is read-only; /tmp is the only writable place.
    - name: ksp-tmp
      mountPath: /tmp
    {{- /* Whole Secrets, never subPath: a subPath mount does not follow Secret updates (certificate reload). */}}
    {{- if $v.listener.tls.existingSecret }}
    - name: ksp-listener-tls
      mountPath: {{ $dir }}/listener-tls
      readOnly: true
    {{- end }}
    {{- if $v.upstream.tls.existingSecret }}
    - name: ksp-upstream-tls
      mountPath: {{ $dir }}/upstream-tls
      readOnly: true
    {{- end }}
    {{- if hasPrefix "SASL_" $v.upstream.securityProtocol }}
    - name: ksp-upstream-sasl
      mountPath: {{ $dir }}/upstream-sasl
      readOnly: true
    {{- end }}
    {{- with $v.extraVolumeMounts }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
{{- end }}

{{- define "kafka-share-proxy.volumes" -}}
{{- $v := .Values -}}
- name: ksp-config
  configMap:
    name: {{ include "kafka-share-proxy.fullname" . }}
- name: ksp-tmp
  {{- with $v.tmpSizeLimit }}
  emptyDir:
    sizeLimit: {{ . }}
  {{- else }}
  emptyDir: {}
  {{- end }}
{{- if $v.listener.tls.existingSecret }}
- name: ksp-listener-tls
  secret:
    secretName: {{ $v.listener.tls.existingSecret }}
    defaultMode: 0444
{{- end }}
{{- if $v.upstream.tls.existingSecret }}
- name: ksp-upstream-tls
  secret:
    secretName: {{ $v.upstream.tls.existingSecret }}
    defaultMode: 0444
{{- end }}
{{- if hasPrefix "SASL_" $v.upstream.securityProtocol }}
- name: ksp-upstream-sasl
  secret:
    secretName: {{ $v.upstream.sasl.existingSecret }}
    defaultMode: 0444
    items:
      - key: {{ $v.upstream.sasl.passwordKey }}
        path: {{ $v.upstream.sasl.passwordKey }}
{{- end }}
{{- with $v.extraVolumes }}
{{ toYaml . }}
{{- end }}
{{- end }}
