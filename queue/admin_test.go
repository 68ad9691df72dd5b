package queue

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestEnsureTopicIsIdempotent(t *testing.T) {
	t.Parallel()
	topic := newTopic(t, 3) // creates it
	ctx := testContext(t)
	require.NoError(t, EnsureTopic(ctx, testBrokers, topic, 3))
	require.NoError(t, EnsureTopic(ctx, testBrokers, topic, 5), "an existing topic is left as it is")
	end, err := EndOffsets(ctx, testBrokers, topic)
	require.NoError(t, err)
	require.Equal(t, map[int]int64{0: 0, 1: 0, 2: 0}, end)
}

func TestEnsureTopicValidates(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	require.ErrorIs(t, EnsureTopic(ctx, testBrokers, "", 1), ErrNoTopic)
	require.ErrorIs(t, EnsureTopic(ctx, testBrokers, "x", 0), ErrInvalidConfig)
	require.ErrorIs(t, EnsureTopic(ctx, nil, "x", 1), ErrInvalidConfig)
}

func TestOffsetsOfUnknownTopic(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	_, err := EndOffsets(ctx, testBrokers, "no-such-topic-"+t.Name())
	require.ErrorIs(t, err, ErrUnknownTopic)
	_, err = CommittedOffsets(ctx, testBrokers, "g", "no-such-topic-"+t.Name())
	require.ErrorIs(t, err, ErrUnknownTopic)
}

func TestOffsetsAfterProduce(t *testing.T) {
	t.Parallel()
	topic := newTopic(t, 2)
	produceN(t, topic, 20)
	a := Admin{Brokers: testBrokers}
	ctx := testContext(t)
	end, err := a.EndOffsets(ctx, topic)
	require.NoError(t, err)
	require.Len(t, end, 2)
	require.Equal(t, int64(20), end[0]+end[1])
	got, err := a.CommittedOffsets(ctx, "never-consumed-"+t.Name(), topic)
	require.NoError(t, err)
	require.Empty(t, got, "an unknown group has no committed offsets")
	_, err = a.CommittedOffsets(ctx, "", topic)
	require.ErrorIs(t, err, ErrInvalidConfig)
}
