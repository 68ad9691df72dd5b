package queue

import (
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/ingest"
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

	bootstrap, dials, _ := countingForwarder(t, testBrokers[0])
	shared := Admin{Brokers: []string{bootstrap}}.Shared(topic)
	poll(shared)
	// kafka-go's own metadata refresh may overlap a call and open a
	// second control connection; never one a call.
	polled := dials.Load()
	require.LessOrEqual(t, polled, int64(3), "a shared Admin keeps its bootstrap connections")
	require.NoError(t, shared.Ping(ctx))
	require.Greater(t, dials.Load(), polled, "Ping asks the brokers on a connection of its own")
	shared.Close()

	bootstrap, dials, _ = countingForwarder(t, testBrokers[0])
	poll(Admin{Brokers: []string{bootstrap}})
	require.GreaterOrEqual(t, dials.Load(), int64(60), "a plain Admin dials at least once a call")

	_, err := shared.EndOffsets(ctx, "other-"+topic)
	require.ErrorIs(t, err, ErrTopicNotConfigured, "a shared Admin knows only its topics")
}

// Every client of the package fetches the metadata of the topics it uses,
// not that of every topic in the cluster (kafka-go's default, megabytes a
// refresh on a cluster of thousands of partitions): beside 40 other
// topics, an Admin's calls, a Producer's writes and Ping read from the
// broker less than a third of what a kafka-go client fetching every
// topic's metadata reads for one call.
func TestClientsFetchOnlyTheirTopicsMetadata(t *testing.T) {
	t.Parallel()
	topic := newTopic(t, 2)
	for range 20 {
		newTopic(t, 1) // 40 topics with the dead-letter ones
	}
	ctx := testContext(t)

	bootstrap, _, read := countingForwarder(t, testBrokers[0])
	every := &kafka.Transport{IdleTimeout: callIdleTimeout} // MetadataTopics nil: every topic
	defer every.CloseIdleConnections()
	all := &kafka.Client{Addr: kafka.TCP(bootstrap), Transport: every}
	_, err := all.Metadata(ctx, &kafka.MetadataRequest{Topics: []string{topic}})
	require.NoError(t, err)
	everyTopic := read.Load()

	scoped := func(name string, call func(addr string) error) {
		addr, _, read := countingForwarder(t, testBrokers[0])
		require.NoError(t, call(addr), name)
		t.Logf("%s read %d bytes; a client of every topic's metadata %d", name, read.Load(), everyTopic)
		require.Less(t, 3*read.Load(), everyTopic, "%s fetched the metadata of other topics", name)
	}
	scoped("EndOffsets", func(addr string) error {
		_, err := Admin{Brokers: []string{addr}}.EndOffsets(ctx, topic)
		return err
	})
	scoped("GroupMembers", func(addr string) error {
		_, _, err := Admin{Brokers: []string{addr}}.GroupMembers(ctx, "g-"+topic)
		return err
	})
	scoped("Ping", func(addr string) error { return Admin{Brokers: []string{addr}}.Ping(ctx) })
	scoped("Produce", func(addr string) error {
		p, err := NewProducer(ProducerConfig{Brokers: []string{addr}, Topics: []string{topic}})
		require.NoError(t, err)
		defer p.Close()
		return p.Produce(ctx, topic, []ingest.Record{{ID: "a", Value: []byte(`{"id":"a"}`)}})
	})

	p, err := NewProducer(ProducerConfig{Brokers: testBrokers, Topics: []string{topic}})
	require.NoError(t, err)
	defer p.Close()
	err = p.Produce(ctx, DeadLetterTopic(topic), []ingest.Record{{ID: "a", Value: []byte(`{}`)}})
	require.ErrorIs(t, err, ErrTopicNotConfigured, "a write outside the producer's topics fails at once")
}

// countingForwarder listens on 127.0.0.1, forwards each connection to
// target, and counts the connections and the bytes read from target.
func countingForwarder(t *testing.T, target string) (addr string, dials, read *atomic.Int64) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	dials, read = new(atomic.Int64), new(atomic.Int64)
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
			wg.Go(func() { _, _ = io.Copy(countingWriter{in, read}, out); in.Close() })
		}
	})
	return ln.Addr().String(), dials, read
}

// countingWriter adds the bytes it writes to w to n.
type countingWriter struct {
	w io.Writer
	n *atomic.Int64
}

func (c countingWriter) Write(b []byte) (int, error) {
	k, err := c.w.Write(b)
	c.n.Add(int64(k))
	return k, err
}
