// Package sinksim is the throttled sink emulator behind `sluice sink-sim`:
// an HTTP server speaking sink's batch protocol that enforces a provisioned
// rate (a token bucket of one second, or a strict sliding window) and,
// optionally, per-key-range limits with splitting ranges; answers 429 with
// Retry-After; dedupes by record ID; injects latency and errors; and
// reports exact statistics (accepted, rejected, duplicates, the most units
// accepted in any sliding 1 s and 200 ms window, and a 200 ms series). It is
// the oracle of sluice's end-to-end tests and benchmarks, and users rehearse
// loads against it.
//
// The wire protocol and the emulator's guarantees are documented in package
// sink.
package sinksim
