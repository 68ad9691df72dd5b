package worker

import (
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/ingest"
	"github.com/sluicehq/sluice/lease"
)

// TestConfigValidateNamesTheField checks each rule of Config once: the
// error is a *ConfigError wrapping ErrConfig whose Field is the setting
// to change, and a valid Config with its zero fields defaulted passes.
func TestConfigValidateNamesTheField(t *testing.T) {
	valid := func() Config {
		return Config{Brokers: []string{"127.0.0.1:9092"}, Topic: "quakes", Pool: lease.Pool{Name: "quakes", Capacity: 100, Partitions: 4}}
	}
	require.NoError(t, valid().Validate())
	for _, tc := range []struct {
		field string
		edit  func(*Config)
	}{
		{"Brokers", func(c *Config) { c.Brokers = nil }},
		{"Topic", func(c *Config) { c.Topic = "" }},
		{"Slice", func(c *Config) { c.Slice = time.Millisecond }},
		{"MaxBatch", func(c *Config) { c.MaxBatch = -1 }},
		{"Concurrency", func(c *Config) { c.Concurrency = -1 }},
		{"MaxInFlight", func(c *Config) { c.MaxInFlight = -1 }},
		{"MaxInFlightBytes", func(c *Config) { c.MaxInFlightBytes = ingest.RecordOverhead - 1 }},
		{"MaxAttempts", func(c *Config) { c.MaxAttempts = -1 }},
		{"Guard", func(c *Config) { c.Guard = ingest.DefaultSlice }},
		{"RequestTimeout, Grace, ReadyAfter, StallTimeout", func(c *Config) { c.StallTimeout = -time.Second }},
		{"Reserved", func(c *Config) { c.Reserved = 5 }},
		{"Priority", func(c *Config) { c.Priority = 3 }},
		{"Weight", func(c *Config) { c.Weight = -2 }},
		{"Pool.Capacity", func(c *Config) { c.Pool.Capacity = 0 }},
		{"Pool.Partitions", func(c *Config) { c.Pool.Partitions = 0 }},
	} {
		c := valid()
		tc.edit(&c)
		err := c.Validate()
		var ce *ConfigError
		require.ErrorAs(t, err, &ce, tc.field)
		require.Equal(t, tc.field, ce.Field)
		require.True(t, errors.Is(err, ErrConfig), tc.field)
	}
}
