package worker

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package when a test leaves a goroutine running: a
// worker's Run must stop everything it started.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
