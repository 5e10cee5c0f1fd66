package fleet

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"time"

	"github.com/redis/go-redis/v9"
)

// Queue is a model group's queue as the whole fleet sees it: the requests
// that wait for capacity on every instance, ordered by priority, then by
// arrival. Each instance still serves its own waiting requests; the fleet's
// queue only counts each one's place, so that a request whose place the
// fleet's windows cannot serve before its deadline is told at once, on
// whichever instance it waits, and no instance forecasts with a share of
// the windows learned from whoever won the last race.
//
// Keys (one hash tag per group): <prefix>{q:<group hash>}:waiting, a
// sorted set of the waiting requests scored by place, and :expires, the
// same members scored by when they stop counting (Redis' clock), so that
// an instance that died does not hold places for good.
type Queue struct {
	s                 *Store
	waiting, expiries string
}

// Queue returns the fleet's queue of the model group name.
func (s *Store) Queue(name string) *Queue {
	sum := sha256.Sum256([]byte("llm_router model group\x00" + name))
	base := s.prefix + "{q:" + hex.EncodeToString(sum[:12]) + "}:"
	return &Queue{s: s, waiting: base + "waiting", expiries: base + "expires"}
}

// queueJoinScript adds a waiting request, first dropping the requests
// whose time is past.
//
//	KEYS[1] waiting, KEYS[2] expires
//	ARGV[1] member, ARGV[2] score (its place: priority, then arrival),
//	ARGV[3] how long it counts, ms
var queueJoinScript = redis.NewScript(`
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local gone = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now)
for _, m in ipairs(gone) do
  redis.call('ZREM', KEYS[1], m)
  redis.call('ZREM', KEYS[2], m)
end
local expires = now + tonumber(ARGV[3])
redis.call('ZADD', KEYS[1], ARGV[2], ARGV[1])
redis.call('ZADD', KEYS[2], expires, ARGV[1])
local last = tonumber(redis.call('ZRANGE', KEYS[2], -1, -1, 'WITHSCORES')[2])
redis.call('PEXPIREAT', KEYS[1], last)
redis.call('PEXPIREAT', KEYS[2], last)
return 1
`)

// placeScore orders waiting requests: a higher priority first, then the
// earlier arrival (Unix ms; instances' clocks agree well enough for a
// place).
func placeScore(priority, maxPriority int, arrival time.Time) float64 {
	return float64(maxPriority-priority)*(1<<41) + float64(arrival.UnixMilli())
}

// Join adds a request waiting on this instance, of priority (0 to
// maxPriority) that arrived at arrival and waits at most wait. It returns
// the request's member name, for Ahead and Leave.
func (q *Queue) Join(priority, maxPriority int, arrival time.Time, wait time.Duration) (string, error) {
	s := q.s
	if !s.available() {
		return "", ErrUnavailable
	}
	member := s.nextToken()
	ctx, cancel := context.WithTimeout(s.ctx, s.timeout)
	defer cancel()
	err := queueJoinScript.Run(ctx, s.client, []string{q.waiting, q.expiries}, member,
		placeScore(priority, maxPriority, arrival), max(wait, time.Millisecond).Milliseconds()+1000).Err()
	if err != nil {
		s.fail("queue", err)
		return "", err
	}
	s.succeeded()
	return member, nil
}

// Ahead returns how many requests wait before member, fleet-wide.
func (q *Queue) Ahead(member string) (int64, error) {
	s := q.s
	if !s.available() {
		return 0, ErrUnavailable
	}
	ctx, cancel := context.WithTimeout(s.ctx, s.timeout)
	defer cancel()
	n, err := s.client.ZRank(ctx, q.waiting, member).Result()
	if err != nil {
		if err != redis.Nil {
			s.fail("queue", err)
		}
		return 0, err
	}
	s.succeeded()
	return n, nil
}

// Leave takes member out of the fleet's queue.
func (q *Queue) Leave(member string) {
	s := q.s
	if !s.available() {
		return
	}
	ctx, cancel := context.WithTimeout(s.ctx, s.timeout)
	defer cancel()
	pipe := s.client.TxPipeline()
	pipe.ZRem(ctx, q.waiting, member)
	pipe.ZRem(ctx, q.expiries, member)
	if _, err := pipe.Exec(ctx); err != nil {
		s.fail("queue", err)
		return
	}
	s.succeeded()
}
