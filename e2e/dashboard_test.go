package e2e

// Checks the Grafana dashboard under deploy/grafana against the metrics
// sluice really exports: every panel query is parsed with Prometheus's own
// PromQL parser, and every metric, label and label value it selects, and
// every label it groups or matches by, must be one that the metrics
// package or the intake API registers, as gathered from a registry fed
// with real components, or a scrape label; every selector is narrowed by
// the namespace, job and pool variables; and each query's unit, worked
// out from its metrics and functions, is the one its panel shows. No
// build tag: it runs with `go test ./...`.

import (
	"cmp"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql/parser"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/api"
	"github.com/sluicehq/sluice/ingest"
	"github.com/sluicehq/sluice/lease"
	"github.com/sluicehq/sluice/metrics"
	"github.com/sluicehq/sluice/pacing"
	"github.com/sluicehq/sluice/recordtype"
)

// grafanaDashboard is the part of Grafana's dashboard JSON model the test
// reads.
type grafanaDashboard struct {
	Title         string `json:"title"`
	UID           string `json:"uid"`
	SchemaVersion int    `json:"schemaVersion"`
	Templating    struct {
		List []struct {
			Name       string          `json:"name"`
			Type       string          `json:"type"`
			Query      json.RawMessage `json:"query"`
			Definition string          `json:"definition"`
			Datasource *grafanaDS      `json:"datasource"`
			Multi      bool            `json:"multi"`
			IncludeAll bool            `json:"includeAll"`
			AllValue   string          `json:"allValue"`
		} `json:"list"`
	} `json:"templating"`
	Panels []grafanaPanel `json:"panels"`
}

type grafanaDS struct {
	Type string `json:"type"`
	UID  string `json:"uid"`
}

type grafanaPanel struct {
	ID         int        `json:"id"`
	Type       string     `json:"type"`
	Title      string     `json:"title"`
	Datasource *grafanaDS `json:"datasource"`
	GridPos    struct {
		H, W, X, Y int
	} `json:"gridPos"`
	Targets []struct {
		RefID      string     `json:"refId"`
		Expr       string     `json:"expr"`
		Datasource *grafanaDS `json:"datasource"`
	} `json:"targets"`
	Panels      []grafanaPanel `json:"panels"` // a collapsed row's
	FieldConfig struct {
		Defaults struct {
			Unit string `json:"unit"`
		} `json:"defaults"`
		Overrides []struct {
			Matcher struct {
				ID      string `json:"id"`
				Options string `json:"options"`
			} `json:"matcher"`
			Properties []struct {
				ID    string `json:"id"`
				Value any    `json:"value"`
			} `json:"properties"`
		} `json:"overrides"`
	} `json:"fieldConfig"`
}

// The values the test gives Grafana's variables before parsing a query,
// as Grafana interpolates them; the dashboard's own variables become
// stand-ins the test recognizes in the selectors.
var grafanaVars = strings.NewReplacer(
	"$__rate_interval", "2m",
	"$__interval", "1m",
	"$__range", "1h",
	"$namespace", "namespace_variable",
	"$job", "job_variable",
	"$pool", "pool_variable",
)

// scopeVariables are the dashboard's variables that narrow every query,
// by the label each narrows and its stand-in.
var scopeVariables = map[string]string{"namespace": "namespace_variable", "job": "job_variable", "pool": "pool_variable"}

// scrapeLabels are the labels Prometheus gives every series of a target
// besides the ones sluice registers: job and instance always, namespace
// and pod from Kubernetes discovery (prometheus-operator's PodMonitor, the
// chart's podMonitor, sets both).
var scrapeLabels = []string{"job", "instance", "namespace", "pod"}

// registeredMetric is what the test knows of one exported metric family.
type registeredMetric struct {
	typ    dto.MetricType
	labels map[string][]string // label → values seen
}

func TestGrafanaDashboard(t *testing.T) {
	root, err := filepath.Abs("..")
	require.NoError(t, err)
	raw, err := os.ReadFile(filepath.Join(root, "deploy", "grafana", "sluice.json"))
	require.NoError(t, err)
	var dash grafanaDashboard
	require.NoError(t, json.Unmarshal(raw, &dash))
	require.NotEmpty(t, dash.Title)
	require.NotEmpty(t, dash.UID)
	require.GreaterOrEqual(t, dash.SchemaVersion, 41, "the schema of a current Grafana (12 or later)")

	registered := registeredMetrics(t, root)
	// The names the metrics package doc lists are the ones it exports.
	doc, err := os.ReadFile(filepath.Join(root, "metrics", "metrics.go"))
	require.NoError(t, err)
	for name, m := range registered {
		if !strings.HasPrefix(name, "sluice_api_") {
			require.Contains(t, string(doc), name, "the metrics package doc lists %s", name)
		}
		require.NotEmpty(t, m.labels, "%s has labels", name)
	}

	// Variables: a Prometheus data source, then namespace, job and pool
	// from a real metric, each narrowed by the ones before it.
	var vars []string
	for _, v := range dash.Templating.List {
		vars = append(vars, v.Name)
		if v.Name == "datasource" {
			require.Equal(t, "datasource", v.Type)
			require.JSONEq(t, `"prometheus"`, string(v.Query))
			continue
		}
		_, scoped := scopeVariables[v.Name]
		require.True(t, scoped, "a variable the test does not know: %s", v.Name)
		require.Equal(t, "query", v.Type)
		require.Equal(t, "${datasource}", v.Datasource.UID)
		require.True(t, v.Multi && v.IncludeAll, "%s: several at once", v.Name)
		require.Equal(t, ".*", v.AllValue, "%s: All matches values not listed yet", v.Name)
		selector, label := labelValuesQuery(t, v.Definition)
		require.Equal(t, v.Name, label, "variable %s lists the label %s", v.Name, v.Name)
		families := checkQuery(t, registered, "variable "+v.Name, selector)
		require.Len(t, families, 1)
		require.Contains(t, withLabel(registered[families[0]].labels, scrapeLabels...), label, "variable %s: %s", v.Name, v.Definition)
		vs := selectorsOf(t, selector)
		for _, before := range vars[1 : len(vars)-1] {
			requireNarrowed(t, "variable "+v.Name, vs[0], before)
		}
		var q struct{ Query string }
		require.NoError(t, json.Unmarshal(v.Query, &q))
		require.Equal(t, v.Definition, q.Query, "variable %s: the query is its definition", v.Name)
	}
	require.Equal(t, []string{"datasource", "namespace", "job", "pool"}, vars, "the variables, in the order they narrow")

	panels := flattenPanels(dash.Panels)
	used := map[string]bool{} // metric families the dashboard shows
	ids := map[int]bool{}
	var cells [][4]int
	for _, p := range panels {
		require.False(t, ids[p.ID], "panel id %d twice", p.ID)
		ids[p.ID] = true
		g := p.GridPos
		require.True(t, g.W > 0 && g.H > 0 && g.X >= 0 && g.X+g.W <= 24, "panel %q: gridPos %+v within 24 columns", p.Title, g)
		for _, c := range cells {
			overlap := g.X < c[0]+c[2] && c[0] < g.X+g.W && g.Y < c[1]+c[3] && c[1] < g.Y+g.H
			require.False(t, overlap, "panel %q overlaps another at %+v", p.Title, g)
		}
		cells = append(cells, [4]int{g.X, g.Y, g.W, g.H})
		if p.Type == "row" {
			continue
		}
		require.NotEmpty(t, p.Targets, "panel %q has queries", p.Title)
		require.Equal(t, "${datasource}", p.Datasource.UID, "panel %q uses the data source variable", p.Title)
		units := map[string]string{} // refId → the unit the panel shows it in
		for _, o := range p.FieldConfig.Overrides {
			require.Equal(t, "byFrameRefID", o.Matcher.ID, "panel %q: overrides by query", p.Title)
			for _, prop := range o.Properties {
				if prop.ID == "unit" {
					units[o.Matcher.Options] = prop.Value.(string)
				}
			}
		}
		for _, tg := range p.Targets {
			what := p.Title + " " + tg.RefID
			require.Equal(t, "${datasource}", tg.Datasource.UID, "panel %q %s", p.Title, tg.RefID)
			for _, name := range checkQuery(t, registered, what, tg.Expr) {
				used[name] = true
			}
			for _, vs := range selectorsOf(t, tg.Expr) {
				for _, label := range []string{"namespace", "job", "pool"} {
					if _, has := registered[vs.Name].labels[label]; has || label != "pool" {
						requireNarrowed(t, what, vs, label)
					}
				}
			}
			unit := cmp.Or(units[tg.RefID], p.FieldConfig.Defaults.Unit)
			require.Equal(t, grafanaUnit(t, registered, what, tg.Expr), unit, "%s: %s", what, tg.Expr)
		}
	}

	// The brief of the dashboard: each of these is on it.
	for _, name := range []string{
		"sluice_slice_used_units_total", "sluice_leased_units_per_second", "sluice_pool_capacity_units_per_second",
		"sluice_leases_held", "sluice_consumer_lag_records", "sluice_eta_seconds", "sluice_sink_record_results_total",
		"sluice_throttle_cuts_total", "sluice_records_total", "sluice_batch_duration_seconds",
		"sluice_api_requests_total", "sluice_api_request_duration_seconds",
		"sluice_send_max_units_1s", "sluice_ready", "sluice_hot_key_ranges_total", "sluice_hot_key_range_cuts_total",
		"sluice_demand_units_per_second", "sluice_redis_unreachable_seconds", "sluice_sink_state",
	} {
		require.True(t, used[name], "the dashboard shows %s", name)
	}
}

// flattenPanels lists the panels with the ones inside collapsed rows.
func flattenPanels(ps []grafanaPanel) []grafanaPanel {
	var out []grafanaPanel
	for _, p := range ps {
		out = append(out, p)
		out = append(out, flattenPanels(p.Panels)...)
	}
	return out
}

// labelValuesQuery splits Grafana's label_values(selector, label).
func labelValuesQuery(t *testing.T, q string) (selector, label string) {
	t.Helper()
	args, ok := strings.CutPrefix(q, "label_values(")
	require.True(t, ok, "%q", q)
	args, ok = strings.CutSuffix(args, ")")
	require.True(t, ok, "%q", q)
	i := strings.LastIndex(args, ",")
	require.Positive(t, i, "%q", q)
	return strings.TrimSpace(args[:i]), strings.TrimSpace(args[i+1:])
}

// selectorsOf parses a query after Grafana's interpolation and returns its
// vector selectors.
func selectorsOf(t *testing.T, expr string) []*parser.VectorSelector {
	t.Helper()
	ast, err := parser.NewParser(parser.Options{}).ParseExpr(grafanaVars.Replace(expr))
	require.NoError(t, err, "%s", expr)
	var out []*parser.VectorSelector
	parser.Inspect(ast, func(n parser.Node, _ []parser.Node) error {
		if vs, ok := n.(*parser.VectorSelector); ok {
			out = append(out, vs)
		}
		return nil
	})
	return out
}

// requireNarrowed: the selector matches label against its variable
// (label=~"$label", as the variable may hold several values or All).
func requireNarrowed(t *testing.T, what string, vs *parser.VectorSelector, label string) {
	t.Helper()
	for _, m := range vs.LabelMatchers {
		if m.Name == label {
			require.Equal(t, labels.MatchRegexp, m.Type, "%s: %s=~\"$%s\"", what, label, label)
			require.Equal(t, scopeVariables[label], m.Value, "%s: %s=~\"$%s\"", what, label, label)
			return
		}
	}
	require.Failf(t, "not narrowed", "%s: %s has no %s=~\"$%s\"", what, vs, label, label)
}

// grafanaUnit works out the unit of a query from its metrics (their name's
// unit: units/s, seconds, records, ...) and the functions over them (rate
// divides a counter by seconds, a ratio of like units is a fraction), and
// returns the Grafana unit a panel must show it in: count:units/s for the
// pool's unit per second, count:records, s, percentunit, and so on.
func grafanaUnit(t *testing.T, registered map[string]registeredMetric, what, expr string) string {
	t.Helper()
	ast, err := parser.NewParser(parser.Options{}).ParseExpr(grafanaVars.Replace(expr))
	require.NoError(t, err)
	u := queryUnit(t, registered, what, ast)
	g, ok := map[string]string{
		"units/s": "count:units/s", "units": "count:units",
		"records/s": "count:records/s", "records": "count:records",
		"requests/s": "reqps", "bytes/s": "Bps",
		"events/s": "ops", "events": "short",
		"s": "s", "s/s": "percentunit", "ratio": "percentunit",
		"partitions": "short", "workers": "short",
	}[u]
	require.True(t, ok, "%s: no Grafana unit for %q", what, u)
	return g
}

// metricUnits gives each metric family's unit by its name's ending, the
// longest matching first; counters count it, gauges measure it.
var metricUnits = []struct{ suffix, unit string }{
	{"_units_per_second", "units/s"},
	{"_units_1s", "units/s"}, // the units of the busiest second: a rate over that second
	{"_units_total", "units"},
	{"_seconds_total", "s"},
	{"_seconds_sum", "s"},
	{"_seconds_count", "events"},
	{"_seconds", "s"},
	{"_records", "records"},
	{"sluice_records_total", "records"},
	{"_record_results_total", "records"},
	{"_records_accepted_total", "records"},
	{"_retries_total", "records"}, // record attempts scheduled again
	{"_requests_total", "requests"},
	{"_bytes_total", "bytes"},
	{"_total", "events"},
	{"_leases_held", "partitions"},
	{"_partitions_missing", "partitions"},
	{"sluice_ready", "workers"},      // 1 per ready worker
	{"sluice_sink_state", "workers"}, // 1 per paused worker
}

func queryUnit(t *testing.T, registered map[string]registeredMetric, what string, n parser.Node) string {
	t.Helper()
	switch e := n.(type) {
	case *parser.VectorSelector:
		for _, mu := range metricUnits {
			if strings.HasSuffix(e.Name, mu.suffix) {
				return mu.unit
			}
		}
		require.Failf(t, "no unit", "%s: the test knows no unit of %s", what, e.Name)
	case *parser.MatrixSelector:
		return queryUnit(t, registered, what, e.VectorSelector)
	case *parser.ParenExpr:
		return queryUnit(t, registered, what, e.Expr)
	case *parser.AggregateExpr:
		if e.Op == parser.COUNT {
			return "workers" // series counted: one per worker
		}
		return queryUnit(t, registered, what, e.Expr)
	case *parser.Call:
		switch e.Func.Name {
		case "rate", "irate":
			return queryUnit(t, registered, what, e.Args[0]) + "/s"
		case "increase", "delta", "deriv":
			return queryUnit(t, registered, what, e.Args[0])
		case "histogram_quantile":
			return "s" // sluice's histograms measure seconds
		}
		require.Failf(t, "no unit", "%s: the test knows no unit of %s()", what, e.Func.Name)
	case *parser.BinaryExpr:
		if e.Op.IsComparisonOperator() {
			return queryUnit(t, registered, what, e.LHS) // a filter keeps the left side
		}
		l, r := queryUnit(t, registered, what, e.LHS), queryUnit(t, registered, what, e.RHS)
		require.Equal(t, parser.ItemType(parser.DIV), e.Op, "%s: the test knows the units of ratios and filters only", what)
		switch {
		case l == r:
			return "ratio"
		case l == "s/s" && r == "events/s":
			return "s" // seconds per event: a mean duration
		}
		require.Failf(t, "no unit", "%s: %s / %s", what, l, r)
	}
	require.Failf(t, "no unit", "%s: %T", what, n)
	return ""
}

// checkQuery parses a panel's PromQL after Grafana's interpolation and
// checks each selector and grouping against the registered metrics. It
// returns the metric families the query reads.
func checkQuery(t *testing.T, registered map[string]registeredMetric, what, expr string) []string {
	t.Helper()
	q := grafanaVars.Replace(expr)
	require.NotContains(t, q, "$", "%s: a variable the test does not know in %q", what, expr)
	ast, err := parser.NewParser(parser.Options{}).ParseExpr(q)
	require.NoError(t, err, "%s: %s", what, expr)

	var families []string
	// family resolves a selector to its metric family and the labels its
	// series carry (le on a histogram's buckets).
	family := func(vs *parser.VectorSelector) (string, map[string][]string) {
		name := vs.Name
		require.NotEmpty(t, name, "%s: a selector without a metric name: %s", what, vs)
		if m, ok := registered[name]; ok && m.typ != dto.MetricType_HISTOGRAM {
			return name, withLabel(m.labels, scrapeLabels...)
		}
		for _, suffix := range []string{"_bucket", "_sum", "_count"} {
			base, ok := strings.CutSuffix(name, suffix)
			if m, found := registered[base]; ok && found {
				require.Equal(t, dto.MetricType_HISTOGRAM, m.typ, "%s: %s of %s, which is no histogram", what, suffix, base)
				l := withLabel(m.labels, scrapeLabels...)
				if suffix == "_bucket" {
					l = withLabel(l, "le")
				}
				return base, l
			}
		}
		require.Failf(t, "unknown metric", "%s: %s is registered by neither the metrics package nor the API (%q)", what, name, expr)
		return "", nil
	}
	var walk func(n parser.Node) []map[string][]string // the label sets under n
	walk = func(n parser.Node) []map[string][]string {
		var sets []map[string][]string
		if vs, ok := n.(*parser.VectorSelector); ok {
			name, ls := family(vs)
			families = append(families, name)
			for _, m := range vs.LabelMatchers {
				if m.Name == labels.MetricName {
					continue
				}
				values, ok := ls[m.Name]
				require.True(t, ok, "%s: %s has no label %s", what, name, m.Name)
				if m.Type == labels.MatchEqual {
					require.Contains(t, values, m.Value, "%s: %s{%s} is never %q", what, name, m.Name, m.Value)
				}
			}
			return []map[string][]string{ls}
		}
		for _, c := range parser.Children(n) {
			sets = append(sets, walk(c)...)
		}
		if bin, ok := n.(*parser.BinaryExpr); ok && bin.VectorMatching != nil && bin.VectorMatching.On {
			// on (...) matches on labels both sides must have.
			for _, l := range bin.VectorMatching.MatchingLabels {
				for _, ls := range sets {
					require.Contains(t, ls, l, "%s: matched on %s, which a series below has not: %q", what, l, expr)
				}
			}
		}
		if agg, ok := n.(*parser.AggregateExpr); ok && !agg.Without {
			for _, l := range agg.Grouping {
				for _, ls := range sets {
					require.Contains(t, ls, l, "%s: grouped by %s, which a series below has not: %q", what, l, expr)
				}
			}
			// Above an aggregation only the grouping labels are left.
			kept := map[string][]string{}
			for _, l := range agg.Grouping {
				kept[l] = nil
			}
			return []map[string][]string{kept}
		}
		return sets
	}
	walk(ast)
	require.NotEmpty(t, families, "%s: the query reads no metric", what)
	return families
}

// withLabel returns l with more labels (of any value).
func withLabel(l map[string][]string, extra ...string) map[string][]string {
	out := map[string][]string{}
	for _, e := range extra {
		out[e] = nil
	}
	for k, v := range l {
		out[k] = v
	}
	return out
}

// registeredMetrics gathers what a worker process and the intake API
// export, from the real metrics.Collector (over a real lease manager on an
// in-process Redis and a real pacer) and a real api.Handler that has
// answered one request, on a fresh registry each.
func registeredMetrics(t *testing.T, root string) map[string]registeredMetric {
	t.Helper()
	out := map[string]registeredMetric{}
	gather := func(reg *prometheus.Registry) {
		mfs, err := reg.Gather()
		require.NoError(t, err)
		for _, mf := range mfs {
			m := registeredMetric{typ: mf.GetType(), labels: map[string][]string{}}
			for _, s := range mf.GetMetric() {
				for _, lp := range s.GetLabel() {
					if !slices.Contains(m.labels[lp.GetName()], lp.GetValue()) {
						m.labels[lp.GetName()] = append(m.labels[lp.GetName()], lp.GetValue())
					}
				}
			}
			out[mf.GetName()] = m
		}
	}

	// A worker: what `sluice worker --metrics-addr` registers.
	mr := miniredis.RunT(t)
	client := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	t.Cleanup(func() { _ = client.Close() })
	mgr, err := lease.New(lease.Config{Pool: lease.Pool{Name: "quakes", Capacity: 100, Partitions: 4}, WorkerID: "w1"}, client)
	require.NoError(t, err)
	pacer, err := pacing.New(pacing.Config{}, mgr)
	require.NoError(t, err)
	reg := prometheus.NewRegistry()
	col, err := metrics.New(reg)
	require.NoError(t, err)
	col.Add(metrics.Worker{Pool: "quakes", Lease: mgr, Pacer: pacer, Lag: func() int64 { return 42 }, Sink: pausedSink{}}, &ingest.Counters{})
	col.ObserveWrite("quakes")(10, 5*time.Millisecond)
	gather(reg)
	require.Contains(t, out, "sluice_batch_duration_seconds")

	// The intake API, after one accepted request.
	types, err := recordtype.Load(filepath.Join(root, "examples", "types.yaml"))
	require.NoError(t, err)
	reg = prometheus.NewRegistry()
	h, err := api.New(api.Config{Types: types, Producer: acceptProducer{}, Registry: reg,
		Tokens: map[[32]byte][]string{api.HashToken("token"): {"*"}}})
	require.NoError(t, err)
	req := httptest.NewRequest(http.MethodPost, "/v1/records/earthquake", strings.NewReader(`{"id":"nc1","time":"2025-05-01T00:00:00Z"}`+"\n"))
	req.Header.Set("Authorization", "Bearer token")
	req.Header.Set("Content-Type", "application/x-ndjson")
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	require.Equal(t, http.StatusAccepted, rec.Code, "%s", rec.Body)
	gather(reg)
	require.Contains(t, out, "sluice_api_requests_total")
	return out
}

// pausedSink is a worker's sink state as the collector reads it (the
// metrics' names and labels do not depend on its values).
type pausedSink struct{}

func (pausedSink) SinkPaused() (bool, time.Time)  { return true, time.Now().Add(-time.Second) }
func (pausedSink) SinkPausedTotal() time.Duration { return time.Second }
func (pausedSink) Ready() error                   { return nil }

type acceptProducer struct{}

func (acceptProducer) Produce(context.Context, string, []ingest.Record) error { return nil }
