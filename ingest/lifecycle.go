package ingest

import (
	"context"
	"errors"
)

// Runner is a component with one lifecycle: Run returns when ctx is done (or
// it fails) and its goroutines have exited.
type Runner interface {
	Run(ctx context.Context) error
}

// RunFunc adapts a function to Runner.
type RunFunc func(ctx context.Context) error

// Run calls f.
func (f RunFunc) Run(ctx context.Context) error { return f(ctx) }

// RunStack runs layers together and stops them in dependency order: when ctx
// is done or any layer returns, the first layer is stopped, and each next
// one only after the previous has returned. A worker's stack is pipeline
// (stop fetching, drain), then source (commit what was acknowledged, close),
// then leases (stop counting, unlock). It returns the layers' errors joined.
func RunStack(ctx context.Context, layers ...Runner) error {
	type exit struct {
		i   int
		err error
	}
	cancels := make([]context.CancelFunc, len(layers))
	exits := make(chan exit, len(layers))
	for i, l := range layers {
		lctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
		cancels[i] = cancel
		go func() { exits <- exit{i, l.Run(lctx)} }()
	}
	errs := make([]error, len(layers))
	done := make([]bool, len(layers))
	record := func(e exit) { errs[e.i], done[e.i] = e.err, true }
	select {
	case <-ctx.Done():
	case e := <-exits:
		record(e)
	}
	for i := range layers {
		cancels[i]()
		for !done[i] {
			record(<-exits)
		}
	}
	return errors.Join(errs...)
}
