package queue

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/sluicehq/sluice/ingest"
)

// ErrUnknownTopic is returned (wrapped) when a topic does not exist.
var ErrUnknownTopic = errors.New("queue: unknown topic")

// ErrTopicNotConfigured is returned (wrapped) by a Producer or a shared
// Admin asked about a topic outside those it was created for: its
// metadata covers only them.
var ErrTopicNotConfigured = errors.New("queue: topic not configured")

// inScope returns nil when every topic is one of scope, else an error
// wrapping ErrTopicNotConfigured that names it.
func inScope(topics, scope []string) error {
	for _, t := range topics {
		if !slices.Contains(scope, t) {
			return fmt.Errorf("topic %q: %w (this client's topics: %q)", t, ErrTopicNotConfigured, scope)
		}
	}
	return nil
}

// adminTimeout bounds each admin call whose ctx has no earlier deadline.
const adminTimeout = 30 * time.Second

// callIdleTimeout is the idle timeout of the transport an admin call
// opens for itself. kafka-go keeps a transport's connection timer, and
// through it the cluster metadata the transport fetched, until the idle
// timeout fires even after CloseIdleConnections (v0.4.51), so at its
// default of 30 s a caller polling every 200 ms held about 150 such
// transports: 0.3 MiB each on a broker with 200 topics.
const callIdleTimeout = time.Second

// Admin creates topics and reads offsets and groups (for a bulk load's
// progress, readiness, tests); it implements ingest.Offsets. The
// package-level functions of the same names are an Admin with a zero Conn
// (PLAINTEXT). The zero value is unusable: set Brokers.
type Admin struct {
	// Brokers are the bootstrap brokers, "host:port". Required.
	Brokers []string
	// Conn is how to connect: TLS and SASL. Default: the zero Conn,
	// PLAINTEXT.
	Conn Conn

	// shared is the transport of an Admin from Shared; nil: each call
	// opens one of its own.
	shared *kafka.Transport
}

// Shared returns a copy of a whose EndOffsets, CommittedOffsets and
// GroupMembers share one kafka-go transport: one connection per broker,
// and the partitions of topics from the metadata kafka-go refreshes every
// 6 s. Use it to poll offsets or groups often (a bulk load's progress,
// every 200 ms). Its calls about any other topic fail, wrapping
// ErrTopicNotConfigured. Ping and EnsureTopic keep opening their own
// transport: they must ask the brokers, not a cache. Close the copy when
// done with it.
func (a Admin) Shared(topics ...string) Admin {
	a.shared = a.Conn.Transport()
	a.shared.MetadataTopics = metadataScope(topics)
	return a
}

// metadataScope is the MetadataTopics of a transport that uses only
// topics: never nil, which kafka-go takes for every topic in the cluster
// (on a cluster of 4,100 partitions, 2.5 MB and 32,000 allocations to
// decode for each fetch, measured with kafka-go v0.4.51 against Kafka
// 3.9; 19 KiB and 130 for one topic). An empty scope asks for the brokers
// alone.
func metadataScope(topics []string) []string {
	return append([]string{}, topics...)
}

// Close closes the connections of an Admin from Shared; a no-op otherwise.
func (a Admin) Close() {
	if a.shared != nil {
		a.shared.CloseIdleConnections()
	}
}

var _ ingest.Offsets = Admin{}

// Ping asks the brokers for the cluster's metadata of no topic (the
// brokers alone): nil when one answers within the admin timeout
// (readiness). A TLS or SASL failure is a
// *BrokerError. At start-up, prefer Check, which tries every broker.
func (a Admin) Ping(ctx context.Context) error {
	return a.withOwnClient(ctx, nil, func(ctx context.Context, c *kafka.Client) error {
		_, err := c.Metadata(ctx, &kafka.MetadataRequest{Topics: []string{}})
		return err
	})
}

// Check returns Check(ctx, a.Brokers, a.Conn).
func (a Admin) Check(ctx context.Context) error { return Check(ctx, a.Brokers, a.Conn) }

// withClient runs fn with a kafka-go client whose metadata covers topics
// (none: the brokers alone): on a's shared transport, or else on one of
// the call's own, closed afterwards. Each call is bounded by adminTimeout.
// A TLS or SASL failure comes back as a *BrokerError.
func (a Admin) withClient(ctx context.Context, topics []string, fn func(context.Context, *kafka.Client) error) error {
	if len(a.Brokers) == 0 {
		return fmt.Errorf("%w: no brokers", ErrInvalidConfig)
	}
	transport := a.shared
	if transport == nil {
		transport = a.Conn.Transport()
		transport.IdleTimeout = callIdleTimeout
		transport.MetadataTopics = metadataScope(topics)
		defer transport.CloseIdleConnections()
	} else if err := inScope(topics, transport.MetadataTopics); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, adminTimeout)
	defer cancel()
	return a.Conn.annotate(a.Brokers, fn(ctx, &kafka.Client{Addr: kafka.TCP(a.Brokers...), Transport: transport}))
}

// withOwnClient is withClient on a transport of the call's own, whether
// or not a is shared.
func (a Admin) withOwnClient(ctx context.Context, topics []string, fn func(context.Context, *kafka.Client) error) error {
	a.shared = nil
	return a.withClient(ctx, topics, fn)
}

// EnsureTopic returns Admin{Brokers: brokers}.EnsureTopic(ctx, topic, partitions).
func EnsureTopic(ctx context.Context, brokers []string, topic string, partitions int) error {
	return Admin{Brokers: brokers}.EnsureTopic(ctx, topic, partitions)
}

// EnsureTopic creates topic with partitions partitions and the broker's
// default replication factor, unless it exists (an existing topic is left
// as it is, whatever its partition count), and waits until every partition
// has a leader that answers for its offsets. Idempotent; use it for "<topic>.dlq" too. Bounded by ctx and
// 30 s.
func (a Admin) EnsureTopic(ctx context.Context, topic string, partitions int) error {
	if topic == "" {
		return fmt.Errorf("ensure topic: %w", ErrNoTopic)
	}
	if partitions < 1 {
		return fmt.Errorf("ensure topic %q: %w: partitions must be ≥ 1 (got %d)", topic, ErrInvalidConfig, partitions)
	}
	return a.withOwnClient(ctx, []string{topic}, func(ctx context.Context, c *kafka.Client) error {
		res, err := c.CreateTopics(ctx, &kafka.CreateTopicsRequest{Topics: []kafka.TopicConfig{{
			Topic: topic, NumPartitions: partitions, ReplicationFactor: -1,
		}}})
		if err != nil {
			return fmt.Errorf("create topic %q: %w", topic, err)
		}
		if err := res.Errors[topic]; err != nil && !errors.Is(err, kafka.TopicAlreadyExists) {
			return fmt.Errorf("create topic %q: %w", topic, err)
		}
		// Wait until the topic is visible with a leader per partition
		// that answers for its log (creation is asynchronous on a real
		// cluster: a leader in the metadata may still answer Not Leader
		// For Partition for a moment).
		for wait := 10 * time.Millisecond; ; wait = min(2*wait, time.Second) {
			_, err := endOffsets(ctx, c, topic)
			if err == nil {
				return nil
			}
			select {
			case <-ctx.Done():
				return fmt.Errorf("wait for topic %q: %w (last error: %w)", topic, context.Cause(ctx), err)
			case <-time.After(wait):
			}
		}
	})
}

// partitionsOf returns the partition IDs of topic, an error unless every
// partition has a leader.
func partitionsOf(ctx context.Context, c *kafka.Client, topic string) ([]int, error) {
	md, err := c.Metadata(ctx, &kafka.MetadataRequest{Topics: []string{topic}})
	if err != nil {
		return nil, fmt.Errorf("read metadata of topic %q: %w", topic, err)
	}
	for _, t := range md.Topics {
		if t.Name != topic {
			continue
		}
		if errors.Is(t.Error, kafka.UnknownTopicOrPartition) {
			return nil, fmt.Errorf("%w: %q", ErrUnknownTopic, topic)
		}
		if t.Error != nil {
			return nil, fmt.Errorf("read metadata of topic %q: %w", topic, t.Error)
		}
		if len(t.Partitions) == 0 {
			return nil, fmt.Errorf("topic %q has no partitions yet", topic)
		}
		ids := make([]int, len(t.Partitions))
		for i, p := range t.Partitions {
			if p.Error != nil {
				return nil, fmt.Errorf("topic %q partition %d: %w", topic, p.ID, p.Error)
			}
			if p.Leader.Host == "" {
				return nil, fmt.Errorf("topic %q partition %d has no leader", topic, p.ID)
			}
			ids[i] = p.ID
		}
		return ids, nil
	}
	return nil, fmt.Errorf("%w: %q", ErrUnknownTopic, topic)
}

// EndOffsets returns Admin{Brokers: brokers}.EndOffsets(ctx, topic).
func EndOffsets(ctx context.Context, brokers []string, topic string) (map[int]int64, error) {
	return Admin{Brokers: brokers}.EndOffsets(ctx, topic)
}

// EndOffsets returns the high watermark of each partition of topic (the
// offset the next produced record gets; every record below it is readable).
// It fails, wrapping ErrUnknownTopic, when the topic does not exist.
func (a Admin) EndOffsets(ctx context.Context, topic string) (map[int]int64, error) {
	var out map[int]int64
	err := a.withClient(ctx, []string{topic}, func(ctx context.Context, c *kafka.Client) (err error) {
		out, err = endOffsets(ctx, c, topic)
		return err
	})
	return out, err
}

func endOffsets(ctx context.Context, c *kafka.Client, topic string) (map[int]int64, error) {
	ids, err := partitionsOf(ctx, c, topic)
	if err != nil {
		return nil, err
	}
	reqs := make([]kafka.OffsetRequest, len(ids))
	for i, id := range ids {
		reqs[i] = kafka.LastOffsetOf(id)
	}
	res, err := c.ListOffsets(ctx, &kafka.ListOffsetsRequest{Topics: map[string][]kafka.OffsetRequest{topic: reqs}})
	if err != nil {
		return nil, fmt.Errorf("list end offsets of topic %q: %w", topic, err)
	}
	out := make(map[int]int64, len(ids))
	for _, p := range res.Topics[topic] {
		if p.Error != nil {
			return nil, fmt.Errorf("list end offsets of topic %q partition %d: %w", topic, p.Partition, p.Error)
		}
		out[p.Partition] = p.LastOffset
	}
	if len(out) != len(ids) {
		return nil, fmt.Errorf("list end offsets of topic %q: %d of %d partitions answered", topic, len(out), len(ids))
	}
	return out, nil
}

// CommittedOffsets returns Admin{Brokers: brokers}.CommittedOffsets(ctx, group, topic).
func CommittedOffsets(ctx context.Context, brokers []string, group, topic string) (map[int]int64, error) {
	return Admin{Brokers: brokers}.CommittedOffsets(ctx, group, topic)
}

// CommittedOffsets returns group's committed offset ("next offset to read")
// of each partition of topic; a partition without a committed offset is
// absent from the map. It fails, wrapping ErrUnknownTopic, when the topic
// does not exist; an unknown group has no committed offsets.
func (a Admin) CommittedOffsets(ctx context.Context, group, topic string) (map[int]int64, error) {
	if group == "" {
		return nil, fmt.Errorf("%w: no consumer group", ErrInvalidConfig)
	}
	var out map[int]int64
	err := a.withClient(ctx, []string{topic}, func(ctx context.Context, c *kafka.Client) error {
		ids, err := partitionsOf(ctx, c, topic)
		if err != nil {
			return err
		}
		res, err := c.OffsetFetch(ctx, &kafka.OffsetFetchRequest{GroupID: group, Topics: map[string][]int{topic: ids}})
		if err == nil {
			err = res.Error
		}
		if errors.Is(err, kafka.GroupIdNotFound) {
			// kfake's answer for a group that never committed; Kafka
			// answers offset -1 instead.
			out = map[int]int64{}
			return nil
		}
		if err != nil {
			return fmt.Errorf("fetch committed offsets of group %q on topic %q: %w", group, topic, err)
		}
		out = make(map[int]int64, len(ids))
		for _, p := range res.Topics[topic] {
			if p.Error != nil {
				return fmt.Errorf("fetch committed offsets of group %q on topic %q partition %d: %w", group, topic, p.Partition, p.Error)
			}
			if p.CommittedOffset >= 0 {
				out[p.Partition] = p.CommittedOffset
			}
		}
		return nil
	})
	return out, err
}

// GroupMembers returns Admin{Brokers: brokers}.GroupMembers(ctx, group).
func GroupMembers(ctx context.Context, brokers []string, group string) (members int, stable bool, err error) {
	return Admin{Brokers: brokers}.GroupMembers(ctx, group)
}

// GroupMembers returns how many members a consumer group has and whether it
// is stable (every member has its assignment; not rebalancing). A group
// that does not exist yet has 0 members.
func (a Admin) GroupMembers(ctx context.Context, group string) (members int, stable bool, err error) {
	err = a.withClient(ctx, nil, func(ctx context.Context, c *kafka.Client) error {
		res, err := c.DescribeGroups(ctx, &kafka.DescribeGroupsRequest{GroupIDs: []string{group}})
		if err != nil {
			return fmt.Errorf("describe group %q: %w", group, err)
		}
		for _, g := range res.Groups {
			if g.GroupID != group {
				continue
			}
			if g.Error != nil {
				return fmt.Errorf("describe group %q: %w", group, g.Error)
			}
			members, stable = len(g.Members), g.GroupState == "Stable"
		}
		return nil
	})
	return members, stable, err
}

// EnsureTopics creates topic with partitions partitions and its
// dead-letter topic (DeadLetterTopic) with one, unless they exist.
func (a Admin) EnsureTopics(ctx context.Context, topic string, partitions int) error {
	if err := a.EnsureTopic(ctx, topic, partitions); err != nil {
		return err
	}
	return a.EnsureTopic(ctx, DeadLetterTopic(topic), 1)
}
