package fleet

import (
	"context"

	"github.com/redis/go-redis/v9"
)

// The fleet's census: how many instances share the store, for the shares
// of a consumer's limits an instance admits on its own while Redis cannot
// answer (outage.go). Each instance marks itself in
// <prefix>instances (a sorted set of instances scored by when their mark
// ends, Redis' clock) every PollInterval with the poll, one call, and
// counts the marks that have not ended; the count last read stands while
// Redis does not answer. A mark lasts the store's keep (3 polls, at least
// 3 s): an instance that dies leaves the count then; one that closes
// leaves it at once.

// censusScript marks the instance and counts the live marks.
//
//	KEYS[1]  the census, ARGV[1] the instance, ARGV[2] a mark's life (ms)
//
// Marks that ended, or that end further ahead than a mark lives (another
// clock or program), are taken out; a key of another type is replaced.
// It returns the instances counted, this one included.
var censusScript = redis.NewScript(`
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[2])
if not pcall(redis.call, 'ZREMRANGEBYSCORE', KEYS[1], '-inf', now) then
  redis.call('DEL', KEYS[1])
end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '(' .. (now + ttl + ` + skewMS + `), '+inf')
redis.call('ZADD', KEYS[1], now + ttl, ARGV[1])
redis.call('PEXPIRE', KEYS[1], 2 * ttl)
return redis.call('ZCARD', KEYS[1])
`)

// census marks this instance in the fleet's census and keeps the count
// (the poll loop, Redis up). A failed call keeps the last count.
func (s *Store) census() {
	ctx, cancel := context.WithTimeout(s.ctx, s.bgTimeout)
	defer cancel()
	n, err := censusScript.Run(ctx, s.client, []string{s.prefix + "instances"}, s.origin, s.keep.Milliseconds()).Int64()
	if err != nil {
		s.obs.Error("census")
		return
	}
	s.peers.Store(max(n, 1))
}

// leaveCensus takes this instance out of the census (Close).
func (s *Store) leaveCensus() {
	ctx, cancel := context.WithTimeout(context.Background(), s.bgTimeout)
	defer cancel()
	_ = s.client.ZRem(ctx, s.prefix+"instances", s.origin).Err()
}

// instances returns the instances the census last counted, this one
// included: 0 while the store has never counted them.
func (s *Store) instances() int64 { return s.peers.Load() }
