package queue

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

// testBrokers are the brokers the adapter tests run against: the
// comma-separated SLUICE_TEST_BROKERS (a real Kafka started by
// scripts/kafka.sh), else an embedded broker started by TestMain.
var testBrokers []string

func TestMain(m *testing.M) {
	code := func() int {
		if env := os.Getenv("SLUICE_TEST_BROKERS"); env != "" {
			testBrokers = strings.Split(env, ",")
		} else {
			emb, err := StartEmbedded(context.Background())
			if err != nil {
				fmt.Fprintln(os.Stderr, err)
				return 1
			}
			defer emb.Close()
			testBrokers = emb.Addrs()
		}
		return m.Run()
	}()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

var topicSeq atomic.Int64

// newTopic creates a topic of its own for the test, with its dead-letter
// topic, and returns its name.
func newTopic(t *testing.T, partitions int) string {
	t.Helper()
	name := regexp.MustCompile(`[^a-zA-Z0-9]+`).ReplaceAllString(t.Name(), "-")
	topic := fmt.Sprintf("test-%s-%d-%d", strings.ToLower(name), time.Now().UnixNano()%1e6, topicSeq.Add(1))
	ctx := testContext(t)
	require.NoError(t, EnsureTopic(ctx, testBrokers, topic, partitions))
	require.NoError(t, EnsureTopic(ctx, testBrokers, DeadLetterTopic(topic), 1))
	return topic
}

// testContext is cancelled when the test ends and after one minute.
func testContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// testLogger discards, unless SLUICE_TEST_LOG is set.
func testLogger() *slog.Logger {
	if os.Getenv("SLUICE_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}
