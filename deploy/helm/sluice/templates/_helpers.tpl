{{/* The chart's name, or nameOverride. */}}
{{- define "sluice.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The release's objects are named after it, with the chart's name unless the release already has it. */}}
{{- define "sluice.fullname" -}}
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

{{- define "sluice.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels of every object. */}}
{{- define "sluice.labels" -}}
helm.sh/chart: {{ include "sluice.chart" . }}
app.kubernetes.io/name: {{ include "sluice.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: sluice
{{- end }}

{{/* Selector labels of one component (worker, api): pass (list $ "worker"). */}}
{{- define "sluice.selectorLabels" -}}
{{- $ := index . 0 -}}
app.kubernetes.io/name: {{ include "sluice.name" $ }}
app.kubernetes.io/instance: {{ $.Release.Name }}
app.kubernetes.io/component: {{ index . 1 }}
{{- end }}

{{- define "sluice.image" -}}
{{- if .Values.image.digest -}}
{{ .Values.image.repository }}@{{ .Values.image.digest }}
{{- else -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end }}
{{- end }}

{{/* A number as the CLI parses it: whole numbers without an exponent (YAML numbers arrive as float64, which would print 1e+06). */}}
{{- define "sluice.number" -}}
{{- if eq (float64 .) (floor .) }}{{ int64 . }}{{ else }}{{ . }}{{ end }}
{{- end }}

{{- define "sluice.topic" -}}
{{- required "topic.name is required: the Kafka topic the workers drain" .Values.topic.name }}
{{- end }}

{{/* The workers' consumer group: topic.group, else sluice-<topic> as sluice names it. */}}
{{- define "sluice.group" -}}
{{- .Values.topic.group | default (printf "sluice-%s" (include "sluice.topic" .)) }}
{{- end }}

{{- define "sluice.typesFile" -}}
{{- printf "%s/types.yaml" (trimSuffix "/" .Values.types.mountPath) }}
{{- end }}

{{- define "sluice.secretName" -}}
{{- .Values.secrets.existingSecret | default (printf "%s-credentials" (include "sluice.fullname" .)) }}
{{- end }}

{{/* Whether a Secret holds credentials: an existing one, or values to create one from. */}}
{{- define "sluice.hasSecret" -}}
{{- if or .Values.secrets.existingSecret (include "sluice.createSecret" .) }}true{{ end }}
{{- end }}

{{- define "sluice.createSecret" -}}
{{- if not .Values.secrets.existingSecret }}
{{- range $k, $v := .Values.secrets.create }}{{ if $v }}true{{ end }}{{ end }}
{{- end }}
{{- end }}

{{/*
Plain environment variables, sorted: pass (list $chartSet $userSet); the
user's (worker.env, api.env) win over the chart's.
*/}}
{{- define "sluice.env" -}}
{{- $env := merge (deepCopy (index . 1)) (index . 0) }}
{{- range $k := keys $env | sortAlpha }}
- name: {{ $k }}
  value: {{ index $env $k | toString | quote }}
{{- end }}
{{- end }}

{{/*
One credential as an environment variable from the Secret: pass
(list $ "VARIABLE" "keyName"). With an existing Secret the key may be
missing (optional); with a created one only keys given a value are passed.
*/}}
{{- define "sluice.secretEnv" -}}
{{- $ := index . 0 }}
{{- $var := index . 1 }}
{{- $key := index . 2 }}
{{- if or $.Values.secrets.existingSecret (index $.Values.secrets.create $key) }}
- name: {{ $var }}
  valueFrom:
    secretKeyRef:
      name: {{ include "sluice.secretName" $ }}
      key: {{ index $.Values.secrets.keys $key }}
      {{- if $.Values.secrets.existingSecret }}
      optional: true
      {{- end }}
{{- end }}
{{- end }}

{{/*
The credentials a component (worker, api) takes from the Secret: pass
(list $ "worker"). The Kafka SASL and Redis passwords only when enabled:
the sluice this chart was written for does not read them yet.
*/}}
{{- define "sluice.credentials" -}}
{{- $ := index . 0 }}
{{- if eq (index . 1) "worker" }}
{{- include "sluice.secretEnv" (list $ "SLUICE_SINK_AUTHORIZATION" "sinkAuthorization") }}
{{- include "sluice.secretEnv" (list $ "SLUICE_AZURE_ACCOUNT_KEY" "azureAccountKey") }}
{{- include "sluice.secretEnv" (list $ "PGPASSWORD" "pgPassword") }}
{{- if $.Values.redis.auth.enabled }}
{{- include "sluice.secretEnv" (list $ "SLUICE_REDIS_PASSWORD" "redisPassword") }}
{{- end }}
{{- else }}
{{- include "sluice.secretEnv" (list $ "SLUICE_API_TOKEN" "apiToken") }}
{{- end }}
{{- if $.Values.kafka.sasl.enabled }}
{{- include "sluice.secretEnv" (list $ "SLUICE_KAFKA_SASL_PASSWORD" "kafkaSaslPassword") }}
{{- end }}
{{- end }}

{{/* The pool's and topic's largest worker count: the fewer of the topic's and the pool's partitions. */}}
{{- define "sluice.maxWorkers" -}}
{{- min (int64 .Values.topic.partitions) (int64 .Values.pool.partitions) }}
{{- end }}

{{/* The most workers KEDA may run: keda.maxReplicaCount, capped at sluice.maxWorkers. */}}
{{- define "sluice.kedaMax" -}}
{{- $max := int64 (include "sluice.maxWorkers" .) }}
{{- if and .Values.keda.maxReplicaCount (lt (int64 .Values.keda.maxReplicaCount) $max) }}
{{- $max = int64 .Values.keda.maxReplicaCount }}
{{- end }}
{{- $max }}
{{- end }}

{{/* Checks that fail the render with a message naming the value. */}}
{{- define "sluice.validate" -}}
{{- $_ := required "kafka.brokers is required: Kafka bootstrap brokers, host:port[,host:port...]" .Values.kafka.brokers }}
{{- $_ := required "redis.addr is required: the Redis holding the capacity pools, host:port" .Values.redis.addr }}
{{- $_ := required "sink.url is required: the throttled service, e.g. http://sink:8088 or postgres://user@db:5432/app?table=t" .Values.sink.url }}
{{- $_ := include "sluice.topic" . }}
{{- if le (float64 (required "pool.capacity is required: the service's provisioned rate in units/s" .Values.pool.capacity)) 0.0 }}
{{- fail "pool.capacity is required: the service's provisioned rate in units/s, > 0" }}
{{- end }}
{{- if lt (int64 .Values.pool.partitions) 1 }}
{{- fail "pool.partitions must be ≥ 1" }}
{{- end }}
{{- if lt (int64 .Values.topic.partitions) 1 }}
{{- fail "topic.partitions must be ≥ 1" }}
{{- end }}
{{- $replicas := int64 .Values.worker.replicaCount }}
{{- $most := $replicas }}
{{- if .Values.keda.enabled }}
{{- $replicas = int64 .Values.keda.minReplicaCount }}
{{- $most = int64 (include "sluice.kedaMax" .) }}
{{- end }}
{{- if gt $replicas (int64 (include "sluice.maxWorkers" .)) }}
{{- fail (printf "%d worker replicas, but topic.partitions is %d and pool.partitions %d: a worker beyond either gets no Kafka partition or no capacity partition" $replicas (int64 .Values.topic.partitions) (int64 .Values.pool.partitions)) }}
{{- end }}
{{- if gt (mul (int64 .Values.pool.reservedPartitions) $most) (int64 .Values.pool.partitions) }}
{{- fail (printf "pool.reservedPartitions %d × %d workers exceeds pool.partitions %d" (int64 .Values.pool.reservedPartitions) $most (int64 .Values.pool.partitions)) }}
{{- end }}
{{- if and (or .Values.worker.type .Values.api.enabled) (not .Values.types.content) }}
{{- fail "worker.type and api.enabled need types.content, the record-types file" }}
{{- end }}
{{- if .Values.types.content }}
{{- $doc := fromYaml .Values.types.content }}
{{- if hasKey $doc "Error" }}
{{- fail (printf "types.content is not YAML: %s" $doc.Error) }}
{{- end }}
{{- end }}
{{- if .Values.worker.type }}
{{- $t := index ((fromYaml .Values.types.content).types | default dict) .Values.worker.type }}
{{- if not $t }}
{{- fail (printf "worker.type %q is not a type of types.content" .Values.worker.type) }}
{{- end }}
{{- if and $t.topic (ne $t.topic .Values.topic.name) }}
{{- fail (printf "worker.type %q produces to topic %q (types.content), but topic.name is %q: the API and the workers would use different topics" .Values.worker.type $t.topic .Values.topic.name) }}
{{- end }}
{{- end }}
{{- if hasKey .Values.types.files "types.yaml" }}
{{- fail "types.files must not hold types.yaml: that is types.content" }}
{{- end }}
{{- end }}

{{/* Pod annotations: Prometheus scraping and checksums that roll the pods when their config changes. */}}
{{- define "sluice.podAnnotations" -}}
{{- $ := index . 0 }}
{{- $port := index . 1 }}
{{- if $.Values.prometheusAnnotations }}
prometheus.io/scrape: "true"
prometheus.io/port: {{ $port | quote }}
prometheus.io/path: /metrics
{{- end }}
{{- if $.Values.types.content }}
checksum/types: {{ include (print $.Template.BasePath "/configmap.yaml") $ | sha256sum }}
{{- end }}
{{- if include "sluice.createSecret" $ }}
checksum/credentials: {{ include (print $.Template.BasePath "/secret.yaml") $ | sha256sum }}
{{- end }}
{{- end }}
