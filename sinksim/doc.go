// Package sinksim is the throttled sink emulator behind `sluice sink-sim`:
// an HTTP server speaking sluice's batch protocol (package sinkwire) that enforces a provisioned
// rate (a token bucket of one second, or a strict sliding window) and,
// optionally, per-key-range limits with splitting ranges; answers 429 with
// Retry-After; dedupes by record ID; injects latency and errors; and
// reports exact statistics (accepted, rejected, duplicates, the most units
// accepted in any sliding 1 s and 200 ms window, and a 200 ms series). It is
// the oracle of sluice's end-to-end tests and benchmarks, and users rehearse
// loads against it.
//
// # Guarantees
//
// The emulator enforces Capacity units/s in one of two modes: "bucket", a
// token bucket holding one second of capacity refilled at Capacity/s (the
// per-second budget of Cosmos DB provisioned RU/s), or "window", a strict
// sliding one-second window that never admits more than Capacity units in
// any (t−1 s, t]. Both are computed in exact integer arithmetic. Each
// request is admitted atomically at one instant. max_units_1s and
// max_units_200ms are exact: the largest number of charged units (stored
// plus duplicates) admitted in any half-open window (t−w, t] since the
// start, over the emulator's clock.
package sinksim
