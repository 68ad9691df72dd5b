// Package lease shares a throttled resource's capacity among uncoordinated
// workers through leases on capacity partitions kept in Redis.
//
// # Pools and partitions
//
// A Pool is one throttled resource: Capacity in Unit per second (records/s,
// bytes/s or cost units/s), split into Partitions P of Capacity/P units/s
// each (PartitionRate), leased for TTL (default 15 s). EnsurePool stores the
// definition in Redis; a worker started with a different one gets an error
// wrapping ErrPoolMismatch that names both.
//
// # Effective rate: ramp-up and live changes
//
// A partition is worth the pool's effective rate / P, which may change over
// time in two ways every worker agrees on:
//
//   - Ramp-up (Pool.Ramp, presets RampGCS and RampFirestore from the storage
//     vendors' guidance for new key ranges): effective = min(Capacity,
//     Start·Factor^((t − epoch)/Period)). The epoch is a Redis key set by the
//     first worker with demand and kept alive by every worker with demand;
//     it expires, and the ramp starts over, once the pool has been idle for
//     IdleReset (default 24 h).
//   - Live changes (SetPool, `sluice pool set`): the new capacity and
//     partitions are stored with a Switch instant one renewal interval
//     ahead, and announced on the pool's change channel. Every Manager reads
//     the definition when the change feed or a version says it changed (at
//     once, or at its next keep-alive, within KeepAlive ≤ RenewEvery/3),
//     and at the switch instant all of them stop counting the old values
//     and start counting the new ones; leases on partitions the change
//     removes stop counting at the switch, partitions it adds are taken
//     only after it. So the workers' sum never exceeds the old capacity
//     before the switch nor the new one after it. A Manager that has not
//     known its definition current (read it, or had its version confirmed
//     by a keep-alive) for half a renewal interval stops counting its
//     leases, so it cannot miss a switch.
//
// A live change follows one rule whoever makes it (`sluice pool set`, a
// definition applied at start with DefinitionApply, a capacity source's
// decision): a decrease (neither capacity nor partitions higher) switches
// DecreaseLead (250 ms) ahead, before the next second; a raise at the
// lead given (a renewal interval for `pool set` and an applied
// definition, ProbeLead for a capacity source, whose raises change the
// capacity alone and so are safe however late a worker learns of them).
// Two switches are at least a second apart, so a worker's sliding second
// never spans two.
//
// Rate and Credit integrate the effective rate exactly (closed form across
// the ramp and the switch).
//
// # Defining a pool: apply, adopt, refuse
//
// DefinePool stores a worker's definition when Redis has none. When the
// stored one differs in what can change live (the capacity or its source,
// the partitions): DefinitionAdopt runs with the stored one if it was
// changed live, else refuses (EnsurePool); DefinitionApply applies the
// worker's as a live change, recorded with the worker's ID in the
// definition's change history, and refuses (ErrPoolFlapping) a change
// that would set the pool back for the second time within FlapWindow
// (X, D, X, and D again: two deployments that keep disagreeing; one
// rollback is allowed); DefinitionRefuse refuses. The unit, the lease TTL
// and the ramp never change live.
//
// # Capacity sources
//
// Pool.Source says where the capacity comes from: the number given, the
// sink (SourceSink: a DynamoDB table's write throughput, a REST API's
// announced limit, through a CapacityReader), or a probe (SourceProbe).
// A Controller per process decides it once per Source.Every for the whole
// pool: the first process to ask takes the pool's turn (a script on the
// capacity state key that compares the last decision's time with the
// interval), reads the sink or takes a probe step, and
// writes the result with UpdatePool, which every Manager follows like any
// live change. A probe decides on the pool's account: every process adds
// what its workers sent, their throttled attempts, latencies and backlog
// to buckets of 500 ms. See probeStep for the rule and its overshoot
// bound.
//
// # Guarantee
//
// A Manager reports, as ingest.Capacity, the rate of the leases it can
// prove valid. A lease counts PartitionRate from the instant its lock
// returned until the first of: the Manager releases it (it stops counting
// before Unlock is sent), an extend fails (it stops counting at once), or
// the instant Until() − Margin, where Until() is redsync's conservative
// validity (start of the lock/extend call + TTL − 1 % of TTL) and
//
//	Margin ≥ RequestTimeout + Slice + Drift   (default exactly that: 2 s + 200 ms + 2 ms + TTL/100)
//
// A pacer that releases work only against counted rate finishes the last
// slice's requests (at most Slice + RequestTimeout later) before the key can
// expire in Redis, with Drift left for clock-rate differences; a peer can
// only take the partition after the key is deleted or expired. So at every
// instant the partitions counted by all workers are disjoint and the sum of
// their rates is ≤ Capacity. This holds unless a fault outlasts the margin
// (a process paused longer than Margin while sending, Redis losing its
// data), and then only for the affected partitions, for at most one margin
// plus one renewal interval.
//
// Credit(from, to) is the exact integral of that counted rate over [from,
// to): each lease contributes PartitionRate × |[from, to) ∩ [acquired,
// stopped counting)|, where a lease taken over with a hand-over (below)
// counts from the instant the hand-over gives. It never shrinks for
// instants already past (an extend that returns after the lease stopped
// counting starts a new interval instead of filling the gap), and leases that stopped counting are kept
// for HistoryKeep (10 s). Across a hand-over the giver's credit ends when it
// stops counting and the taker's starts after its lock returned, so the
// workers' credits never overlap on a partition (unless the giver hands
// over what it left unspent, below; the taker's credit then reaches back
// before its lock, where Credit grows for instants already past). The giver unlocks up to
// one Slice after it stopped counting: a pacer checks its one-second
// account at each send, so a send just before the drop may rest on credit
// that reaches up to a slice before a later window, and without the pause
// a taker earning on the partition at once could push that window over the
// pool (seen as +6.5 % in a sliding second at a two-worker hand-over under
// load). Config.Releasable gives the pause: the least that keeps the
// giver's sends within its credit, 0 or a few milliseconds for a worker
// that sent at the rate it earned (a slice without it). Its pacer holds its sends
// of the second after the unlock to its new rate, so that they do not
// spend credit earned on the partition before either. And it unlocks only
// once every send it made before it stopped counting has been answered
// (Config.Answered): the sink may accept a request any time before its
// answer, and a request held up on its way (a descheduled process, a
// queueing path) would otherwise land beside the taker's sends on the
// same capacity.
//
// One release hands over more: a worker that unlocks released leases
// with nothing else cooling asks Config.HandOver since when its account
// no longer needs their credit (pacing says yes only when the worker gave
// up all it held), and its unlock script
// sets, beside each lease it deletes, a hand-over key that expires that
// instant plus handOverKeep (2 s, at most half the TTL). A worker that
// locks such a partition reads the key's remaining life with PTTL on
// every Redis and counts the partition from the instant it gives (read
// against its own clock after the answer, so never earlier than the
// giver's), instead of from its lock: the giver's sends the sink may
// have accepted fit in the credit before that instant, and the taker's
// sends come after the unlock, so no sliding window holds more than the
// partition's credit. Every other unlock deletes the hand-over keys, and
// a lease taken after a key was set outlives it (TTL > 2 × handOverKeep),
// so a key only ever speaks of the last release before the lock.
//
// # Leases and renewal
//
// Each partition is one redsync mutex (its key set with NX and PX, its
// value "<worker ID>/<random>"). A worker below its share takes the
// partitions it lacks with one script call per Redis, on partitions it
// does not hold, its own (see Fair share) before the others, in random
// order: the script sets the free ones, up to the number it lacks, and
// reads each one's hand-over key in the same atomic step, so a worker's
// whole share is locked in one round trip where a redsync lock and a
// hand-over read for each would take two per partition.
// Several Redis clients passed to New are independent masters; a lock,
// extend or unlock then needs a quorum of len/2+1. Each
// lease is extended RenewEvery (default TTL/3) after its last lock or
// extend, under a deadline at its counting end; leases due within the next
// RenewEvery/2 are extended with it, so a worker's leases come due together
// and one script call per Redis extends them all (each key only if it
// still holds this lease's value, as redsync's extend; the new validity is
// the call's start + TTL − 1 % of the TTL, as redsync computes it). New
// requires Margin + RenewEvery ≤ 90 % of TTL. On exit Run stops counting
// every lease, unlocks them (one script call per Redis that deletes each
// key still holding its lease's value, as redsync's unlock does for one,
// bounded by the operation timeout) and withdraws the worker, so peers
// need not wait out the TTL.
//
// # Reserved capacity
//
// Config.Reserved K partitions are held for the worker's lifetime: taken at
// start, renewed, never released for lack of demand. They are ordinary
// leases, so the pool guarantee holds. While fewer than K are free the worker
// logs it (rate-limited), reports it in ReservedShort, and keeps trying.
//
// # Fair share
//
// Every Tick (default 100 ms) a worker computes its demand in partitions,
// ceil(demand / PartitionRate) capped at P (+Inf, a backlog, asks for P; 0
// for none), and its fair share from the live members (see Redis cost for
// how it learns them). Every worker computes the same share from the same
// list: first each member's reserved partitions (in
// worker ID order while they last, whatever its class), then the rest
// class by class, highest first (see Priorities and weights), each class
// sharing what the classes above it left by a weighted max-min water fill
// over what its members want beyond their reservations: each member gets
// min(its want, its weight × a common level), the leftover partitions when
// the level cannot be met exactly going by the Sainte-Laguë rule (the
// member whose share + 1/2 over its weight is lowest, ties to the lowest
// worker ID; with equal weights, one each to the lowest worker IDs at the
// level), so shares sum to min(P, Σ wants).
// A worker releases partitions above its share at once and acquires up to
// it (at most 2 tries per partition it lacks per attempt, free partitions
// p with p mod members = its rank by worker ID first, so workers that see
// the same members try disjoint ones); below its share with nothing free
// (a peer has not released yet) it tries again as soon as a peer
// publishes that it unlocked partitions, and otherwise after Tick/5,
// doubling up to KeepAlive. The keys of a vanished worker's leases expire
// silently, so when the taken partitions include some whose holder is no
// longer a member, it reads their time to live (a PTTL each, at most 8,
// pipelined) and tries again when the first expires, if that is sooner: a
// killed worker's capacity is back in use within a tick of its leases
// expiring.
// A worker with demand 0 holds nothing after its next tick.
// Nobody can hoard the pool.
//
// # Priorities and weights
//
// Config.Priority puts a worker in one of three classes, PriorityHigh,
// PriorityNormal (the default) and PriorityLow, and Config.Weight (default
// 1) weighs it inside its class. The pool is allocated in class order: the
// wants of a higher class are met first, max-min fair inside the class
// weighted by each member's weight (two members with backlogs and weights
// 2 and 1 split 2:1), and the next class shares what is left, so a lower
// class uses everything a higher one does not want and nothing is idle
// while anyone has demand. Reserved partitions come off the top whatever
// the holder's class (a reservation is a floor even for a low class) and
// count in the holder's class: its want includes them, and Status shows
// them in its class.
//
// A lower class gives capacity back as fast as the change feed carries a
// higher class's rise: the higher worker's SetDemand wakes its loop, which
// announces the new want at once (one script call, published on the
// pool's channel); every peer reads the members when the message arrives
// and, below its new share, stops counting the partitions above it in
// that same step, within a Tick of the message and so within a slice
// (the loop is woken by the message, not by its next tick). It unlocks
// them one Slice later, as every release does, and the higher worker takes
// them as soon as the release is published. So the pool sum holds during
// the hand-over by the rule every release follows: the giver stops
// counting before it unlocks, the taker counts only after its lock
// returned, and the credits of the two never overlap. A worker whose
// want rose from nothing takes no more than an equal split among the
// members of its own class for its first ticks (peers of its class woken
// by the same backlog may not have announced yet); lower classes yield to
// it at once all the same.
//
// Classes are fixed names, not part of the pool's definition: workers of
// one pool with different classes share it as described, and a worker of
// an earlier version (which announces neither) counts as normal with
// weight 1.
//
// # Redis cost
//
// Redis commands grow with the leases held and the renewal interval, not
// with the tick or the record rate. A worker announces its demand only
// when what the share is computed from changes (want, reservation, need,
// class, weight; a want that moves by less than an eighth, and less than
// 2 partitions, waits for the next keep-alive, so a wavering demand costs
// nothing), and otherwise refreshes it every KeepAlive (default
// min(MemberTTL, RenewEvery)/3, 1.7 s with the default 15 s TTL), or three
// times less often while it wants and holds nothing (an idle member
// changes no share by coming or going); each is one script call, which
// rewrites the announcement when its share changed and otherwise once per
// MemberTTL, and the keys' 24-hour TTLs once an hour, and removes the
// members whose announcement expired only once the earliest expiry it
// last saw has passed, so that most keep-alives cost the server three
// commands (the call, ZADD, MGET), and one in three or so a fourth
// (ZRANGEBYSCORE). Each script goes whole (EVAL) on a client's first
// call and by its SHA1 after, and an acquire tries at most 4 locks at
// once, each on a pooled connection that cost a HELLO when it opened. A
// change is published on the pool's channel; peers subscribed to it read
// the members (one script call, whatever their number) only then, and at
// least every 30 s as a safety net. Each
// keep-alive answers with the members' and the definition's change
// counters, so a message lost while a subscription reconnects is caught
// by the next keep-alive, and a Redis user without channel rights still
// works, learning of changes a keep-alive later. The definition is
// watched the same way (read again every 30 s, or every RenewEvery/2 for
// a ramp, whose shared epoch workers with demand keep alive). A worker's
// leases cost one extend call per Redis per RenewEvery, however many it
// holds; the server executes two commands per lease inside it (GET,
// PEXPIRE). As the server counts them, scripts' inner calls included,
// an idle worker costs about 1.1-1.3 commands/s with the defaults, and three
// workers draining a pool of 2,000 records/s on 20 partitions about 6.5
// commands per 1,000 records once running, 9.7 for a 30 s job with its
// start-up and shutdown (TestBudgetRedisCommands holds the first two,
// bench scenario 10 measures all three).
//
// # Redis keys
//
// With prefix (default "sluice") and pool name:
//
//	{prefix}:{pool}:def          string, JSON definition {"name","capacity","unit","partitions","ttl",
//	                             "ramp":{"start","factor","period","idle_reset"}?,
//	                             "switch":{"at_unix_ms","capacity_before","partitions_before"}?,
//	                             "source":{"kind","every","floor","ceiling","margin","reprobe"}?, "from"?,
//	                             "changes":[{"by","def","at_unix_ms"}]?}; no TTL
//	{prefix}:{pool}:ramp         string, the ramp's epoch in Unix ms; PX = Ramp.IdleReset, refreshed by workers with demand
//	{prefix}:{pool}:p:{i}        string, partition i's redsync lock; value "<worker ID>/<32 hex>"; PX = TTL
//	{prefix}:{pool}:live         sorted set, worker ID → the instant (Unix ms, the worker's clock) its
//	                             announcement expires: its last keep-alive + MemberTTL (default
//	                             max(4 × Tick, RenewEvery); three times that while idle); every
//	                             announcement removes the expired
//	{prefix}:{pool}:ann          hash, worker ID → "<want partitions> <demand units/s> <reserved partitions>
//	                             <backlog units> <need partitions> <need since, Unix ms> <class> <weight>"
//	{prefix}:{pool}:mver         integer, incremented at every membership change
//	{prefix}:{pool}:dver         integer, incremented by SetPool
//	{prefix}:{pool}:changes      pub/sub channel: "m <worker>" after a membership change, "d" after SetPool
//	{prefix}:{pool}:cap          hash, a capacity source's state: "decided" (Unix ms), "by",
//	                             and a probe's "onset", "onset_at", "base_latency_us"; no TTL
//	{prefix}:{pool}:obs:{b}      hash, a probe's account for bucket b (Unix ms / 500): "u" units sent,
//	                             "a" attempts, "t" throttled, "l" latency µs, "n" answers, "b" 1 with a backlog;
//	                             PX 2 min
//
// live, ann and mver expire after 24 h unused. On a Redis Cluster the
// pool name is written in literal braces, a hash tag (sluice:{orders}:p:3;
// see Redis Cluster); elsewhere without (sluice:orders:p:3).
// Membership uses declared keys rather than SCAN, whose cost grows with
// the whole keyspace. Status reads the same keys for `sluice pool status`
// (Demand and Backlog there are as of the member's last keep-alive).
// Workers of earlier versions kept their members elsewhere ({pool}:m:* and
// {pool}:members): during a rolling upgrade the two generations do not see
// each other's demand (the leases stay exclusive; only the fair share is
// off until every worker runs one version).
//
// # Connecting to Redis
//
// RedisConfig describes the Redis that holds the pools as managed Redis
// (ElastiCache with AUTH or ACL users and in-transit encryption, Azure
// Cache for Redis, Redis Cloud) or Sentinel asks: "host:port" addresses
// or redis:// and rediss:// URLs (go-redis's ParseURL: user, password,
// database, TLS), several of them being independent masters forming a
// Redlock quorum; an ACL username and a password given apart (from the
// environment or a file; a URL's own credentials win); a CA file, a client
// certificate and key, a server name for TLS; or a Sentinel master name
// and Sentinel addresses instead of addresses, for go-redis's failover
// client; or, with Cluster, seed nodes of one Redis Cluster, for
// go-redis's cluster client. OpenRedis validates it and returns the
// []redis.UniversalClient that New, EnsurePool, SetPool and Status take;
// PingRedis checks them at start-up and returns *RedisError values that
// name each address (passwords redacted) and say "authentication failed"
// for a wrong password or disabled user, "permission denied" for an ACL
// refusal, "TLS handshake failed" for a certificate that does not verify.
// It passes when a quorum answers and none answered with such a mistake.
// Passwords never appear in errors, String, GoString or LogValue output.
//
// An ACL user needs only its pools' keys and channels and these command
// groups (Redis 7; the Lua scripts' commands are checked one by one, so
// the key pattern applies inside them too):
//
//	user sluice on >PASSWORD resetkeys ~sluice:* resetchannels &sluice:* -@all +@read +@write +@scripting +@transaction +@connection +@pubsub -@dangerous
//
// with the default prefix "sluice" (a Config.Prefix of "p" needs ~p:* and
// &p:*). Without the channel rights (&sluice:*, +@pubsub) leases still
// work, and peers learn of demand changes at their next keep-alive
// instead of at once.
//
// # Redis Cluster
//
// With RedisConfig.Cluster the addresses are seeds of one cluster
// (ElastiCache in cluster mode, Memorystore for Redis Cluster, Azure Cache
// for Redis with clustering, a self-run cluster): OpenRedis returns one
// go-redis ClusterClient, which reads the slots from a seed (CLUSTER
// SLOTS), sends each command to the master of its key's slot, and follows
// MOVED answers and failovers by itself. Seeds share the user, password
// and TLS settings; each node's certificate is checked against the
// address the cluster announces for it, unless ServerName is given. The
// ACL user above needs +cluster|slots besides.
//
// Keys. A cluster runs a script, MULTI/EXEC or MGET only when every key
// it names hashes to one slot, so on a cluster (a *redis.ClusterClient
// passed to New, EnsurePool, SetPool or Status) a pool's name is a hash
// tag: every key of pool "orders" is sluice:{orders}:…, in the slot of
// "orders". On other Redis the keys keep the layout of earlier versions,
// so that a rolling upgrade never has two generations lock one partition
// under two names; clusters and other clients cannot be mixed in one
// Manager (New returns an error wrapping ErrInvalidConfig). What touches
// several keys at once: the extend and release scripts (a worker's
// leases, p:{i}), the announce, withdraw and members scripts (live, ann,
// mver, dver), MGET of the partitions (candidates, reclaim), SetPool's
// WATCH and MULTI on def and dver, Status's pipeline; the ramp epoch, the
// lock and the reclaim calls touch one key each. All are in the pool's slot
// (TestClusterKeysShareOneSlot records every command a pool's workers
// send and checks each key's slot on a real cluster). So one pool lives on
// one shard: its Redis load (under a command per second per worker, see
// Redis cost) is one master's, and different pools spread over the shards.
//
// Change feed. The pool's channel uses classic PUBLISH and SUBSCRIBE, not
// sharded SPUBLISH and SSUBSCRIBE. A cluster delivers a classic message to
// subscribers on every node, replicas included, so a worker's
// subscription keeps working through a failover of the pool's master
// (the server ends a sharded subscription when its slot moves away, and
// sharded pub/sub needs Redis 7, which not every managed cluster runs);
// the PUBLISH inside the announce and withdraw scripts is the same on
// every kind of Redis; and the ACL's channel pattern (&sluice:*) covers
// it. The price, every message crossing the cluster bus to every node, is
// small: messages are sent only on changes (a member's share, a
// definition, partitions freed), not per lease or per tick. A message
// lost while a subscription reconnects is caught by the next keep-alive's
// versions, as on one Redis.
//
// Failover. A coordinated failover (CLUSTER FAILOVER on a replica, without
// FORCE or TAKEOVER: the master holds its clients' writes while the
// replica catches up, then they swap) loses no acknowledged write, so
// the guarantee holds unchanged: no lease is ever counted by two workers
// and no pool second exceeds Capacity. The lease tests and the e2e suite
// do it mid-run on a real cluster (there the swap takes 30-70 ms, no
// lease is lost, and the busiest second at the sink stays at or below
// Capacity). Commands sent during the swap wait or are redirected; an
// extend that fails or comes too late drops its lease at once, as for any
// Redis error. (A second failover of the same shard within twice
// cluster-node-timeout waits for the masters' votes, seconds; leases whose
// extends time out meanwhile stop counting and are taken again after.) An uncoordinated failover (a master crashes or is cut off,
// and its replica is promoted after cluster-node-timeout) is "Redis
// losing its data" in the Guarantee above: replication is asynchronous,
// so a lock or extend the old master acknowledged just before it went
// may be missing on the new one. Until the slot is served again every
// extend fails, so leases stop counting then (the rate drops, never
// rises); afterwards a partition whose lock was lost may be taken by a
// second worker while its holder still counts it, but only until the
// holder's next extend, which finds the key gone or another's and stops
// counting it: overshoot only on the partitions written in the last
// replication lag before the crash, each for at most one renewal interval
// plus the margin.
//
// # In-process Redis
//
// For --embedded, miniredis (v2.40.0 and later) with ClockTTL(true) makes
// key TTLs follow the real clock, so leases expire as in Redis.
package lease
