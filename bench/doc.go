// Package bench is sluice's benchmark harness: the seven scenarios of the
// design's "How we measure" section, an eighth on write hotspots (sink
// key strategies against a range-partitioned emulator) and a ninth on bulk
// loads of any size (a streamed .csv.gz input, the producer beside a raw
// kafka-go writer, peak RSS, draining while producing), and a tenth on the
// leases' Redis cost at fleet scale (an idle worker's commands/s, busy
// workers' commands per 1,000 records, 200 lease managers on one pool),
// each run against
// the same sink emulator (sinksim.Sim, served over HTTP on 127.0.0.1) on the same Kafka data,
// with the alternatives measured in the same run beside sluice:
//
//   - naive: retry-on-error with no client-side limit (the project's retry
//     policy, which honours Retry-After);
//   - static: a per-worker golang.org/x/time/rate limiter at capacity ÷ N;
//   - gcra: a global Redis GCRA limiter (github.com/go-redis/redis_rate/v10),
//     one call per batch;
//   - raw: a bare kafka-go FetchMessage + CommitMessages loop (overhead
//     only), beside which scenario 5 runs sluice into a discarding sink and
//     through the emulator, with allocations per record.
//
// sluice itself runs with its real components wired as cmd/sluice wires
// them: queue.Source, lease.Manager, pacing.Pacer, pipeline.Pipeline and
// sink.HTTPSink, each worker with its own consumer, Redis client and lease
// manager, as separate pods would have.
//
// Measures (DESIGN.md §6): utilization = ideal time ÷ elapsed time, ideal =
// total cost ÷ capacity, elapsed = first fetch to last acknowledgement;
// max_1s_window = most units the sink accepted in any sliding second ÷
// capacity; amplification = sink record attempts ÷ records; throttles =
// 429 answers. Figures are printed, never judged: a benchmark fails only on
// errors, not on slow numbers.
//
// Services are embedded by default (kfake for Kafka, miniredis with
// ClockTTL for Redis), but scenarios 5 and 9 always use a real Kafka,
// which they start with scripts/kafka.sh on Config.KafkaPort unless
// Config.Real names one, and scenario 10 a real redis-server (beside
// miniredis), which it starts with scripts/redis.sh on Config.RedisPort
// unless Config.Real names one; Config.Real points the harness at a real
// Kafka and Redis instead. The sink is always the in-process emulator.
package bench
