package e2e

// Checks the alert rules in deploy/prometheus/alerts.yaml with
// Prometheus's own code: the file is parsed and validated by its rule
// parser (model/rulefmt, which parses each expr with the PromQL parser and
// each annotation as a template); every metric, label and label value an
// expr selects, groups or matches on must be one sluice registers (as the
// dashboard's test gathers them) or a scrape label; each rule is evaluated
// by Prometheus's rule engine on sample series, a failure that must fire
// it in time and a healthy run that must not; and the chart's copy,
// rendered as a PrometheusRule, holds the same rules. No build tag: it
// runs with `go test ./...`.

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/histogram"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/model/rulefmt"
	"github.com/prometheus/prometheus/promql"
	"github.com/prometheus/prometheus/promql/parser"
	"github.com/prometheus/prometheus/storage"
	"github.com/prometheus/prometheus/template"
	"github.com/prometheus/prometheus/tsdb/chunkenc"
	"github.com/prometheus/prometheus/tsdb/chunks"
	"github.com/prometheus/prometheus/util/annotations"
	"github.com/stretchr/testify/require"
	"helm.sh/helm/v3/pkg/chart/loader"
)

// alertRuleFiles are the plain rule file and the chart's copy of it.
var alertRuleFiles = []string{
	filepath.Join("deploy", "prometheus", "alerts.yaml"),
	filepath.Join("deploy", "helm", "sluice", "files", "alerts.yaml"),
}

// loadAlertRules parses a rule file as Prometheus does, failing t on any
// error Prometheus would report.
func loadAlertRules(t *testing.T, path string) *rulefmt.RuleGroups {
	t.Helper()
	groups, errs := rulefmt.ParseFile(path, false, model.LegacyValidation, parser.NewParser(parser.Options{}), slog.New(slog.DiscardHandler))
	require.Empty(t, errs, "%s: Prometheus refuses the rules", path)
	require.NotNil(t, groups)
	return groups
}

// alertScenario is a set of sample series (promqltest's load notation,
// one sample a minute) and when the alert must first fire on them: within
// [from, to] after the first sample, or never when to is zero.
type alertScenario struct {
	name     string
	series   string
	from, to time.Duration
}

// alertBrief is what each rule must watch, and how it must behave.
var alertBrief = map[string]struct {
	metric    string // the family its expr must read
	scenarios []alertScenario
}{
	"SluiceSinkPaused": {"sluice_sink_state", []alertScenario{
		{"paused for good from minute 6", `
sluice_sink_state{namespace="ingest",pool="quakes",worker="w1"} 0x5 1x20
sluice_sink_state{namespace="ingest",pool="quakes",worker="w2"} 0x25`, 11 * time.Minute, 11 * time.Minute},
		{"the workers take turns being paused, the sink never writes", `
sluice_sink_state{namespace="ingest",pool="quakes",worker="w1"} 1 0 1 0 1 0 1 0 1 0 1 0 1 0 1 0
sluice_sink_state{namespace="ingest",pool="quakes",worker="w2"} 0 1 0 1 0 1 0 1 0 1 0 1 0 1 0 1`, 5 * time.Minute, 5 * time.Minute},
		{"paused for 3 minutes, then resumed", `
sluice_sink_state{namespace="ingest",pool="quakes",worker="w1"} 0x5 1x2 0x20`, 0, 0},
	}},
	"SluiceConsumerLagGrowing": {"sluice_consumer_lag_records", []alertScenario{
		{"lag grows by 100 records a minute from minute 10", `
sluice_consumer_lag_records{namespace="ingest",pool="quakes",worker="w1"} 1000x10 1000+50x30
sluice_consumer_lag_records{namespace="ingest",pool="quakes",worker="w2"} 1000x10 1000+50x30`, 20 * time.Minute, 22 * time.Minute},
		{"bursts that the pool drains: 5 minutes up, 5 down", `
sluice_consumer_lag_records{namespace="ingest",pool="quakes",worker="w1"} 0+200x5 1000-200x5 0+200x5 1000-200x5 0+200x5 1000-200x5 0+200x5 1000-200x5`, 0, 0},
		{"a large backlog draining, and a worker whose lag is unknown", `
sluice_consumer_lag_records{namespace="ingest",pool="quakes",worker="w1"} 100000-100x40
sluice_consumer_lag_records{namespace="ingest",pool="quakes",worker="w2"} -1x40`, 0, 0},
	}},
	"SluiceLeasedBelowDemand": {"sluice_demand_units_per_second", []alertScenario{
		{"two workers get 300 of the 500 units/s they ask for", `
sluice_pool_effective_units_per_second{namespace="ingest",pool="quakes"} 1000x30
sluice_demand_units_per_second{namespace="ingest",pool="quakes",worker="w1"} 250x30
sluice_demand_units_per_second{namespace="ingest",pool="quakes",worker="w2"} 250x30
sluice_leased_units_per_second{namespace="ingest",pool="quakes",worker="w1"} 150x30
sluice_leased_units_per_second{namespace="ingest",pool="quakes",worker="w2"} 150x30`, 10 * time.Minute, 10 * time.Minute},
		{"backlogs beyond the pool (demand capped at it), 600 of 1000 leased", `
sluice_pool_effective_units_per_second{namespace="ingest",pool="quakes"} 1000x30
sluice_demand_units_per_second{namespace="ingest",pool="quakes",worker="w1"} 1000x30
sluice_demand_units_per_second{namespace="ingest",pool="quakes",worker="w2"} 1000x30
sluice_leased_units_per_second{namespace="ingest",pool="quakes",worker="w1"} 300x30
sluice_leased_units_per_second{namespace="ingest",pool="quakes",worker="w2"} 300x30`, 10 * time.Minute, 10 * time.Minute},
		{"backlogs beyond the pool, the whole pool leased", `
sluice_pool_effective_units_per_second{namespace="ingest",pool="quakes"} 1000x30
sluice_demand_units_per_second{namespace="ingest",pool="quakes",worker="w1"} 1000x30
sluice_demand_units_per_second{namespace="ingest",pool="quakes",worker="w2"} 1000x30
sluice_leased_units_per_second{namespace="ingest",pool="quakes",worker="w1"} 500x30
sluice_leased_units_per_second{namespace="ingest",pool="quakes",worker="w2"} 500x30`, 0, 0},
		{"the demand met, and idle workers", `
sluice_pool_effective_units_per_second{namespace="ingest",pool="quakes"} 1000x30
sluice_demand_units_per_second{namespace="ingest",pool="quakes",worker="w1"} 250x15 0x15
sluice_leased_units_per_second{namespace="ingest",pool="quakes",worker="w1"} 300x15 0x15`, 0, 0},
	}},
	"SluiceDeadLettersRising": {"sluice_records_total", []alertScenario{
		{"5 dead letters at minute 20", `
sluice_records_total{namespace="ingest",pool="quakes",outcome="dead_lettered"} 0x20 5x20
sluice_records_total{namespace="ingest",pool="quakes",outcome="delivered"} 0+1000x40`, 21 * time.Minute, 21 * time.Minute},
		{"records delivered, none dead-lettered, a restart", `
sluice_records_total{namespace="ingest",pool="quakes",outcome="dead_lettered"} 3x20 0x20
sluice_records_total{namespace="ingest",pool="quakes",outcome="delivered"} 0+1000x40`, 0, 0},
	}},
	"SluiceRedisUnreachable": {"sluice_redis_unreachable_seconds", []alertScenario{
		{"Redis down from minute 10", `
sluice_redis_unreachable_seconds{namespace="ingest",pool="quakes",worker="w1"} 0x10 60+60x20`, 12 * time.Minute, 12 * time.Minute},
		{"a 30-second blip", `
sluice_redis_unreachable_seconds{namespace="ingest",pool="quakes",worker="w1"} 0x10 30 0x20`, 0, 0},
	}},
	"SluiceWorkerNotReady": {"sluice_ready", []alertScenario{
		{"not ready from minute 10", `
sluice_ready{namespace="ingest",pool="quakes",worker="w1"} 1x9 0x20
sluice_ready{namespace="ingest",pool="quakes",worker="w2"} 1x30`, 15 * time.Minute, 15 * time.Minute},
		{"not ready for 3 minutes", `
sluice_ready{namespace="ingest",pool="quakes",worker="w1"} 1x9 0x2 1x20`, 0, 0},
	}},
}

func TestAlertRules(t *testing.T) {
	root, err := filepath.Abs("..")
	require.NoError(t, err)
	path := filepath.Join(root, alertRuleFiles[0])
	groups := loadAlertRules(t, path)

	// The chart's copy is the same file, so that the PrometheusRule and
	// the plain rule file cannot drift apart.
	plain, err := os.ReadFile(path)
	require.NoError(t, err)
	chartCopy, err := os.ReadFile(filepath.Join(root, alertRuleFiles[1]))
	require.NoError(t, err)
	require.Equal(t, string(plain), string(chartCopy), "cp %s %s", alertRuleFiles[0], alertRuleFiles[1])

	registered := registeredMetrics(t, root)
	seen := map[string]bool{}
	for _, g := range groups.Groups {
		for _, r := range g.Rules {
			require.NotEmpty(t, r.Alert, "%s: alerting rules only", r.Record)
			require.False(t, seen[r.Alert], "%s twice", r.Alert)
			seen[r.Alert] = true
			brief, ok := alertBrief[r.Alert]
			require.True(t, ok, "%s: a rule the test does not know; give it scenarios", r.Alert)

			families := checkQuery(t, registered, r.Alert, r.Expr)
			require.Contains(t, families, brief.metric, "%s watches %s", r.Alert, brief.metric)
			require.Contains(t, []string{"warning", "critical"}, r.Labels["severity"], "%s: a severity", r.Alert)
			for _, a := range []string{"summary", "description"} {
				require.NotEmpty(t, r.Annotations[a], "%s: annotation %s", r.Alert, a)
			}
			require.Greater(t, len(r.Annotations["description"]), 200, "%s: the description says what to do", r.Alert)

			// The labels the annotations name are ones the alert carries.
			expr, err := parser.NewParser(parser.Options{}).ParseExpr(r.Expr)
			require.NoError(t, err)
			out := outputLabels(t, registered, expr)
			for _, text := range r.Annotations {
				for _, m := range templateLabelRE.FindAllStringSubmatch(text, -1) {
					require.Contains(t, out, m[1], "%s: the annotations name $labels.%s, which %q does not keep", r.Alert, m[1], r.Expr)
				}
			}

			for _, sc := range brief.scenarios {
				t.Run(r.Alert+"/"+sc.name, func(t *testing.T) {
					checkAlertScenario(t, r, expr, sc)
				})
			}
		}
	}
	for name := range alertBrief {
		require.True(t, seen[name], "the rules alert on %s", name)
	}
}

// templateLabelRE finds the labels an annotation's template names.
var templateLabelRE = regexp.MustCompile(`\$labels\.([a-zA-Z_][a-zA-Z0-9_]*)`)

// checkAlertScenario evaluates rule r once a minute over the scenario's
// series with Prometheus's PromQL engine, as a Prometheus with a 1-minute
// evaluation interval does: a series of the result is pending from the
// first evaluation that returns it, firing once it has been returned for
// the rule's `for`, and forgotten at the first evaluation that does not
// return it. It checks when the rule first fires, and expands the
// annotations of a firing alert with Prometheus's template expander and
// the variables its rule manager defines ($labels, $value).
func checkAlertScenario(t *testing.T, r rulefmt.Rule, expr parser.Expr, sc alertScenario) {
	require.Zero(t, r.KeepFiringFor, "the evaluation here knows no keep_firing_for")
	storage := loadSeries(t, sc.series, time.Minute)
	engine := promql.NewEngine(promql.EngineOpts{MaxSamples: 1_000_000, Timeout: time.Minute, LookbackDelta: 5 * time.Minute})
	query := func(ctx context.Context, q string, ts time.Time) (promql.Vector, error) {
		qry, err := engine.NewInstantQuery(ctx, storage, nil, q, ts)
		if err != nil {
			return nil, err
		}
		defer qry.Close()
		res := qry.Exec(ctx)
		if res.Err != nil {
			return nil, res.Err
		}
		return res.Vector()
	}
	start := time.Unix(0, 0).UTC()
	activeSince := map[string]time.Time{}
	var firstFiring time.Duration = -1
	for at := time.Duration(0); at <= 40*time.Minute; at += time.Minute {
		ts := start.Add(at)
		vec, err := query(context.Background(), expr.String(), ts)
		require.NoError(t, err, "at %s", at)
		seen := map[string]bool{}
		for _, smpl := range vec {
			series := smpl.Metric.DropMetricName()
			key := series.String()
			seen[key] = true
			since, ok := activeSince[key]
			if !ok {
				since, activeSince[key] = ts, ts
			}
			if ts.Sub(since) < time.Duration(r.For) {
				continue // pending
			}
			if firstFiring < 0 {
				firstFiring = at
			}
			data := template.AlertTemplateData(series.Map(), nil, "", smpl)
			for name, text := range r.Annotations {
				defs := "{{$labels := .Labels}}{{$externalLabels := .ExternalLabels}}{{$externalURL := .ExternalURL}}{{$value := .Value}}"
				out, err := template.NewTemplateExpander(context.Background(), defs+text, "__alert_"+r.Alert, data,
					model.Time(ts.UnixMilli()), template.QueryFunc(query), nil, nil).Expand()
				require.NoError(t, err, "%s: annotation %s", r.Alert, name)
				require.NotContains(t, out, "<no value>", "%s: annotation %s: %s", r.Alert, name, out)
				if name == "summary" {
					require.Contains(t, out, "quakes", "%s: the summary names the pool", r.Alert)
				}
			}
		}
		for key := range activeSince {
			if !seen[key] {
				delete(activeSince, key)
			}
		}
	}
	if sc.to == 0 {
		require.Negative(t, firstFiring, "%s must not fire on %q, but fired at %s", r.Alert, sc.name, firstFiring)
		return
	}
	require.GreaterOrEqual(t, firstFiring, time.Duration(0), "%s never fired on %q", r.Alert, sc.name)
	require.True(t, firstFiring >= sc.from && firstFiring <= sc.to,
		"%s fired at %s on %q, want %s to %s", r.Alert, firstFiring, sc.name, sc.from, sc.to)
}

// loadSeries reads series in the notation of Prometheus's rule tests
// (`metric{label="v"} 0x5 1+1x10`, one line each, _ for a missing sample)
// with the PromQL parser, one sample every step from time 0, into an
// in-memory storage for the PromQL engine.
func loadSeries(t *testing.T, input string, step time.Duration) storage.Queryable {
	t.Helper()
	var all []storage.Series
	for _, line := range strings.Split(strings.TrimSpace(input), "\n") {
		lbls, vals, err := parser.NewParser(parser.Options{}).ParseSeriesDesc(line)
		require.NoError(t, err, "%q", line)
		var ss []chunks.Sample
		for i, v := range vals {
			if !v.Omitted {
				ss = append(ss, floatSample{t: int64(i) * step.Milliseconds(), f: v.Value})
			}
		}
		all = append(all, storage.NewListSeries(lbls, ss))
	}
	return &storage.MockQueryable{MockQuerier: &storage.MockQuerier{
		SelectMockFunction: func(_ bool, _ *storage.SelectHints, ms ...*labels.Matcher) storage.SeriesSet {
			var out []storage.Series
			for _, s := range all {
				if slices.IndexFunc(ms, func(m *labels.Matcher) bool { return !m.Matches(s.Labels().Get(m.Name)) }) < 0 {
					out = append(out, s)
				}
			}
			slices.SortFunc(out, func(a, b storage.Series) int { return labels.Compare(a.Labels(), b.Labels()) })
			return &listSeriesSet{series: out, i: -1}
		},
	}}
}

// floatSample is one float sample (chunks.Sample).
type floatSample struct {
	t int64
	f float64
}

func (s floatSample) T() int64                      { return s.t }
func (s floatSample) ST() int64                     { return 0 }
func (s floatSample) F() float64                    { return s.f }
func (s floatSample) H() *histogram.Histogram       { return nil }
func (s floatSample) FH() *histogram.FloatHistogram { return nil }
func (s floatSample) Type() chunkenc.ValueType      { return chunkenc.ValFloat }
func (s floatSample) Copy() chunks.Sample           { return s }

// listSeriesSet is a storage.SeriesSet over a slice.
type listSeriesSet struct {
	series []storage.Series
	i      int
}

func (l *listSeriesSet) Next() bool                        { l.i++; return l.i < len(l.series) }
func (l *listSeriesSet) At() storage.Series                { return l.series[l.i] }
func (l *listSeriesSet) Err() error                        { return nil }
func (l *listSeriesSet) Warnings() annotations.Annotations { return nil }

// outputLabels is the set of labels the series of an expression's result
// may carry (a vector selector's registered and scrape labels, what an
// aggregation keeps, a binary operation's left side or, for or, what both
// sides have).
func outputLabels(t *testing.T, registered map[string]registeredMetric, n parser.Node) map[string]bool {
	t.Helper()
	switch e := n.(type) {
	case *parser.VectorSelector:
		out := map[string]bool{}
		m, ok := registered[e.Name]
		require.True(t, ok, "%s is not registered", e.Name)
		for l := range m.labels {
			out[l] = true
		}
		for _, l := range scrapeLabels {
			out[l] = true
		}
		return out
	case *parser.MatrixSelector:
		return outputLabels(t, registered, e.VectorSelector)
	case *parser.SubqueryExpr:
		return outputLabels(t, registered, e.Expr)
	case *parser.ParenExpr:
		return outputLabels(t, registered, e.Expr)
	case *parser.UnaryExpr:
		return outputLabels(t, registered, e.Expr)
	case *parser.NumberLiteral, *parser.StringLiteral:
		return map[string]bool{}
	case *parser.AggregateExpr:
		inner := outputLabels(t, registered, e.Expr)
		out := map[string]bool{}
		if e.Without {
			for l := range inner {
				if !slices.Contains(e.Grouping, l) {
					out[l] = true
				}
			}
			return out
		}
		for _, l := range e.Grouping {
			out[l] = true
		}
		return out
	case *parser.Call:
		for _, a := range e.Args {
			if a.Type() == parser.ValueTypeVector || a.Type() == parser.ValueTypeMatrix {
				return outputLabels(t, registered, a)
			}
		}
		return map[string]bool{}
	case *parser.BinaryExpr:
		lhs, rhs := outputLabels(t, registered, e.LHS), outputLabels(t, registered, e.RHS)
		switch {
		case e.LHS.Type() != parser.ValueTypeVector:
			return rhs
		case e.RHS.Type() != parser.ValueTypeVector || e.Op != parser.LOR:
			return lhs
		}
		out := map[string]bool{}
		for l := range lhs {
			if rhs[l] {
				out[l] = true
			}
		}
		return out
	}
	require.Failf(t, "unknown node", "%T in an alert expression", n)
	return nil
}

// checkPrometheusRule: the chart's PrometheusRule holds exactly the rules
// of deploy/prometheus/alerts.yaml.
func checkPrometheusRule(t *testing.T, r rendered) {
	t.Helper()
	pr := decodeNamed[monitoringv1.PrometheusRule](t, r, "PrometheusRule/quakes-sluice")
	checkLabels(t, "PrometheusRule", pr.Labels)
	if extra, ok := value(r.values, "prometheusRule.labels"); ok {
		for k, v := range extra.(map[string]any) {
			require.Equal(t, v, pr.Labels[k], "prometheusRule.labels %s: for the Prometheus's ruleSelector", k)
		}
	}
	want := loadAlertRules(t, filepath.Join(repoRoot(t), alertRuleFiles[0]))
	require.Len(t, pr.Spec.Groups, len(want.Groups))
	for i, g := range want.Groups {
		got := pr.Spec.Groups[i]
		require.Equal(t, g.Name, got.Name)
		require.Len(t, got.Rules, len(g.Rules), "group %s", g.Name)
		for j, w := range g.Rules {
			rule := got.Rules[j]
			require.Equal(t, w.Alert, rule.Alert)
			require.Equal(t, w.Expr, rule.Expr.String(), "%s: expr", w.Alert)
			if w.For == 0 {
				require.Nil(t, rule.For, "%s: for", w.Alert)
			} else {
				require.NotNil(t, rule.For, "%s: for", w.Alert)
				d, err := model.ParseDuration(string(*rule.For))
				require.NoError(t, err)
				require.Equal(t, w.For, d, "%s: for", w.Alert)
			}
			require.Equal(t, w.Labels, rule.Labels, "%s: labels", w.Alert)
			require.Equal(t, w.Annotations, rule.Annotations, "%s: annotations", w.Alert)
		}
	}
}

// repoRoot is the repository's root: the nearest folder up from the
// working directory whose go.mod is sluice's (tests may chdir to it).
func repoRoot(t *testing.T) string {
	t.Helper()
	dir, err := os.Getwd()
	require.NoError(t, err)
	for {
		if mod, err := os.ReadFile(filepath.Join(dir, "go.mod")); err == nil && strings.HasPrefix(string(mod), "module github.com/sluicehq/sluice\n") {
			return dir
		}
		parent := filepath.Dir(dir)
		require.NotEqual(t, dir, parent, "no sluice go.mod above the working directory")
		dir = parent
	}
}

// TestAlertRulesInChart: the chart's copy of the rules is in the packaged
// chart (not ignored), and the PrometheusRule renders only when asked.
func TestAlertRulesInChart(t *testing.T) {
	root, err := filepath.Abs("..")
	require.NoError(t, err)
	chrt, err := loader.Load(filepath.Join(root, "deploy", "helm", "sluice"))
	require.NoError(t, err)
	var found bool
	for _, f := range chrt.Files {
		found = found || f.Name == "files/alerts.yaml"
	}
	require.True(t, found, "files/alerts.yaml is part of the chart")
	r := mustRender(t, chrt, values(t, helmRequired))
	require.NotContains(t, r.names(), "PrometheusRule/quakes-sluice", "off by default")
	r = mustRender(t, chrt, values(t, helmRequired, "prometheusRule: {enabled: true, labels: {release: kube-prometheus-stack}}"))
	checkPrometheusRule(t, r)
	require.Equal(t, fmt.Sprint(len(alertBrief)), fmt.Sprint(strings.Count(r.docs["PrometheusRule/quakes-sluice"], "- alert: ")))
}
