//go:build !race

package bulkload

const raceEnabled = false
