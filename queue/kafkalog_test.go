package queue

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"

	"github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/require"
)

// What kafka-go reports as an error but is routine is a DEBUG line: an
// idle partition's fetch timeout, a group's rebalance. A WARN is left for
// what a user should look at, and a group that keeps rebalancing is one.
func TestKafkaErrorsThatAreRoutineAreDebug(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	log := slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
	warn := kafkaLogger(log, slog.LevelWarn)
	lines := func() []string { return strings.Split(strings.TrimSpace(buf.String()), "\n") }

	warn("the kafka reader got an unknown error reading partition %d of %s at offset %d: %s", 3, "quakes", 0,
		errors.New("read tcp 127.0.0.1:36944->127.0.0.1:41265: i/o timeout"))
	warn("%v", fmt.Errorf("Failed to join group sluice-quakes: %w", kafka.RebalanceInProgress))
	warn("%v", kafka.IllegalGeneration)
	require.Len(t, lines(), 3)
	for _, l := range lines() {
		require.Contains(t, l, "level=DEBUG", l)
	}

	// Three more rebalances make five in the minute: routine; the sixth
	// is a WARN naming the count.
	buf.Reset()
	for range 3 {
		warn("%v", kafka.RebalanceInProgress)
	}
	require.NotContains(t, buf.String(), "level=WARN")
	warn("%v", kafka.RebalanceInProgress)
	require.Contains(t, buf.String(), "level=WARN")
	require.Contains(t, buf.String(), "rebalanced 6 times in the last minute")

	// Other errors are WARNs, at most one every 5 s.
	other := kafkaLogger(log, slog.LevelWarn)
	buf.Reset()
	other("failed to read from current broker for partition %d of %s at offset %d: %v", 0, "quakes", 5, errors.New("connection refused"))
	other("failed to read from current broker for partition %d of %s at offset %d: %v", 0, "quakes", 5, errors.New("connection refused"))
	require.Len(t, lines(), 1)
	require.Contains(t, buf.String(), "level=WARN")
	require.Contains(t, buf.String(), "connection refused")
}
