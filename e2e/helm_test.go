package e2e

// Checks the Helm chart under deploy/helm/sluice without a cluster: it is
// rendered by Helm's own library (client-only dry run, as `helm template`
// does) and linted by Helm's linter, every rendered object is decoded
// strictly (an unknown or duplicate field is an error) into its upstream
// Go type (k8s.io/api, KEDA's ScaledObject), and every sluice command,
// flag and SLUICE_* variable the pods get is checked against the `--help`
// of a freshly built sluice binary. Like compose_test.go it has no build
// tag: it runs with `go test ./...`.

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	kedav1alpha1 "github.com/kedacore/keda/v2/apis/keda/v1alpha1"
	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/pflag"
	"github.com/stretchr/testify/require"
	"helm.sh/helm/v3/pkg/action"
	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	helmvalues "helm.sh/helm/v3/pkg/cli/values"
	"helm.sh/helm/v3/pkg/lint"
	"helm.sh/helm/v3/pkg/lint/support"
	"helm.sh/helm/v3/pkg/releaseutil"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
	"mvdan.cc/sh/v3/expand"
	"mvdan.cc/sh/v3/syntax"
	kjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"

	"github.com/sluicehq/sluice/api"
	"github.com/sluicehq/sluice/httpserver"
	"github.com/sluicehq/sluice/ingest"
	"github.com/sluicehq/sluice/metrics"
	"github.com/sluicehq/sluice/recordtype"
	"github.com/sluicehq/sluice/sink"
)

const (
	helmRelease   = "quakes"
	helmNamespace = "ingest"
)

// helmRequired are the values the chart cannot render without; the minimal
// install sets exactly these.
const helmRequired = `
kafka: {brokers: "kafka:9092"}
redis: {addr: "redis:6379"}
sink: {url: "http://sink:8088"}
pool: {capacity: 2000}
topic: {name: earthquakes}
`

// helmEverything turns every optional part on: the API, KEDA, the record
// types, credentials in a Secret the chart creates, the PDB, and every
// security setting of Kafka (SCRAM over TLS with a private CA and a client
// certificate) and Redis (an ACL user over TLS to three masters, with a
// client certificate).
const helmEverything = `
image: {repository: registry.example/sluice, tag: "1.2.3"}
kafka:
  brokers: ["kafka-0.kafka:9093", "kafka-1.kafka:9093"]
  tls: {enabled: true, secretName: kafka-tls, caKey: ca.crt, certKey: tls.crt, keyKey: tls.key, serverName: kafka.internal}
  sasl: {mechanism: SCRAM-SHA-512, username: sluice-quakes}
redis:
  addr: ["rediss://redis-a:6380", "rediss://redis-b:6380", "rediss://redis-c:6380/0"]
  username: sluice
  tls: {secretName: redis-tls, mountPath: /etc/sluice/redis-certs, caKey: ca.pem, certKey: client.pem, keyKey: client-key.pem, serverName: redis.internal}
sink: {url: "https://ingest.example.com/v1"}
pool:
  name: quakes-interactive
  capacity: 2000000
  unit: bytes
  partitions: 24
  leaseTTL: 20s
  reservedPartitions: 1
topic: {name: earthquakes, partitions: 12}
worker:
  type: earthquake
  idField: id
  priority: high
  weight: 2
  graceSeconds: 30
  metricsPort: 9464
  env: {SLUICE_BATCH_SIZE: "500", SLUICE_SINK_KEY_STRATEGY: "hash-prefix:4"}
  extraArgs: ["--concurrency=8"]
pdb: {enabled: true, maxUnavailable: 1}
api: {enabled: true, port: 8081, maxBody: 1048576, env: {SLUICE_LOG_LEVEL: debug}}
keda: {enabled: true, minReplicaCount: 2, maxReplicaCount: 50, lagThreshold: 5000}
secrets:
  create:
    sinkAuthorization: "Bearer not-a-real-token"
    azureAccountKey: "bm90LWEta2V5"
    pgPassword: "not-a-password"
    apiToken: "not-an-api-token"
    kafkaSaslPassword: "not-the-kafka-password"
    redisPassword: "not-the-redis-password"
`

// helmSentinel reaches Redis through Sentinel, over TLS, each with its own
// credentials, and Kafka with SASL PLAIN over TLS and the system's roots.
const helmSentinel = `
kafka:
  tls: {enabled: true}
  sasl: {mechanism: plain, username: "$ConnectionString"}
redis:
  addr: ""
  username: sluice
  tls: {enabled: true, secretName: redis-tls, caKey: ca.crt}
  sentinel: {master: mymaster, addrs: ["sentinel-0:26379", "sentinel-1:26379"], username: sentinel-user}
keda: {enabled: true, minReplicaCount: 1, maxReplicaCount: 4}
secrets:
  create:
    kafkaSaslPassword: "Endpoint=sb://not-a-namespace/;SharedAccessKey=not-a-key"
    redisPassword: "not-the-redis-password"
    redisSentinelPassword: "not-the-sentinel-password"
`

// helmExistingSecret uses a Secret the chart does not create, and Kafka
// with SASL, whose password is in that Secret.
const helmExistingSecret = `
secrets: {existingSecret: sluice-credentials}
kafka: {sasl: {mechanism: SCRAM-SHA-256, username: sluice}}
`

func TestHelmChart(t *testing.T) {
	h := newHelmChart(t)
	t.Run("required values", h.testRequiredValues)
	t.Run("refuses what cannot work", h.testRefusals)
	t.Run("minimal install", h.testMinimalInstall)
	t.Run("everything on", h.testEverythingOn)
	t.Run("Sentinel, SASL PLAIN and KEDA", h.testSentinel)
	t.Run("every combination of the connection settings", h.testConnectionCombinations)
	t.Run("existing secret", h.testExistingSecret)
	t.Run("every combination of the platform options", h.testPlatformCombinations)
	t.Run("env, envFrom and extra volumes", h.testExtras)
	t.Run("KEDA only where the cluster serves it", h.testKEDAOnlyWhereServed)
	t.Run("the PDB lets unready workers go", h.testPDBEvictionPolicy)
	t.Run("every sink scheme", h.testSinkSchemes)
	t.Run("the documented install commands", h.testREADMECommands)
}

// helmChart is the chart under deploy/helm/sluice, loaded, and what its
// checks share: a freshly built sluice binary and the repository's example
// record types.
type helmChart struct {
	root   string // the repository
	dir    string // the chart's directory
	chrt   *chart.Chart
	sluice *sluiceCLI
	// typesYAML and schema are the record types of the repository's
	// example, as a user would pass them with --set-file.
	typesYAML, schema []byte
}

func newHelmChart(t *testing.T) *helmChart {
	t.Helper()
	root, err := filepath.Abs("..")
	require.NoError(t, err)
	chartDir := filepath.Join(root, "deploy", "helm", "sluice")
	chrt, err := loader.Load(chartDir)
	require.NoError(t, err)
	require.Equal(t, chart.APIVersionV2, chrt.Metadata.APIVersion)
	sluice := newSluiceCLI(t, root)

	typesYAML, err := os.ReadFile(filepath.Join(root, "examples", "types.yaml"))
	require.NoError(t, err)
	schema, err := os.ReadFile(filepath.Join(root, "examples", "earthquake.schema.json"))
	require.NoError(t, err)
	return &helmChart{root: root, dir: chartDir, chrt: chrt, sluice: sluice, typesYAML: typesYAML, schema: schema}
}

// withTypes adds the example's record types to vals.
func (h *helmChart) withTypes(vals chartutil.Values) chartutil.Values {
	vals["types"] = map[string]any{
		"content": string(h.typesYAML),
		"files":   map[string]any{"earthquake.schema.json": string(h.schema)},
	}
	return vals
}

// testRequiredValues checks that the chart renders nothing without each of
// its required values.
func (h *helmChart) testRequiredValues(t *testing.T) {
	_, err := renderChart(t, h.chrt, values(t))
	require.ErrorContains(t, err, "kafka.brokers is required", "the chart's defaults alone must not render")
	for _, key := range []string{"kafka.brokers", "redis.addr", "sink.url", "pool.capacity", "topic.name"} {
		vals := values(t, helmRequired)
		parent, leaf, _ := strings.Cut(key, ".")
		delete(vals[parent].(map[string]any), leaf)
		_, err := renderChart(t, h.chrt, vals)
		require.ErrorContains(t, err, key+" is required", "rendering without %s", key)
	}
}

// testRefusals checks that the chart refuses values that cannot work, each
// with an error that says why.
func (h *helmChart) testRefusals(t *testing.T) {
	for _, c := range []struct{ values, err string }{
		{"worker: {replicaCount: 7}\ntopic: {partitions: 6}", "7 worker replicas, but topic.partitions is 6"},
		{"worker: {replicaCount: 4}\npool: {partitions: 3}", "4 worker replicas, but topic.partitions is 6 and pool.partitions 3"},
		{"keda: {enabled: true, minReplicaCount: 8}", "8 worker replicas"},
		{"pool: {reservedPartitions: 11}", "pool.reservedPartitions 11 × 2 workers exceeds pool.partitions 20"},
		{"worker: {type: earthquake}", "need types.content"},
		{"worker: {priority: urgent}", `worker.priority "urgent": want high, normal or low`},
		{"worker: {weight: 0}", "worker.weight 0: want a positive integer"},
		{"api: {enabled: true}", "need types.content"},
		{"kafka: {sasl: {mechanism: GSSAPI, username: u}}\nsecrets: {create: {kafkaSaslPassword: p}}", `kafka.sasl.mechanism "GSSAPI": want PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512`},
		{"kafka: {sasl: {mechanism: SCRAM-SHA-256}}\nsecrets: {create: {kafkaSaslPassword: p}}", "kafka.sasl.username is required"},
		{"kafka: {sasl: {mechanism: SCRAM-SHA-256, username: u}}", "kafka.sasl.mechanism needs the password"},
		{"kafka: {tls: {enabled: true, caKey: ca.crt}}", "kafka.tls.caKey, certKey and keyKey name files of a Secret: set kafka.tls.secretName"},
		{"kafka: {tls: {secretName: t, certKey: tls.crt}}", "kafka.tls.certKey and kafka.tls.keyKey: a client certificate needs both"},
		{"redis: {addr: 'redis://cache:6379', tls: {enabled: true}}", "redis.tls with a redis:// address: use rediss://"},
		{"redis: {addr: '', sentinel: {master: m}}", "redis.sentinel.addrs is required with redis.sentinel.master"},
		{"redis: {sentinel: {master: m, addrs: 's:26379'}}", "redis.addr and redis.sentinel.master: give one"},
		{"redis: {addr: ['rediss://a:6380', 'redis://b:6379'], tls: {enabled: true}}", "redis.tls with a redis:// address: use rediss://"},
		{"kafka: {brokers: []}", "kafka.brokers is required"},
		{"worker: {extraVolumes: [{name: tmp, emptyDir: {}}]}", `worker.extraVolumes: the name "tmp" is the chart's own volume`},
		{"api: {extraVolumes: [{emptyDir: {}}]}", "api.extraVolumes: each volume needs a name"},
		{"worker: {env: [{value: x}]}", "worker.env: each entry of a list is an EnvVar with a name"},
		{"worker: {env: 'SLUICE_BATCH_SIZE=5'}", "worker.env: a map of name to value, or a list of EnvVar objects"},
		{"pdb: {unhealthyPodEvictionPolicy: Always}", `pdb.unhealthyPodEvictionPolicy "Always": want IfHealthyBudget or AlwaysAllow`},
	} {
		_, err := renderChart(t, h.chrt, values(t, helmRequired, c.values))
		require.ErrorContains(t, err, c.err, "values %s", c.values)
	}
	// The worker's topic must be its record type's (the API produces there).
	_, err := renderChart(t, h.chrt, h.withTypes(values(t, helmRequired, "worker: {type: earthquake}\ntopic: {name: quakes}")))
	require.ErrorContains(t, err, `worker.type "earthquake" produces to topic "earthquakes" (types.content), but topic.name is "quakes"`)
	_, err = renderChart(t, h.chrt, h.withTypes(values(t, helmRequired, "worker: {type: tsunami}")))
	require.ErrorContains(t, err, `worker.type "tsunami" is not a type of types.content`)
}

// testMinimalInstall renders the required values alone: the workers, their
// PDB and their account.
func (h *helmChart) testMinimalInstall(t *testing.T) {
	vals := values(t, helmRequired)
	requireLintClean(t, h.dir, vals)
	r := mustRender(t, h.chrt, vals)
	require.ElementsMatch(t, []string{"Deployment/quakes-sluice-worker", "PodDisruptionBudget/quakes-sluice-worker", "ServiceAccount/quakes-sluice"}, r.names(),
		"by default: the workers, their PDB and their account, nothing else")

	w := checkWorker(t, h.sluice, r, nil)
	require.Equal(t, int32(2), *w.deploy.Spec.Replicas)
	require.Equal(t, "sluice:0.1.0", w.container.Image, "the image tag defaults to the chart's appVersion")
	require.Equal(t, "sluice-earthquakes", w.env["SLUICE_GROUP"], "sluice's own default group")
	require.Equal(t, "2000", w.env["SLUICE_CAPACITY"])
	require.Equal(t, "10s", w.env["SLUICE_GRACE"], "sluice's default grace")
	require.Equal(t, "normal", w.env["SLUICE_PRIORITY"], "the pods before a bulk load (low) on the same pool")
	require.Equal(t, "1", w.env["SLUICE_WEIGHT"])
	require.NotContains(t, w.env, "SLUICE_TYPES", "no types file, no --types")
	for _, e := range w.container.Env {
		require.Nil(t, e.ValueFrom, "%s: no credentials were given", e.Name)
	}
	checkPDB(t, r, w)
	require.Contains(t, r.notes, "kubectl -n ingest get pods")
}

// testEverythingOn renders helmEverything: every optional part on, every
// credential in a Secret the chart creates.
func (h *helmChart) testEverythingOn(t *testing.T) {
	vals := h.withTypes(values(t, helmEverything))
	requireLintClean(t, h.dir, vals)
	r := mustRender(t, h.chrt, vals)
	require.ElementsMatch(t, []string{
		"Deployment/quakes-sluice-worker", "PodDisruptionBudget/quakes-sluice-worker", "ScaledObject/quakes-sluice-worker",
		"TriggerAuthentication/quakes-sluice-kafka", "Deployment/quakes-sluice-api", "Service/quakes-sluice-api",
		"ConfigMap/quakes-sluice-types", "Secret/quakes-sluice-credentials", "ServiceAccount/quakes-sluice",
	}, r.names())

	secret := decodeOne[corev1.Secret](t, r, "Secret")
	require.Equal(t, map[string][]byte{
		"sink-authorization":  []byte("Bearer not-a-real-token"),
		"azure-account-key":   []byte("bm90LWEta2V5"),
		"pgpassword":          []byte("not-a-password"),
		"api-token":           []byte("not-an-api-token"),
		"kafka-sasl-password": []byte("not-the-kafka-password"),
		"redis-password":      []byte("not-the-redis-password"),
	}, secret.Data, "each credential given, under its key, and nothing else")

	w := checkWorker(t, h.sluice, r, secret)
	require.Nil(t, w.deploy.Spec.Replicas, "KEDA owns the replica count")
	require.Equal(t, "registry.example/sluice:1.2.3", w.container.Image)
	require.Equal(t, "2000000", w.env["SLUICE_CAPACITY"], "no exponent: the CLI gets the number as written")
	require.Equal(t, "30s", w.env["SLUICE_GRACE"])
	require.Equal(t, int64(50), *w.pod.TerminationGracePeriodSeconds, "grace + 20 s")
	require.Equal(t, "earthquake", w.env["SLUICE_TYPE"])
	require.Equal(t, "high", w.env["SLUICE_PRIORITY"])
	require.Equal(t, "2", w.env["SLUICE_WEIGHT"])
	require.Equal(t, "500", w.env["SLUICE_BATCH_SIZE"], "worker.env is passed through")
	require.Equal(t, []string{"worker", "--concurrency=8"}, w.container.Args)
	require.Equal(t, map[string]string{
		"SLUICE_SINK_AUTHORIZATION":  "sink-authorization",
		"SLUICE_AZURE_ACCOUNT_KEY":   "azure-account-key",
		"PGPASSWORD":                 "pgpassword",
		"SLUICE_KAFKA_SASL_PASSWORD": "kafka-sasl-password",
		"SLUICE_REDIS_PASSWORD":      "redis-password",
	}, secretRefs(t, w.container, secret.Name, false), "the worker's credentials")
	require.Equal(t, "true", w.env["SLUICE_KAFKA_TLS"])
	require.Equal(t, "/etc/sluice/kafka-tls/ca.crt", w.env["SLUICE_KAFKA_CA_FILE"])
	require.Equal(t, "/etc/sluice/redis-certs/client-key.pem", w.env["SLUICE_REDIS_KEY_FILE"])
	require.Equal(t, "SCRAM-SHA-512", w.env["SLUICE_KAFKA_SASL_MECHANISM"])
	require.Equal(t, "sluice", w.env["SLUICE_REDIS_USERNAME"])
	// The record type the worker drains is the file's, on the same topic.
	types := loadMountedTypes(t, r, w.pod, w.container, w.env["SLUICE_TYPES"])
	require.Contains(t, types, w.env["SLUICE_TYPE"])
	require.Equal(t, w.env["SLUICE_TOPIC"], types[w.env["SLUICE_TYPE"]].Topic)
	checkPDB(t, r, w)
	checkScaledObject(t, r, w)
	a := checkAPI(t, h.sluice, r, secret, w)
	require.Equal(t, map[string]string{
		"SLUICE_API_TOKEN":           "api-token",
		"SLUICE_KAFKA_SASL_PASSWORD": "kafka-sasl-password",
	}, secretRefs(t, a.container, secret.Name, false), "the API's credentials: its token, and Kafka's")
	require.NotContains(t, a.env, "SLUICE_REDIS_ADDR", "the API does not use Redis")
	require.Contains(t, r.notes, "port-forward svc/quakes-sluice-api")
}

// testSentinel renders helmSentinel: Redis through Sentinel, Kafka with
// SASL PLAIN, KEDA.
func (h *helmChart) testSentinel(t *testing.T) {
	vals := values(t, helmRequired, helmSentinel)
	requireLintClean(t, h.dir, vals)
	r := mustRender(t, h.chrt, vals)
	require.ElementsMatch(t, []string{
		"Deployment/quakes-sluice-worker", "PodDisruptionBudget/quakes-sluice-worker", "ScaledObject/quakes-sluice-worker",
		"TriggerAuthentication/quakes-sluice-kafka", "Secret/quakes-sluice-credentials", "ServiceAccount/quakes-sluice",
	}, r.names())
	secret := decodeOne[corev1.Secret](t, r, "Secret")
	w := checkWorker(t, h.sluice, r, secret)
	require.Equal(t, map[string]string{
		"SLUICE_KAFKA_SASL_PASSWORD":     "kafka-sasl-password",
		"SLUICE_REDIS_PASSWORD":          "redis-password",
		"SLUICE_REDIS_SENTINEL_PASSWORD": "redis-sentinel-password",
	}, secretRefs(t, w.container, secret.Name, false))
	require.NotContains(t, w.env, "SLUICE_REDIS_ADDR", "the Sentinels name the master")
	require.Equal(t, "PLAIN", w.env["SLUICE_KAFKA_SASL_MECHANISM"], "as the CLI spells it")
	require.NotContains(t, w.env, "SLUICE_KAFKA_CA_FILE", "the system's roots")
	checkScaledObject(t, r, w)
}

// testConnectionCombinations renders every combination of the Kafka and
// Redis connection settings, a created or existing Secret, and KEDA on or
// off.
func (h *helmChart) testConnectionCombinations(t *testing.T) {
	kafka := map[string]string{
		"plaintext":       "",
		"TLS, system CAs": "kafka: {tls: {enabled: true}}",
		"TLS, own CA":     "kafka: {tls: {secretName: kafka-tls, caKey: ca.crt}}",
		"mTLS":            "kafka: {tls: {secretName: kafka-tls, caKey: ca.crt, certKey: tls.crt, keyKey: tls.key, serverName: kafka.internal}}",
		"SASL_PLAINTEXT":  "kafka: {sasl: {mechanism: scram-sha-256, username: sluice}}",
		"SASL_SSL":        "kafka: {tls: {secretName: kafka-tls, caKey: ca.crt}, sasl: {mechanism: SCRAM-SHA-512, username: sluice}}",
	}
	redis := map[string]string{
		"host:port":         "",
		"ACL user, TLS":     "redis: {addr: 'redis-a:6380,redis-b:6380,redis-c:6380', username: sluice, tls: {enabled: true, secretName: redis-tls, caKey: ca.crt, certKey: tls.crt, keyKey: tls.key}}",
		"rediss:// URL":     "redis: {addr: 'rediss://sluice@cache:6380/0', tls: {secretName: redis-tls, caKey: ca.crt}}",
		"Sentinel over TLS": "redis: {addr: '', tls: {enabled: true}, sentinel: {master: m, addrs: 's-0:26379,s-1:26379', username: s}}",
	}
	secrets := map[string]string{
		"created":  "secrets: {create: {kafkaSaslPassword: k, redisPassword: r, redisSentinelPassword: s, apiToken: a}}",
		"existing": "secrets: {existingSecret: sluice-credentials}",
	}
	renders := 0
	for kName, kVals := range kafka {
		for rName, rVals := range redis {
			for sName, sVals := range secrets {
				for _, keda := range []bool{false, true} {
					vals := h.withTypes(values(t, helmRequired, kVals, rVals, sVals, "api: {enabled: true}",
						fmt.Sprintf("keda: {enabled: %t, minReplicaCount: 1, maxReplicaCount: 3}", keda)))
					name := fmt.Sprintf("Kafka %s, Redis %s, %s Secret, KEDA %t", kName, rName, sName, keda)
					r, err := renderChart(t, h.chrt, vals)
					require.NoError(t, err, name)
					for key, doc := range r.docs {
						decodeStrict(t, key, doc)
					}
					var secret *corev1.Secret
					if sName == "created" {
						secret = decodeOne[corev1.Secret](t, r, "Secret")
					}
					w := checkWorker(t, h.sluice, r, secret)
					checkAPI(t, h.sluice, r, secret, w)
					if keda {
						checkScaledObject(t, r, w)
					} else {
						require.NotContains(t, r.names(), "ScaledObject/quakes-sluice-worker", name)
						require.NotContains(t, r.names(), "TriggerAuthentication/quakes-sluice-kafka", name)
					}
					renders++
				}
			}
		}
	}
	t.Logf("%d combinations rendered and checked", renders)
}

// testExistingSecret renders helmExistingSecret: the pods read every
// credential from a Secret the chart does not create.
func (h *helmChart) testExistingSecret(t *testing.T) {
	vals := h.withTypes(values(t, helmRequired, helmExistingSecret, "api: {enabled: true}"))
	requireLintClean(t, h.dir, vals)
	r := mustRender(t, h.chrt, vals)
	require.NotContains(t, r.names(), "Secret/sluice-credentials", "an existing Secret is not created")
	for _, n := range r.names() {
		require.False(t, strings.HasPrefix(n, "Secret/"), "no Secret is created: %s", n)
	}
	w := checkWorker(t, h.sluice, r, nil)
	require.Equal(t, map[string]string{
		"SLUICE_SINK_AUTHORIZATION":  "sink-authorization",
		"SLUICE_AZURE_ACCOUNT_KEY":   "azure-account-key",
		"PGPASSWORD":                 "pgpassword",
		"SLUICE_KAFKA_SASL_PASSWORD": "kafka-sasl-password",
		"SLUICE_REDIS_PASSWORD":      "redis-password",
	}, secretRefs(t, w.container, "sluice-credentials", true), "every key of the existing Secret, each optional")
	a := checkAPI(t, h.sluice, r, nil, w)
	require.Equal(t, map[string]string{
		"SLUICE_API_TOKEN":           "api-token",
		"SLUICE_KAFKA_SASL_PASSWORD": "kafka-sasl-password",
	}, secretRefs(t, a.container, "sluice-credentials", true))
}

// testPlatformCombinations renders every combination of the platform
// options (service account, extras, PodMonitor, PrometheusRule, KEDA) on
// the clusters that serve them or not.
func (h *helmChart) testPlatformCombinations(t *testing.T) {
	// Each option on and off, KEDA served or not, in every combination;
	// the forms of each option take turns (an account of the chart's or
	// an existing one, worker.env as a list or a map, no KEDA API or
	// an old cluster), so that every form meets every other option.
	type form struct{ name, values string }
	accounts := [2][]form{
		{{"the default account", "serviceAccount: {create: false}"}, {"an existing account", "serviceAccount: {create: false, name: workload-identity}"}},
		{{"own account with an identity", "serviceAccount: {create: true, annotations: {eks.amazonaws.com/role-arn: 'arn:aws:iam::111122223333:role/sluice-quakes'}}"},
			{"own account, named", "serviceAccount: {create: true, name: quakes-writer}"}},
	}
	extras := [2][]form{
		{{"no extras", ""}},
		{{"env list, envFrom, volumes, API", helmExtras}, {"env map with valueFrom, API", helmEnvMap}},
	}
	podMonitor := [2][]form{{{"", ""}}, {{"PodMonitor", "podMonitor: {enabled: true, labels: {release: kube-prometheus-stack}, interval: 30s, scrapeTimeout: 10s}"}}}
	rule := [2][]form{{{"", ""}}, {{"PrometheusRule", "prometheusRule: {enabled: true, labels: {release: kube-prometheus-stack}}"}}}
	const kedaOn = "keda: {enabled: true, minReplicaCount: 1, maxReplicaCount: 3}"
	kedas := []struct {
		name, values string
		on           []cluster
	}{
		{"no KEDA", "", []cluster{fullCluster}},
		{"KEDA served", kedaOn, []cluster{fullCluster}},
		{"KEDA asked, not served", kedaOn, []cluster{bareCluster, oldCluster}},
	}
	renders := 0
	seen := map[string]bool{}
	for _, a := range accounts {
		for _, e := range extras {
			for _, pm := range podMonitor {
				for _, pr := range rule {
					for _, k := range kedas {
						pick := func(fs []form) form { return fs[renders%len(fs)] }
						parts := []form{pick(a), pick(e), pick(pm), pick(pr)}
						on := k.on[renders%len(k.on)]
						name := fmt.Sprintf("%s, %s, %s, %s, %s on %s", parts[0].name, parts[1].name, parts[2].name, parts[3].name, k.name, on.name)
						vals := h.withTypes(values(t, helmRequired, parts[0].values, parts[1].values, parts[2].values, parts[3].values, k.values))
						r, err := renderOn(t, h.chrt, vals, on)
						require.NoError(t, err, name)
						for key, doc := range r.docs {
							decodeStrict(t, key, doc)
						}
						w := checkWorker(t, h.sluice, r, nil)
						if valueBool(t, vals, "api.enabled") {
							checkAPI(t, h.sluice, r, nil, w)
						}
						for _, p := range parts {
							seen[p.name] = true
						}
						seen[on.name] = true
						renders++
					}
				}
			}
		}
	}
	require.Equal(t, 2*2*2*2*3, renders)
	for _, fs := range [][]form{accounts[0], accounts[1], extras[1]} {
		for _, f := range fs {
			require.True(t, seen[f.name], "%s was rendered", f.name)
		}
	}
	require.True(t, seen[oldCluster.name] && seen[bareCluster.name])
	t.Logf("%d combinations rendered and checked", renders)
}

// testExtras renders helmExtras and helmEnvMap: the pods' own variables,
// envFrom and extra volumes.
func (h *helmChart) testExtras(t *testing.T) {
	vals := h.withTypes(values(t, helmRequired, helmExtras))
	requireLintClean(t, h.dir, vals)
	r := mustRender(t, h.chrt, vals)
	w := checkWorker(t, h.sluice, r, nil)
	require.Equal(t, "debug", w.env["SLUICE_LOG_LEVEL"], "worker.env replaces the chart's variable")
	require.Equal(t, "/etc/sluice/sink/headers", w.env["SLUICE_SINK_HEADERS_FILE"])
	require.Equal(t, &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.name"}}, envVar(t, w.container, "POD_NAME").ValueFrom)
	require.Len(t, w.container.EnvFrom, 2)
	m := mountAt(t, w, "/etc/sluice/sink")
	require.Equal(t, "sink-headers", volume(t, w, m.Name).Secret.SecretName, "the headers file is the Secret's")
	a := checkAPI(t, h.sluice, r, nil, w)
	require.Equal(t, "warn", a.env["SLUICE_LOG_LEVEL"])
	require.NotNil(t, volume(t, a, "scratch").EmptyDir)

	// A map merges key by key across values files, and may give an
	// EnvVar's body.
	vals = h.withTypes(values(t, helmRequired, helmEnvMap, "worker: {env: {SLUICE_BATCH_SIZE: 1000000}}"))
	r = mustRender(t, h.chrt, vals)
	w = checkWorker(t, h.sluice, r, nil)
	require.Equal(t, "1000000", w.env["SLUICE_BATCH_SIZE"], "a later values file wins; numbers as the CLI parses them")
	require.Equal(t, "debug", w.env["SLUICE_LOG_LEVEL"], "and the earlier one's other keys stay")
	ref := envVar(t, w.container, "AWS_SECRET_ACCESS_KEY").ValueFrom
	require.Equal(t, "aws-credentials", ref.SecretKeyRef.Name)
}

// testKEDAOnlyWhereServed checks that the ScaledObject is rendered only on
// a cluster that serves KEDA's API, with a warning otherwise.
func (h *helmChart) testKEDAOnlyWhereServed(t *testing.T) {
	vals := values(t, helmRequired, "keda: {enabled: true, minReplicaCount: 8}")
	_, err := renderOn(t, h.chrt, vals, fullCluster)
	require.ErrorContains(t, err, "8 worker replicas", "with KEDA, its minimum must fit the partitions")
	for _, c := range []cluster{bareCluster, oldCluster} {
		r := mustRenderOn(t, h.chrt, vals, c)
		w := checkWorker(t, h.sluice, r, nil)
		require.Equal(t, int32(2), *w.deploy.Spec.Replicas, "without KEDA: worker.replicaCount")
		require.Contains(t, r.notes, "WARNING: keda.enabled is set, but the cluster does not serve KEDA's API")
	}
	r := mustRenderOn(t, h.chrt, values(t, helmRequired, "keda: {enabled: true}"), fullCluster)
	require.Contains(t, r.names(), "ScaledObject/quakes-sluice-worker")
	require.NotContains(t, r.notes, "WARNING")
	checkWorker(t, h.sluice, r, nil)
}

// testPDBEvictionPolicy checks the PDB's unhealthyPodEvictionPolicy:
// AlwaysAllow by default, none on a cluster that predates the field, or as
// the values set it.
func (h *helmChart) testPDBEvictionPolicy(t *testing.T) {
	for _, c := range []struct {
		values string
		on     cluster
		want   *policyv1.UnhealthyPodEvictionPolicyType
	}{
		{"", fullCluster, ptr(policyv1.AlwaysAllow)},
		{"", oldCluster, nil},
		{"pdb: {unhealthyPodEvictionPolicy: IfHealthyBudget}", bareCluster, ptr(policyv1.IfHealthyBudget)},
		{"pdb: {unhealthyPodEvictionPolicy: ''}", fullCluster, nil},
	} {
		r := mustRenderOn(t, h.chrt, values(t, helmRequired, c.values), c.on)
		pdb := decodeOne[policyv1.PodDisruptionBudget](t, r, "PodDisruptionBudget")
		require.Equal(t, c.want, pdb.Spec.UnhealthyPodEvictionPolicy, "%q on %s", c.values, c.on.name)
		checkWorker(t, h.sluice, r, nil)
	}
	r := mustRender(t, h.chrt, values(t, helmRequired, "pdb: {enabled: false}"))
	checkWorker(t, h.sluice, r, nil)
}

// testSinkSchemes renders a worker for every sink scheme sluice takes, and
// checks that values.yaml and the chart README document each.
func (h *helmChart) testSinkSchemes(t *testing.T) {
	// The schemes sluice takes, as its own error lists them.
	err := sink.CheckURL("no-such-scheme://x")
	require.Error(t, err)
	_, list, ok := strings.Cut(err.Error(), "(want ")
	require.True(t, ok, "%v", err)
	list, _, _ = strings.Cut(list, ")")
	schemes := strings.FieldsFunc(strings.ReplaceAll(list, " or ", ","), func(r rune) bool { return r == ',' || r == ' ' })
	require.Contains(t, schemes, "s3", "parsed %q", list)
	valuesDoc, err := os.ReadFile(filepath.Join(h.dir, "values.yaml"))
	require.NoError(t, err)
	_, sinkDoc, _ := strings.Cut(string(valuesDoc), "\nsink:\n")
	sinkDoc, _, _ = strings.Cut(sinkDoc, "\n  url:")
	readme, err := os.ReadFile(filepath.Join(h.dir, "README.md"))
	require.NoError(t, err)
	for _, scheme := range schemes {
		example, ok := sinkExamples[scheme]
		require.True(t, ok, "scheme %s: give the test an example URL, and document it in values.yaml and the chart README", scheme)
		require.Contains(t, sinkDoc, scheme+"://", "values.yaml's sink.url documents %s", scheme)
		require.Contains(t, string(readme), scheme+"://", "the chart README documents %s", scheme)
		require.NoError(t, sink.CheckURL(example.url), "%s", example.url)
		r := mustRender(t, h.chrt, values(t, helmRequired, fmt.Sprintf("sink: {url: %q}", example.url), example.values))
		w := checkWorker(t, h.sluice, r, nil)
		require.Equal(t, example.url, w.env["SLUICE_SINK"])
	}
}

// testREADMECommands renders and lints every helm command of the shell
// blocks of docs/production.md and the chart's README, on a cluster with
// KEDA and prometheus-operator and on one with neither, and checks that
// they use every example values file.
func (h *helmChart) testREADMECommands(t *testing.T) {
	t.Chdir(h.root) // the commands run from the repository's root
	cmds := readmeHelmCommands(t, h.root, filepath.Join("docs", "production.md"), filepath.Join("deploy", "helm", "sluice", "README.md"))
	perFile := map[string]int{}
	usedExamples := map[string]bool{}
	multiBroker := false
	for _, c := range cmds {
		perFile[c.file]++
		vals, files := c.values(t)
		for _, f := range files {
			usedExamples[filepath.ToSlash(f)] = true
		}
		for _, cl := range []cluster{fullCluster, bareCluster} {
			r, err := renderOn(t, h.chrt, vals, cl)
			require.NoError(t, err, "%s: rendering on %s", c, cl.name)
			for key, doc := range r.docs {
				decodeStrict(t, key, doc)
			}
			var secret *corev1.Secret
			if r.docs["Secret/quakes-sluice-credentials"] != "" {
				secret = decodeOne[corev1.Secret](t, r, "Secret")
			}
			w := checkWorker(t, h.sluice, r, secret)
			if r.docs["Deployment/quakes-sluice-api"] != "" {
				checkAPI(t, h.sluice, r, secret, w)
			}
			multiBroker = multiBroker || strings.Contains(w.env["SLUICE_BROKERS"], ",")
		}
		requireLintClean(t, h.dir, vals)
	}
	require.GreaterOrEqual(t, perFile[filepath.Join("docs", "production.md")], 1, "docs/production.md's Kubernetes section installs the chart")
	require.GreaterOrEqual(t, perFile[filepath.Join("deploy", "helm", "sluice", "README.md")], 4, "the chart README's commands")
	require.True(t, multiBroker, "some command gives several brokers, the case --set splits at the comma")
	examples, err := filepath.Glob(filepath.Join("deploy", "helm", "examples", "*.yaml"))
	require.NoError(t, err)
	require.NotEmpty(t, examples)
	for _, f := range examples {
		require.True(t, usedExamples[filepath.ToSlash(f)], "%s: no README command uses it, so nothing renders it", f)
	}

	// What the READMEs said before: Helm splits --set at the comma.
	_, err = (&helmvalues.Options{Values: []string{"kafka.brokers=b-1:9096,b-2:9096"}}).MergeValues(nil)
	require.ErrorContains(t, err, "has no value")
}

// helmExtras sets every extra of the pods: variables as a list of EnvVar
// objects (plain, from a Secret, a ConfigMap and the pod itself, and one
// that replaces the chart's), envFrom, and a Secret mounted for the sink's
// headers file; the API its own.
const helmExtras = `
worker:
  env:
    - name: SLUICE_SINK_HEADERS_FILE
      value: /etc/sluice/sink/headers
    - name: AWS_ACCESS_KEY_ID
      valueFrom: {secretKeyRef: {name: aws-credentials, key: access-key-id}}
    - name: SLUICE_CONCURRENCY
      valueFrom: {configMapKeyRef: {name: sluice-tuning, key: concurrency}}
    - name: POD_NAME
      valueFrom: {fieldRef: {fieldPath: metadata.name}}
    - name: SLUICE_LOG_LEVEL
      value: debug
  envFrom:
    - secretRef: {name: aws-credentials}
    - configMapRef: {name: sluice-tuning, optional: true}
  extraVolumes:
    - name: sink-headers
      secret: {secretName: sink-headers}
  extraVolumeMounts:
    - {name: sink-headers, mountPath: /etc/sluice/sink, readOnly: true}
api:
  enabled: true
  env: [{name: SLUICE_LOG_LEVEL, value: warn}]
  envFrom: [{configMapRef: {name: api-settings}}]
  extraVolumes: [{name: scratch, emptyDir: {sizeLimit: 64Mi}}]
  extraVolumeMounts: [{name: scratch, mountPath: /scratch}]
`

// helmEnvMap gives worker.env as a map, with a value from a Secret.
const helmEnvMap = `
worker:
  env:
    SLUICE_BATCH_SIZE: 250
    SLUICE_LOG_LEVEL: debug
    AWS_SECRET_ACCESS_KEY: {valueFrom: {secretKeyRef: {name: aws-credentials, key: secret-access-key}}}
api: {enabled: true}
`

// sinkExamples has a URL of each sink scheme, and the values that go with
// it.
var sinkExamples = map[string]struct{ url, values string }{
	"http":        {"http://sink-sim.ingest:8088", ""},
	"https":       {"https://ingest.example.com/v1", "secrets: {create: {sinkAuthorization: 'Bearer not-a-token'}}"},
	"rest+http":   {"rest+http://api.ingest:3000/items/{id}", ""},
	"rest+https":  {"rest+https://api.example.com/v1/quakes/{id}", "worker: {env: {SLUICE_SINK_METHOD: PUT}}"},
	"postgres":    {"postgres://sluice@db.ingest:5432/quakes?table=events", "secrets: {create: {pgPassword: not-a-password}}"},
	"azuretables": {"azuretables://quakes.table.core.windows.net?table=events", "secrets: {create: {azureAccountKey: bm90LWEta2V5}}"},
	"dynamodb": {"dynamodb://quakes?region=eu-west-1",
		"pool: {unit: cost, cost: 1/KiB}\nserviceAccount: {annotations: {eks.amazonaws.com/role-arn: 'arn:aws:iam::111122223333:role/sluice'}}"},
	"s3":          {"s3://quakes/2025?region=eu-west-1", "serviceAccount: {annotations: {eks.amazonaws.com/role-arn: 'arn:aws:iam::111122223333:role/sluice'}}"},
	"gs":          {"gs://quakes/2025", "serviceAccount: {annotations: {iam.gke.io/gcp-service-account: sluice@project.iam.gserviceaccount.com}}"},
	"opensearch":  {"opensearch://search.ingest:9200/quakes", ""},
	"opensearchs": {"opensearchs://search.example.com:9200/quakes", "secrets: {create: {sinkAuthorization: 'ApiKey bm90LWEta2V5'}}"},
}

func ptr[T any](v T) *T { return &v }

// values merges YAML documents over each other (later ones win), as
// repeated `helm install -f` does, into values for the chart.
func values(t *testing.T, docs ...string) chartutil.Values {
	t.Helper()
	out := chartutil.Values{}
	for _, d := range docs {
		v, err := chartutil.ReadValues([]byte(d))
		require.NoError(t, err, "values:\n%s", d)
		out = chartutil.MergeTables(v, out)
	}
	return out
}

// rendered is one install's manifests, by kind and name.
type rendered struct {
	docs    map[string]string // "Kind/name" → YAML
	notes   string
	values  chartutil.Values // the values given, over the chart's defaults
	cluster cluster          // the cluster it was rendered for
}

func (r rendered) names() []string { return slices.Collect(maps.Keys(r.docs)) }

// cluster is what `helm install` learns of the cluster it installs into:
// the Kubernetes version, and the APIs it serves beyond the built-in ones.
type cluster struct {
	name string
	kube string
	apis []string
}

var (
	// fullCluster has KEDA and the prometheus-operator's CRDs.
	fullCluster = cluster{"Kubernetes 1.33 with KEDA and prometheus-operator", "v1.33.0", []string{"keda.sh/v1alpha1", "monitoring.coreos.com/v1"}}
	// bareCluster has neither.
	bareCluster = cluster{"Kubernetes 1.33 alone", "v1.33.0", nil}
	// oldCluster predates the PDB's unhealthyPodEvictionPolicy (beta in 1.27).
	oldCluster = cluster{"Kubernetes 1.26", "v1.26.3", nil}
)

// has reports whether c serves the API group/version.
func (c cluster) has(api string) bool { return slices.Contains(c.apis, api) }

// renderChart renders the chart as `helm install` does for fullCluster:
// an install in client-only dry-run mode with the cluster's version and
// APIs given, as `helm template --kube-version --api-versions` does.
func renderChart(t *testing.T, chrt *chart.Chart, vals chartutil.Values) (rendered, error) {
	t.Helper()
	return renderOn(t, chrt, vals, fullCluster)
}

// renderOn renders the chart for cluster c.
func renderOn(t *testing.T, chrt *chart.Chart, vals chartutil.Values, c cluster) (rendered, error) {
	t.Helper()
	install := action.NewInstall(&action.Configuration{Log: t.Logf})
	install.DryRun = true
	install.DryRunOption = "client"
	install.ClientOnly = true
	install.Replace = true
	install.ReleaseName = helmRelease
	install.Namespace = helmNamespace
	kube, err := chartutil.ParseKubeVersion(c.kube)
	require.NoError(t, err)
	install.KubeVersion = kube
	install.APIVersions = c.apis
	rel, err := install.Run(chrt, vals)
	if err != nil {
		return rendered{}, err
	}
	full, err := chartutil.CoalesceValues(chrt, vals)
	require.NoError(t, err)
	r := rendered{docs: map[string]string{}, notes: rel.Info.Notes, values: full, cluster: c}
	require.Empty(t, rel.Hooks, "the chart has no hooks")
	for _, doc := range releaseutil.SplitManifests(rel.Manifest) {
		var meta struct {
			metav1.TypeMeta   `json:",inline"`
			metav1.ObjectMeta `json:"metadata"`
		}
		require.NoError(t, yaml.Unmarshal([]byte(doc), &meta), "manifest:\n%s", doc)
		key := meta.Kind + "/" + meta.Name
		require.NotContains(t, r.docs, key, "two objects %s", key)
		r.docs[key] = doc
	}
	return r, nil
}

func mustRender(t *testing.T, chrt *chart.Chart, vals chartutil.Values) rendered {
	t.Helper()
	return mustRenderOn(t, chrt, vals, fullCluster)
}

func mustRenderOn(t *testing.T, chrt *chart.Chart, vals chartutil.Values, c cluster) rendered {
	t.Helper()
	r, err := renderOn(t, chrt, vals, c)
	require.NoError(t, err, "on %s", c.name)
	for key, doc := range r.docs {
		decodeStrict(t, key, doc)
	}
	return r
}

// apiTypes maps each kind the chart may render to its apiVersion and the
// upstream Go type it decodes into.
var apiTypes = map[string]struct {
	apiVersion string
	new        func() any
}{
	"Deployment":            {"apps/v1", func() any { return new(appsv1.Deployment) }},
	"Service":               {"v1", func() any { return new(corev1.Service) }},
	"ConfigMap":             {"v1", func() any { return new(corev1.ConfigMap) }},
	"Secret":                {"v1", func() any { return new(corev1.Secret) }},
	"PodDisruptionBudget":   {"policy/v1", func() any { return new(policyv1.PodDisruptionBudget) }},
	"ServiceAccount":        {"v1", func() any { return new(corev1.ServiceAccount) }},
	"PodMonitor":            {"monitoring.coreos.com/v1", func() any { return new(monitoringv1.PodMonitor) }},
	"PrometheusRule":        {"monitoring.coreos.com/v1", func() any { return new(monitoringv1.PrometheusRule) }},
	"ScaledObject":          {"keda.sh/v1alpha1", func() any { return new(kedav1alpha1.ScaledObject) }},
	"TriggerAuthentication": {"keda.sh/v1alpha1", func() any { return new(kedav1alpha1.TriggerAuthentication) }},
}

// decodeStrict decodes a manifest into its upstream type as the API server
// does with strict field validation: case-sensitive field names, and an
// unknown or duplicate field is an error. It returns the object.
func decodeStrict(t *testing.T, key, doc string) any {
	t.Helper()
	js, err := yaml.YAMLToJSONStrict([]byte(doc))
	require.NoError(t, err, "%s: not YAML, or a duplicate key:\n%s", key, doc)
	var tm metav1.TypeMeta
	require.NoError(t, json.Unmarshal(js, &tm))
	typ, ok := apiTypes[tm.Kind]
	require.True(t, ok, "%s: the chart renders a kind the test does not know: %s", key, tm.Kind)
	require.Equal(t, typ.apiVersion, tm.APIVersion, "%s", key)
	obj := typ.new()
	strictErrs, err := kjson.UnmarshalStrict(js, obj)
	require.NoError(t, err, "%s:\n%s", key, doc)
	require.Empty(t, strictErrs, "%s: fields its type does not have:\n%s", key, doc)
	return obj
}

func decodeOne[T any](t *testing.T, r rendered, kind string) *T {
	t.Helper()
	var found []string
	for key := range r.docs {
		if strings.HasPrefix(key, kind+"/") {
			found = append(found, key)
		}
	}
	require.Len(t, found, 1, "one %s", kind)
	obj, ok := decodeStrict(t, found[0], r.docs[found[0]]).(*T)
	require.True(t, ok, "%s decodes into %T", found[0], obj)
	return obj
}

func decodeNamed[T any](t *testing.T, r rendered, key string) *T {
	t.Helper()
	doc, ok := r.docs[key]
	require.True(t, ok, "%s is rendered (have %v)", key, r.names())
	obj, ok := decodeStrict(t, key, doc).(*T)
	require.True(t, ok)
	return obj
}

// requireLintClean runs Helm's linter on the chart with vals: nothing
// above an informational note.
func requireLintClean(t *testing.T, chartDir string, vals chartutil.Values) {
	t.Helper()
	l := lint.All(chartDir, vals, helmNamespace, false)
	for _, m := range l.Messages {
		require.Less(t, m.Severity, support.WarningSev, "helm lint: %s", m)
	}
}

// pod is one Deployment's pod, as the test sees it.
type pod struct {
	deploy    *appsv1.Deployment
	pod       corev1.PodSpec
	labels    map[string]string
	container corev1.Container
	env       map[string]string // plain values; credentials are in container.Env
}

func podOf(t *testing.T, r rendered, name string) pod {
	t.Helper()
	d := decodeNamed[appsv1.Deployment](t, r, "Deployment/"+name)
	require.Len(t, d.Spec.Template.Spec.Containers, 1, "%s: one container", name)
	p := pod{deploy: d, pod: d.Spec.Template.Spec, labels: d.Spec.Template.Labels, container: d.Spec.Template.Spec.Containers[0], env: map[string]string{}}
	for _, e := range p.container.Env {
		require.NotContains(t, p.env, e.Name, "%s: %s set twice", name, e.Name)
		p.env[e.Name] = e.Value
	}
	sel, err := metav1.LabelSelectorAsSelector(d.Spec.Selector)
	require.NoError(t, err)
	require.False(t, sel.Empty())
	require.True(t, sel.Matches(labels.Set(p.labels)), "%s: the selector matches its own pods", name)
	checkLabels(t, name, d.Labels)
	checkLabels(t, name+" pods", p.labels)
	return p
}

func checkLabels(t *testing.T, what string, l map[string]string) {
	t.Helper()
	for _, k := range []string{"app.kubernetes.io/name", "app.kubernetes.io/instance", "app.kubernetes.io/version",
		"app.kubernetes.io/managed-by", "app.kubernetes.io/part-of", "helm.sh/chart"} {
		require.NotEmpty(t, l[k], "%s: label %s", what, k)
	}
	require.Equal(t, helmRelease, l["app.kubernetes.io/instance"], "%s", what)
	require.Equal(t, "Helm", l["app.kubernetes.io/managed-by"], "%s", what)
}

// checkCLI holds a pod's command line and environment to the CLI: its
// args name a sluice command and flags it has, and every SLUICE_* variable
// is one its help names: a flag's, or a credential its help names.
func checkCLI(t *testing.T, sluice *sluiceCLI, p pod, command string) {
	t.Helper()
	require.Empty(t, p.container.Command, "keep the image's sluice entrypoint")
	cmdPath, rest := sluice.splitCommand(t, p.container.Args)
	require.Equal(t, []string{command}, cmdPath)
	h := sluice.help(t, cmdPath)
	for _, a := range rest {
		flag, ok := strings.CutPrefix(a, "--")
		require.True(t, ok, "sluice %s takes no argument %q", command, a)
		flag, _, _ = strings.Cut(flag, "=")
		require.Contains(t, flagNames(h), flag, "`sluice %s` has no flag --%s", command, flag)
	}
	for _, e := range p.container.Env {
		if !strings.HasPrefix(e.Name, "SLUICE_") {
			continue
		}
		require.Contains(t, namedVars(h), e.Name, "`sluice %s` reads no %s", command, e.Name)
		if e.ValueFrom == nil {
			require.Contains(t, envVars(h), e.Name, "%s is set in plain text but is no flag's variable", e.Name)
		}
	}
}

// checkSecurity holds a pod to the restricted Pod Security Standard.
func checkSecurity(t *testing.T, p pod) {
	t.Helper()
	psc, sc := p.pod.SecurityContext, p.container.SecurityContext
	require.NotNil(t, psc)
	require.NotNil(t, sc)
	require.True(t, *psc.RunAsNonRoot)
	require.NotZero(t, *psc.RunAsUser, "not root")
	require.Equal(t, corev1.SeccompProfileTypeRuntimeDefault, psc.SeccompProfile.Type)
	require.True(t, *sc.RunAsNonRoot)
	require.True(t, *sc.ReadOnlyRootFilesystem)
	require.False(t, *sc.AllowPrivilegeEscalation)
	require.False(t, sc.Privileged != nil && *sc.Privileged)
	require.Equal(t, []corev1.Capability{"ALL"}, sc.Capabilities.Drop)
	require.Empty(t, sc.Capabilities.Add)
	require.Equal(t, corev1.SeccompProfileTypeRuntimeDefault, sc.SeccompProfile.Type)
	require.False(t, *p.pod.AutomountServiceAccountToken, "sluice does not use the Kubernetes API")
	require.False(t, p.pod.HostNetwork || p.pod.HostPID || p.pod.HostIPC)
	// With a read-only root, /tmp is the one writable place.
	tmp := mountAt(t, p, "/tmp")
	require.False(t, tmp.ReadOnly)
	require.NotNil(t, volume(t, p, tmp.Name).EmptyDir, "/tmp is an emptyDir")
	require.False(t, p.container.Resources.Requests.Cpu().IsZero(), "a CPU request")
	require.False(t, p.container.Resources.Requests.Memory().IsZero(), "a memory request")
	require.False(t, p.container.Resources.Limits.Memory().IsZero(), "a memory limit")
	require.NotContains(t, p.container.Image, ":latest")
}

func mountAt(t *testing.T, p pod, path string) corev1.VolumeMount {
	t.Helper()
	for _, m := range p.container.VolumeMounts {
		if m.MountPath == path {
			return m
		}
	}
	require.Failf(t, "no mount", "nothing mounted at %s: %v", path, p.container.VolumeMounts)
	return corev1.VolumeMount{}
}

func volume(t *testing.T, p pod, name string) corev1.Volume {
	t.Helper()
	for _, v := range p.pod.Volumes {
		if v.Name == name {
			return v
		}
	}
	require.Failf(t, "no volume", "no volume %s", name)
	return corev1.Volume{}
}

// containerPort resolves a probe's or Service's port (a number or a port
// name) to the container's port.
func containerPort(t *testing.T, c corev1.Container, port intstr.IntOrString) int32 {
	t.Helper()
	if port.Type == intstr.Int {
		return port.IntVal
	}
	for _, p := range c.Ports {
		if p.Name == port.StrVal {
			return p.ContainerPort
		}
	}
	require.Failf(t, "no port", "container %s has no port %q", c.Name, port.StrVal)
	return 0
}

// listenPort is the port of a host:port setting such as ":9090".
func listenPort(t *testing.T, addr string) int32 {
	t.Helper()
	_, port, err := net.SplitHostPort(addr)
	require.NoError(t, err, "%q", addr)
	n, err := strconv.ParseInt(port, 10, 32)
	require.NoError(t, err)
	return int32(n)
}

// checkProbes: liveness on /healthz and readiness on /readyz, on port, and
// the handler behind port answers both.
func checkProbes(t *testing.T, c corev1.Container, port int32, handler http.Handler) {
	t.Helper()
	for probe, path := range map[*corev1.Probe]string{c.LivenessProbe: "/healthz", c.ReadinessProbe: "/readyz"} {
		require.NotNil(t, probe, "%s: probe on %s", c.Name, path)
		require.NotNil(t, probe.HTTPGet)
		require.Equal(t, path, probe.HTTPGet.Path)
		require.Equal(t, port, containerPort(t, c, probe.HTTPGet.Port), "%s: %s on the port sluice serves it on", c.Name, path)
		rec := httptest.NewRecorder()
		handler.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
		require.Equal(t, http.StatusOK, rec.Code, "%s: GET %s", c.Name, path)
	}
}

// secretRefs maps each variable a container takes from the Secret name to
// its key, checking each reference's optional flag (the values may add
// variables from other Secrets: worker.env, api.env).
func secretRefs(t *testing.T, c corev1.Container, name string, optional bool) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, e := range c.Env {
		if e.ValueFrom == nil {
			continue
		}
		ref := e.ValueFrom.SecretKeyRef
		if ref == nil || ref.Name != name {
			continue
		}
		require.Equal(t, optional, ref.Optional != nil && *ref.Optional, "%s: optional", e.Name)
		out[e.Name] = ref.Key
	}
	return out
}

// checkWorker checks the worker Deployment against the values and the CLI.
// A created secret must hold every key the worker takes from it.
func checkWorker(t *testing.T, sluice *sluiceCLI, r rendered, secret *corev1.Secret) pod {
	t.Helper()
	vals := r.values
	w := podOf(t, r, "quakes-sluice-worker")
	require.Equal(t, "worker", w.labels["app.kubernetes.io/component"])
	checkCLI(t, sluice, w, "worker")
	checkSecurity(t, w)
	checkConnections(t, w, vals, true)
	for _, k := range []string{"SLUICE_BROKERS", "SLUICE_SINK", "SLUICE_POOL", "SLUICE_CAPACITY",
		"SLUICE_PARTITIONS", "SLUICE_TOPIC", "SLUICE_TOPIC_PARTITIONS", "SLUICE_GROUP", "SLUICE_GRACE", "SLUICE_METRICS_ADDR"} {
		require.NotEmpty(t, w.env[k], "worker: %s", k)
	}
	v := func(path string) any {
		val, err := vals.PathValue(path)
		require.NoError(t, err, path)
		return val
	}
	require.Equal(t, v("sink.url"), w.env["SLUICE_SINK"])
	require.Equal(t, v("topic.name"), w.env["SLUICE_TOPIC"])
	for _, k := range []string{"SLUICE_CAPACITY", "SLUICE_PARTITIONS", "SLUICE_TOPIC_PARTITIONS"} {
		n, err := strconv.ParseFloat(w.env[k], 64)
		require.NoError(t, err, "%s=%q", k, w.env[k])
		require.Positive(t, n, k)
	}

	// Metrics, liveness and readiness on the port --metrics-addr serves.
	port := listenPort(t, w.env["SLUICE_METRICS_ADDR"])
	require.Equal(t, port, containerPort(t, w.container, intstr.FromString("metrics")))
	h := sluice.help(t, []string{"worker"})
	require.Regexp(t, `--metrics-addr .*/healthz and /readyz`, h, "the worker serves its probes beside /metrics")
	checkProbes(t, w.container, port, metricsHandler(t))

	// The pod outlives the worker's grace, then commit and lease release.
	grace, err := time.ParseDuration(w.env["SLUICE_GRACE"])
	require.NoError(t, err)
	tgp := time.Duration(*w.pod.TerminationGracePeriodSeconds) * time.Second
	require.GreaterOrEqual(t, tgp, grace+10*time.Second, "terminationGracePeriodSeconds %s must exceed --grace %s with room for the final commit and lease release", tgp, grace)

	if secret != nil {
		for _, e := range w.container.Env {
			if ref := e.ValueFrom; ref != nil && ref.SecretKeyRef != nil && ref.SecretKeyRef.Name == secret.Name {
				require.Contains(t, secret.Data, ref.SecretKeyRef.Key, "%s: the created Secret has its key", e.Name)
			}
		}
	}
	if w.env["SLUICE_TYPES"] != "" {
		loadMountedTypes(t, r, w.pod, w.container, w.env["SLUICE_TYPES"])
	}
	checkExtras(t, w, vals, "worker")
	checkServiceAccount(t, r, w)
	checkFiles(t, w)

	// KEDA owns the replica count where the cluster serves its API; else
	// the workers run worker.replicaCount, and the notes say why.
	if valueBool(t, vals, "keda.enabled") && r.cluster.has("keda.sh/v1alpha1") {
		require.Nil(t, w.deploy.Spec.Replicas, "KEDA owns the replica count")
		checkScaledObject(t, r, w)
	} else {
		require.NotNil(t, w.deploy.Spec.Replicas)
		require.Equal(t, valueInt(t, vals, "worker.replicaCount"), int(*w.deploy.Spec.Replicas))
		require.NotContains(t, r.names(), "ScaledObject/quakes-sluice-worker")
		require.NotContains(t, r.names(), "TriggerAuthentication/quakes-sluice-kafka")
		require.Equal(t, valueBool(t, vals, "keda.enabled"), strings.Contains(r.notes, "does not serve KEDA's API"),
			"the notes warn when keda.enabled finds no KEDA:\n%s", r.notes)
	}
	if valueBool(t, vals, "pdb.enabled") {
		checkPDB(t, r, w)
	} else {
		require.NotContains(t, r.names(), "PodDisruptionBudget/quakes-sluice-worker")
	}
	if valueBool(t, vals, "podMonitor.enabled") {
		checkPodMonitor(t, r, w)
	} else {
		require.NotContains(t, r.names(), "PodMonitor/quakes-sluice")
	}
	if valueBool(t, vals, "prometheusRule.enabled") {
		checkPrometheusRule(t, r)
	} else {
		require.NotContains(t, r.names(), "PrometheusRule/quakes-sluice")
	}
	return w
}

// asString is v if it is a string, else "".
func asString(v any) string {
	s, _ := v.(string)
	return s
}

// value reads a value, a table (as a map[string]any) included; ok is
// false when it is not set.
func value(vals chartutil.Values, path string) (any, bool) {
	if v, err := vals.PathValue(path); err == nil {
		return v, true
	}
	if tbl, err := vals.Table(path); err == nil {
		return map[string]any(tbl), true
	}
	return nil, false
}

func valueBool(t *testing.T, vals chartutil.Values, path string) bool {
	t.Helper()
	v, ok := value(vals, path)
	if !ok {
		return false
	}
	b, isBool := v.(bool)
	require.True(t, isBool, "%s: %v (%T) is no boolean", path, v, v)
	return b
}

// addrs reads a list of addresses (kafka.brokers, redis.addr) as the CLI
// gets it: a list joined with commas, or a string as it is.
func addrs(t *testing.T, vals chartutil.Values, path string) string {
	t.Helper()
	v, _ := value(vals, path)
	switch a := v.(type) {
	case nil:
		return ""
	case string:
		return a
	case []any:
		parts := make([]string, len(a))
		for i, x := range a {
			s, ok := x.(string)
			require.True(t, ok, "%s[%d]: %v (%T) is no host:port string", path, i, x, x)
			require.NotContains(t, s, ",", "%s[%d]: one address per item", path, i)
			parts[i] = s
		}
		return strings.Join(parts, ",")
	}
	require.Failf(t, "not a list of addresses", "%s: %v (%T)", path, v, v)
	return ""
}

// checkServiceAccount: the worker pods run as serviceAccount's account,
// created with its annotations when serviceAccount.create, and never with
// a mounted token; the API pods run as the namespace's default account.
func checkServiceAccount(t *testing.T, r rendered, w pod) {
	t.Helper()
	vals := r.values
	name, _ := value(vals, "serviceAccount.name")
	var accounts []string
	for _, n := range r.names() {
		if strings.HasPrefix(n, "ServiceAccount/") {
			accounts = append(accounts, n)
		}
	}
	if !valueBool(t, vals, "serviceAccount.create") {
		require.Empty(t, accounts, "serviceAccount.create is off")
		require.Equal(t, cmp.Or(asString(name), "default"), w.pod.ServiceAccountName)
		return
	}
	require.Len(t, accounts, 1)
	require.Equal(t, cmp.Or(asString(name), "quakes-sluice"), w.pod.ServiceAccountName)
	sa := decodeNamed[corev1.ServiceAccount](t, r, "ServiceAccount/"+w.pod.ServiceAccountName)
	checkLabels(t, "ServiceAccount", sa.Labels)
	require.NotNil(t, sa.AutomountServiceAccountToken)
	require.False(t, *sa.AutomountServiceAccountToken, "no token: sluice does not use the Kubernetes API")
	want := map[string]string{}
	if a, ok := value(vals, "serviceAccount.annotations"); ok {
		for k, v := range a.(map[string]any) {
			want[k] = v.(string)
		}
	}
	if len(want) == 0 {
		require.Empty(t, sa.Annotations)
	} else {
		require.Equal(t, want, sa.Annotations, "the cloud identity's annotations")
	}
	if key := "Deployment/quakes-sluice-api"; r.docs[key] != "" {
		a := decodeNamed[appsv1.Deployment](t, r, key)
		require.Empty(t, a.Spec.Template.Spec.ServiceAccountName, "the API needs no cloud identity")
	}
}

// checkFiles: every plain SLUICE_*_FILE variable names a file under a
// read-only mount of the container (a Secret's or ConfigMap's), so the
// worker can read it.
func checkFiles(t *testing.T, p pod) {
	t.Helper()
	for name, path := range p.env {
		if !strings.HasPrefix(name, "SLUICE_") || !strings.HasSuffix(name, "_FILE") || path == "" {
			continue
		}
		require.True(t, filepath.IsAbs(path), "%s=%q", name, path)
		var under *corev1.VolumeMount
		for i, m := range p.container.VolumeMounts {
			if rel, err := filepath.Rel(m.MountPath, path); err == nil && !strings.HasPrefix(rel, "..") && rel != "." {
				under = &p.container.VolumeMounts[i]
			}
		}
		require.NotNil(t, under, "%s=%s: no volume is mounted there", name, path)
		require.True(t, under.ReadOnly, "%s: mounted read-only", name)
		vol := volume(t, p, under.Name)
		require.True(t, vol.Secret != nil || vol.ConfigMap != nil || vol.Projected != nil,
			"%s: %s is a Secret's or a ConfigMap's volume", name, under.Name)
	}
}

// checkExtras holds a container to the values' env (a map or a list of
// EnvVar objects), envFrom, extraVolumes and extraVolumeMounts of
// component: each entry of env is there as given, after the chart's own
// variables, and replaces the chart's variable of its name.
func checkExtras(t *testing.T, p pod, vals chartutil.Values, component string) {
	t.Helper()
	var want []corev1.EnvVar
	switch env, _ := value(vals, component+".env"); e := env.(type) {
	case nil:
	case []any:
		roundTrip(t, e, &want)
	case map[string]any:
		for _, name := range slices.Sorted(maps.Keys(e)) {
			v := corev1.EnvVar{Name: name}
			if body, ok := e[name].(map[string]any); ok {
				roundTrip(t, body, &v)
				v.Name = name
			} else {
				v.Value = fmt.Sprint(e[name])
				if f, ok := e[name].(float64); ok {
					v.Value = strconv.FormatFloat(f, 'f', -1, 64) // as the CLI parses it
				}
			}
			want = append(want, v)
		}
	default:
		require.Failf(t, "env", "%s.env: %T", component, env)
	}
	got := p.container.Env
	require.GreaterOrEqual(t, len(got), len(want))
	if len(want) > 0 {
		require.Equal(t, want, got[len(got)-len(want):], "%s.env comes last, as given", component)
	}
	for _, e := range got[:len(got)-len(want)] {
		require.False(t, slices.ContainsFunc(want, func(w corev1.EnvVar) bool { return w.Name == e.Name }),
			"%s.env's %s replaces the chart's", component, e.Name)
	}

	var envFrom []corev1.EnvFromSource
	if v, ok := value(vals, component+".envFrom"); ok {
		roundTrip(t, v, &envFrom)
	}
	require.Equal(t, len(envFrom), len(p.container.EnvFrom))
	if len(envFrom) > 0 {
		require.Equal(t, envFrom, p.container.EnvFrom)
	}
	var vols []corev1.Volume
	if v, ok := value(vals, component+".extraVolumes"); ok {
		roundTrip(t, v, &vols)
	}
	for _, v := range vols {
		require.Contains(t, p.pod.Volumes, v, "%s.extraVolumes", component)
	}
	var mounts []corev1.VolumeMount
	if v, ok := value(vals, component+".extraVolumeMounts"); ok {
		roundTrip(t, v, &mounts)
	}
	for _, m := range mounts {
		require.Contains(t, p.container.VolumeMounts, m, "%s.extraVolumeMounts", component)
		volume(t, p, m.Name)
	}
}

// roundTrip decodes values (maps and lists from YAML) strictly into out,
// a Kubernetes type.
func roundTrip(t *testing.T, in, out any) {
	t.Helper()
	js, err := json.Marshal(in)
	require.NoError(t, err)
	strictErrs, err := kjson.UnmarshalStrict(js, out)
	require.NoError(t, err, "%s", js)
	require.Empty(t, strictErrs, "%s", js)
}

// metricsHandler is the worker's real metrics server (metrics.Serve), on a
// loopback port, as an http.Handler for the probe checks.
func metricsHandler(t *testing.T) http.Handler {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- httpserver.Serve(ctx, ln, metrics.Handler(prometheus.NewRegistry(), nil), 5*time.Second)
	}()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
	})
	base := "http://" + ln.Addr().String()
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		resp, err := http.Get(base + r.URL.Path)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		defer resp.Body.Close()
		w.WriteHeader(resp.StatusCode)
	})
}

// loadMountedTypes finds the ConfigMap mounted where a --types path points
// in the pod, writes its files out and loads them with sluice's own loader.
func loadMountedTypes(t *testing.T, r rendered, spec corev1.PodSpec, c corev1.Container, typesPath string) map[string]*recordtype.Type {
	t.Helper()
	require.True(t, filepath.IsAbs(typesPath), "--types %s", typesPath)
	p := pod{pod: spec, container: c}
	m := mountAt(t, p, filepath.Dir(typesPath))
	require.True(t, m.ReadOnly)
	require.Empty(t, m.SubPath, "a whole ConfigMap volume, so that edits reach the pod")
	vol := volume(t, p, m.Name)
	require.NotNil(t, vol.ConfigMap, "%s is a ConfigMap volume", m.Name)
	require.Empty(t, vol.ConfigMap.Items, "every key is a file under its own name")
	cm := decodeNamed[corev1.ConfigMap](t, r, "ConfigMap/"+vol.ConfigMap.Name)
	checkLabels(t, "ConfigMap", cm.Labels)
	require.Contains(t, cm.Data, filepath.Base(typesPath), "the ConfigMap holds the file --types names")
	dir := t.TempDir()
	for name, content := range cm.Data {
		require.NoError(t, os.WriteFile(filepath.Join(dir, name), []byte(content), 0o600))
	}
	types, err := recordtype.Load(filepath.Join(dir, filepath.Base(typesPath)))
	require.NoError(t, err, "the mounted types file loads, with the schemas it names")
	require.NotEmpty(t, types)
	return types
}

// checkPDB: the budget selects exactly the worker pods.
func checkPDB(t *testing.T, r rendered, w pod) {
	t.Helper()
	pdb := decodeOne[policyv1.PodDisruptionBudget](t, r, "PodDisruptionBudget")
	checkLabels(t, "PDB", pdb.Labels)
	sel, err := metav1.LabelSelectorAsSelector(pdb.Spec.Selector)
	require.NoError(t, err)
	require.False(t, sel.Empty())
	require.True(t, sel.Matches(labels.Set(w.labels)), "the PDB selects the worker pods")
	require.Equal(t, w.deploy.Spec.Selector.MatchLabels, pdb.Spec.Selector.MatchLabels, "the PDB selects what the Deployment owns")
	require.NotNil(t, pdb.Spec.MaxUnavailable)
	require.Nil(t, pdb.Spec.MinAvailable)
	require.Equal(t, valueInt(t, r.values, "pdb.maxUnavailable"), pdb.Spec.MaxUnavailable.IntValue())
	// Unready workers (their sink, an external service, is failing) may be
	// evicted whatever the budget, so a sink outage does not block drains;
	// the field exists from Kubernetes 1.27 (beta) on.
	policy, _ := value(r.values, "pdb.unhealthyPodEvictionPolicy")
	kube, err := chartutil.ParseKubeVersion(r.cluster.kube)
	require.NoError(t, err)
	minor, err := strconv.Atoi(kube.Minor)
	require.NoError(t, err)
	if p, _ := policy.(string); p != "" && minor >= 27 {
		require.NotNil(t, pdb.Spec.UnhealthyPodEvictionPolicy, "on %s", r.cluster.name)
		require.Equal(t, policyv1.UnhealthyPodEvictionPolicyType(p), *pdb.Spec.UnhealthyPodEvictionPolicy)
	} else {
		require.Nil(t, pdb.Spec.UnhealthyPodEvictionPolicy, "on %s, policy %q", r.cluster.name, policy)
	}
	if key := "Deployment/quakes-sluice-api"; r.docs[key] != "" {
		a := decodeNamed[appsv1.Deployment](t, r, key)
		require.False(t, sel.Matches(labels.Set(a.Spec.Template.Labels)), "the workers' PDB does not count API pods")
	}
}

// checkPodMonitor: the PodMonitor selects the release's worker (and API)
// pods and scrapes /metrics on the ports each serves it on.
func checkPodMonitor(t *testing.T, r rendered, w pod) {
	t.Helper()
	pm := decodeNamed[monitoringv1.PodMonitor](t, r, "PodMonitor/quakes-sluice")
	checkLabels(t, "PodMonitor", pm.Labels)
	if extra, ok := value(r.values, "podMonitor.labels"); ok {
		for k, v := range extra.(map[string]any) {
			require.Equal(t, v, pm.Labels[k], "podMonitor.labels %s: for the Prometheus's podMonitorSelector", k)
		}
	}
	require.False(t, pm.Spec.NamespaceSelector.Any, "the release's own namespace")
	require.Empty(t, pm.Spec.NamespaceSelector.MatchNames)
	sel, err := metav1.LabelSelectorAsSelector(&pm.Spec.Selector)
	require.NoError(t, err)
	require.False(t, sel.Empty())
	pods := []pod{w}
	if r.docs["Deployment/quakes-sluice-api"] != "" {
		pods = append(pods, podOf(t, r, "quakes-sluice-api"))
	}
	interval, _ := value(r.values, "podMonitor.interval")
	timeout, _ := value(r.values, "podMonitor.scrapeTimeout")
	for _, p := range pods {
		require.True(t, sel.Matches(labels.Set(p.labels)), "the PodMonitor selects %s", p.deploy.Name)
		// The port of the container's /metrics: --metrics-addr, or the API's --listen.
		addr := cmp.Or(p.env["SLUICE_METRICS_ADDR"], p.env["SLUICE_LISTEN"])
		port := listenPort(t, addr)
		scraped := 0
		for _, ep := range pm.Spec.PodMetricsEndpoints {
			require.NotNil(t, ep.Port, "endpoints name their port")
			require.Equal(t, "/metrics", ep.Path)
			require.Equal(t, monitoringv1.Duration(asString(interval)), ep.Interval)
			require.Equal(t, monitoringv1.Duration(asString(timeout)), ep.ScrapeTimeout)
			for _, cp := range p.container.Ports {
				if cp.Name == *ep.Port {
					require.Equal(t, port, cp.ContainerPort, "%s: port %s serves /metrics", p.deploy.Name, cp.Name)
					scraped++
				}
			}
		}
		require.Equal(t, 1, scraped, "%s is scraped once", p.deploy.Name)
	}
}

// checkScaledObject: KEDA scales the worker Deployment on its consumer
// group's lag, never beyond the topic's or the pool's partitions, and
// reads the lag with the workers' own Kafka security (checkKEDAAuth).
func checkScaledObject(t *testing.T, r rendered, w pod) {
	t.Helper()
	vals := r.values
	so := decodeOne[kedav1alpha1.ScaledObject](t, r, "ScaledObject")
	checkLabels(t, "ScaledObject", so.Labels)
	require.Equal(t, w.deploy.Name, so.Spec.ScaleTargetRef.Name)
	require.Equal(t, "Deployment", so.Spec.ScaleTargetRef.Kind)
	require.Equal(t, "apps/v1", so.Spec.ScaleTargetRef.APIVersion)
	topicParts, err := strconv.Atoi(w.env["SLUICE_TOPIC_PARTITIONS"])
	require.NoError(t, err)
	poolParts, err := strconv.Atoi(w.env["SLUICE_PARTITIONS"])
	require.NoError(t, err)
	require.NotNil(t, so.Spec.MaxReplicaCount)
	require.NotNil(t, so.Spec.MinReplicaCount)
	maxR, minR := int(*so.Spec.MaxReplicaCount), int(*so.Spec.MinReplicaCount)
	require.LessOrEqual(t, maxR, topicParts, "a worker beyond the topic's partitions gets none")
	require.LessOrEqual(t, maxR, poolParts, "a worker beyond the pool's partitions gets no capacity")
	asked := valueInt(t, vals, "keda.maxReplicaCount")
	if asked == 0 {
		asked = topicParts // 0: as many as the topic has partitions
	}
	require.Equal(t, min(topicParts, poolParts, asked), maxR, "keda.maxReplicaCount %d, capped", asked)
	require.Equal(t, valueInt(t, vals, "keda.minReplicaCount"), minR)
	if reserved := w.env["SLUICE_RESERVED_PARTITIONS"]; reserved != "" {
		n, err := strconv.Atoi(reserved)
		require.NoError(t, err)
		require.LessOrEqual(t, n*maxR, poolParts, "every worker KEDA may start gets its reserved partitions")
	}
	require.Len(t, so.Spec.Triggers, 1)
	trig := so.Spec.Triggers[0]
	require.Equal(t, "kafka", trig.Type)
	md := trig.Metadata
	require.Equal(t, w.env["SLUICE_BROKERS"], md["bootstrapServers"])
	require.Equal(t, w.env["SLUICE_TOPIC"], md["topic"])
	require.Equal(t, w.env["SLUICE_GROUP"], md["consumerGroup"], "the group the workers join")
	require.Equal(t, "sluice-"+w.env["SLUICE_TOPIC"], md["consumerGroup"], "sluice's default group name")
	lag, err := strconv.Atoi(md["lagThreshold"])
	require.NoError(t, err)
	require.Equal(t, valueInt(t, vals, "keda.lagThreshold"), lag)
	require.Equal(t, "false", md["allowIdleConsumers"])
	require.Equal(t, "earliest", md["offsetResetPolicy"], "sluice starts a new group at the first offset")
	checkKEDAAuth(t, r, w, trig)
}

// kedaSASL is KEDA's name (its kafka trigger's sasl) of each mechanism the
// CLI takes.
var kedaSASL = map[string]string{"PLAIN": "plaintext", "SCRAM-SHA-256": "scram_sha256", "SCRAM-SHA-512": "scram_sha512"}

// checkKEDAAuth: the trigger connects as the workers do. TLS when they use
// it; their SASL mechanism; and a TriggerAuthentication that gives KEDA
// their user (the worker container's variable), their password (the same
// Secret key) and their TLS files (the same keys of the Secret mounted
// where their *_FILE variables point).
func checkKEDAAuth(t *testing.T, r rendered, w pod, trig kedav1alpha1.ScaleTriggers) {
	t.Helper()
	md := trig.Metadata
	if w.env["SLUICE_KAFKA_TLS"] == "true" {
		require.Equal(t, "enable", md["tls"], "the workers use TLS")
	} else {
		require.NotContains(t, md, "tls")
	}
	mech := w.env["SLUICE_KAFKA_SASL_MECHANISM"]
	if mech != "" {
		require.Equal(t, kedaSASL[mech], md["sasl"], "KEDA's name of %s", mech)
	} else {
		require.NotContains(t, md, "sasl")
	}
	files := map[string]string{"ca": "SLUICE_KAFKA_CA_FILE", "cert": "SLUICE_KAFKA_CERT_FILE", "key": "SLUICE_KAFKA_KEY_FILE"}
	needAuth := mech != ""
	for _, v := range files {
		needAuth = needAuth || w.env[v] != ""
	}
	if !needAuth {
		require.Nil(t, trig.AuthenticationRef, "nothing for KEDA to authenticate with")
		return
	}
	require.NotNil(t, trig.AuthenticationRef)
	require.Empty(t, trig.AuthenticationRef.Kind, "a TriggerAuthentication in the release's namespace")
	ta := decodeNamed[kedav1alpha1.TriggerAuthentication](t, r, "TriggerAuthentication/"+trig.AuthenticationRef.Name)
	checkLabels(t, "TriggerAuthentication", ta.Labels)

	params := map[string]bool{}
	for _, e := range ta.Spec.Env {
		require.Equal(t, w.container.Name, e.ContainerName, "%s: from the worker container", e.Parameter)
		require.Contains(t, w.env, e.Name, "%s: the worker container sets %s in plain text", e.Parameter, e.Name)
		params[e.Parameter] = true
		require.Equal(t, "username", e.Parameter, "only the user comes from a plain variable")
		require.Equal(t, "SLUICE_KAFKA_SASL_USERNAME", e.Name)
	}
	for _, ref := range ta.Spec.SecretTargetRef {
		require.False(t, params[ref.Parameter], "%s given twice", ref.Parameter)
		params[ref.Parameter] = true
		if ref.Parameter == "password" {
			pw := envVar(t, w.container, "SLUICE_KAFKA_SASL_PASSWORD")
			require.NotNil(t, pw.ValueFrom, "the workers' password comes from a Secret")
			require.Equal(t, pw.ValueFrom.SecretKeyRef.Name, ref.Name, "the workers' Secret")
			require.Equal(t, pw.ValueFrom.SecretKeyRef.Key, ref.Key, "the workers' key")
			continue
		}
		v, ok := files[ref.Parameter]
		require.True(t, ok, "a parameter KEDA's kafka scaler takes from a Secret: %s", ref.Parameter)
		secret, key := secretFileOf(t, w, w.env[v])
		require.Equal(t, secret, ref.Name, "%s: the Secret the workers mount for %s", ref.Parameter, v)
		require.Equal(t, key, ref.Key, "%s: the file the workers read (%s)", ref.Parameter, v)
	}
	want := map[string]bool{}
	if mech != "" {
		want["username"], want["password"] = true, true
	}
	for p, v := range files {
		if w.env[v] != "" {
			want[p] = true
		}
	}
	require.Equal(t, want, params, "KEDA gets what the workers connect with, and nothing else")
}

// valueInt reads a whole-number value.
func valueInt(t *testing.T, vals chartutil.Values, path string) int {
	t.Helper()
	v, err := vals.PathValue(path)
	require.NoError(t, err, path)
	switch n := v.(type) {
	case float64:
		return int(n)
	case int:
		return n
	case int64:
		return int(n)
	}
	require.Failf(t, "not a number", "%s: %v (%T)", path, v, v)
	return 0
}

func envVar(t *testing.T, c corev1.Container, name string) corev1.EnvVar {
	t.Helper()
	for _, e := range c.Env {
		if e.Name == name {
			return e
		}
	}
	require.Failf(t, "no variable", "%s sets no %s", c.Name, name)
	return corev1.EnvVar{}
}

// secretFileOf resolves a file path in a pod to the Secret volume mounted
// over its folder (whole, read-only) and the Secret key the file is.
func secretFileOf(t *testing.T, p pod, path string) (secret, key string) {
	t.Helper()
	require.True(t, filepath.IsAbs(path), "%q", path)
	m := mountAt(t, p, filepath.Dir(path))
	require.True(t, m.ReadOnly, "%s: read-only", m.MountPath)
	require.Empty(t, m.SubPath, "a whole Secret volume, so that a renewed certificate reaches the pod")
	vol := volume(t, p, m.Name)
	require.NotNil(t, vol.Secret, "%s is a Secret volume", m.Name)
	require.Empty(t, vol.Secret.Items, "every key is a file under its own name")
	return vol.Secret.SecretName, filepath.Base(path)
}

// checkConnections holds a pod's Kafka (and, withRedis, Redis)
// variables to the values: every connection setting arrives, the TLS
// files are the Secret's keys mounted where the variables point, and the
// passwords come from the credentials Secret only when they are used.
func checkConnections(t *testing.T, p pod, vals chartutil.Values, withRedis bool) {
	t.Helper()
	str := func(path string) string {
		v, err := vals.PathValue(path)
		if err != nil {
			return "" // not set: the chart's default is ""
		}
		s, _ := v.(string)
		return s
	}
	on := func(path string) bool {
		v, err := vals.PathValue(path)
		return err == nil && v == true
	}
	type tlsVars struct{ prefix, values string }
	check := func(tv tlsVars) {
		tlsWanted := on(tv.values+".enabled") || str(tv.values+".caKey") != "" || str(tv.values+".certKey") != "" || str(tv.values+".serverName") != ""
		if tv.prefix == "SLUICE_REDIS_" && !on(tv.values+".enabled") {
			tlsWanted = false // rediss:// addresses say it themselves
		}
		if tlsWanted {
			require.Equal(t, "true", p.env[tv.prefix+"TLS"], "%s: %sTLS", p.deploy.Name, tv.prefix)
		} else {
			require.NotContains(t, p.env, tv.prefix+"TLS")
		}
		for key, v := range map[string]string{"caKey": "CA_FILE", "certKey": "CERT_FILE", "keyKey": "KEY_FILE"} {
			want := str(tv.values + "." + key)
			if want == "" {
				require.NotContains(t, p.env, tv.prefix+v)
				continue
			}
			secret, file := secretFileOf(t, p, p.env[tv.prefix+v])
			require.Equal(t, str(tv.values+".secretName"), secret, "%s%s: a file of %s.secretName", tv.prefix, v, tv.values)
			require.Equal(t, want, file, "%s%s: the Secret's key %s.%s", tv.prefix, v, tv.values, key)
		}
		require.Equal(t, str(tv.values+".serverName"), p.env[tv.prefix+"SERVER_NAME"])
	}

	require.Equal(t, addrs(t, vals, "kafka.brokers"), p.env["SLUICE_BROKERS"])
	check(tlsVars{"SLUICE_KAFKA_", "kafka.tls"})
	mech := str("kafka.sasl.mechanism")
	require.Equal(t, strings.ToUpper(mech), p.env["SLUICE_KAFKA_SASL_MECHANISM"])
	require.Equal(t, map[bool]string{true: str("kafka.sasl.username")}[mech != ""], p.env["SLUICE_KAFKA_SASL_USERNAME"])
	_, hasPassword := secretEnv(p.container)["SLUICE_KAFKA_SASL_PASSWORD"]
	require.Equal(t, mech != "", hasPassword, "the SASL password with a mechanism, and only then")

	redisVars := []string{"SLUICE_REDIS_ADDR", "SLUICE_REDIS_USERNAME", "SLUICE_REDIS_TLS", "SLUICE_REDIS_CA_FILE", "SLUICE_REDIS_SENTINEL_MASTER", "SLUICE_REDIS_PASSWORD"}
	if !withRedis {
		for _, v := range redisVars {
			require.NotContains(t, secretEnv(p.container), v, "%s: no Redis", p.deploy.Name)
			require.NotContains(t, p.env, v, "%s: no Redis", p.deploy.Name)
		}
		return
	}
	check(tlsVars{"SLUICE_REDIS_", "redis.tls"})
	require.Equal(t, str("redis.username"), p.env["SLUICE_REDIS_USERNAME"])
	if master := str("redis.sentinel.master"); master != "" {
		require.NotContains(t, p.env, "SLUICE_REDIS_ADDR")
		require.Equal(t, master, p.env["SLUICE_REDIS_SENTINEL_MASTER"])
		require.Equal(t, addrs(t, vals, "redis.sentinel.addrs"), p.env["SLUICE_REDIS_SENTINEL_ADDRS"])
		require.Equal(t, str("redis.sentinel.username"), p.env["SLUICE_REDIS_SENTINEL_USERNAME"])
	} else {
		require.Equal(t, addrs(t, vals, "redis.addr"), p.env["SLUICE_REDIS_ADDR"])
		require.NotContains(t, p.env, "SLUICE_REDIS_SENTINEL_MASTER")
		require.NotContains(t, secretEnv(p.container), "SLUICE_REDIS_SENTINEL_PASSWORD", "the Sentinels' password only with Sentinel")
	}
}

// secretEnv maps the variables a container takes from a Secret to their
// references.
func secretEnv(c corev1.Container) map[string]*corev1.SecretKeySelector {
	out := map[string]*corev1.SecretKeySelector{}
	for _, e := range c.Env {
		if e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil {
			out[e.Name] = e.ValueFrom.SecretKeyRef
		}
	}
	return out
}

// checkAPI checks the intake API's Deployment and Service.
func checkAPI(t *testing.T, sluice *sluiceCLI, r rendered, secret *corev1.Secret, w pod) pod {
	t.Helper()
	vals := r.values
	a := podOf(t, r, "quakes-sluice-api")
	require.Equal(t, "api", a.labels["app.kubernetes.io/component"])
	checkCLI(t, sluice, a, "api")
	checkSecurity(t, a)
	checkConnections(t, a, vals, false)
	require.Equal(t, w.env["SLUICE_BROKERS"], a.env["SLUICE_BROKERS"], "the API produces where the workers consume")
	h := sluice.help(t, []string{"api"})
	require.Regexp(t, `GET /healthz, GET /readyz`, h, "the API serves its probes beside it")

	port := listenPort(t, a.env["SLUICE_LISTEN"])
	require.Equal(t, port, containerPort(t, a.container, intstr.FromString("http")))
	types := loadMountedTypes(t, r, a.pod, a.container, a.env["SLUICE_TYPES"])
	handler, err := api.New(api.Config{Types: types, Producer: discardProducer{}, Registry: prometheus.NewRegistry()})
	require.NoError(t, err, "the API starts with the mounted types")
	checkProbes(t, a.container, port, handler)
	require.Greater(t, *a.pod.TerminationGracePeriodSeconds, int64(30), "sluice api finishes in-flight requests within 30 s")
	if secret != nil {
		for _, e := range a.container.Env {
			if ref := e.ValueFrom; ref != nil && ref.SecretKeyRef != nil && ref.SecretKeyRef.Name == secret.Name {
				require.Contains(t, secret.Data, ref.SecretKeyRef.Key, "%s: the created Secret has its key", e.Name)
			}
		}
	}
	checkExtras(t, a, vals, "api")
	checkFiles(t, a)

	svc := decodeOne[corev1.Service](t, r, "Service")
	checkLabels(t, "Service", svc.Labels)
	sel := labels.SelectorFromSet(svc.Spec.Selector)
	require.False(t, sel.Empty())
	require.True(t, sel.Matches(labels.Set(a.labels)), "the Service selects the API pods")
	require.False(t, sel.Matches(labels.Set(w.labels)), "and not the workers")
	require.Len(t, svc.Spec.Ports, 1)
	require.Equal(t, port, containerPort(t, a.container, svc.Spec.Ports[0].TargetPort))
	return a
}

type discardProducer struct{}

func (discardProducer) Produce(context.Context, string, []ingest.Record) error {
	return fmt.Errorf("not in this test")
}

// helmCommand is one `helm install` or `helm upgrade --install` of the
// docs, its words as the shell passes them.
type helmCommand struct {
	file string
	line uint
	args []string // after "helm"
}

func (c helmCommand) String() string {
	return fmt.Sprintf("%s:%d: helm %s", c.file, c.line, strings.Join(c.args, " "))
}

// fencedShellRE finds the shell code blocks of a Markdown file.
var fencedShellRE = regexp.MustCompile("(?ms)^```(?:sh|bash|shell)\n(.*?)^```")

// readmeHelmCommands returns the helm commands of the shell blocks of the
// Markdown files, parsed and expanded as a POSIX shell does (quotes,
// escapes, line continuations, brace expansion), with every variable set
// to a stand-in value. A word that a shell would glob (an unquoted [ or *)
// fails the test: zsh, macOS's shell, stops at a pattern that matches no
// file.
func readmeHelmCommands(t *testing.T, root string, files ...string) []helmCommand {
	t.Helper()
	var out []helmCommand
	for _, file := range files {
		md, err := os.ReadFile(filepath.Join(root, file))
		require.NoError(t, err)
		for _, m := range fencedShellRE.FindAllSubmatchIndex(md, -1) {
			block := string(md[m[2]:m[3]])
			if !regexp.MustCompile(`(?m)^\s*helm `).MatchString(block) {
				continue
			}
			startLine := uint(strings.Count(string(md[:m[2]]), "\n"))
			f, err := syntax.NewParser(syntax.Variant(syntax.LangBash)).Parse(strings.NewReader(block), file)
			require.NoError(t, err, "%s: a shell block that does not parse", file)
			syntax.Walk(f, func(n syntax.Node) bool {
				call, ok := n.(*syntax.CallExpr)
				if !ok || len(call.Args) == 0 || call.Args[0].Lit() != "helm" {
					return true
				}
				var globbed []string
				cfg := &expand.Config{
					Env: expand.FuncEnviron(func(name string) string { return "not-a-real-" + strings.ToLower(name) }),
					ReadDir2: func(dir string) ([]fs.DirEntry, error) {
						globbed = append(globbed, dir)
						return nil, nil
					},
				}
				words, err := expand.Fields(cfg, call.Args[1:]...)
				line := startLine + call.Pos().Line()
				require.NoError(t, err, "%s:%d: the shell cannot expand the command", file, line)
				require.Empty(t, globbed, "%s:%d: an unquoted glob pattern; quote the word", file, line)
				out = append(out, helmCommand{file: file, line: line, args: words})
				return true
			})
		}
	}
	return out
}

// values parses the command's flags as helm install (or upgrade --install)
// does and merges its values with Helm's own code: value files, then
// --set-json, --set, --set-string, --set-file and --set-literal. It
// returns the values and the value files read. The release must be
// helmRelease in helmNamespace, the chart deploy/helm/sluice.
func (c helmCommand) values(t *testing.T) (chartutil.Values, []string) {
	t.Helper()
	require.NotEmpty(t, c.args, "%s", c)
	sub := c.args[0]
	require.Contains(t, []string{"install", "upgrade"}, sub, "%s: install or upgrade --install", c)
	fs := pflag.NewFlagSet("helm "+sub, pflag.ContinueOnError)
	fs.SetOutput(io.Discard)
	var opts helmvalues.Options
	fs.StringSliceVarP(&opts.ValueFiles, "values", "f", nil, "")
	fs.StringArrayVar(&opts.Values, "set", nil, "")
	fs.StringArrayVar(&opts.StringValues, "set-string", nil, "")
	fs.StringArrayVar(&opts.FileValues, "set-file", nil, "")
	fs.StringArrayVar(&opts.JSONValues, "set-json", nil, "")
	fs.StringArrayVar(&opts.LiteralValues, "set-literal", nil, "")
	namespace := fs.StringP("namespace", "n", "default", "")
	fs.Bool("create-namespace", false, "")
	fs.Bool("wait", false, "")
	fs.Bool("atomic", false, "")
	var install *bool
	if sub == "upgrade" {
		install = fs.BoolP("install", "i", false, "")
	}
	require.NoError(t, fs.Parse(c.args[1:]), "%s: helm %s would refuse its flags", c, sub)
	if install != nil {
		require.True(t, *install, "%s: upgrade without --install needs a release the test does not have", c)
	}
	require.Equal(t, []string{helmRelease, "deploy/helm/sluice"}, fs.Args(), "%s: release %s of the repository's chart", c, helmRelease)
	require.Equal(t, helmNamespace, *namespace, "%s", c)
	merged, err := opts.MergeValues(nil)
	require.NoError(t, err, "%s: helm refuses the values", c)
	return merged, opts.ValueFiles
}
