package main

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// A capacity source the sink cannot answer, and the source flags without a
// source, are usage errors (exit 2) that name what to use instead.
// Not parallel: see TestVersion (urfave/cli's help flag is shared).
func TestCapacitySourceUsageErrors(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		want []string
	}{
		{"from a sink that cannot tell", []string{"--capacity", "sink", "--sink", "postgres://u@127.0.0.1:1/db?table=t"},
			[]string{"--capacity sink", "a postgres sink announces no capacity", "give a number, or probe"}},
		{"DynamoDB in records", []string{"--capacity", "sink", "--sink", "dynamodb://quakes?region=eu-west-1"},
			[]string{"--capacity sink", "write capacity units", "--unit cost --cost 1/KiB"}},
		{"neither a number nor a source", []string{"--capacity", "plenty"},
			[]string{"--capacity", "sink (read it from the sink) or probe (find it)"}},
		{"no capacity", nil, []string{"--capacity: required"}},
		{"a floor for a number", []string{"--capacity", "100", "--capacity-floor", "10"},
			[]string{"--capacity-floor: only with --capacity sink or probe"}},
		{"a probe's margin for the sink", []string{"--capacity", "sink", "--probe-margin", "0.1", "--sink", "dynamodb://q?region=r"},
			[]string{"--probe-margin: only with --capacity probe"}},
		{"a bad probe margin", []string{"--capacity", "probe", "--probe-margin", "0.9"},
			[]string{"--capacity, --capacity-floor", "margin must be within (0, 0.5]"}},
		{"a bad definition mode", []string{"--capacity", "100", "--pool-definition", "merge"},
			[]string{"--pool-definition", "want apply, adopt or refuse"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, _, stderr := runCLI(t, append([]string{"worker", "--brokers", "127.0.0.1:1"}, tc.args...)...)
			require.Equal(t, exitUsage, code, stderr)
			for _, w := range tc.want {
				require.Contains(t, stderr, w)
			}
		})
	}
}
