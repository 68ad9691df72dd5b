// Package stress finds one partition's real ceiling before production, as
// the storage vendors advise: Stress writes records that share one
// partition key (so they stay in one key range) at a rising rate in 100 ms
// slices, stops at the first step the sink throttles or fails beyond a
// threshold, and reports the highest rate the partition held and a verdict
// against a target (e.g. 2,000 entities/s for an Azure Tables partition).
package stress
