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
//	ARGV[1] origin, ARGV[2] lease (ms, 0: no lease to renew), then 8 per
//	call: its kind ('j' Join, 'r' a fair Join that gives its consumer's
//	last turn back first: Joining.GiveBack, 'a' look, 'l' Leave, 'u'
//	Leave unserved: LeaveUnserved), member, score (its
//	place; a fair join's: its priority's base), how long it counts (ms),
//	its tokens, '1' to sum the tokens before it, its consumer ('': none,
//	the score is its place) and its cost in fair units (fairJoin)
//
// It returns 2 integers per call: its place and the tokens before it
// (-1, 0: the member is not there; 0, 0 for a Leave of either kind).
var queueBatchScript = redis.NewScript(queueLib + fairJoin + `
if tonumber(ARGV[2]) > 0 then
  renew(ARGV[1], tonumber(ARGV[2]))
end
sweep()
-- Leaves unserved in a row go together (fairGiveBack: one pass over the
-- priority's members for the lot, not one each).
local unserved = {}
for i = 3, #ARGV, 8 do
  local m = ARGV[i + 1]
  if ARGV[i] == 'u' then
    unserved[#unserved + 1] = m
  elseif #unserved > 0 then
    fairGiveBack(unserved)
    unserved = {}
  end
  if ARGV[i] == 'l' then
    fairLeave(m)
    drop(m)
  elseif ARGV[i] == 'j' or ARGV[i] == 'r' then
    local score = ARGV[i + 2]
    if ARGV[i + 6] ~= '' then
      if ARGV[i] == 'r' then
        score = fairRejoin(tonumber(score), ARGV[i + 6], tonumber(ARGV[i + 7]))
      else
        score = fairScore(tonumber(score), ARGV[i + 6], tonumber(ARGV[i + 7]))
      end
    end
    redis.call('ZADD', KEYS[1], score, m)
    redis.call('ZADD', KEYS[2], now + tonumber(ARGV[i + 3]), m)
    redis.call('HSET', KEYS[4], m, ARGV[i + 4])
  end
end
if #unserved > 0 then
  fairGiveBack(unserved)
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
for i = 3, #ARGV, 8 do
  local r, t = 0, 0
  if ARGV[i] == 'j' or ARGV[i] == 'r' or ARGV[i] == 'a' then
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
	kind               string // "j", "r", "a", "l", "u"
	member             string
	score              float64
	consumer           string  // a fair join's consumer (fairID), "" for arrival's order
	cost               float64 // its cost in fair units (fairCost)
	counts, tokens     int64
	withTokens         bool
	ahead, tokensAhead int64
	err                error
	done               chan struct{}
	abandoned          bool // its caller stopped waiting (under the queue's mu)
}

// call sends c in the next batch and waits for its answer (callAll).
func (q *Queue) call(c *queueCall) error {
	return q.callAll([]*queueCall{c})[0]
}

// callAll sends cs in the next batch, all in the same one, and waits for
// their answers, at most the store's Timeout; a call whose answer did not
// come in time is answered context.DeadlineExceeded (a Join that lands
// then is taken out at the next renewal).
func (q *Queue) callAll(cs []*queueCall) []error {
	errs := make([]error, len(cs))
	if q.late.Load() {
		// Redis answers late: none of these waits on it (TestALateRedisHoldsNoQueuedRequestPastTimeout).
		q.probe()
		for i := range errs {
			errs[i] = ErrUnavailable
		}
		return errs
	}
	q.enqueue(cs...)
	t := time.NewTimer(q.s.timeout)
	defer t.Stop()
	for i, c := range cs {
		select {
		case <-c.done:
			errs[i] = c.err
			continue
		case <-t.C:
		}
		q.mu.Lock()
		for k := i; k < len(cs); k++ {
			select {
			case <-cs[k].done:
				errs[k] = cs[k].err
			default:
				cs[k].abandoned = true
				errs[k] = context.DeadlineExceeded
			}
		}
		q.mu.Unlock()
		break
	}
	return errs
}

// probe sends a look at no member when no batch is in flight, for the
// time Redis takes to answer it (run sets q.late from it): while Redis
// answers late the request path's calls go not at all, and this tells
// when it answers in time again.
func (q *Queue) probe() {
	q.mu.Lock()
	busy := q.sending
	q.mu.Unlock()
	if !busy {
		q.enqueue(&queueCall{kind: "a", abandoned: true})
	}
}

// notePlace keeps the place a look or join was answered (Queue.places),
// or forgets it when the member is not there; under q.mu.
func (q *Queue) notePlace(c *queueCall) {
	switch {
	case c.member == "":
	case c.kind == "l" || c.kind == "u" || c.ahead < 0 || c.abandoned && c.kind != "a":
		delete(q.places, c.member) // a Leave lands after its member's looks: none is kept past it
	default:
		if q.places == nil {
			q.places = map[string][2]int64{}
		}
		q.places[c.member] = [2]int64{c.ahead, c.tokensAhead}
	}
}

// enqueue puts cs in the next batch, starting the sender when none runs
// (tracked by the store's wait group, so that Close waits for it; a
// closed store sends nothing: its calls are answered ErrUnavailable).
func (q *Queue) enqueue(cs ...*queueCall) {
	for _, c := range cs {
		c.done = make(chan struct{})
	}
	q.mu.Lock()
	q.pending = append(q.pending, cs...)
	lead := !q.sending
	q.sending = true
	q.mu.Unlock()
	if !lead {
		return
	}
	s := q.s
	s.mu.Lock()
	closed := s.closed
	if !closed {
		s.wg.Add(1)
	}
	s.mu.Unlock()
	if closed {
		q.answerClosed()
		return
	}
	go func() {
		defer s.wg.Done()
		q.send()
	}()
}

// answerClosed answers the pending calls of a closed store.
func (q *Queue) answerClosed() {
	q.mu.Lock()
	batch := q.pending
	q.pending, q.sending = nil, false
	q.mu.Unlock()
	q.answer(batch, nil, ErrUnavailable)
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
	args := make([]any, 0, 2+8*len(batch))
	args = append(args, s.origin, lease)
	for _, c := range batch {
		if c.kind == "j" || c.kind == "r" || members > 0 {
			lease = s.lease.Milliseconds()
		}
		args = append(args, c.kind, c.member, c.score, c.counts, c.tokens, flag(c.withTokens), c.consumer, c.cost)
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
		q.late.Store(s.busy(err, start))
		s.callFailed("queue", err, start)
		return nil, err
	}
	s.answered()
	q.late.Store(s.late(start))
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
		case (c.kind == "j" || c.kind == "r") && c.abandoned:
			q.stale = append(q.stale, c.member)
		case c.kind == "j" || c.kind == "r":
			q.members++
		}
		if err == nil {
			c.ahead, c.tokensAhead = res[2*i], res[2*i+1]
			q.notePlace(c)
		}
		close(c.done)
	}
}
