package fleet

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/llmrouter/caddy-llm-router/provider"
)

// An instance's lease on a queue where it has requests waiting: renewed
// every queueRenew, it ends queueLease after the last renewal. So the
// places of an instance killed (or cut from Redis) stop counting within a
// second.
const (
	queueLease = time.Second
	queueRenew = 250 * time.Millisecond
)

// ErrNotQueued is returned by Queue.Ahead for a member the fleet's queue no
// longer holds: its instance was taken for dead (it missed its heartbeats
// while Redis was unreachable) or its time passed. The caller joins again.
// queueHorizon bounds how far ahead a queue's expiry or lease may be: the
// longest wait any provider states (no request waits longer); one beyond
// it was not written by the router and is dropped, so that the queue's
// keys expire.
const queueHorizon = provider.MaxCooldown

var queueHorizonMS = strconv.FormatInt(queueHorizon.Milliseconds(), 10)

var ErrNotQueued = errors.New("not in the fleet's queue")

// Queue is a model group's queue as the whole fleet sees it: the requests
// that wait for capacity on every instance, ordered by priority, then by
// arrival. Each instance still serves its own waiting requests; the fleet's
// queue only counts each one's place, so that a request whose place the
// fleet's windows cannot serve before its deadline is told at once, on
// whichever instance it waits, and no instance forecasts with a share of
// the windows learned from whoever won the last race.
//
// A place held by a request that is gone must not count for long, or the
// other instances answer 429s the fleet could serve. So:
//   - each member is named by its instance ("<origin>-<order>-<seq>":
//     the instance's own order of arrival, then a number unique to the
//     join), and an
//     instance renews its lease on the queue every queueRenew while it
//     has requests there; another instance's look sweeps the members of
//     an instance whose lease (queueLease) ran out: killed, or cut from
//     Redis (its requests join again when they look next);
//   - every member also stops counting a second after its deadline;
//   - a Leave (or a Join whose answer was lost) that Redis did not
//     confirm is tried again at the next renewal; Close waits for the
//     requests waiting here to leave (a config reload does not wait for
//     them), then takes out what is left.
//
// Keys, with one hash tag per queue (one Redis Cluster slot):
// <prefix>{q:<hash>}:waiting, the members scored by place; :expires, the
// same members scored by when they stop counting; :alive, the instances
// scored by when their lease ends (Redis' clock). The hash covers the
// group's name and its deployments' identities: two configs that share a
// store share a group's queue only when the group is the same.
type Queue struct {
	s                                *Store
	key                              string
	waiting, expires, living, tokens string
	fair                             string // the consumers' fair tags (fair.go)

	mu      sync.Mutex
	joined  bool         // this instance joined it at least once
	members int          // joined on this instance and not left
	stale   []string     // to take out at the next poll: unconfirmed Leaves and Joins
	pending []*queueCall // calls for the next batch (queue_batch.go)
	sending bool         // a batch is in flight
	// late: the last batch was answered after half the store's timeout,
	// or timed out while Redis is up (load): the request path waits on
	// Redis no more, a look is answered its member's last place (places)
	// and a Join ErrUnavailable (the request takes its place in this
	// instance's queue), both at once, and a probe goes in their stead,
	// until a batch answers sooner (queue_batch.go). Each look waited
	// again before, and a request looking every 20 ms waited 0.5 s on
	// Redis in all for a timeout of 50 ms.
	late atomic.Bool
	// places are the places its looks and joins last answered, by member
	// (under mu; a member leaves with its Leave): while Redis answers
	// late, a look is answered its last place, so that the request goes
	// on counting its place fleet-wide (a place it holds can only move up
	// meanwhile), not this instance's share of the windows, which told
	// requests the fleet could serve 429 early.
	places map[string][2]int64
}

// Queue returns the fleet's queue of the model group name whose
// deployments have the given identities (see DeploymentID), one per store
// however many configs ask.
func (s *Store) Queue(name string, identities []string) *Queue {
	ids := make([]string, len(identities))
	for i, id := range identities {
		ids[i] = DeploymentID(id)
	}
	slices.Sort(ids)
	sum := sha256.Sum256([]byte("llm_router model group\x00" + name + "\x00" + strings.Join(slices.Compact(ids), ",")))
	key := hex.EncodeToString(sum[:12])
	s.mu.Lock()
	defer s.mu.Unlock()
	if q := s.queues[key]; q != nil {
		return q
	}
	base := s.prefix + "{q:" + key + "}:"
	q := &Queue{s: s, key: key, waiting: base + "waiting", expires: base + "expires", living: base + "alive", tokens: base + "tokens", fair: base + "fair"}
	s.queues[key] = q
	return q
}

// queueLib, the start of each queue script: now (Redis' clock, ms);
// sweep, which takes out the members whose time is past or whose
// instance's lease ran out; renew, which renews an instance's lease; keep,
// which makes the keys outlive their members and leases.
//
//	KEYS[1] waiting, KEYS[2] expires, KEYS[3] alive, KEYS[4] tokens (a
//	hash: each member's token estimate)
var queueLib = `
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
-- What the router cannot have written is replaced: a key of another type,
-- an expiry or a lease beyond queueHorizon.
for i, want in ipairs({'zset', 'zset', 'zset', 'hash', 'hash'}) do
  local ty = redis.call('TYPE', KEYS[i]).ok
  if ty ~= want and ty ~= 'none' then
    redis.call('DEL', KEYS[i])
  end
end
local horizon = '(' .. (now + ` + queueHorizonMS + `)
for _, m in ipairs(redis.call('ZRANGEBYSCORE', KEYS[2], horizon, '+inf')) do
  redis.call('ZREM', KEYS[1], m)
  redis.call('HDEL', KEYS[4], m)
end
redis.call('ZREMRANGEBYSCORE', KEYS[2], horizon, '+inf')
redis.call('ZREMRANGEBYSCORE', KEYS[3], horizon, '+inf')
local function drop(m)
  redis.call('ZREM', KEYS[1], m)
  redis.call('ZREM', KEYS[2], m)
  redis.call('HDEL', KEYS[4], m)
end
local function dropOrigins(set)
  for _, m in ipairs(redis.call('ZRANGE', KEYS[1], 0, -1)) do
    if set[string.match(m, '^[^-]*')] then
      drop(m)
    end
  end
end
local function sweep()
  for _, m in ipairs(redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now)) do
    drop(m)
  end
  local dead = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', now)
  if #dead > 0 then
    local set = {}
    for _, o in ipairs(dead) do
      set[o] = true
    end
    redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now)
    dropOrigins(set)
  end
end
local function keep(upto)
  for i = 2, 3 do
    local last = redis.call('ZRANGE', KEYS[i], -1, -1, 'WITHSCORES')[2]
    if last then
      upto = math.max(upto, tonumber(last))
    end
  end
  for i = 1, 5 do
    redis.call('PEXPIREAT', KEYS[i], upto)
  end
end
-- place returns {rank, tokens of those before} of member m ({-1, 0} when
-- it is not there); the tokens only when withTokens is '1'.
local function place(m, withTokens)
  local r = redis.call('ZRANK', KEYS[1], m)
  if not r then
    return {-1, 0}
  end
  local t = 0
  if withTokens == '1' then
    for from = 0, r - 1, 500 do
      local ms = redis.call('ZRANGE', KEYS[1], from, math.min(from + 499, r - 1))
      for _, v in ipairs(redis.call('HMGET', KEYS[4], unpack(ms))) do
        t = t + (tonumber(v) or 0)
      end
    end
  end
  return {r, t}
end
local function renew(origin, lease)
  redis.call('ZADD', KEYS[3], now + lease, origin)
end
`

// queueRenewScript renews an instance's lease (when it has members here)
// and takes out the members listed.
//
//	ARGV[1] origin, ARGV[2] lease (ms, 0: no lease to renew), ARGV[3..] members
var queueRenewScript = redis.NewScript(queueLib + `
if tonumber(ARGV[2]) > 0 then
  renew(ARGV[1], tonumber(ARGV[2]))
end
sweep()
for i = 3, #ARGV do
  drop(ARGV[i])
end
keep(now)
return 1
`)

// queueCloseScript takes out every member of the instance ARGV[1], and its
// lease.
var queueCloseScript = redis.NewScript(queueLib + `
redis.call('ZREM', KEYS[3], ARGV[1])
dropOrigins({[ARGV[1]] = true})
sweep()
keep(now)
return 1
`)

func (q *Queue) keys() []string { return []string{q.waiting, q.expires, q.living, q.tokens, q.fair} }

// placeScore orders waiting requests: a higher priority first, then the
// earlier arrival (Unix ms; instances' clocks agree well enough for a
// place). Requests of one priority and millisecond are ordered by member
// name, which is the order of their Joins on one instance.
func placeScore(priority, maxPriority int, arrival time.Time) float64 {
	return float64(maxPriority-priority)*(1<<42) + float64(arrival.UnixMilli())
}

// Join adds a request waiting on this instance, of priority (0 to
// maxPriority) that arrived at arrival, waits at most wait and estimates
// tokens; order is the instance's own order of arrival in the group's
// queue, which orders its requests of one priority and millisecond. It returns the request's member name, for Ahead and Leave, how
// many wait before it fleet-wide and (withTokens) their tokens; or
// ErrUnavailable (the store is down) or Redis' error: the caller counts its
// place on local state alone.
func (q *Queue) Join(priority, maxPriority int, arrival time.Time, order uint64, wait time.Duration, tokens int64, withTokens bool) (member string, ahead, tokensAhead int64, err error) {
	return q.JoinAs("", 0, priority, maxPriority, arrival, order, wait, tokens, withTokens)
}

// JoinAs is Join for a request of consumer of weight (more than 0): its
// place among its priority is its consumer's fair tag in the fleet
// (fair.go), not its arrival. Weight 0 is Join (the consumer unused).
func (q *Queue) JoinAs(consumer string, weight float64, priority, maxPriority int, arrival time.Time, order uint64, wait time.Duration, tokens int64, withTokens bool) (member string, ahead, tokensAhead int64, err error) {
	j := []Joining{{Consumer: consumer, Weight: weight, Priority: priority, MaxPriority: maxPriority, Arrival: arrival, Order: order, Wait: wait, Tokens: tokens, WithTokens: withTokens}}
	q.JoinAll(j)
	return j[0].Member, j[0].Ahead, j[0].TokensAhead, j[0].Err
}

// Joining is one request of JoinAll: JoinAs' arguments, then its answer
// (Member, Ahead, TokensAhead, or Err as Join's).
type Joining struct {
	Consumer              string
	Weight                float64
	Priority, MaxPriority int
	Arrival               time.Time
	Order                 uint64
	Wait                  time.Duration
	Tokens                int64
	WithTokens            bool
	// GiveBack gives the consumer's last turn back before the join tags
	// it (a fair join): the request left the queue served to claim
	// capacity and its claim was refused, so that it joins again with
	// the turn it had, not a second one (router's take).
	GiveBack           bool
	Member             string
	Ahead, TokensAhead int64
	Err                error
}

// JoinAll is JoinAs for several requests in one step: they go in one script
// call (queueBatchScript applies every join before it answers a place),
// so each one's place counts the others before it, and a burst's joins
// cost one round trip, not one each. Each is answered in place.
func (q *Queue) JoinAll(joins []Joining) {
	s := q.s
	if !s.available() {
		for i := range joins {
			joins[i].Err = ErrUnavailable
		}
		return
	}
	q.mu.Lock()
	q.joined = true
	q.mu.Unlock()
	cs := make([]*queueCall, len(joins))
	for i, j := range joins {
		// Fixed width: one instance's members of one millisecond sort in
		// the order they arrived there; the join's number keeps a member
		// that joins again apart from its earlier self (a stale Leave of
		// that one must not take this one out).
		member := fmt.Sprintf("%s-%016x-%x", s.origin, j.Order, s.seq.Add(1))
		c := &queueCall{kind: "j", member: member, score: placeScore(j.Priority, j.MaxPriority, j.Arrival),
			counts: max(j.Wait, time.Millisecond).Milliseconds() + 1000, tokens: max(j.Tokens, 0), withTokens: j.WithTokens}
		if j.Weight > 0 {
			c.score, c.consumer, c.cost = placeBase(j.Priority, j.MaxPriority), fairID(j.Consumer), fairCost(j.Weight)
			c.member = fairMember(member, c.consumer, c.cost)
			if j.GiveBack {
				c.kind = "r"
			}
		}
		cs[i] = c
	}
	for i, err := range q.callAll(cs) {
		if joins[i].Err = err; err == nil {
			joins[i].Member, joins[i].Ahead, joins[i].TokensAhead = cs[i].member, cs[i].ahead, cs[i].tokensAhead
		}
	}
}

// Ahead returns how many requests wait before member, fleet-wide, and
// (withTokens) their tokens; ErrNotQueued when the queue no longer holds
// it; ErrUnavailable or Redis' error when the store cannot tell.
func (q *Queue) Ahead(member string, withTokens bool) (ahead, tokensAhead int64, err error) {
	s := q.s
	if !s.available() {
		return 0, 0, ErrUnavailable
	}
	if q.late.Load() {
		q.mu.Lock()
		p, ok := q.places[member]
		q.mu.Unlock()
		if ok {
			q.probe()
			return p[0], p[1], nil
		}
	}
	c := &queueCall{kind: "a", member: member, withTokens: withTokens}
	if err := q.call(c); err != nil {
		return 0, 0, err
	}
	if c.ahead < 0 {
		return 0, 0, ErrNotQueued
	}
	return c.ahead, c.tokensAhead, nil
}

func flag(b bool) string {
	if b {
		return "1"
	}
	return "0"
}

// Leave takes member out of the fleet's queue, in the next batch, without
// waiting for Redis (a request that leaves goes on at once: Redis holds
// none on its way out); when Redis does not confirm it (or is known to be
// down), at the next renewal that it answers. Until it lands, the other
// instances may count member both in the queue and in what it spends:
// once too often, never too few. A fair member (JoinAs) that leaves the
// head of its priority moves the priority's virtual time to its start:
// it was served.
func (q *Queue) Leave(member string) { q.leave(member, "l") }

// LeaveUnserved is Leave for a request that leaves unserved (its
// deadline, a 429, its client gone): a fair member's turn is given back,
// as this instance's queue gives it (router/queue.go unspend).
func (q *Queue) LeaveUnserved(member string) { q.leave(member, "u") }

// leave sends a Leave of kind ("l", "u") of member.
func (q *Queue) leave(member, kind string) {
	q.mu.Lock()
	q.members--
	delete(q.places, member)
	q.mu.Unlock()
	if !q.s.available() {
		q.mu.Lock()
		q.stale = append(q.stale, member)
		q.mu.Unlock()
		return
	}
	q.enqueue(&queueCall{kind: kind, member: member})
}

// renewLoop renews this instance's leases every queueRenew (renewQueues).
func (s *Store) renewLoop() {
	defer s.wg.Done()
	t := time.NewTicker(queueRenew)
	defer t.Stop()
	for {
		select {
		case <-s.ctx.Done():
			return
		case <-t.C:
		}
		if s.health.Load() == healthDown {
			continue // the poller tries Redis again; the waiters count locally
		}
		ctx, cancel := context.WithTimeout(s.ctx, s.bgTimeout)
		if err := s.renewQueues(ctx); err != nil {
			s.obs.Error("queue")
		}
		cancel()
	}
}

// queued reports whether requests wait in a queue on this instance.
func (s *Store) queued() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, q := range s.queues {
		q.mu.Lock()
		n := q.members
		q.mu.Unlock()
		if n > 0 {
			return true
		}
	}
	return false
}

// renewQueues renews this instance's lease on each queue where it has
// requests waiting and takes out the members whose Leave Redis did not
// confirm. A queue with neither is skipped.
func (s *Store) renewQueues(ctx context.Context) error {
	s.mu.Lock()
	queues := make([]*Queue, 0, len(s.queues))
	for _, q := range s.queues {
		queues = append(queues, q)
	}
	s.mu.Unlock()
	for _, q := range queues {
		q.mu.Lock()
		stale, members := q.stale, q.members
		q.stale = nil
		q.mu.Unlock()
		if members == 0 && len(stale) == 0 {
			continue
		}
		lease := int64(0)
		if members > 0 {
			lease = s.lease.Milliseconds()
		}
		args := make([]any, 0, 2+len(stale))
		args = append(args, s.origin, lease)
		for _, m := range stale {
			args = append(args, m)
		}
		if err := queueRenewScript.Run(ctx, s.client, q.keys(), args...).Err(); err != nil {
			q.mu.Lock()
			q.stale = append(q.stale, stale...)
			q.mu.Unlock()
			return err
		}
	}
	return nil
}

// closeQueues takes this instance's members out of every queue it joined
// (Close).
func (s *Store) closeQueues(ctx context.Context) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, q := range s.queues {
		q.mu.Lock()
		joined := q.joined
		q.mu.Unlock()
		if joined {
			_ = queueCloseScript.Run(ctx, s.client, q.keys(), s.origin).Err()
		}
	}
}
