package ingest_test

import (
	"context"
	"errors"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/ingest"
)

func TestRunStackStopsLayersInOrder(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var order []string
	layer := func(name string, err error) ingest.Runner {
		return ingest.RunFunc(func(ctx context.Context) error {
			<-ctx.Done()
			mu.Lock()
			order = append(order, name)
			mu.Unlock()
			return err
		})
	}
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	boom := errors.New("boom")
	err := ingest.RunStack(ctx, layer("pipeline", nil), layer("source", boom), layer("leases", nil))
	require.ErrorIs(t, err, boom)
	require.Equal(t, []string{"pipeline", "source", "leases"}, order)
}

func TestRunStackStopsAllWhenOneFails(t *testing.T) {
	t.Parallel()
	boom := errors.New("kafka unreachable")
	wait := ingest.RunFunc(func(ctx context.Context) error { <-ctx.Done(); return nil })
	err := ingest.RunStack(t.Context(), wait, ingest.RunFunc(func(context.Context) error { return boom }), wait)
	require.ErrorIs(t, err, boom)
}
