//go:build race

package bench

// raceEnabled: the race detector slows the tests down about tenfold.
const raceEnabled = true
