//go:build race

package bulkload

// raceEnabled: the race detector slows the tests down about tenfold.
const raceEnabled = true
