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
A list of addresses as the CLI takes it (host:port,host:port): a YAML list
joined with commas, or a string as it is.
*/}}
{{- define "sluice.list" -}}
{{- if kindIs "slice" . }}{{ join "," . }}{{ else if . }}{{ toString . }}{{ end }}
{{- end }}

{{/*
A container's environment as a YAML list: pass
(list $ $chartVars "worker" $userEnv). $chartVars is a dict of the chart's
plain variables, sorted by name; then the credentials from the Secret
(sluice.credentials); then $userEnv (worker.env, api.env): a map of name to
a value or to an EnvVar's body ({valueFrom: ...}), or a list of EnvVar
objects. A user's entry replaces the chart's variable of the same name and
comes last, so it may refer to the chart's as $(NAME).
*/}}
{{- define "sluice.envList" -}}
{{- $ := index . 0 }}
{{- $chart := index . 1 }}
{{- $component := index . 2 }}
{{- $userEnv := index . 3 | default dict }}
{{- $user := list }}
{{- if kindIs "slice" $userEnv }}
{{- range $userEnv }}
{{- if not (and (kindIs "map" .) .name) }}
{{- fail (printf "%s.env: each entry of a list is an EnvVar with a name (name, and value or valueFrom), got %v" $component .) }}
{{- end }}
{{- $user = append $user (deepCopy .) }}
{{- end }}
{{- else if kindIs "map" $userEnv }}
{{- range $name := keys $userEnv | sortAlpha }}
{{- $v := index $userEnv $name }}
{{- if kindIs "map" $v }}
{{- $user = append $user (merge (dict "name" $name) (deepCopy $v)) }}
{{- else }}
{{- $user = append $user (dict "name" $name "value" $v) }}
{{- end }}
{{- end }}
{{- else }}
{{- fail (printf "%s.env: a map of name to value, or a list of EnvVar objects" $component) }}
{{- end }}
{{- $names := dict }}
{{- range $user }}
{{- if hasKey . "value" }}
{{- $_ := set . "value" (include "sluice.string" .value) }}
{{- end }}
{{- $_ := set $names .name true }}
{{- end }}
{{- $out := list }}
{{- range $name := keys $chart | sortAlpha }}
{{- if not (hasKey $names $name) }}
{{- $out = append $out (dict "name" $name "value" (index $chart $name | toString)) }}
{{- end }}
{{- end }}
{{- range include "sluice.credentials" (list $ $component) | fromYamlArray }}
{{- if not (hasKey $names .name) }}
{{- $out = append $out . }}
{{- end }}
{{- end }}
{{- concat $out $user | toYaml }}
{{- end }}

{{/* A value as an environment variable's text: whole numbers without an exponent, anything else as it is. */}}
{{- define "sluice.string" -}}
{{- if or (kindIs "float64" .) (kindIs "int64" .) (kindIs "int" .) }}{{ include "sluice.number" . }}{{ else }}{{ toString . }}{{ end }}
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
(list $ "worker"). Kafka's SASL password only with a SASL mechanism, the
Sentinels' password only with Sentinel: the CLI refuses a password it
would not use.
*/}}
{{- define "sluice.credentials" -}}
{{- $ := index . 0 }}
{{- if eq (index . 1) "worker" }}
{{- include "sluice.secretEnv" (list $ "SLUICE_SINK_AUTHORIZATION" "sinkAuthorization") }}
{{- include "sluice.secretEnv" (list $ "SLUICE_AZURE_ACCOUNT_KEY" "azureAccountKey") }}
{{- include "sluice.secretEnv" (list $ "PGPASSWORD" "pgPassword") }}
{{- include "sluice.secretEnv" (list $ "SLUICE_REDIS_PASSWORD" "redisPassword") }}
{{- if $.Values.redis.sentinel.master }}
{{- include "sluice.secretEnv" (list $ "SLUICE_REDIS_SENTINEL_PASSWORD" "redisSentinelPassword") }}
{{- end }}
{{- else }}
{{- include "sluice.secretEnv" (list $ "SLUICE_API_TOKEN" "apiToken") }}
{{- end }}
{{- if $.Values.kafka.sasl.mechanism }}
{{- include "sluice.secretEnv" (list $ "SLUICE_KAFKA_SASL_PASSWORD" "kafkaSaslPassword") }}
{{- end }}
{{- end }}

{{/* The path of a file of a TLS Secret mounted at tls.mountPath: pass (list $tls "keyName"). */}}
{{- define "sluice.tlsFile" -}}
{{- $tls := index . 0 }}
{{- printf "%s/%s" (trimSuffix "/" $tls.mountPath) (index $tls (index . 1)) }}
{{- end }}

{{/* Whether a TLS block (kafka.tls, redis.tls) asks for TLS: enabled, or a file or server name given. */}}
{{- define "sluice.tlsOn" -}}
{{- if or .enabled .caKey .certKey .keyKey .serverName }}true{{ end }}
{{- end }}

{{/*
The Kafka connection's plain variables, set into a dict: pass (list $ $env).
Every component that talks to Kafka (worker, api) gets them.
*/}}
{{- define "sluice.kafkaEnv" -}}
{{- $ := index . 0 }}
{{- $env := index . 1 }}
{{- $k := $.Values.kafka }}
{{- $_ := set $env "SLUICE_BROKERS" (include "sluice.list" $k.brokers) }}
{{- if include "sluice.tlsOn" $k.tls }}
{{- $_ := set $env "SLUICE_KAFKA_TLS" "true" }}
{{- end }}
{{- range $key, $var := dict "caKey" "SLUICE_KAFKA_CA_FILE" "certKey" "SLUICE_KAFKA_CERT_FILE" "keyKey" "SLUICE_KAFKA_KEY_FILE" }}
{{- if index $k.tls $key }}
{{- $_ := set $env $var (include "sluice.tlsFile" (list $k.tls $key)) }}
{{- end }}
{{- end }}
{{- if $k.tls.serverName }}
{{- $_ := set $env "SLUICE_KAFKA_SERVER_NAME" $k.tls.serverName }}
{{- end }}
{{- if $k.sasl.mechanism }}
{{- $_ := set $env "SLUICE_KAFKA_SASL_MECHANISM" (upper $k.sasl.mechanism) }}
{{- $_ := set $env "SLUICE_KAFKA_SASL_USERNAME" $k.sasl.username }}
{{- end }}
{{- end }}

{{/* The Redis connection's plain variables, set into a dict: pass (list $ $env). */}}
{{- define "sluice.redisEnv" -}}
{{- $ := index . 0 }}
{{- $env := index . 1 }}
{{- $r := $.Values.redis }}
{{- if $r.sentinel.master }}
{{- $_ := set $env "SLUICE_REDIS_SENTINEL_MASTER" $r.sentinel.master }}
{{- $_ := set $env "SLUICE_REDIS_SENTINEL_ADDRS" (include "sluice.list" $r.sentinel.addrs) }}
{{- if $r.sentinel.username }}
{{- $_ := set $env "SLUICE_REDIS_SENTINEL_USERNAME" $r.sentinel.username }}
{{- end }}
{{- else }}
{{- $_ := set $env "SLUICE_REDIS_ADDR" (include "sluice.list" $r.addr) }}
{{- end }}
{{- if $r.username }}
{{- $_ := set $env "SLUICE_REDIS_USERNAME" $r.username }}
{{- end }}
{{- if $r.tls.enabled }}
{{- $_ := set $env "SLUICE_REDIS_TLS" "true" }}
{{- end }}
{{- range $key, $var := dict "caKey" "SLUICE_REDIS_CA_FILE" "certKey" "SLUICE_REDIS_CERT_FILE" "keyKey" "SLUICE_REDIS_KEY_FILE" }}
{{- if index $r.tls $key }}
{{- $_ := set $env $var (include "sluice.tlsFile" (list $r.tls $key)) }}
{{- end }}
{{- end }}
{{- if $r.tls.serverName }}
{{- $_ := set $env "SLUICE_REDIS_SERVER_NAME" $r.tls.serverName }}
{{- end }}
{{- end }}

{{/*
The TLS Secrets a component mounts, as "name: tls block" YAML: pass
(list $ "worker"). The API talks to Kafka only.
*/}}
{{- define "sluice.tlsSecrets" -}}
{{- $ := index . 0 }}
{{- if $.Values.kafka.tls.secretName }}
kafka-tls: {{ toJson $.Values.kafka.tls }}
{{- end }}
{{- if and (eq (index . 1) "worker") $.Values.redis.tls.secretName }}
redis-tls: {{ toJson $.Values.redis.tls }}
{{- end }}
{{- end }}

{{/* The mounts of the TLS Secrets: pass (list $ "worker"). */}}
{{- define "sluice.tlsMounts" -}}
{{- range $name, $tls := include "sluice.tlsSecrets" . | fromYaml }}
- name: {{ $name }}
  mountPath: {{ $tls.mountPath }}
  readOnly: true
{{- end }}
{{- end }}

{{/* The volumes of the TLS Secrets: pass (list $ "worker"). */}}
{{- define "sluice.tlsVolumes" -}}
{{- range $name, $tls := include "sluice.tlsSecrets" . | fromYaml }}
- name: {{ $name }}
  secret:
    secretName: {{ $tls.secretName }}
{{- end }}
{{- end }}

{{/* KEDA's name of a SASL mechanism (its kafka trigger's sasl). */}}
{{- define "sluice.kedaSASL" -}}
{{- get (dict "PLAIN" "plaintext" "SCRAM-SHA-256" "scram_sha256" "SCRAM-SHA-512" "scram_sha512") (upper .Values.kafka.sasl.mechanism) }}
{{- end }}

{{/*
Whether KEDA scales the workers: keda.enabled, and the cluster serves
KEDA's API. Without it the workers run worker.replicaCount replicas.
*/}}
{{- define "sluice.keda" -}}
{{- if and .Values.keda.enabled (.Capabilities.APIVersions.Has "keda.sh/v1alpha1") }}true{{ end }}
{{- end }}

{{/* Whether KEDA needs a TriggerAuthentication: SASL, or TLS files. */}}
{{- define "sluice.kedaAuth" -}}
{{- if and (include "sluice.keda" .) (or .Values.kafka.sasl.mechanism .Values.kafka.tls.caKey .Values.kafka.tls.certKey) }}true{{ end }}
{{- end }}

{{/* The workers' service account: serviceAccount.name, else the release's full name when the chart creates it, else the namespace's default. */}}
{{- define "sluice.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- .Values.serviceAccount.name | default (include "sluice.fullname" .) }}
{{- else }}
{{- .Values.serviceAccount.name | default "default" }}
{{- end }}
{{- end }}

{{/* Checks of a component's extra volumes: pass (list "worker" $w). */}}
{{- define "sluice.validateExtras" -}}
{{- $name := index . 0 }}
{{- $c := index . 1 }}
{{- range $c.extraVolumes }}
{{- if not .name }}
{{- fail (printf "%s.extraVolumes: each volume needs a name" $name) }}
{{- end }}
{{- if has .name (list "tmp" "types" "kafka-tls" "redis-tls") }}
{{- fail (printf "%s.extraVolumes: the name %q is the chart's own volume; choose another" $name .name) }}
{{- end }}
{{- end }}
{{- end }}

{{/* Checks of a TLS block: pass (list "kafka.tls" $tls). */}}
{{- define "sluice.validateTLS" -}}
{{- $name := index . 0 }}
{{- $tls := index . 1 }}
{{- if and (or $tls.caKey $tls.certKey $tls.keyKey) (not $tls.secretName) }}
{{- fail (printf "%s.caKey, certKey and keyKey name files of a Secret: set %s.secretName" $name $name) }}
{{- end }}
{{- if ne (empty $tls.certKey) (empty $tls.keyKey) }}
{{- fail (printf "%s.certKey and %s.keyKey: a client certificate needs both" $name $name) }}
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
{{- $_ := required "kafka.brokers is required: Kafka bootstrap brokers, a list of host:port ({b-1:9092,b-2:9092} with --set)" (include "sluice.list" .Values.kafka.brokers) }}
{{- $r := .Values.redis }}
{{- if $r.sentinel.master }}
{{- $_ := required "redis.sentinel.addrs is required with redis.sentinel.master: the Sentinels, a list of host:port" (include "sluice.list" $r.sentinel.addrs) }}
{{- if include "sluice.list" $r.addr }}
{{- fail "redis.addr and redis.sentinel.master: give one (with Sentinel the master's address comes from the Sentinels)" }}
{{- end }}
{{- else }}
{{- $_ := required "redis.addr is required: the Redis holding the capacity pools, host:port or a redis:// or rediss:// URL (or redis.sentinel.master and addrs)" (include "sluice.list" $r.addr) }}
{{- if and (include "sluice.tlsOn" $r.tls) (contains "redis://" (include "sluice.list" $r.addr)) }}
{{- fail "redis.tls with a redis:// address: use rediss:// (the URL's scheme decides)" }}
{{- end }}
{{- end }}
{{- include "sluice.validateTLS" (list "kafka.tls" .Values.kafka.tls) }}
{{- include "sluice.validateTLS" (list "redis.tls" $r.tls) }}
{{- with .Values.kafka.sasl }}
{{- if .mechanism }}
{{- if not (has (upper .mechanism) (list "PLAIN" "SCRAM-SHA-256" "SCRAM-SHA-512")) }}
{{- fail (printf "kafka.sasl.mechanism %q: want PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512" .mechanism) }}
{{- end }}
{{- $_ := required "kafka.sasl.username is required with kafka.sasl.mechanism" .username }}
{{- if not (or $.Values.secrets.existingSecret $.Values.secrets.create.kafkaSaslPassword) }}
{{- fail "kafka.sasl.mechanism needs the password: secrets.create.kafkaSaslPassword, or secrets.existingSecret with the key secrets.keys.kafkaSaslPassword" }}
{{- end }}
{{- end }}
{{- end }}
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
{{- if include "sluice.keda" . }}
{{- $replicas = int64 .Values.keda.minReplicaCount }}
{{- $most = int64 (include "sluice.kedaMax" .) }}
{{- end }}
{{- if gt $replicas (int64 (include "sluice.maxWorkers" .)) }}
{{- fail (printf "%d worker replicas, but topic.partitions is %d and pool.partitions %d: a worker beyond either gets no Kafka partition or no capacity partition" $replicas (int64 .Values.topic.partitions) (int64 .Values.pool.partitions)) }}
{{- end }}
{{- if gt (mul (int64 .Values.pool.reservedPartitions) $most) (int64 .Values.pool.partitions) }}
{{- fail (printf "pool.reservedPartitions %d × %d workers exceeds pool.partitions %d" (int64 .Values.pool.reservedPartitions) $most (int64 .Values.pool.partitions)) }}
{{- end }}
{{- if not (has .Values.worker.priority (list "high" "normal" "low")) }}
{{- fail (printf "worker.priority %q: want high, normal or low" .Values.worker.priority) }}
{{- end }}
{{- if lt (int64 .Values.worker.weight) 1 }}
{{- fail (printf "worker.weight %v: want a positive integer" .Values.worker.weight) }}
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
{{- include "sluice.validateExtras" (list "worker" .Values.worker) }}
{{- include "sluice.validateExtras" (list "api" .Values.api) }}
{{- with .Values.pdb.unhealthyPodEvictionPolicy }}
{{- if not (has . (list "IfHealthyBudget" "AlwaysAllow")) }}
{{- fail (printf "pdb.unhealthyPodEvictionPolicy %q: want IfHealthyBudget or AlwaysAllow (or empty)" .) }}
{{- end }}
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
