package bulkload

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package when a test leaves a goroutine running: a
// load, its read-ahead and its decompressors must stop with it.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
