package fleet

import (
	"context"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// A consumer's `concurrent` across the fleet: one count of places in
// flight for the whole fleet, leased in slices. Each instance holds a
// slice of the consumer's places (<prefix>{c:<id>}:concurrent, a hash of
// instance -> slice), admits requests into it in memory and frees them
// there, so that a request costs no Redis call while its instance's slice
// has a free place. The slices never add up to more than the limit
// (concurrentScript grants from what the other instances' live slices
// leave), and an instance never has more in flight than its slice: the
// fleet never has more than the limit in flight. A slice is the places in
// flight plus a spare (a quarter of the recent peak, at least one), renewed
// every concurrentRenew; an instance that another one waits for
// (contended) keeps no spare: it gives back each place its requests free,
// at its next look (leaseTick). A slice lives concurrentTTL without
// renewal: an instance that dies gives its places back to the fleet then.
//
// While Redis does not answer within the store's timeout, an instance
// admits into the free places of its slice until the slice's TTL ends,
// and beyond them up to its share of the limit (outage.go: the limit over
// the instances the census counts, its places in flight counted in it);
// the next renewal leases at least what it has in flight.

const (
	// concurrentTTL is how long a slice outlives its last renewal in
	// Redis (and, from the call's start, on the instance).
	concurrentTTL = 6 * time.Second
	// concurrentRenew is how often a slice in use is renewed.
	concurrentRenew = 2 * time.Second
	// concurrentRecheck is how long an instance refuses a consumer whose
	// fleet-wide places were all in flight before it asks Redis again.
	concurrentRecheck = 250 * time.Millisecond
	// concurrentIdle is how long a spare place is kept with no request
	// taking one.
	concurrentIdle = time.Second
)

// flightSlice is this instance's slice of one consumer's places in flight.
type flightSlice struct {
	s   *Store
	key string

	mu        sync.Mutex
	limit     int       // the plan's concurrent, as the last request stated it
	slice     int       // places leased (in Redis' hash)
	used      int       // of them, in flight
	floor     int       // while a call is in flight: the places it keeps, the most in flight meanwhile
	peak      int       // the most in flight since the last call
	until     time.Time // local clock: the slice is usable before it
	renewed   time.Time // the last call's start
	taken     time.Time // the last place taken
	contended time.Time // another instance waits for places until then
	refused   time.Time // the fleet full: refuse without asking until then
	flight    inFlight
}

// spare is the free places to lease beyond those in flight; under f.mu.
func (f *flightSlice) spare(now time.Time) int {
	if now.Before(f.contended) || now.Sub(f.taken) >= concurrentIdle {
		return 0
	}
	return max(1, f.peak/4)
}

// take takes a free place of a live slice at now.
func (f *flightSlice) take(now time.Time, limit int) (ok, refused bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.limit = limit
	places := f.slice
	if f.flight.done != nil {
		places = min(places, f.floor) // the call may shrink the slice to it
	}
	if now.Before(f.until) && f.used < places && f.used < limit {
		f.used++
		f.peak, f.taken = max(f.peak, f.used), now
		return true, false
	}
	return false, now.Before(f.refused)
}

// release frees a place; a contended slice gives it back at the next look.
func (f *flightSlice) release() {
	f.mu.Lock()
	f.used--
	give := time.Now().Before(f.contended)
	f.mu.Unlock()
	if give {
		f.s.kickLeases()
	}
}

// TakeConcurrent implements consumer.Fleet: a place in flight of consumer
// name on plan among limit fleet-wide, from this instance's slice while it
// has one free (no Redis call), else from a larger slice within the
// store's timeout. release gives it back (once). ok is false when the
// fleet's places are all in flight, or Redis did not answer in time and
// neither the slice nor the instance's share (outage.go) has one free.
func (s *Store) TakeConcurrent(name, plan string, limit int) (release func(), ok bool) {
	if limit <= 0 {
		return func() {}, true
	}
	f := s.consumerLimits(name, plan).flights()
	ctx, cancel := context.WithTimeout(s.ctx, s.timeout)
	defer cancel()
	for {
		now := time.Now()
		ok, refused := f.take(now, limit)
		if ok {
			return f.releaser(), true
		}
		if refused {
			return nil, false
		}
		if !s.available() {
			return f.offline(now, limit)
		}
		f.mu.Lock()
		wait, lead := f.flight.join()
		f.mu.Unlock()
		if lead {
			if f.call(ctx, now, true) != nil {
				return f.offline(time.Now(), limit)
			}
			continue
		}
		select {
		case <-wait:
		case <-ctx.Done():
			return f.offline(time.Now(), limit)
		}
	}
}

// call leases the slice again from now: the places in flight, one more
// when need, and the spare; as the one call in flight (f.flight), which it
// lands.
func (f *flightSlice) call(ctx context.Context, now time.Time, need bool) error {
	s := f.s
	f.mu.Lock()
	want, floor, limit := f.used+f.spare(now), f.used, f.limit
	f.floor = floor
	if need {
		want++
	}
	f.mu.Unlock()
	res, err := concurrentScript.Run(ctx, s.client, []string{f.key}, s.origin, limit, min(want, limit), floor,
		concurrentTTL.Milliseconds()).Int64Slice()
	if err == nil && len(res) != 2 {
		err = errBadReply
	}
	if err != nil {
		s.callFailed("concurrent", err, now)
	} else {
		s.answered()
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.flight.land()
	if err != nil {
		return err
	}
	f.slice, f.until, f.renewed, f.peak = int(res[0]), now.Add(concurrentTTL), now, f.used
	if res[1] == 1 {
		f.contended = now.Add(concurrentRenew + leaseTick)
	}
	if need && f.slice <= f.used {
		f.refused = now.Add(concurrentRecheck)
	}
	return nil
}

// upkeep renews the slice every concurrentRenew while it holds places,
// and gives back the spare it no longer needs (all, closing).
func (f *flightSlice) upkeep(now time.Time, closing bool) {
	f.mu.Lock()
	if closing {
		f.used, f.taken = 0, time.Time{}
	}
	// Places taken on the instance's share while Redis could not answer
	// (outage.go) enter the slice at once.
	due := (f.slice > 0 || f.used > 0) && (now.Sub(f.renewed) >= concurrentRenew || f.slice > f.used+f.spare(now) || f.slice < f.used)
	lead := false
	if due {
		_, lead = f.flight.join()
	}
	f.mu.Unlock()
	if !lead {
		return
	}
	parent := f.s.ctx
	if closing {
		parent = context.Background()
	}
	ctx, cancel := context.WithTimeout(parent, f.s.bgTimeout)
	defer cancel()
	_ = f.call(ctx, now, false)
}

// flights returns c's slice of places in flight, made on first use.
func (c *consumerLimits) flights() *flightSlice {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.flight == nil {
		c.flight = &flightSlice{s: c.b.s, key: c.base + "concurrent"}
	}
	return c.flight
}

// snapshotFlights returns the consumers' slices of places in flight.
func (s *Store) snapshotFlights() []*flightSlice {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []*flightSlice
	for _, c := range s.consumers {
		if f := c.held(); f != nil {
			out = append(out, f)
		}
	}
	return out
}

// idle reports whether f holds nothing in Redis and no call is in flight.
func (f *flightSlice) idle() bool {
	if f == nil {
		return true
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.slice == 0 && f.used == 0 && f.flight.done == nil
}

// concurrentScript leases an instance's slice of a consumer's places in
// flight, atomically: the hash holds each instance's slice, its end on
// Redis' clock, and until when it waits for more ("<slice>:<end ms>:<wants
// until ms>"). Entries that ended (a dead instance's), or that are no
// entry this script wrote, are deleted.
//
//	KEYS[1]  the hash
//	ARGV[1]  the instance, ARGV[2] the limit, ARGV[3] the slice asked,
//	         ARGV[4] the places it has in flight (its slice is never less),
//	         ARGV[5] the slice's TTL (ms)
//
// It returns {slice granted, 1 when another instance waits for places}.
var concurrentScript = redis.NewScript(`
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local me, limit, want, floor, ttl = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local ok, all = pcall(redis.call, 'HGETALL', KEYS[1])
if not ok then
  redis.call('DEL', KEYS[1])
  all = {}
end
local others, contended = 0, 0
for i = 1, #all, 2 do
  local n, ends, wants = string.match(all[i + 1], '^(%d+):(%d+):(%d+)$')
  if all[i] ~= me then
    if not n or tonumber(ends) <= now or tonumber(ends) > now + ttl + ` + skewMS + ` then
      redis.call('HDEL', KEYS[1], all[i])
    else
      others = others + tonumber(n)
      if tonumber(wants) > now then
        contended = 1
      end
    end
  end
end
local got = math.max(floor, math.min(want, limit - others))
local wants = 0
if got < want then
  wants = now + ttl
end
if got > 0 or wants > 0 then
  redis.call('HSET', KEYS[1], me, got .. ':' .. (now + ttl) .. ':' .. wants)
  redis.call('PEXPIRE', KEYS[1], 2 * ttl)
else
  redis.call('HDEL', KEYS[1], me)
end
return {got, contended}
`)

// upkeepFlights looks at the consumers' slices of places in flight (the
// leases' loop, every leaseTick; closing: each gives back all it holds).
func (s *Store) upkeepFlights(now time.Time, closing bool) {
	for _, f := range s.snapshotFlights() {
		f.upkeep(now, closing)
	}
}
