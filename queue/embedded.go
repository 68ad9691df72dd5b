package queue

import (
	"context"
	"fmt"
	"slices"

	"github.com/twmb/franz-go/pkg/kfake"
)

// Embedded is an in-process Kafka-protocol broker (franz-go's kfake) for
// --embedded and tests: one broker on a random 127.0.0.1 port, data in
// memory only, topics created explicitly (no auto-creation).
type Embedded struct {
	cluster *kfake.Cluster
}

// StartEmbedded starts the broker. ctx is not retained; Close stops it.
func StartEmbedded(ctx context.Context) (*Embedded, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("start embedded Kafka broker: %w", context.Cause(ctx))
	}
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.Ports(0))
	if err != nil {
		return nil, fmt.Errorf("start embedded Kafka broker: %w", err)
	}
	return &Embedded{cluster: c}, nil
}

// Addrs returns the broker's "127.0.0.1:port" addresses.
func (e *Embedded) Addrs() []string { return slices.Clone(e.cluster.ListenAddrs()) }

// Close stops the broker and drops its data.
func (e *Embedded) Close() { e.cluster.Close() }
