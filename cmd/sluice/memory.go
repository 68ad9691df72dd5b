package main

import (
	"log/slog"
	"os"
	"runtime/debug"

	"github.com/urfave/cli/v2"
)

func memoryLimitFlag() cli.Flag {
	f := intFlag("memory-limit", 0, "soft limit of the Go runtime's memory in `MiB`: the garbage collector works harder near it, so the process stays within about this plus its code (the GOMEMLIMIT variable, when set, wins). Default: room for what the load's bounds may hold: 64 MiB for reading and producing, plus 3 × --max-in-flight-bytes per in-process worker (256 MiB with one worker, 448 with two, at the defaults); not applied by default while an --embedded broker or sink keeps the records in memory; 0: none")
	f.DefaultText = "64 + 3 × workers × in-flight MiB"
	return f
}

// memoryBaseMiB is the part of --memory-limit's default that does not
// depend on the workers: reading and producing (the rows read ahead, the
// records Kafka has not acknowledged, the 500,000 IDs remembered, about
// 30 MiB live) with room for the garbage collector.
const memoryBaseMiB = 64

// defaultMemoryLimitMiB is --memory-limit's default for a load with
// workers in-process workers, each bounded to inFlight bytes of records
// fetched and not finished: memoryBaseMiB plus three times their bound
// (the records themselves, what the Kafka readers hold beside them, and
// room for the garbage collector), so that the limit costs nothing while
// the bounds hold and stops a leak all the same. Measured on 1,000,000
// USGS rows with two workers and a pool fast enough to let them fetch as
// far ahead as their bound (docs/bulk-loads.md): the live heap reached
// 250 MB; a limit of 80 MiB cost 65 % more time and 86 % more CPU than
// none, 320 MiB 4–13 %, 384 MiB nothing.
func defaultMemoryLimitMiB(workers int, inFlight int64) int64 {
	return memoryBaseMiB + 3*int64(workers)*(inFlight>>20)
}

// setMemoryLimit applies --memory-limit (its default for workers
// in-process workers of inFlight bytes each when not given), unless
// GOMEMLIMIT is set or, without the flag given, inProcess says a service
// in this process keeps every record.
func setMemoryLimit(c *cli.Context, inProcess bool, workers int, inFlight int64, log *slog.Logger) {
	mib := int64(c.Int("memory-limit"))
	if !c.IsSet("memory-limit") {
		mib = defaultMemoryLimitMiB(workers, inFlight)
	}
	if mib <= 0 || os.Getenv("GOMEMLIMIT") != "" || (inProcess && !c.IsSet("memory-limit")) {
		return
	}
	debug.SetMemoryLimit(mib << 20)
	// Under the limit, collect when the heap has tripled rather than
	// doubled (GOGC=200): a load's live heap is small and steady, and
	// the limit bounds the total anyway.
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(200)
	}
	log.Debug("memory limit set", "mib", mib)
}
