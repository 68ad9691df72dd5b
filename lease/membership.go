package lease

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// Membership layout: the sorted set {prefix}:{pool}:live scores each
// worker ID with the instant, in Unix milliseconds of the worker's clock,
// its announcement expires (clock differences between hosts shift a
// vanished worker's expiry by as much; the leases do not depend on it); the hash {prefix}:{pool}:ann holds the
// announcements. A worker announces with one script call when what the
// fair share reads changes, and again every KeepAlive to stay live. An
// announcement also removes the members whose instant has passed, when
// the earliest instant it last saw has passed (before that none can
// have: an instant only moves later). A
// change of the members (an announcement that changes, a new member, one
// removed as expired, a withdrawal) increments the counter
// {prefix}:{pool}:mver and is published on the channel
// {prefix}:{pool}:changes, so peers read the members only when they
// changed; the announcement answers with the counters, so a peer that
// missed a message (a reconnect) learns it at its next keep-alive. Reads
// and announcements are single script calls whatever the number of
// members, and the keys are declared, so no SCAN is needed.

// announceScript makes worker ARGV[1] live for ARGV[3] ms from ARGV[7]
// (the worker's clock, Unix ms), writes ARGV[2] as its announcement when
// ARGV[9] is "1" or the member is new, and, when ARGV[11] is "1", removes
// the members whose instant passed. A rewrite that finds other fair-share fields stored
// than it writes (want, reservation, need, class, weight: Redis lost or
// rolled back a write) counts as a change. When ARGV[4] is "1" (the fair-share fields changed), the member
// is new and ARGV[8] is "1" (it wants partitions), or some were removed,
// it increments KEYS[3] and publishes "m <worker>" on ARGV[5]. When
// ARGV[10] is "1" or the member is new (the keys may just have been
// created), the keys are set to expire after ARGV[6] ms (the worker
// refreshes that now and then, not at every keep-alive). A PUBLISH the ACL
// refuses (a user without channel rights) is ignored: peers then learn of
// changes from the versions. It returns {members version, definition
// version (KEYS[4], 0 if unset), members removed, the earliest instant
// of the members left (-1 when it did not look)}. A keep-alive costs the
// server three commands (the script's call, ZADD, and MGET of the
// versions), one more (ZRANGEBYSCORE) when it removes the expired, and
// HGET and HSET when it writes.
var announceScript = newScript(`
local function share(v)
  local f = {}
  for x in string.gmatch(v, '%S+') do f[#f + 1] = x end
  return table.concat({f[1] or '', f[3] or '', f[5] or '', f[7] or '', f[8] or ''}, ' ')
end
local now = tonumber(ARGV[7])
local changed = ARGV[4] == '1'
local new = redis.call('ZADD', KEYS[1], now + tonumber(ARGV[3]), ARGV[1]) == 1
if new and ARGV[8] == '1' then changed = true end
if new or ARGV[9] == '1' then
  if not new and not changed then
    local old = redis.call('HGET', KEYS[2], ARGV[1])
    if not old or share(old) ~= share(ARGV[2]) then changed = true end
  end
  redis.call('HSET', KEYS[2], ARGV[1], ARGV[2])
end
local dead, first = {}, -1
if ARGV[11] == '1' then
  first = 0
  repeat
    local batch = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', '+inf', 'WITHSCORES', 'LIMIT', #dead, 16)
    for i = 1, #batch, 2 do
      local at = tonumber(batch[i + 1])
      if at > now then
        first = at
        break
      end
      dead[#dead + 1] = batch[i]
    end
  until first > 0 or #batch < 32
  for _, w in ipairs(dead) do
    redis.call('ZREM', KEYS[1], w)
    redis.call('HDEL', KEYS[2], w)
  end
end
local v
if changed or #dead > 0 then
  v = redis.call('INCR', KEYS[3])
  redis.pcall('PUBLISH', ARGV[5], 'm ' .. ARGV[1])
end
local vs = redis.call('MGET', KEYS[3], KEYS[4])
if new or ARGV[10] == '1' then
  redis.call('PEXPIRE', KEYS[1], ARGV[6])
  redis.call('PEXPIRE', KEYS[2], ARGV[6])
  redis.call('PEXPIRE', KEYS[3], ARGV[6])
end
return {v or tonumber(vs[1] or '0'), tonumber(vs[2] or '0'), #dead, first}
`)

// withdrawScript removes worker ARGV[1] and, when ARGV[3] is "1" (it
// wanted partitions), increments KEYS[3] and publishes on ARGV[2]. A
// member that wants nothing changes no share, so its arrival and departure
// are not announced; peers see them at their next read.
var withdrawScript = newScript(`
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('HDEL', KEYS[2], ARGV[1])
if ARGV[3] == '1' then
  redis.call('INCR', KEYS[3])
  redis.pcall('PUBLISH', ARGV[2], 'm ' .. ARGV[1])
end
return 1
`)

// membersScript returns {members version, worker, announcement, worker,
// announcement, ...} for the members whose instant is after ARGV[1] (Unix
// ms).
var membersScript = newScript(`
local now = tonumber(ARGV[1])
local out = {redis.call('GET', KEYS[3]) or '0'}
local ws = redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. now, '+inf')
for i = 1, #ws, 500 do
  local part = {}
  for j = i, math.min(i + 499, #ws) do part[#part + 1] = ws[j] end
  local vs = redis.call('HMGET', KEYS[2], unpack(part))
  for j, w in ipairs(part) do
    if vs[j] then
      out[#out + 1] = w
      out[#out + 1] = vs[j]
    end
  end
end
return out
`)

// membersKeyTTL keeps an abandoned pool's membership keys from living
// forever; a worker refreshes it at its first announcement and every
// membersKeyRefresh after.
const (
	membersKeyTTL     = 24 * time.Hour
	membersKeyRefresh = time.Hour
)

// A worker that wants nothing and holds nothing (idle) changes no peer's
// share by coming or going, so it keeps its announcement alive
// idleKeepAliveFactor times less often, live for as many times its
// MemberTTL: an idle fleet costs Redis about one command per second per
// worker. It announces at once when it wants partitions again.
const idleKeepAliveFactor = 3

// announcement is what a worker publishes about itself.
type announcement struct {
	Want      int     // partitions wanted, 0..P, reserved ones included
	Demand    float64 // units/s, may be +Inf
	Reserved  int     // partitions held for the worker's lifetime, 0..P
	Backlog   float64 // units waiting for the worker (queue lag and fetched), -1 unknown
	Need      int     // the fewest partitions its head record can be sent with, 0..P
	NeedSince int64   // when it began waiting for Need, Unix ms
	Priority  Priority
	Weight    int // ≥ 1; 0 (an announcement of an earlier version) counts as DefaultWeight
}

// member is a as worker's entry in the fair share.
func (a announcement) member(worker string) member {
	return member{Worker: worker, Want: a.Want, Reserved: a.Reserved, Need: a.Need, NeedSince: a.NeedSince, Priority: a.Priority, Weight: a.Weight}
}

// wants reports whether a asks for any partition, so that its arrival or
// departure changes the peers' shares.
func (a announcement) wants() bool { return a.Want > 0 || a.Reserved > 0 || a.Need > 0 }

// sameShare reports whether a and b ask for the same fair share: the
// fields the share is computed from agree (Demand and Backlog are only
// shown by Status, and refreshed with the keep-alive; NeedSince orders
// only needs of more than one partition).
func (a announcement) sameShare(b announcement) bool {
	return a.Want == b.Want && a.Reserved == b.Reserved && a.Need == b.Need && (a.Need <= 1 || a.NeedSince == b.NeedSince) &&
		a.Priority == b.Priority && a.Weight == b.Weight
}

// encode writes a as space-separated fields; older workers read the
// leading ones they know.
func (a announcement) encode() string {
	return strconv.Itoa(a.Want) + " " + strconv.FormatFloat(a.Demand, 'g', -1, 64) + " " + strconv.Itoa(a.Reserved) +
		" " + strconv.FormatFloat(a.Backlog, 'g', -1, 64) + " " + strconv.Itoa(a.Need) + " " + strconv.FormatInt(a.NeedSince, 10) +
		" " + a.Priority.String() + " " + strconv.Itoa(a.Weight)
}

// decodeAnnouncement reads what encode wrote; missing trailing fields (a
// worker of an earlier version) take their zero value (PriorityNormal for
// the class), and Backlog -1.
func decodeAnnouncement(v string) (announcement, error) {
	f := strings.Fields(v)
	a := announcement{Backlog: -1}
	if len(f) == 0 {
		return a, fmt.Errorf("member value %q: empty", v)
	}
	var errs []error
	parse := func(i int, set func(string) error) {
		if i < len(f) {
			errs = append(errs, set(f[i]))
		}
	}
	parse(0, func(s string) (err error) { a.Want, err = strconv.Atoi(s); return err })
	parse(1, func(s string) (err error) { a.Demand, err = strconv.ParseFloat(s, 64); return err })
	parse(2, func(s string) (err error) { a.Reserved, err = strconv.Atoi(s); return err })
	parse(3, func(s string) (err error) { a.Backlog, err = strconv.ParseFloat(s, 64); return err })
	parse(4, func(s string) (err error) { a.Need, err = strconv.Atoi(s); return err })
	parse(5, func(s string) (err error) { a.NeedSince, err = strconv.ParseInt(s, 10, 64); return err })
	parse(6, func(s string) (err error) { a.Priority, err = ParsePriority(s); return err })
	parse(7, func(s string) (err error) { a.Weight, err = strconv.Atoi(s); return err })
	if err := errors.Join(errs...); err != nil {
		return announcement{}, fmt.Errorf("member value %q: %w", v, err)
	}
	return a, nil
}

// versions is what an announcement answers: the members' and the
// definition's change counters, and how many expired members it removed.
type versions struct {
	members, def int64
	removed      int64
	earliest     time.Time // the earliest expiry of the members left; zero when not looked for
}

// announceWrite says what an announcement call does beside keeping the
// member live and removing expired ones: its fair-share fields changed
// (changed), the encoded announcement is to be written (write), the
// keys' TTLs are due a refresh (refresh), and the expired members are to
// be removed (sweep).
type announceWrite struct{ changed, write, refresh, sweep bool }

// announce publishes worker's announcement a, encoded as enc, live for
// ttl.
func announce(ctx context.Context, c redis.UniversalClient, k keys, worker string, a announcement, enc string, ttl time.Duration, w announceWrite) (versions, error) {
	res, err := announceScript.Run(ctx, c, []string{k.live(), k.announcements(), k.membersVersion(), k.defVersion()},
		worker, enc, ttl.Milliseconds(), boolArg(w.changed), k.changes(), membersKeyTTL.Milliseconds(), time.Now().UnixMilli(),
		boolArg(a.wants()), boolArg(w.write), boolArg(w.refresh), boolArg(w.sweep)).Int64Slice()
	if err != nil {
		return versions{}, err
	}
	if len(res) != 4 {
		return versions{}, fmt.Errorf("lease: announce answered %v", res)
	}
	v := versions{members: res[0], def: res[1], removed: res[2]}
	if res[3] > 0 {
		v.earliest = time.UnixMilli(res[3])
	}
	return v, nil
}

// withdraw removes worker, whose last announcement was last, from the
// members.
func withdraw(ctx context.Context, c redis.UniversalClient, k keys, worker string, last announcement) error {
	return withdrawScript.Run(ctx, c, []string{k.live(), k.announcements(), k.membersVersion()}, worker, k.changes(), boolArg(last.wants())).Err()
}

// readMembers returns the live members, their announcements and the
// members version they were read at.
func readMembers(ctx context.Context, c redis.UniversalClient, k keys) (map[string]announcement, int64, error) {
	res, err := membersScript.Run(ctx, c, []string{k.live(), k.announcements(), k.membersVersion()}, time.Now().UnixMilli()).StringSlice()
	if err != nil {
		return nil, 0, err
	}
	if len(res) == 0 {
		return nil, 0, errors.New("lease: member listing answered nothing")
	}
	ver, err := strconv.ParseInt(res[0], 10, 64)
	if err != nil {
		return nil, 0, fmt.Errorf("lease: members version %q: %w", res[0], err)
	}
	out := make(map[string]announcement, len(res)/2)
	for i := 1; i+1 < len(res); i += 2 {
		a, err := decodeAnnouncement(res[i+1])
		if err != nil {
			continue // not ours to judge; a malformed member counts as absent
		}
		out[res[i]] = a
	}
	return out, ver, nil
}

// announce publishes the worker's announcement to every Redis and notes
// from the answers whether the members or the definition changed unseen.
// An idle worker (see idleKeepAliveFactor) announces less often.
func (m *Manager) announce(ctx context.Context, a announcement, changed bool) {
	start := time.Now()
	every, ttl := m.cfg.KeepAlive, m.cfg.MemberTTL
	if !a.wants() && len(m.Held()) == 0 {
		every, ttl = idleKeepAliveFactor*every, idleKeepAliveFactor*ttl
	}
	enc := a.encode()
	// The announcement is written when its share changed, to a Redis
	// whose last call failed, and whole once per MemberTTL whatever this
	// worker believes a Redis stores (a failover or a restart may have
	// lost a write); the script finds out whether what it replaced was
	// another share. A failed call is not announced as a change by
	// itself: under load that would make every peer read the members at
	// once, and fail again.
	periodic := !start.Before(m.writtenAt.Add(m.cfg.MemberTTL))
	refresh := m.keysAt.IsZero() || !start.Before(m.keysAt.Add(membersKeyRefresh))
	got := make([]*versions, len(m.clients))
	n := m.each(ctx, func(ctx context.Context, i int, c redis.UniversalClient) error {
		w := announceWrite{changed: changed, write: periodic || m.stored[i] == "" || (changed && m.stored[i] != enc), refresh: refresh,
			sweep: !start.Before(m.earliest[i])}
		v, err := announce(ctx, c, m.keys, m.cfg.WorkerID, a, enc, ttl, w)
		if err != nil {
			m.stored[i] = "" // unknown: written again next time
			m.earliest[i] = time.Time{}
			return err
		}
		got[i] = &v
		if w.sweep {
			m.earliest[i] = v.earliest
		}
		if w.write {
			m.stored[i] = enc
		}
		return nil
	}, "lease_announce", "demand announcement failed")
	if ctx.Err() == nil {
		m.redisHealth.observe(n >= len(m.clients)/2+1, time.Now())
	}
	if n == 0 {
		return // again at the next tick
	}
	m.lastAnn, m.annAt, m.annEvery = a, start, every
	if periodic {
		m.writtenAt = start
	}
	if refresh {
		m.keysAt = start
	}
	confirmed := false
	for i, v := range got {
		if v == nil {
			continue
		}
		want := m.seenMembers[i]
		if changed && want >= 0 {
			want++ // this announcement's own change
		}
		if want < 0 || v.members != want || v.removed > 0 {
			m.membersDirty.Store(true)
		} else {
			m.seenMembers[i] = v.members
		}
		m.reportedDef[i] = v.def
		if v.def == m.seenDef[i] {
			confirmed = true
		} else {
			m.defDirty.Store(true)
		}
	}
	if confirmed {
		m.defReadAt = start
	}
}

// readMembers reads the members from every Redis into m.peers (the union;
// the larger want wins); false when none answered.
func (m *Manager) readMembers(ctx context.Context) bool {
	var (
		mu  sync.Mutex
		out = map[string]announcement{}
		ver = make([]int64, len(m.clients))
	)
	start := time.Now()
	n := m.each(ctx, func(ctx context.Context, i int, c redis.UniversalClient) error {
		got, v, err := readMembers(ctx, c, m.keys)
		if err != nil {
			ver[i] = -1
			return err
		}
		ver[i] = v
		mu.Lock()
		defer mu.Unlock()
		for w, a := range got {
			if b, ok := out[w]; !ok || a.Want > b.Want {
				out[w] = a
			}
		}
		return nil
	}, "lease_members", "member lookup failed")
	if n == 0 {
		return false
	}
	for i, v := range ver {
		m.seenMembers[i] = v // -1 where it failed: read again after its next announcement
	}
	m.peers, m.membersRead = out, start
	m.outranks.Store(m.outranksAPeer())
	return true
}
