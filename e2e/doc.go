// Package e2e holds sluice's multi-process end-to-end tests: separate sluice
// worker, sink-sim and bulk-load processes against a real Apache Kafka
// broker and a real redis-server started by scripts/. The tests carry the
// build tag e2e and run with `make e2e`. Nothing imports this package.
package e2e
