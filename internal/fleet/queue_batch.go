package fleet

import (
	"context"
	"time"

	"github.com/redis/go-redis/v9"
)

// An instance's calls to one queue are group-committed: a call made while
// another is in flight waits for it to land and goes in the next one, with
// every call that came meanwhile, as one script call (queueBatchScript).
// So a burst of waiting requests costs a script call per round trip, not
// one per Join, look and Leave; a lone call goes at once. Each caller
// waits at most the store's Timeout from its own call.

// queueBatchScript applies a batch of an instance's queue calls in order,
// then answers each Join's and look's place.
//
//	ARGV[1] origin, ARGV[2] lease (ms, 0: no lease to renew), then 6 per
//	call: its kind ('j' Join, 'a' look, 'l' Leave), member, score (its
//	place), how long it counts (ms), its tokens, '1' to sum the tokens
//	before it
//
// It returns 2 integers per call: its place and the tokens before it
// (-1, 0: the member is not there; 0, 0 for a Leave).
var queueBatchScript = redis.NewScript(queueLib + `
if tonumber(ARGV[2]) > 0 then
  renew(ARGV[1], tonumber(ARGV[2]))
end
sweep()
for i = 3, #ARGV, 6 do
  local m = ARGV[i + 1]
  if ARGV[i] == 'l' then
    drop(m)
  elseif ARGV[i] == 'j' then
    redis.call('ZADD', KEYS[1], ARGV[i + 2], m)
    redis.call('ZADD', KEYS[2], now + tonumber(ARGV[i + 3]), m)
    redis.call('HSET', KEYS[4], m, ARGV[i + 4])
  end
end
-- before[r + 1]: the tokens of the members ranked before r, summed once.
local before
local function tokensBefore(r)
  if not before then
    before = {}
    local ms, t = redis.call('ZRANGE', KEYS[1], 0, -1), 0
    for from = 1, #ms, 500 do
      local vs = redis.call('HMGET', KEYS[4], unpack(ms, from, math.min(from + 499, #ms)))
      for j, v in ipairs(vs) do
        before[from + j - 1] = t
        t = t + (tonumber(v) or 0)
      end
    end
  end
  return before[r + 1] or 0
end
local out = {}
for i = 3, #ARGV, 6 do
  local r, t = 0, 0
  if ARGV[i] ~= 'l' then
    r = redis.call('ZRANK', KEYS[1], ARGV[i + 1])
    if not r then
      r = -1
    elseif ARGV[i + 5] == '1' then
      t = tokensBefore(r)
    end
  end
  out[#out + 1] = r
  out[#out + 1] = t
end
keep(now)
return out
`)

// queueCall is one call in a batch: its arguments, then its answer.
type queueCall struct {
	kind               string // "j", "a", "l"
	member             string
	score              float64
	counts, tokens     int64
	withTokens         bool
	ahead, tokensAhead int64
	err                error
	done               chan struct{}
	abandoned          bool // its caller stopped waiting (under the queue's mu)
}

// call sends c in the next batch and waits for its answer, at most the
// store's Timeout; a call whose answer did not come in time is answered
// context.DeadlineExceeded (a Join that lands then is taken out at the
// next renewal).
func (q *Queue) call(c *queueCall) error {
	c.done = make(chan struct{})
	q.mu.Lock()
	q.pending = append(q.pending, c)
	lead := !q.sending
	q.sending = true
	q.mu.Unlock()
	if lead {
		go q.send()
	}
	t := time.NewTimer(q.s.timeout)
	defer t.Stop()
	select {
	case <-c.done:
		return c.err
	case <-t.C:
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	select {
	case <-c.done:
		return c.err
	default:
		c.abandoned = true
		return context.DeadlineExceeded
	}
}

// send sends the pending calls, a batch per call to Redis, until none is
// left.
func (q *Queue) send() {
	for {
		q.mu.Lock()
		batch, members := q.pending, q.members
		q.pending = nil
		if len(batch) == 0 {
			q.sending = false
			q.mu.Unlock()
			return
		}
		q.mu.Unlock()
		res, err := q.run(batch, members)
		q.answer(batch, res, err)
	}
}

// run sends batch in one script call; members is how many of this
// instance's requests wait in the queue (its lease is renewed when any
// does, or one joins).
func (q *Queue) run(batch []*queueCall, members int) ([]int64, error) {
	s := q.s
	if !s.available() {
		return nil, ErrUnavailable
	}
	lease := int64(0)
	args := make([]any, 0, 2+6*len(batch))
	args = append(args, s.origin, lease)
	for _, c := range batch {
		if c.kind == "j" || members > 0 {
			lease = s.lease.Milliseconds()
		}
		args = append(args, c.kind, c.member, c.score, c.counts, c.tokens, flag(c.withTokens))
	}
	args[1] = lease
	start := time.Now()
	ctx, cancel := context.WithTimeout(s.ctx, s.timeout)
	defer cancel()
	res, err := queueBatchScript.Run(ctx, s.client, q.keys(), args...).Int64Slice()
	if err == nil && len(res) != 2*len(batch) {
		err = errBadReply
	}
	if err != nil {
		s.callFailed("queue", err, start)
		return nil, err
	}
	s.answered()
	return res, nil
}

// answer gives each call of batch its answer: its place, or err. A Join
// that failed (its answer may be lost while it landed) or landed after its
// caller stopped waiting, and a Leave that failed, are taken out at the
// next renewal.
func (q *Queue) answer(batch []*queueCall, res []int64, err error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	for i, c := range batch {
		c.err = err
		switch {
		case err != nil:
			if c.kind != "a" {
				q.stale = append(q.stale, c.member)
			}
		case c.kind == "j" && c.abandoned:
			q.stale = append(q.stale, c.member)
		case c.kind == "j":
			q.members++
		}
		if err == nil {
			c.ahead, c.tokensAhead = res[2*i], res[2*i+1]
		}
		close(c.done)
	}
}
