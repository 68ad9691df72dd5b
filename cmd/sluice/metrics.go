package main

import (
	"context"
	"errors"
	"fmt"
	"net"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/urfave/cli/v2"

	"github.com/sluicehq/sluice/httpserver"
	"github.com/sluicehq/sluice/metrics"
)

func metricsFlag() cli.Flag {
	return inCategory(catLog, stringFlag("metrics-addr", "", "serve Prometheus /metrics, /healthz and /readyz on this `host:port` (off when empty)"))[0]
}

// newMetrics returns a registry with the Go and process collectors and
// sluice's own, or nils when --metrics-addr is not set.
func newMetrics(c *cli.Context) (*prometheus.Registry, *metrics.Collector, error) {
	if c.String("metrics-addr") == "" {
		return nil, nil, nil
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	col, err := metrics.New(reg)
	return reg, col, err
}

// withMetrics runs run and, when reg is set, the metrics server on addr
// beside it (metrics.Handler: /metrics, /healthz, and /readyz from ready),
// stopped after run returned.
func withMetrics(ctx context.Context, addr string, reg *prometheus.Registry, ready func(context.Context) error, run func(context.Context) error) error {
	if reg == nil {
		return run(ctx)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return usageError(fmt.Errorf("--metrics-addr: %w", err))
	}
	stop := httpserver.Background(ctx, ln, metrics.Handler(reg, ready), httpserver.DefaultDrain)
	err = run(ctx)
	return errors.Join(err, stop())
}
