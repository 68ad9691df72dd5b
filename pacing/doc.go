// Package pacing releases a worker's leased capacity in slices.
//
// A Pacer opens a slice every Config.Slice (200 ms by default) and gives it a
// budget in units (the pool's unit: records, bytes or cost such as RU). The
// budget is the smallest of:
//
//   - what a golang.org/x/time/rate token bucket allows, whose limit is the
//     worker's current rate (units/s) and which gives a slice at most one
//     slice of it (rate × Slice, rounded up to a whole unit). The bucket
//     holds one unit more, which only carries the fraction a whole-unit
//     budget leaves to the next slice. The limit and size are set at the
//     start of every slice, so a lease gained or lost applies at the next
//     slice;
//   - the room left in a sliding account: the integral of the worker's rate
//     over the last Config.Window (1 s by default), as reported by
//     Capacity.Credit, minus every unit still in the account;
//
// minus the debt left by records that cost more than a slice, floored to a
// whole unit.
//
// # Guarantees
//
// Every time the pipeline sends (calls Spend), the units in the account,
// including that send, are at most the integral of the worker's rate over
// the Window before it. A token bucket alone would let rate × Window +
// burst through, since a late slice's lump lands in the next window.
// Because the bound is the integral and not the current rate, a worker
// whose rate just dropped keeps sending at its new rate without a dip, and
// one whose lease was just gained earns credit from the instant it was
// gained, never before. With the lease side's rule that a worker stops
// counting a partition before it releases it, the sum of the workers'
// sends stays within the pool's capacity across hand-overs (see
// TestHandOver), for records of any cost.
//
// The bound looks back from each send: the pacer cannot know that a lease
// will be lost, so a window that starts just before the worker's rate drops
// may hold up to one slice more than its own integral. The lease side
// unlocks a released partition only once no send leans on it (Releasable
// gives the wait, at most a slice after it stopped counting), and
// the gainer's account holds its sends to the credit earned since the
// gain, which keeps the pool within capacity when a partition changes
// hands (TestHandOver). A lease manager gives capacity back of its own
// will only when Releasable says the account does not lean on it, and
// the sends that follow must not lean on it either: a worker that sent
// below its rate still has the credit it earned before the release in its
// one-second account, and would spend it beside the peer earning on the
// same capacity. For a Window after the release's grace (the wait before
// the unlock, on which nobody earns), Spend admits a send only if the
// account, with it, stays within the new rate's credit, plus the freed
// rate over the grace, in every coming window too. A rate gained while
// the bucket fills at the old rate adds a slice of the gain to the bucket
// at the next opening, as the first rate after none starts with a full
// bucket: leases just taken are used at once, and the account holds each
// send to the credit they earned.
//
// A worker that gives up all its capacity can hand a peer what its
// account left unspent: HandOver gives the least instant from which its
// sends that the sink may have accepted in the last Window fit in its
// credit, so a peer may count the capacity from there rather than from
// its lock (lease.Config.HandOver carries the instant to the peer), and
// for a Window after it the pacer counts none of that credit in its own
// account. A worker that sent one costly record a second thus leaves the
// next worker in line a second's credit, and the record after its last
// goes out as soon as the next worker holds the capacity.
//
// # Judged at the sink
//
// A throttled service counts a request when it accepts it, somewhere
// between its send and its answer. So a send stays in the account until
// Window after its answer arrived (the pipeline calls the func Spend
// returns), and no sooner than Guard + Window after it was sent: the
// allowance between send and acceptance is the send's own measured
// latency, and Config.Guard (0 by default) only a floor under it. Sends
// whose answer has not arrived never leave. A sliding second at the sink
// therefore holds at most what the account held at the sends in it, however
// late a request arrived; the price is utilization, about latency ÷ Window
// on a long run (0.5 % at 5 ms).
//
// # Records that cost more than a slice
//
// The pipeline never splits a record, so a record costing more than one
// slice's budget (want in Next) is admitted whole once nothing is owed and
// the account has room for all of it; the units the bucket cannot cover
// become debt, repaid from the following slices' tokens before they get a
// budget. The long-run rate therefore stays exact, and the sliding account
// still holds.
//
// A record costing more than one Window at the worker's rate can never fit
// in its account, and it is never sent beyond the integral: at every slice
// the pacer tells a Capacity that implements Gatherer the least rate the
// record at the head of the line needs (its cost per Window), and the lease
// side (lease.Manager) gathers that many partitions for the worker, whole
// and in turn with the pool's other workers that wait for a costly record,
// so the pool's sliding second holds whatever the records cost and however
// many workers there are. The record is sent once the account, at the
// gathered rate, holds it.
//
// A rate of 0 (no valid lease) gives a budget of 0.
//
// # Throttle feedback
//
// Leases keep sluice's workers within the pool, but the service may be
// shared with applications that take no leases. When the sink throttles
// anyway a whole request (or says its limit is nearly used up), the
// pipeline calls Throttled (a record throttled alone slows only its key
// range, see package ingest), and the pacer applies AIMD to its own
// rate (the rate of this worker in this pool; other pools are untouched): at
// the next slice the rate is cut to Config.Cut (0.7) × the current rate, once
// per slice however many writes were throttled, and every slice without a
// throttle raises the ceiling by Config.Recovery (10 %) of the leased rate per
// second until it reaches the leased rate and is lifted. Stats counts the
// cuts and the recoveries. The ceiling only ever lowers the rate below the
// leases, so the pool guarantee is unaffected.
//
// # Usage
//
// A Pacer has no goroutines and no package-level state. The pipeline calls
// Next and Spend from its slice loop; Spend is safe to call concurrently with
// Next. Time is the wall clock (time.Now and timers), so tests drive a Pacer
// inside a testing/synctest bubble.
package pacing
