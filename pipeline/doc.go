// Package pipeline is sluice's engine: the worker pipeline that drains a
// queue into a throttled sink at a leased rate, through the ports package
// ingest declares.
//
// The pipeline releases work in slices. Every slice it asks its Pacer for a
// budget in units, dequeues at most that much from its Source, writes the
// records in batches to its Sink with bounded concurrency (a slice's sends
// spread evenly over the slice, each under the request deadline), retries
// retryable results (each attempt is charged to the budget again),
// dead-letters the records the sink refused for good through a bounded
// queue of its own, and marks every finished record Done so the Source can
// commit. It fetches nothing while the bytes of the records in flight
// reach Config.MaxInFlightBytes, so memory does not grow with the
// backlog, and a crash loses nothing: unfinished records are still in the
// queue. That bound limits memory, not the rate: a slice whose budget is
// left once it has sent what was fetched goes on sending records as they
// arrive, within the budget, until the slice is over.
//
// Each fetched record is read once, from its raw bytes (ingest.ScanObject): the
// pass checks that it is one JSON object and takes its ID field, without
// decoding the other fields. Only a record type's Processor (a schema, a
// sink key template) decodes a record whole.
//
// Every sink answer is classified by its scope. A verdict about one record
// dead-letters that record; a failure of the whole request or of the sink
// (a transport error, a timeout, 401, 403, 404, a 5xx outage, throttling,
// an answer the adapter cannot parse) pauses the sink behind a circuit
// breaker (capped backoff, one probe at a time), spends no budget and uses
// up no record's attempts. Ready reports a pause, an unreachable dead-letter
// topic or queue once it has lasted Config.ReadyAfter, and Run
// returns a *StalledError after Config.StallTimeout.
//
// # Throttle feedback per key range
//
// A range-partitioned store (Azure Tables, Cloud Storage, OSS, Spanner;
// sluice sink-sim --partition-limit) cuts its keys (a record's SinkKey,
// else its ID) into lexicographic ranges with a limit each, so a 429 for
// one record usually says that its range is full, not that the sink is.
// A request throttled as a whole (a *SinkError) and a sink's near-limit
// hint still slow the worker as a whole (Pacer's ThrottleFeedback); a
// record throttled alone slows only its key range, which the pipeline
// learns from the answers:
//
//   - Evidence. A sink admits a request's records in order at one instant,
//     so a record accepted after another of the same request was throttled
//     is in another range, one that had room: a cool key. Records accepted
//     before the first throttle prove nothing (they may have taken a full
//     range's last slots). For a sink that writes a batch's records as
//     separate requests at once (the REST sink), the evidence is only
//     approximate: a wrong bound costs a few more throttles, which correct
//     it.
//   - Bounds. The answer's throttled keys, in key order, make groups that
//     no cool key separates. A group's range reaches, on each side, to its
//     nearest cool key, cut at the shortest prefix of the cool key that the
//     throttled keys do not share: "hot/17" throttled beside a cool
//     "cold/19" makes the range ["d", +∞), so the next keys of the cool
//     sequence ("cold/20") stay out of it; "07/…" throttled beside a cool
//     "08/…" makes [−∞, "08"). With no cool key on a side the range has no
//     end there: sequential keys, whose every new key lands above the
//     throttled one, are all in it. A new range never reaches into a
//     neighbouring one, and a cool key inside a range splits it: a side
//     holding a key throttled by the same answer stays hot, the other is
//     forgotten.
//   - Rate. A new range may send 0.95 × what its keys accepted in the last
//     second (that second counting in its account, as it does at the
//     sink). Throttled again by a request sent at its current rate, it is
//     cut to 0.95 × the lesser of what it accepted in the last second and
//     its rate. After a throttle it holds 0.5 s (1 s when the throttle found
//     the same ceiling as the one before), then, while its rate is what
//     holds its records back, rises by 5 % of its ceiling a slice, and past
//     1.1 × the ceiling (the store split the range) by a step that doubles
//     every slice; never beyond 1.25 × what it sent in the last second, as
//     the sink's sliding second shows an excess only once it was sent.
//     Its sends are spread as the slice's are: at most a slice of its rate
//     per slice, and within its sliding second.
//   - Holding back. When a slice opens, each range releases the records it
//     holds (throttled ones first, after the sink's Retry-After, then in
//     order) as its rate allows; then fresh records go, except those whose
//     range has no room, which it holds. The rest of the budget goes to the
//     other keys. Fresh records are held only while the held ones cost less
//     than two slices' budget; past that the next record waits in line, so
//     when every record goes to one hot range (sequential keys) the worker
//     runs at that range's rate, which is then the right total, with
//     bounded memory and commits held back by at most that much. Records
//     of a slice whose range was found or cut after the slice opened are
//     looked at again just before they are sent.
//   - Memory. At most 256 ranges (the one throttled least recently goes),
//     each remembering 8 throttled keys; 8,192 accepted keys to measure
//     rates. A range neither throttled nor holding a record back for 3 s is
//     forgotten, and its records are sent.
//
// An answer that throttled every record of a request, each in a range
// already known hot, is that range's answer: its records wait in it, and the
// sink is not paused. Counters report the ranges found (HotRanges) and their
// cuts (RangeCuts).
// A sink that answers throttling only for whole requests gets the worker's
// AIMD alone.
//
// The pipeline knows no concrete adapter: it drives the ports of package
// ingest (Source, DeadLetters, Sink, RetryPolicy, Pacer, Capacity), which
// queue, lease, pacing and sink implement. Package worker assembles it with
// them.
package pipeline
