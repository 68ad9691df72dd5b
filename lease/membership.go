package lease

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// Membership layout: each worker SETs {prefix}:{pool}:m:{worker} to
// "<want partitions> <demand units/s>" with a short TTL (MemberTTL) every
// tick, and SADDs its ID to the set {prefix}:{pool}:members in the same
// transaction. Readers list the set and GET every member key; IDs whose key
// has expired are removed from the set by the same script, atomically, so a
// worker is a member exactly while its key lives. The set avoids SCAN,
// whose cost grows with the whole keyspace.

// membersScript returns a flat list worker, value, worker, value, ... of
// the live members of the set KEYS[1] (member keys are ARGV[1]..worker),
// removing dead ones when ARGV[2] is "1".
var membersScript = redis.NewScript(`
local out = {}
for _, w in ipairs(redis.call('SMEMBERS', KEYS[1])) do
  local v = redis.call('GET', ARGV[1] .. w)
  if v then
    out[#out + 1] = w
    out[#out + 1] = v
  elseif ARGV[2] == '1' then
    redis.call('SREM', KEYS[1], w)
  end
end
return out
`)

// membersSetTTL keeps an abandoned pool's member set from living forever.
const membersSetTTL = 24 * time.Hour

// announcement is what a worker publishes about itself.
type announcement struct {
	Want      int     // partitions wanted, 0..P, reserved ones included
	Demand    float64 // units/s, may be +Inf
	Reserved  int     // partitions held for the worker's lifetime, 0..P
	Backlog   float64 // units waiting for the worker (queue lag and fetched), -1 unknown
	Need      int     // the fewest partitions its head record can be sent with, 0..P
	NeedSince int64   // when it began waiting for Need, Unix ms
}

// encode writes a as space-separated fields; older workers read the
// leading ones they know.
func (a announcement) encode() string {
	return strconv.Itoa(a.Want) + " " + strconv.FormatFloat(a.Demand, 'g', -1, 64) + " " + strconv.Itoa(a.Reserved) +
		" " + strconv.FormatFloat(a.Backlog, 'g', -1, 64) + " " + strconv.Itoa(a.Need) + " " + strconv.FormatInt(a.NeedSince, 10)
}

// decodeAnnouncement reads what encode wrote; missing trailing fields (a
// worker of an earlier version) take their zero value, and Backlog -1.
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
	if err := errors.Join(errs...); err != nil {
		return announcement{}, fmt.Errorf("member value %q: %w", v, err)
	}
	return a, nil
}

// announce publishes worker's demand for ttl.
func announce(ctx context.Context, c redis.UniversalClient, k keys, worker string, a announcement, ttl time.Duration) error {
	_, err := c.TxPipelined(ctx, func(p redis.Pipeliner) error {
		p.Set(ctx, k.member(worker), a.encode(), ttl)
		p.SAdd(ctx, k.members(), worker)
		p.PExpire(ctx, k.members(), membersSetTTL)
		return nil
	})
	return err
}

// withdraw removes worker from the members.
func withdraw(ctx context.Context, c redis.UniversalClient, k keys, worker string) error {
	_, err := c.TxPipelined(ctx, func(p redis.Pipeliner) error {
		p.Del(ctx, k.member(worker))
		p.SRem(ctx, k.members(), worker)
		return nil
	})
	return err
}

// readMembers returns the live members and their announcements; with
// cleanup, it also drops expired IDs from the set.
func readMembers(ctx context.Context, c redis.UniversalClient, k keys, cleanup bool) (map[string]announcement, error) {
	flag := "0"
	if cleanup {
		flag = "1"
	}
	res, err := membersScript.Run(ctx, c, []string{k.members()}, k.memberPrefix(), flag).StringSlice()
	if err != nil {
		return nil, err
	}
	out := make(map[string]announcement, len(res)/2)
	for i := 0; i+1 < len(res); i += 2 {
		a, err := decodeAnnouncement(res[i+1])
		if err != nil {
			continue // not ours to judge; a malformed member counts as absent
		}
		out[res[i]] = a
	}
	return out, nil
}
