package queue

import (
	"cmp"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/segmentio/kafka-go"
	"golang.org/x/time/rate"

	"github.com/sluicehq/sluice/ingest"
)

// Header names sluice sets on the messages it produces.
const (
	// HeaderID carries the record's idempotency key (ingest.Record.ID).
	HeaderID = "sluice-id"
	// HeaderReason carries why a record was dead-lettered.
	HeaderReason = "sluice-reason"
	// HeaderSource carries where a dead-lettered record was consumed,
	// "topic/partition@offset".
	HeaderSource = "sluice-source"
	// HeaderTruncated is set on a dead letter whose value was cut to fit a
	// Kafka message: the value's full size in bytes.
	HeaderTruncated = "sluice-truncated"
)

var (
	// ErrCloseTimeout is returned (wrapped) when the Kafka reader did not
	// close within SourceConfig.CloseTimeout.
	ErrCloseTimeout = errors.New("queue: closing the Kafka reader timed out")
	// ErrInvalidConfig is returned (wrapped) by constructors given an
	// unusable configuration.
	ErrInvalidConfig = errors.New("queue: invalid configuration")
)

// SourceConfig configures a Source.
type SourceConfig struct {
	// Brokers are the bootstrap brokers, "host:port". Required.
	Brokers []string
	// Conn is how to connect: TLS and SASL. kafka-go's Reader retries a
	// connection that fails, logging only: call Check first to fail fast.
	// Default: the zero Conn, PLAINTEXT.
	Conn Conn
	// Topic is the topic to consume. Required.
	Topic string
	// Group is the consumer group; its members share the topic's
	// partitions and its committed offsets are where a restart resumes.
	// Required.
	Group string
	// CommitInterval is how often Run commits the offsets that advanced.
	// Default 200 ms (one pacing slice).
	CommitInterval time.Duration
	// CommitTimeout bounds one commit, which blocks while the group
	// rebalances. A commit that fails is retried at the next interval.
	// Default 5 s.
	CommitTimeout time.Duration
	// CloseTimeout bounds the final commit and, separately, closing the
	// reader (leaving the group) when Run stops. Default 5 s.
	CloseTimeout time.Duration
	// MaxWait is how long the reader waits for the broker's answer to a
	// fetch. kafka-go asks the broker to hold a fetch with no data for
	// MaxWait less its allowance for the round trip (1 s, or a quarter of
	// MaxWait below 1 s), and a fetch not answered by MaxWait fails with
	// an i/o timeout: the partition's reader then drops its connection
	// and dials again after 100 ms, its records held meanwhile. With
	// MinBytes 1 a fetch returns as soon as one record is there, so the
	// hold only affects an idle partition (and how long it delays a
	// rebalance). Default 1.25 s: the broker holds an idle fetch 250 ms
	// and has a whole second beyond that to answer. (At 50 ms, a broker
	// sharing two busy cores missed the 12.5 ms it was left 64 and 72
	// times in a 100 s run of two live workers, each time holding a
	// partition's records back 100 ms or more.)
	MaxWait time.Duration
	// MaxBytes is the most bytes one fetch returns per partition; it must
	// be at least the largest message. Default 10 MiB.
	MaxBytes int
	// QueueCapacity is how many fetched messages the reader buffers ahead
	// of Fetch (the prefetch bound on memory). Default 100.
	QueueCapacity int
	// SessionTimeout is how long the group waits for a silent member
	// before giving its partitions to others: a crashed worker's records
	// are reclaimed after this, and a rebalance that starts while a killed
	// member is still in the group stops every consumer until then.
	// Default 6 s, the floor the broker allows by default
	// (group.min.session.timeout.ms).
	SessionTimeout time.Duration
	// HeartbeatInterval is how often the member heartbeats, which is also
	// how soon it notices a rebalance. Default 1 s.
	HeartbeatInterval time.Duration
	// Logger receives the source's logs. Default slog.Default().
	Logger *slog.Logger
}

// Source consumes a topic in a consumer group with kafka-go's Reader
// (FetchMessage, never ReadMessage; the reader's own CommitInterval is 0)
// and commits, per partition, only offsets below which every fetched record
// is Done. It implements ingest.Source; a pipeline must also check Owns
// before sending a record and drop it unsent when it is false. It joins
// the group with StickyGroupBalancer, then kafka-go's RangeGroupBalancer.
// Fetch, Owns and Done may be called before and while Run runs; Run
// (called once) commits and, on stop, closes the reader.
type Source struct {
	cfg     SourceConfig
	log     *slog.Logger
	rc      kafka.ReaderConfig
	tracker *commitTracker

	// joinOnce creates joined, the group's reader, at the first Run or
	// Fetch (see reader).
	joinOnce sync.Once
	joined   *kafka.Reader

	statsMu sync.Mutex // serializes reader.Stats, which resets its counters

	// clientID identifies this member in the group (DescribeGroups).
	clientID string
	admin    *kafka.Client

	lagMu sync.Mutex
	lags  map[int]int64 // partition → records beyond the last fetched

	closeOnce sync.Once
	closeErr  error
}

var (
	_ ingest.Source = (*Source)(nil)
	_ ingest.Owner  = (*Source)(nil)
	_ ingest.Lagger = (*Source)(nil)
)

// NewSource validates cfg and creates the consumer. Its reader joins the
// group when Run or Fetch is first called, so a source that is closed
// before it runs never joins: a member that joined and went away without
// leaving would hold its partitions until SessionTimeout. Call Run (or
// Close) so that it is closed.
func NewSource(cfg SourceConfig) (*Source, error) {
	cfg.CommitInterval = cmp.Or(cfg.CommitInterval, 200*time.Millisecond)
	cfg.CommitTimeout = cmp.Or(cfg.CommitTimeout, 5*time.Second)
	cfg.CloseTimeout = cmp.Or(cfg.CloseTimeout, 5*time.Second)
	cfg.MaxWait = cmp.Or(cfg.MaxWait, 1250*time.Millisecond)
	cfg.MaxBytes = cmp.Or(cfg.MaxBytes, 10<<20)
	cfg.QueueCapacity = cmp.Or(cfg.QueueCapacity, 100)
	cfg.SessionTimeout = cmp.Or(cfg.SessionTimeout, 6*time.Second)
	cfg.HeartbeatInterval = cmp.Or(cfg.HeartbeatInterval, time.Second)
	cfg.Logger = cmp.Or(cfg.Logger, slog.Default())
	switch {
	case len(cfg.Brokers) == 0:
		return nil, fmt.Errorf("%w: no brokers", ErrInvalidConfig)
	case cfg.Topic == "":
		return nil, fmt.Errorf("%w: no topic", ErrInvalidConfig)
	case cfg.Group == "":
		return nil, fmt.Errorf("%w: no consumer group", ErrInvalidConfig)
	case cfg.CommitInterval < 0 || cfg.CommitTimeout < 0 || cfg.CloseTimeout < 0 || cfg.MaxWait < 0 || cfg.SessionTimeout < 0 || cfg.HeartbeatInterval < 0:
		return nil, fmt.Errorf("%w: durations must be > 0", ErrInvalidConfig)
	case cfg.MaxBytes < 1 || cfg.QueueCapacity < 1:
		return nil, fmt.Errorf("%w: MaxBytes and QueueCapacity must be ≥ 1", ErrInvalidConfig)
	case cfg.HeartbeatInterval >= cfg.SessionTimeout:
		return nil, fmt.Errorf("%w: HeartbeatInterval (%s) must be below SessionTimeout (%s)", ErrInvalidConfig, cfg.HeartbeatInterval, cfg.SessionTimeout)
	}
	log := cfg.Logger.With("topic", cfg.Topic, "group", cfg.Group)
	clientID := "sluice-" + rand.Text()[:16]
	dialer := cfg.Conn.Dialer()
	dialer.ClientID = clientID
	transport := cfg.Conn.Transport()
	transport.ClientID = clientID
	// The client only describes the group: the topic's metadata is all it
	// needs, not that of every topic in the cluster every 6 s.
	transport.MetadataTopics = metadataScope([]string{cfg.Topic})
	rc := kafka.ReaderConfig{
		Brokers:           cfg.Brokers,
		GroupID:           cfg.Group,
		Topic:             cfg.Topic,
		QueueCapacity:     cfg.QueueCapacity,
		MinBytes:          1,
		MaxBytes:          cfg.MaxBytes,
		MaxWait:           cfg.MaxWait,
		ReadLagInterval:   -1,
		HeartbeatInterval: cfg.HeartbeatInterval,
		SessionTimeout:    cfg.SessionTimeout,
		CommitInterval:    0, // synchronous, explicit commits only
		StartOffset:       kafka.FirstOffset,
		Dialer:            dialer,
		Logger:            kafkaLogger(log, slog.LevelDebug),
		ErrorLogger:       kafkaLogger(log, slog.LevelWarn),
	}
	tracker := newCommitTracker()
	rc.GroupBalancers = []kafka.GroupBalancer{StickyGroupBalancer{Owned: tracker.join}, kafka.RangeGroupBalancer{}}
	if err := rc.Validate(); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	return &Source{
		cfg: cfg, log: log, rc: rc, tracker: tracker, clientID: clientID,
		admin: &kafka.Client{Addr: kafka.TCP(cfg.Brokers...), Transport: transport},
	}, nil
}

// Fetch returns the next record, with Pos, Key and Value set and ID set
// from the "sluice-id" header when present (else empty). It blocks until a
// record is available or ctx is done, and then returns ctx's error. After
// the source is closed it returns an error wrapping io.EOF. Records that
// the group's re-seek after a rebalance fetches again are skipped when they
// are Done or still held (not released by Owns), so a partition this
// member keeps never hands a record out twice.
func (s *Source) Fetch(ctx context.Context) (ingest.Record, error) {
	r := s.reader()
	if r == nil {
		return ingest.Record{}, fmt.Errorf("fetch from topic %q: the source is closed: %w", s.cfg.Topic, io.EOF)
	}
	for {
		m, err := r.FetchMessage(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return ingest.Record{}, context.Cause(ctx)
			}
			return ingest.Record{}, fmt.Errorf("fetch from topic %q: %w", s.cfg.Topic, err)
		}
		s.noticeRebalance()
		s.noteLag(m)
		rec := recordOf(m)
		deliver, reset := s.tracker.fetched(rec.Pos)
		if reset {
			s.log.Info("partition fetched from a new offset, its records in flight will not be committed",
				"partition", rec.Pos.Partition, "offset", rec.Pos.Offset)
		}
		if deliver {
			return rec, nil
		}
		// A re-fetch (the re-seek of a new generation) of a record already
		// Done or still held: handing it out again would send it twice.
	}
}

// recordOf converts a fetched message.
func recordOf(m kafka.Message) ingest.Record {
	rec := ingest.Record{
		Key:   m.Key,
		Value: m.Value,
		Pos:   ingest.Position{Topic: m.Topic, Partition: m.Partition, Offset: m.Offset},
	}
	for _, h := range m.Headers {
		if h.Key == HeaderID {
			rec.ID = string(h.Value)
		}
	}
	return rec
}

// Done marks a fetched record finished; its offset is committed by Run once
// every record fetched before it on its partition is Done too. Safe for
// concurrent use, in any order; duplicates and records this source did not
// fetch are ignored.
func (s *Source) Done(rec ingest.Record) {
	if !s.tracker.done(rec.Pos) {
		s.log.Debug("done for a record not in flight ignored", "source", rec.Pos.String())
	}
}

// Owns reports whether rec is a record of this member's current assignment
// that may be sent: fetched by this source, not Done, and its partition
// fetched (or confirmed by the group) since the member last started
// joining the group. It is false from the moment a rebalance starts (the
// member's join) until the new generation fetches or confirms the record's
// partition, and for records of partitions the rebalance revoked.
//
// A record for which Owns is false is released: the caller must drop it
// unsent and not call Done for it. It is fetched again — kafka-go re-seeks
// every partition to the group's committed offset in each generation — by
// this member when it keeps the partition, else by the partition's new
// owner, so dropping it loses nothing and avoids sending it twice. Cheap
// (a lock and a binary search); safe for concurrent use.
func (s *Source) Owns(rec ingest.Record) bool { return s.tracker.owns(rec.Pos) }

// Lag returns how many records wait in this member's partitions beyond the
// last one fetched, as of the latest fetch from each (the broker's high
// watermark minus the next offset); -1 before anything was fetched. It
// implements ingest.Lagger, so a caught-up worker hands its capacity back
// at once. Partitions fetched from in an earlier generation count until
// their last lag was 0 or they are fetched again.
func (s *Source) Lag() int64 {
	s.lagMu.Lock()
	defer s.lagMu.Unlock()
	if s.lags == nil {
		return -1
	}
	var total int64
	for _, l := range s.lags {
		total += l
	}
	return total
}

// noteLag records the lag of m's partition after m.
func (s *Source) noteLag(m kafka.Message) {
	s.lagMu.Lock()
	defer s.lagMu.Unlock()
	if s.lags == nil {
		s.lags = make(map[int]int64)
	}
	s.lags[m.Partition] = max(m.HighWaterMark-m.Offset-1, 0)
}

// InFlight returns the number of fetched records held by the pipeline: not
// Done and not released by Owns.
func (s *Source) InFlight() int { return s.tracker.inFlight() }

// Run commits, every CommitInterval, each partition's offset that advanced.
// A failed commit is logged and retried at the next interval. When ctx is
// done it makes a final commit (bounded by CloseTimeout), then closes the
// reader, leaving the group (bounded by CloseTimeout, error wrapping
// ErrCloseTimeout). It returns nil on a clean stop, else the final commit's
// and the close's errors joined.
func (s *Source) Run(ctx context.Context) error {
	s.reader() // join the group now, not at the first Fetch
	tick := time.NewTicker(s.cfg.CommitInterval)
	defer tick.Stop()
	errLog := rate.Sometimes{Interval: 5 * time.Second}
	for {
		select {
		case <-ctx.Done():
			final, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.cfg.CloseTimeout)
			err := s.commit(final)
			cancel()
			if err != nil {
				err = fmt.Errorf("final commit: %w", err)
			}
			return errors.Join(err, s.Close())
		case <-tick.C:
		}
		cctx, cancel := context.WithTimeout(ctx, s.cfg.CommitTimeout)
		err := errors.Join(s.confirmAssignment(cctx), s.commit(cctx))
		cancel()
		if err != nil && ctx.Err() == nil {
			errLog.Do(func() {
				s.log.Warn("commit failed, retrying at the next interval", "err", err, "in_flight", s.tracker.inFlight())
			})
		}
	}
}

// reader returns the group's reader, creating it (which joins the group)
// on the first call; nil once the source is closed.
func (s *Source) reader() *kafka.Reader {
	s.joinOnce.Do(func() { s.joined = kafka.NewReader(s.rc) })
	return s.joined
}

// noticeRebalance tells the tracker when the reader started fetching from
// a new group generation (or, as kafka-go counts it, re-connected to a
// partition's new leader, which changes nothing). kafka-go counts a
// generation before it fetches in it, and Fetch calls this before tracking
// each message, so every message of a new generation is tracked as such.
func (s *Source) noticeRebalance() {
	s.statsMu.Lock()
	defer s.statsMu.Unlock()
	if r := s.reader(); r != nil && r.Stats().Rebalances > 0 {
		s.tracker.begin()
		s.log.Debug("group generation started")
	}
}

// confirmAssignment asks the group for this member's assignment once per
// generation, when the reader fetches from it: assigned partitions become
// current even when nothing more is fetched from them (so their Done
// records are committed and the next join claims them), and the state of
// the others, revoked, is dropped.
func (s *Source) confirmAssignment(ctx context.Context) error {
	s.noticeRebalance()
	gen, unconfirmed := s.tracker.generation()
	if !unconfirmed {
		return nil
	}
	res, err := s.admin.DescribeGroups(ctx, &kafka.DescribeGroupsRequest{GroupIDs: []string{s.cfg.Group}})
	if err != nil {
		return fmt.Errorf("describe group %q: %w", s.cfg.Group, err)
	}
	for _, g := range res.Groups {
		if g.Error != nil {
			return fmt.Errorf("describe group %q: %w", s.cfg.Group, g.Error)
		}
		if g.GroupID != s.cfg.Group || g.GroupState != "Stable" {
			continue // rebalancing: ask again at the next interval
		}
		for _, m := range g.Members {
			if m.ClientID != s.clientID {
				continue
			}
			assigned := map[string][]int{}
			for _, t := range m.MemberAssignments.Topics {
				assigned[t.Topic] = append(assigned[t.Topic], t.Partitions...)
			}
			s.tracker.confirm(gen, assigned) // ignored if a join started meanwhile
		}
	}
	return nil
}

// commit commits what the tracker offers.
func (s *Source) commit(ctx context.Context) error {
	s.noticeRebalance()
	commits := s.tracker.committable()
	if len(commits) == 0 {
		return nil
	}
	msgs := make([]kafka.Message, len(commits))
	for i, c := range commits {
		// kafka-go commits Offset+1: the next offset to read.
		msgs[i] = kafka.Message{Topic: c.topic, Partition: c.partition, Offset: c.offset - 1}
	}
	// What is committable was fetched, so the reader exists.
	if err := s.reader().CommitMessages(ctx, msgs...); err != nil {
		return fmt.Errorf("commit offsets of group %q on topic %q: %w", s.cfg.Group, s.cfg.Topic, err)
	}
	for _, c := range commits {
		s.tracker.committed(c)
	}
	s.log.Debug("offsets committed", "partitions", len(commits))
	return nil
}

// Close closes the reader, leaving the group, without committing; bounded
// by CloseTimeout (an error wrapping ErrCloseTimeout, and the close goes on
// in the background). Run calls it; call it directly only when Run never
// ran. Idempotent.
func (s *Source) Close() error {
	s.closeOnce.Do(func() {
		s.joinOnce.Do(func() {}) // a source closed before it ran never joins
		if s.joined != nil {
			s.closeErr = closeBounded(s.joined.Close, s.cfg.CloseTimeout, "Kafka reader")
		}
		if t, ok := s.admin.Transport.(*kafka.Transport); ok {
			t.CloseIdleConnections()
		}
	})
	return s.closeErr
}

// closeBounded runs close, giving up after timeout.
func closeBounded(close func() error, timeout time.Duration, what string) error {
	done := make(chan error, 1)
	go func() { done <- close() }()
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	select {
	case err := <-done:
		if err != nil {
			return fmt.Errorf("close %s: %w", what, err)
		}
		return nil
	case <-timer.C:
		return fmt.Errorf("close %s: %w after %s", what, ErrCloseTimeout, timeout)
	}
}

// kafkaLogger adapts kafka-go's printf logging to slog at level. What
// kafka-go reports as an error but is routine is logged at DEBUG, so that
// a WARN asks for a look: a fetch on an idle partition that timed out
// (kafka-go retries it) and a group's rebalance (every join and leave
// starts one). A group that keeps rebalancing (more than
// rebalanceWarnAfter in a minute) is worth a look, and is a WARN. The
// other errors stay WARNs, at most one every 5 s.
func kafkaLogger(log *slog.Logger, level slog.Level) kafka.LoggerFunc {
	limit := &rate.Sometimes{Interval: 5 * time.Second}
	rebalances := &rebalanceCount{}
	return func(format string, args ...any) {
		for _, a := range args {
			if err, ok := a.(error); ok && errors.Is(err, context.Canceled) {
				return // shutting down
			}
		}
		detail := fmt.Sprintf(format, args...)
		lvl := level
		if lvl >= slog.LevelWarn {
			switch kafkaRoutine(detail) {
			case routineTimeout:
				lvl = slog.LevelDebug
			case routineRebalance:
				lvl = slog.LevelDebug
				if n := rebalances.note(time.Now()); n > rebalanceWarnAfter {
					lvl = slog.LevelWarn
					detail = fmt.Sprintf("the consumer group rebalanced %d times in the last minute (members joining and leaving, or a session timeout too short for the work between fetches): %s", n, detail)
				}
			}
		}
		if !log.Enabled(context.Background(), lvl) {
			return
		}
		line := func() { log.Log(context.Background(), lvl, "kafka client", "detail", detail) }
		if lvl >= slog.LevelWarn {
			limit.Do(line) // a broker that is down repeats itself every few milliseconds
			return
		}
		line()
	}
}

// rebalanceWarnAfter is how many rebalances in a minute are routine.
const rebalanceWarnAfter = 5

// Kinds of routine kafka-go errors.
const (
	routineNone = iota
	routineTimeout
	routineRebalance
)

// kafkaRoutine classifies a kafka-go error line: an idle partition's
// fetch timeout, a rebalance of the group (Rebalance In Progress, or a
// generation a rebalance just ended), or neither.
func kafkaRoutine(detail string) int {
	switch {
	case strings.Contains(detail, "i/o timeout") && strings.Contains(detail, "reading partition"):
		return routineTimeout
	case strings.Contains(detail, kafka.RebalanceInProgress.Title()), strings.Contains(detail, kafka.IllegalGeneration.Title()):
		return routineRebalance
	}
	return routineNone
}

// rebalanceCount counts a group's rebalances over the last minute.
type rebalanceCount struct {
	mu sync.Mutex
	at []time.Time
}

func (r *rebalanceCount) note(now time.Time) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.at = append(r.at, now)
	for len(r.at) > 0 && now.Sub(r.at[0]) > time.Minute {
		r.at = r.at[1:]
	}
	return len(r.at)
}
