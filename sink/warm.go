package sink

import (
	"context"
	"fmt"
)

// warmWith opens up to conns connections to a sink by sending conns probes
// at once (each one opens its own connection when none is idle), and
// returns an error naming target when any probe fails: the first failure.
func warmWith(ctx context.Context, conns int, target string, probe func(context.Context) error) error {
	n := max(conns, 1)
	errs := make(chan error, n)
	for range n {
		go func() { errs <- probe(ctx) }()
	}
	var first error
	for range n {
		if err := <-errs; err != nil && first == nil {
			first = err
		}
	}
	if first != nil {
		return fmt.Errorf("sink: %s does not answer: %w", target, first)
	}
	return nil
}
