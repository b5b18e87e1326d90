{{/*
proxy.toml: what the ConfigMap holds and the image reads from /etc/kafka-share-proxy/proxy.toml
(over its own defaults; docs/deployment.md). Every key is a `share-proxy serve` option; the chart
writes the ones it owns explicitly (listen, ports, upstream, security), then `config:` sorted.
Passwords never appear here: only the paths of the mounted Secret files.
*/}}

{{/* One TOML value. Helm reads YAML numbers as float64: whole numbers are written as integers. */}}
{{- define "kafka-share-proxy.tomlValue" -}}
{{- $v := . }}
{{- if kindIs "bool" $v }}
{{- $v }}
{{- else if kindIs "float64" $v }}
{{- if eq (float64 (int64 $v)) $v }}{{ int64 $v }}{{ else }}{{ $v }}{{ end }}
{{- else if or (kindIs "int" $v) (kindIs "int64" $v) }}
{{- $v }}
{{- else if kindIs "string" $v }}
{{- toJson $v }}
{{- else if kindIs "slice" $v }}
{{- $items := list }}
{{- range $v }}{{ $items = append $items (include "kafka-share-proxy.tomlValue" .) }}{{ end }}
{{- printf "[%s]" (join ", " $items) }}
{{- else }}
{{- fail (printf "kafka-share-proxy: config value %v is not a string, number, boolean or list" $v) }}
{{- end }}
{{- end }}

{{/* Options the chart sets from its own values; `config:` may not set them (nor any password). */}}
{{- define "kafka-share-proxy.managedKeys" -}}
{{- toJson (list "upstream" "listen" "advertised-host" "broker-port-base" "metrics-port" "metrics-host" "log-level" "log-json" "disable-share-groups" "config"
  "listener-ssl-certificate-location" "listener-ssl-key-location" "listener-ssl-key-password" "listener-ssl-key-password-file"
  "listener-ssl-ca-location" "listener-ssl-client-auth" "listener-ssl-min-version" "listener-ssl-reload-interval-ms" "peer-ssl-ca-location"
  "upstream-security-protocol" "upstream-ssl-ca-location" "upstream-ssl-certificate-location" "upstream-ssl-key-location"
  "upstream-ssl-key-password" "upstream-ssl-key-password-file" "upstream-ssl-endpoint-identification-algorithm"
  "upstream-sasl-mechanism" "upstream-sasl-username" "upstream-sasl-password" "upstream-sasl-password-file") }}
{{- end }}

{{/* Refuses values that would render a proxy that cannot start, or a chart that breaks its promises. */}}
{{- define "kafka-share-proxy.validate" -}}
{{- $v := .Values }}
{{- if not $v.upstream.bootstrapServers }}
{{- fail "kafka-share-proxy: upstream.bootstrapServers is required (the Kafka cluster's bootstrap host:port list)" }}
{{- end }}
{{- $scaleOut := and (hasKey $v "scaleOut") $v.scaleOut.enabled }}
{{- if and (gt (int $v.replicaCount) 1) (not $scaleOut) }}
{{- fail "kafka-share-proxy: replicaCount above 1 needs scaleOut.enabled: two independent proxies over one state topic would both own the share state" }}
{{- end }}
{{- if and $scaleOut (include "kafka-share-proxy.sidecar" .) }}
{{- fail "kafka-share-proxy: scaleOut.enabled runs the proxies as a StatefulSet of their own; it cannot be combined with sidecar mode" }}
{{- end }}
{{- $protocol := $v.upstream.securityProtocol }}
{{- $upstreamTls := or (eq $protocol "SSL") (eq $protocol "SASL_SSL") }}
{{- if and $v.upstream.tls.existingSecret (not $upstreamTls) }}
{{- fail (printf "kafka-share-proxy: upstream.tls.existingSecret is set but upstream.securityProtocol is %s (SSL or SASL_SSL use it)" $protocol) }}
{{- end }}
{{- if and $v.upstream.tls.clientCertificate (not $v.upstream.tls.existingSecret) }}
{{- fail "kafka-share-proxy: upstream.tls.clientCertificate needs upstream.tls.existingSecret" }}
{{- end }}
{{- if hasPrefix "SASL_" $protocol }}
{{- if not $v.upstream.sasl.username }}
{{- fail (printf "kafka-share-proxy: upstream.securityProtocol %s needs upstream.sasl.username (the proxy's service user)" $protocol) }}
{{- end }}
{{- if not $v.upstream.sasl.existingSecret }}
{{- fail (printf "kafka-share-proxy: upstream.securityProtocol %s needs upstream.sasl.existingSecret (a Secret holding the service user's password)" $protocol) }}
{{- end }}
{{- end }}
{{- if and (ne $v.listener.tls.clientAuth "none") (not $v.listener.tls.existingSecret) }}
{{- fail (printf "kafka-share-proxy: listener.tls.clientAuth %s needs listener.tls.existingSecret (TLS listeners)" $v.listener.tls.clientAuth) }}
{{- end }}
{{- if and (include "kafka-share-proxy.hasService" .) (include "kafka-share-proxy.loopback" .) (not $v.service.exposeMetrics) }}
{{- fail (printf "kafka-share-proxy: the Service would have no port: the Kafka ports of a proxy listening on %s are not reachable from outside its pod and service.exposeMetrics is false; set proxy.listenHost (e.g. 0.0.0.0) and proxy.advertisedHost to serve Kafka through the Service" (include "kafka-share-proxy.listenHost" .)) }}
{{- end }}
{{- $metricsHost := include "kafka-share-proxy.metricsHost" . }}
{{- if include "kafka-share-proxy.isLoopback" $metricsHost }}
{{- if or $v.startupProbe.enabled $v.livenessProbe.enabled $v.readinessProbe.enabled }}
{{- fail (printf "kafka-share-proxy: proxy.metricsHost %s: the kubelet's HTTP probes come to the pod IP; leave proxy.metricsHost empty (0.0.0.0) or disable the probes" $metricsHost) }}
{{- end }}
{{- if and (include "kafka-share-proxy.hasService" .) $v.service.exposeMetrics }}
{{- fail (printf "kafka-share-proxy: proxy.metricsHost %s cannot be reached through the Service's metrics port; leave proxy.metricsHost empty (0.0.0.0) or set service.exposeMetrics=false" $metricsHost) }}
{{- end }}
{{- end }}
{{- $base := int (include "kafka-share-proxy.brokerPortBase" .) }}
{{- $port := int $v.proxy.port }}
{{- $metrics := int $v.proxy.metricsPort }}
{{- range $v.proxy.brokerNodeIds }}
{{- $p := add $base (int .) }}
{{- if gt $p 65535 }}
{{- fail (printf "kafka-share-proxy: broker %d would listen on port %d (brokerPortBase %d + id), beyond 65535" (int .) $p $base) }}
{{- end }}
{{- if or (eq $p $port) (eq $p $metrics) }}
{{- fail (printf "kafka-share-proxy: broker %d's port %d (brokerPortBase + id) collides with proxy.port or proxy.metricsPort" (int .) $p) }}
{{- end }}
{{- end }}
{{- if eq $port $metrics }}
{{- fail "kafka-share-proxy: proxy.port and proxy.metricsPort must differ" }}
{{- end }}
{{- if and (include "kafka-share-proxy.hasService" .) (eq $v.service.type "NodePort") (not (include "kafka-share-proxy.loopback" .)) }}
{{- range (include "kafka-share-proxy.kafkaPorts" . | fromJsonArray) }}
{{- if or (lt (int .port) 30000) (gt (int .port) 32767) }}
{{- fail (printf "kafka-share-proxy: service.type NodePort: port %s=%d must be in the node-port range 30000-32767, since each nodePort equals its port (the proxy advertises its own ports); e.g. proxy.port: 30092" .name (int .port)) }}
{{- end }}
{{- end }}
{{- end }}
{{- $managed := include "kafka-share-proxy.managedKeys" . | fromJsonArray }}
{{- range $key, $_ := $v.config }}
{{- $normal := $key | replace "_" "-" | lower }}
{{- if has $normal $managed }}
{{- fail (printf "kafka-share-proxy: config.%s is set by the chart from its own values (see values.yaml); set it there" $key) }}
{{- end }}
{{- if and (contains "password" $normal) (not (hasSuffix "-file" $normal)) }}
{{- fail (printf "kafka-share-proxy: config.%s: passwords do not go into the ConfigMap; mount a Secret and use the *-file option" $key) }}
{{- end }}
{{- end }}
{{- end }}

{{- define "kafka-share-proxy.listenAddress" -}}
{{- $host := include "kafka-share-proxy.listenHost" . }}
{{- if contains ":" $host }}[{{ $host }}]{{ else }}{{ $host }}{{ end }}:{{ int .Values.proxy.port }}
{{- end }}

{{- define "kafka-share-proxy.proxyToml" -}}
{{- include "kafka-share-proxy.validate" . }}
{{- $v := .Values }}
{{- $dir := include "kafka-share-proxy.secretsDir" . -}}
# share-proxy serve options rendered by the kafka-share-proxy chart (values.yaml); read over the
# image's defaults. Keys are the flags without "--" (share-proxy serve --help).
upstream = {{ include "kafka-share-proxy.tomlValue" $v.upstream.bootstrapServers }}
listen = {{ include "kafka-share-proxy.listenAddress" . | toJson }}
advertised-host = {{ include "kafka-share-proxy.advertisedHost" . | toJson }}
broker-port-base = {{ include "kafka-share-proxy.brokerPortBase" . }}
metrics-port = {{ int $v.proxy.metricsPort }}
metrics-host = {{ include "kafka-share-proxy.metricsHost" . | toJson }}
log-level = {{ $v.proxy.logLevel | toJson }}
log-json = {{ $v.proxy.logJson }}
{{- if not $v.proxy.shareGroups }}
disable-share-groups = true
{{- end }}
{{- with $v.listener.tls }}
{{- if .existingSecret }}

# Listener TLS from Secret {{ .existingSecret }}
listener-ssl-certificate-location = {{ printf "%s/listener-tls/%s" $dir .certKey | toJson }}
listener-ssl-key-location = {{ printf "%s/listener-tls/%s" $dir .keyKey | toJson }}
{{- if .keyPasswordKey }}
listener-ssl-key-password-file = {{ printf "%s/listener-tls/%s" $dir .keyPasswordKey | toJson }}
{{- end }}
{{- if ne .clientAuth "none" }}
listener-ssl-ca-location = {{ printf "%s/listener-tls/%s" $dir .caKey | toJson }}
{{- end }}
listener-ssl-client-auth = {{ .clientAuth | toJson }}
listener-ssl-min-version = {{ .minVersion | toJson }}
listener-ssl-reload-interval-ms = {{ int .reloadIntervalMs }}
{{- if and (hasKey $v "scaleOut") $v.scaleOut.enabled }}
# Instances call each other on these listeners; the Secret's CA verifies the other pods' certificates.
peer-ssl-ca-location = {{ printf "%s/listener-tls/%s" $dir .caKey | toJson }}
{{- end }}
{{- end }}
{{- end }}

# Upstream cluster
upstream-security-protocol = {{ $v.upstream.securityProtocol | toJson }}
{{- if or (eq $v.upstream.securityProtocol "SSL") (eq $v.upstream.securityProtocol "SASL_SSL") }}
{{- with $v.upstream.tls }}
upstream-ssl-endpoint-identification-algorithm = {{ .endpointIdentificationAlgorithm | toJson }}
{{- if .existingSecret }}
upstream-ssl-ca-location = {{ printf "%s/upstream-tls/%s" $dir .caKey | toJson }}
{{- if .clientCertificate }}
upstream-ssl-certificate-location = {{ printf "%s/upstream-tls/%s" $dir .certKey | toJson }}
upstream-ssl-key-location = {{ printf "%s/upstream-tls/%s" $dir .keyKey | toJson }}
{{- if .keyPasswordKey }}
upstream-ssl-key-password-file = {{ printf "%s/upstream-tls/%s" $dir .keyPasswordKey | toJson }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}
{{- if hasPrefix "SASL_" $v.upstream.securityProtocol }}
{{- with $v.upstream.sasl }}
upstream-sasl-mechanism = {{ .mechanism | toJson }}
upstream-sasl-username = {{ .username | toJson }}
upstream-sasl-password-file = {{ printf "%s/upstream-sasl/%s" $dir .passwordKey | toJson }}
{{- end }}
{{- end }}
{{- with $v.config }}

# config:
{{- range $key, $value := . }}
{{ $key | replace "_" "-" }} = {{ include "kafka-share-proxy.tomlValue" $value }}
{{- end }}
{{- end }}
{{ end }}

{{/* sha256 of proxy.toml, the ConfigMap's only data: a pod annotation, so a config change rolls the pod. */}}
{{- define "kafka-share-proxy.configChecksum" -}}
{{- include "kafka-share-proxy.proxyToml" . | sha256sum }}
{{- end }}
