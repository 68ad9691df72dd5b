package queue

import (
	"io"
	"net"
	"sync"
	"sync/atomic"
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

// TestSharedAdminPollsOnOneConnection polls offsets and the group 20 times
// through a bootstrap address that counts its connections: an Admin from
// Shared dials it once or twice, a plain Admin at least once a call (each
// call fetches the cluster's metadata anew), and Ping dials even on a
// shared Admin.
func TestSharedAdminPollsOnOneConnection(t *testing.T) {
	t.Parallel()
	topic := newTopic(t, 2)
	ctx := testContext(t)
	poll := func(a Admin) {
		for range 20 {
			_, err := a.EndOffsets(ctx, topic)
			require.NoError(t, err)
			_, err = a.CommittedOffsets(ctx, "g-"+topic, topic)
			require.NoError(t, err)
			_, _, err = a.GroupMembers(ctx, "g-"+topic)
			require.NoError(t, err)
		}
	}

	bootstrap, dials := countingForwarder(t, testBrokers[0])
	shared := Admin{Brokers: []string{bootstrap}}.Shared()
	poll(shared)
	// kafka-go's own metadata refresh may overlap a call and open a
	// second control connection; never one a call.
	polled := dials.Load()
	require.LessOrEqual(t, polled, int64(3), "a shared Admin keeps its bootstrap connections")
	require.NoError(t, shared.Ping(ctx))
	require.Greater(t, dials.Load(), polled, "Ping asks the brokers on a connection of its own")
	shared.Close()

	bootstrap, dials = countingForwarder(t, testBrokers[0])
	poll(Admin{Brokers: []string{bootstrap}})
	require.GreaterOrEqual(t, dials.Load(), int64(60), "a plain Admin dials at least once a call")
}

// countingForwarder listens on 127.0.0.1, forwards each connection to
// target, and counts the connections.
func countingForwarder(t *testing.T, target string) (addr string, dials *atomic.Int64) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	dials = new(atomic.Int64)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var open []net.Conn
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range open {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	wg.Go(func() {
		for {
			in, err := ln.Accept()
			if err != nil {
				return
			}
			dials.Add(1)
			out, err := net.Dial("tcp", target)
			if err != nil {
				in.Close()
				continue
			}
			mu.Lock()
			open = append(open, in, out)
			mu.Unlock()
			wg.Go(func() { _, _ = io.Copy(out, in); out.Close() })
			wg.Go(func() { _, _ = io.Copy(in, out); in.Close() })
		}
	})
	return ln.Addr().String(), dials
}
