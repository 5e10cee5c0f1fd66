package router

import (
	"context"
	"fmt"
	"math"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/llmrouter/caddy-llm-router/internal/capacity"
	"github.com/llmrouter/caddy-llm-router/provider"
)

// Group is a model group: its deployments, and the queue of its requests
// that wait for capacity. A Group is used by one Router (one config); its
// zero queue is empty.
type Group struct {
	// Name is the model group's name, for metrics and logs.
	Name        string
	Deployments []*Deployment
	// Fallback is the group a request goes on to, within the same deadline
	// and attempt budget, when none of this group's deployments can serve
	// it (see ServeGroup); nil: none.
	Fallback *Group
	// Fleet is the group's queue as a fleet of instances sees it (fleet
	// mode); nil: this instance's queue alone counts places.
	Fleet FleetQueue
	// Spending is the group's budget and what its answers spent (nil:
	// none): a group whose budget is spent answers 429 until it renews.
	Spending *capacity.Spending
	// MaxQueued bounds how many of the group's requests wait in its queue
	// on this instance: a request that would wait while it is full is
	// answered 429 at once (queueFullError). 0: DefaultMaxQueued of the
	// router's deadline and the group's deployments.
	MaxQueued int
	queue     queue
	// waits and waited count the requests that waited in the queue and
	// the time they spent there (nanoseconds).
	waits, waited atomic.Int64
}

// DefaultMaxQueued is a group's queue bound when none is set:
// DefaultQueuedPerSecond requests per second of the deadline per
// deployment, MinMaxQueued at least (a 60 s deadline: 600 per
// deployment). A request waits only while none of the group's
// deployments has capacity for it, and only for what frees within its
// deadline; where the deployments' windows are known, the queue's
// forecast answers a place they cannot serve in time at once, so the bound
// matters where nothing bounds the forecast (a provider that states no
// window): a deployment serving 10 requests a second for the whole
// deadline is a generous figure for one account, and every waiting
// request holds its body (up to max_body) and its connection.
func DefaultMaxQueued(deadline time.Duration, deployments int) int {
	return max(MinMaxQueued, int(math.Ceil(deadline.Seconds()*DefaultQueuedPerSecond))*max(deployments, 1))
}

// The figures of DefaultMaxQueued.
const (
	DefaultQueuedPerSecond = 10
	MinMaxQueued           = 100
)

// NewGroup returns the group name of deployments ds.
func NewGroup(name string, ds []*Deployment) *Group {
	return &Group{Name: name, Deployments: ds}
}

// Queued returns how many requests wait for capacity in the group now.
func (g *Group) Queued() int { return int(g.queue.n.Load()) }

// Waits returns how many requests have waited in the group's queue, and
// their total wait.
func (g *Group) Waits() (n int64, total time.Duration) {
	return g.waits.Load(), time.Duration(g.waited.Load())
}

// FleetQueue counts a group's waiting requests across a fleet of
// instances (fleet.Queue): a request that waits here joins it too, and its
// place is counted fleet-wide, against the fleet's windows. Every method
// may fail (the store is unreachable): the instance then counts its own
// queue against its share of the windows.
type FleetQueue interface {
	// Join adds a request waiting here, of priority (MinPriority to
	// maxPriority) that arrived at arrival, waits at most wait and
	// estimates tokens; order numbers this instance's requests of the
	// group in the order they arrived, and orders those of one priority
	// and arrival time as this instance's own queue does, so that its head
	// is never counted behind requests queued after it here. The member
	// names it, ahead is how many wait before it fleet-wide and
	// tokensAhead (withTokens) their tokens.
	Join(priority, maxPriority int, arrival time.Time, order uint64, wait time.Duration, tokens int64, withTokens bool) (member string, ahead, tokensAhead int64, err error)
	// Ahead returns how many requests wait before member, fleet-wide, and
	// (withTokens) their tokens; an error when the store cannot tell or no
	// longer holds member (the request joins again at its next look).
	Ahead(member string, withTokens bool) (ahead, tokensAhead int64, err error)
	// Leave takes member out.
	Leave(member string)
}

// Priorities: a request's priority is a number from MinPriority to
// MaxPriority, DefaultPriority when the client or the config says none.
// Under contention a higher priority is served first.
const (
	MinPriority     = 0
	MaxPriority     = 9
	DefaultPriority = 5
)

// Reserve keeps a share of every known window (stated or declared) for
// requests of priority MinPriority or more: others wait for the next
// window, or are answered 429 at once when it would come too late.
type Reserve struct {
	// Share is the part of each window kept, 0..1 (0: none).
	Share float64
	// MinPriority is the lowest priority that may spend the reserve.
	MinPriority int
}

// share returns the reserve a request of priority p must leave.
func (rs Reserve) share(p int) float64 {
	if rs.Share <= 0 || p >= rs.MinPriority {
		return 0
	}
	return rs.Share
}

// queue orders the requests of a group that found no capacity: by priority
// (higher first), then by consumer's fair share (fairTag), then by
// arrival. Only its head may take capacity, so that no two waiting
// requests race for the same unit; a request that arrives while others
// wait goes behind those of its priority whose consumers have had no more
// than their share. An empty queue costs an atomic load.
type queue struct {
	mu      sync.Mutex
	waiting []*waiter // the head first
	n       atomic.Int32
	// arrivals numbers the requests in the order they joined, under mu:
	// one that joins later never goes before one that joined earlier at
	// its priority, so that a place once counted only shrinks (but for
	// higher priorities).
	arrivals uint64
	// joinMu is held across each Join of the fleet's queue (Group.Fleet),
	// so that a request that joins it knows which of this instance's
	// requests before it are not there yet (they join after it, and go
	// before it in the fleet's order): its first place counts them too.
	// Without it, a burst's requests that joined out of their order would
	// each count fewer than are before it, and wait for a place they do
	// not have instead of being told at once.
	joinMu sync.Mutex
	// latest is the latest arrival time: a request that joins later is
	// given no earlier one (its clock was read before another's joined),
	// so that arrival times and numbers agree, as the fleet's queue
	// orders by the one, then the other.
	latest time.Time
	// vtime is the fair queueing's virtual time (the start tag of the
	// last request served from the queue), and finish each consumer's
	// last finish tag (fairTag).
	vtime  float64
	finish map[string]float64
}

// waiter is one request in a queue.
type waiter struct {
	priority int
	// consumer and weight are its Request's Consumer and Weight (the
	// queue's fair share; see queue.fairTag).
	consumer string
	weight   float64
	// start and end are its fair queueing tags (fairTag); served: it
	// left the queue to take capacity (queue.served).
	start, end float64
	served     bool
	arrival    uint64
	tokens     int64
	reserve    float64
	since      time.Time
	deadline   time.Time
	// late: the head found the forecast cannot serve it in time, and woke
	// it to see for itself.
	late atomic.Bool
	// taking: it is claiming capacity and about to leave. The queue's
	// places and forecasts no longer count it (its claim may already be
	// spent): a request behind it that looks meanwhile may count one unit
	// too many as free, never one too few, so it is never answered 429 for
	// a place it does not have.
	taking atomic.Bool
	// blockedUntil (Unix ns on the router's clock) is set while the head
	// sleeps because none of its own candidates is free: a request behind
	// it whose candidates are (another format, no context-length
	// exclusion, fewer tokens) need not wait for it.
	blockedUntil atomic.Int64
	// waitsFor has a bit set for each deployment (by index in the group)
	// the blocked head may take when it wakes: those behind it may go past
	// it only to the others, so that it is not starved of what it waits
	// for. All bits: it could not say (more than 64 deployments).
	waitsFor atomic.Uint64
	// wokeBehindFor is the blockedUntil for which it last woke those
	// behind it: once per instant it waits for, not at every wake-up.
	wokeBehindFor int64

	// member names it in the fleet's queue (Group.Fleet); "" when not
	// there. joined: member was just joined, and fleetAhead is its place
	// (no need to ask again at this look).
	member                  string
	joined                  bool
	inFleet                 atomic.Bool // member is set (read by the others' joins)
	fleetAhead, fleetTokens int64
	// naps counts its short looks while those ahead fleet-wide take free
	// capacity (fleetTurn).
	naps int

	mu     sync.Mutex
	slept  bool // it waited at least once (one answered 429 at once did not)
	kicked bool
	cancel context.CancelFunc // ends the current sleep
}

// before reports whether a is served before b.
func (a *waiter) before(b *waiter) bool {
	if a.priority != b.priority {
		return a.priority > b.priority
	}
	if a.start != b.start {
		return a.start < b.start
	}
	return a.arrival < b.arrival
}

// fairTag gives w its start-time fair queueing tags (Goyal et al., SFQ),
// under q.mu: its start is the later of the virtual time and its
// consumer's last finish, its end its start plus 1/weight (one request's
// cost). Backlogged consumers are so served in proportion to their
// weights, each at least its weight's share of the requests served; one
// that had nothing waiting starts at the virtual time, with no credit for
// its idle time, so that its share went to the others meanwhile. One
// consumer's requests keep their order of arrival; with a single consumer
// (all requests anonymous, or fleet mode: joinQueue) the order is
// arrival's.
func (q *queue) fairTag(w *waiter) {
	if q.finish == nil {
		q.finish = map[string]float64{}
	}
	weight := w.weight
	if !(weight > 0) {
		weight = 1
	}
	w.start = max(q.vtime, q.finish[w.consumer])
	w.end = w.start + 1/weight
	q.finish[w.consumer] = w.end
}

// served advances the virtual time to w's start (the head's when w went
// past it): w leaves the queue to take capacity.
func (q *queue) served(w *waiter) {
	q.mu.Lock()
	defer q.mu.Unlock()
	w.served = true
	at := w.start
	if len(q.waiting) > 0 && q.waiting[0] != w {
		// It went past a blocked head (bypass): the virtual time is the
		// head's, which is still to be served.
		at = min(at, q.waiting[0].start)
	}
	q.vtime = max(q.vtime, at)
	q.forget()
}

// forget drops, under q.mu, the consumers' last finishes that are behind
// the virtual time once they outnumber the waiting requests (their next
// request starts at the virtual time anyway): the map holds no more than
// the consumers waiting or served of late.
func (q *queue) forget() {
	if len(q.finish) <= 2*len(q.waiting)+16 {
		return
	}
	for c, f := range q.finish {
		if f <= q.vtime {
			delete(q.finish, c)
		}
	}
}

// first reports whether no waiting request comes before the request: w
// when it waits, else one of priority p arriving now.
func (q *queue) first(w *waiter, p int) bool {
	if q.n.Load() == 0 {
		return true
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(q.waiting) == 0 {
		return true
	}
	if w != nil {
		return q.waiting[0] == w
	}
	return q.waiting[0].priority < p
}

// headBlocked reports whether the head (not w) sleeps until after now for
// capacity of its own, and the deployments it waits for (waitsFor): w may
// take capacity of the others.
func (q *queue) headBlocked(w *waiter, now time.Time) (uint64, bool) {
	if q.n.Load() == 0 {
		return 0, false
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(q.waiting) == 0 || q.waiting[0] == w || q.waiting[0].blockedUntil.Load() <= now.UnixNano() {
		return 0, false
	}
	return q.waiting[0].waitsFor.Load(), true
}

// bypass keeps, of the ready candidates, those a request may take past a
// blocked head (not among the deployments it waits for), and returns how
// many there are.
func bypass(cands []scored, ready int, waitsFor uint64) int {
	n := 0
	for k := 0; k < ready; k++ {
		if i := cands[k].i; i >= 64 || waitsFor&(1<<uint(i)) == 0 {
			cands[n], cands[k] = cands[k], cands[n]
			n++
		}
	}
	return n
}

// join puts w in its place, unless limit requests wait already (false).
func (q *queue) join(w *waiter, limit int) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(q.waiting) >= limit {
		return false
	}
	q.arrivals++
	w.arrival = q.arrivals
	if w.since.Before(q.latest) {
		w.since = q.latest
	}
	q.latest = w.since
	q.fairTag(w)
	i, _ := slices.BinarySearchFunc(q.waiting, w, func(x, t *waiter) int {
		if x.before(t) {
			return -1
		}
		return 1
	})
	q.waiting = slices.Insert(q.waiting, i, w)
	q.n.Store(int32(len(q.waiting)))
	return true
}

// maxQueued is the group's queue bound under deadline: MaxQueued, else
// DefaultMaxQueued.
func (g *Group) maxQueued(deadline time.Duration) int {
	if g.MaxQueued > 0 {
		return g.MaxQueued
	}
	return DefaultMaxQueued(deadline, len(g.Deployments))
}

// queueFullError answers a request that would wait in g's queue while it
// holds its bound (limit): 429 at once, with Retry-After until the first
// of the candidates is back when one is cooling (the head may go then, and
// a place frees), none when capacity is free now (those before it are
// taking it: no instant is known). A rate-limited client's own retries
// (x-should-retry, which the client APIs send false) would only press on
// the full queue.
func queueFullError(g *Group, cands []scored, limit int, now time.Time) *Error {
	e := &Error{Status: http.StatusTooManyRequests, Class: provider.RateLimited,
		Message: fmt.Sprintf("the queue of model group %s is full (%d requests wait for capacity, max_queued); retry later", g.Name, limit)}
	if len(cands) > 0 {
		// A deployment only busy (Why OK: slow start, the router's own
		// pacing) says nothing of when the queue has room: no Retry-After.
		if first := earliest(cands).f; first.At.After(now) && first.Why != provider.OK {
			e.RetryAfter = retryAfterSeconds(first.At.Sub(now))
		}
	}
	return e
}

// leave takes w out of the queue; the next head, if w was the head, is
// woken to look for capacity.
func (q *queue) leave(w *waiter) {
	q.mu.Lock()
	i := slices.Index(q.waiting, w)
	if i < 0 {
		q.mu.Unlock()
		return
	}
	q.waiting = slices.Delete(q.waiting, i, i+1)
	q.n.Store(int32(len(q.waiting)))
	head := i == 0
	if !w.served {
		head = q.unspend(w) || head
		q.forget()
	}
	var next *waiter
	if head && len(q.waiting) > 0 {
		next = q.waiting[0]
	}
	q.mu.Unlock()
	if next != nil {
		next.kick()
	}
}

// unspend gives back the turn of w, which left the queue unserved (a 429,
// its deadline, its client gone), under q.mu: its consumer's requests
// after it move up one turn (1/weight of virtual time), and so does its
// last finish, so that a consumer whose requests are refused keeps its
// share. It reports whether the order changed.
func (q *queue) unspend(w *waiter) bool {
	d := w.end - w.start
	if d <= 0 {
		return false
	}
	if f, ok := q.finish[w.consumer]; ok && f >= w.end {
		q.finish[w.consumer] = f - d
	}
	moved := false
	for _, x := range q.waiting {
		if x.consumer == w.consumer && x.start > w.start {
			x.start, x.end, moved = x.start-d, x.end-d, true
		}
	}
	if moved {
		slices.SortStableFunc(q.waiting, func(a, b *waiter) int {
			if a.before(b) {
				return -1
			}
			return 1
		})
	}
	return moved
}

// kickHead wakes the head: capacity may have come back (an attempt ended).
func (q *queue) kickHead() {
	if q.n.Load() == 0 {
		return
	}
	q.mu.Lock()
	var head *waiter
	if len(q.waiting) > 0 {
		head = q.waiting[0]
	}
	q.mu.Unlock()
	if head != nil {
		head.kick()
	}
}

// kickAllBut wakes every waiting request but w (nil: all), to look again:
// a deployment's capacity just became known, or the head (w) blocked for
// capacity of its own.
func (q *queue) kickAllBut(w *waiter) {
	if q.n.Load() == 0 {
		return
	}
	q.mu.Lock()
	all := slices.Clone(q.waiting)
	q.mu.Unlock()
	for _, x := range all {
		if x != w {
			x.kick()
		}
	}
}

// place returns how many requests wait before w, and their tokens.
func (q *queue) place(w *waiter) (ahead int64, tokens int64) {
	return q.count(w, false)
}

// count counts the requests before w that are not taking capacity (place),
// or, outsideFleet, only those of them not in the fleet's queue.
func (q *queue) count(w *waiter, outsideFleet bool) (ahead int64, tokens int64) {
	q.mu.Lock()
	defer q.mu.Unlock()
	for _, x := range q.waiting {
		if x == w {
			break
		}
		if x.taking.Load() || outsideFleet && x.inFleet.Load() {
			continue
		}
		ahead++
		tokens += x.tokens
	}
	return ahead, tokens
}

// kick ends w's sleep, or the next one if it is not asleep.
func (w *waiter) kick() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.kicked = true
	if w.cancel != nil {
		w.cancel()
	}
}

// sleep waits d on clock c, or until kicked; it returns ErrClientGone when
// ctx ended.
func (w *waiter) sleep(ctx context.Context, c Clock, d time.Duration) error {
	w.mu.Lock()
	if w.kicked {
		w.kicked = false
		w.mu.Unlock()
		return nil
	}
	sctx, cancel := context.WithCancel(ctx)
	w.cancel, w.slept = cancel, true
	w.mu.Unlock()
	_ = c.Sleep(sctx, d)
	w.mu.Lock()
	w.cancel, w.kicked = nil, false
	w.mu.Unlock()
	cancel()
	if ctx.Err() != nil {
		return ErrClientGone
	}
	return nil
}

// wait holds a request that may not take capacity now (none is free, or
// others wait before it) until it may look again: the head sleeps until the
// first deployment comes back (no less than the backoff after a failure),
// the others until they are woken or the deadline passes. A request that
// cannot be served before its deadline, by what the known windows forecast
// for its place in the queue, is answered at once (unservable).
func (r *Router) wait(ctx context.Context, g *Group, me *waiter, cands []scored, ready int, w *walk, need capacity.Need, now, deadline time.Time) error {
	c := earliest(cands)
	if ready == 0 && !c.f.At.Before(deadline) {
		return r.notBackInTime(g, cands, c, c.f.At.Sub(now), me, now, deadline)
	}
	// The windows are read before the place: a request ahead that claims
	// capacity meanwhile is marked taking before it spends, so that it is
	// counted at most once (in the windows or in the place), never twice.
	fleet := g.Fleet != nil
	s := supplyOf(g.Deployments, cands, need.Reserve, now, deadline, fleet)
	ahead, tokensAhead := g.queue.place(me) // here: it is the head when none is ahead
	fleetAhead, fleetTokens := ahead, tokensAhead
	if fleet {
		if n, tok, ok := r.fleetPlace(g, me, s.tokensBound, now, deadline); ok {
			// Its place in the fleet, against the fleet's windows.
			fleetAhead, fleetTokens = n, tok
		} else {
			fleet = false
			s = supplyOf(g.Deployments, cands, need.Reserve, now, deadline, false)
		}
	}
	if enough, known := s.serves(fleetAhead+1, fleetTokens+me.tokens); known && !enough {
		r.debug("the request's place cannot be served before its deadline", zap.String("group", g.Name),
			zap.Int64("ahead", fleetAhead), zap.Int64("requests_forecast", s.requests), zap.Int64("tokens_forecast", s.tokens),
			zap.Duration("waited", now.Sub(me.since)), zap.Duration("left", deadline.Sub(now)))
		return r.unservable(g.Deployments, cands, fleetAhead+1, fleetTokens+me.tokens, need.Reserve, now, deadline, fleet)
	}
	me.late.Store(false)
	if ahead == 0 {
		r.pruneTail(g, cands, now)
	}
	if ahead > 0 || ready > 0 {
		if waitsFor, blocked := g.queue.headBlocked(me, now); ready > 0 && blocked && bypass(cands, ready, waitsFor) > 0 {
			return nil // the head blocked meanwhile: this one may go now
		}
		return me.sleep(ctx, r.Clock, deadline.Sub(now))
	}
	wait := c.f.At.Sub(now)
	if w.failures > 0 && (w.per[c.i].failed || w.per[c.i].silent) {
		// A retry of a deployment that failed this request: the request's
		// own backoff too (not for one it never tried).
		wait = max(wait, r.Policy.Backoff(w.failures))
	}
	if !now.Add(wait).Before(deadline) {
		return r.notBackInTime(g, cands, c, wait, me, now, deadline)
	}
	r.debug("waiting for a cooling deployment",
		zap.String("deployment", g.Deployments[c.i].Name), zap.Duration("wait", wait))
	until := now.Add(wait).UnixNano()
	var waitsFor uint64
	for _, c := range cands {
		if c.i >= 64 {
			waitsFor = ^uint64(0)
			break
		}
		waitsFor |= 1 << uint(c.i)
	}
	me.waitsFor.Store(waitsFor)
	me.blockedUntil.Store(until)
	defer me.blockedUntil.Store(0)
	if me.wokeBehindFor != until {
		me.wokeBehindFor = until
		g.queue.kickAllBut(me) // those behind may have capacity the head cannot use
	}
	return me.sleep(ctx, r.Clock, wait)
}

// fleetPlace returns how many requests wait before me in the fleet's queue
// (g.Fleet), joining it first when me is not there (its first look, or its
// member was refused or lost); ok false when the store cannot tell.
func (r *Router) fleetPlace(g *Group, me *waiter, withTokens bool, now, deadline time.Time) (ahead, tokensAhead int64, ok bool) {
	if me.member == "" {
		g.queue.joinMu.Lock()
		m, n, tok, err := g.Fleet.Join(me.priority, MaxPriority, me.since, me.arrival, deadline.Sub(now), me.tokens, withTokens)
		if err != nil {
			g.queue.joinMu.Unlock()
			return 0, 0, false
		}
		me.inFleet.Store(true)
		// Those before it here that are not in the fleet's queue yet.
		out, outTokens := g.queue.count(me, true)
		g.queue.joinMu.Unlock()
		me.member, me.joined, me.fleetAhead, me.fleetTokens = m, true, n+out, tok+outTokens
	}
	if me.joined {
		me.joined = false
		return me.fleetAhead, me.fleetTokens, true
	}
	n, tok, err := g.Fleet.Ahead(me.member, withTokens)
	if err != nil {
		leaveFleet(g, me) // it joins again at its next look
		return 0, 0, false
	}
	return n, tok, true
}

// fleetNap is how long a waiting request whose turn in the fleet has not
// come, while capacity is free, waits before it looks again, FleetNaps
// times at most per window (Router.FleetNaps: those ahead of it are taking that capacity);
// then it sleeps until the forecast serves its place.
const (
	fleetNap         = 20 * time.Millisecond
	DefaultFleetNaps = 5
)

// fleetTurn decides whether me, a waiting request whose place is counted
// fleet-wide, may take the capacity free now: only when fewer requests wait
// before it, fleet-wide, than the free windows let start now, so that a
// higher priority, or an earlier arrival, on another instance is served
// first. When it may not, it sleeps until the forecast serves its place,
// and gets its 429 at once when that is past its deadline. ok is true when
// it may go now (or the store cannot tell: it goes on local order).
func (r *Router) fleetTurn(ctx context.Context, g *Group, me *waiter, free []scored, need capacity.Need, now, deadline time.Time) (ok bool, err error) {
	s := supplyOf(g.Deployments, free, need.Reserve, now, now, true)
	if !s.requestsBound && !s.tokensBound {
		return true, nil // nothing known bounds what may start now
	}
	n, tok, placed := r.fleetPlace(g, me, s.tokensBound, now, deadline)
	if !placed {
		return true, nil
	}
	if enough, _ := s.serves(n+1, tok+me.tokens); enough {
		me.naps = 0
		return true, nil
	}
	if s.requests > 0 && me.naps < r.FleetNaps {
		// Capacity is free now, but those ahead of it may be taking it
		// (they hold their places until they spent): look again shortly.
		me.naps++
		return false, me.sleep(ctx, r.Clock, fleetNap)
	}
	me.naps = 0
	at := r.servableAt(g.Deployments, free, n+1, tok+me.tokens, need.Reserve, now, now, true)
	if !at.Before(deadline) {
		r.debug("the request's place in the fleet cannot be served before its deadline", zap.String("group", g.Name),
			zap.Int64("ahead", n), zap.Duration("left", deadline.Sub(now)))
		return false, r.unservable(g.Deployments, free, n+1, tok+me.tokens, need.Reserve, now, deadline, true)
	}
	return false, me.sleep(ctx, r.Clock, at.Sub(now))
}

// leaveFleet takes me out of the fleet's queue, if it is there.
func leaveFleet(g *Group, me *waiter) {
	if me.member != "" {
		g.Fleet.Leave(me.member)
		me.member, me.joined = "", false
		me.inFleet.Store(false)
	}
}

// notBackInTime is the answer to a request none of whose deployments is
// back before its deadline (first, the earliest, in back): coolingError,
// logged at debug level.
func (r *Router) notBackInTime(g *Group, cands []scored, first scored, back time.Duration, me *waiter, now, deadline time.Time) error {
	r.debug("no deployment is back before the request's deadline", zap.String("group", g.Name),
		zap.String("first", g.Deployments[first.i].Name), zap.Duration("back_in", back),
		zap.Duration("waited", now.Sub(me.since)), zap.Duration("left", deadline.Sub(now)))
	return coolingError(cands, first, now)
}

// pruneTail wakes, from the back of the queue, the waiting requests the
// forecast can no longer serve before their deadlines (another instance of
// a fleet took its share, a window was smaller than stated), so that they
// get their 429 now rather than at their deadline. The head calls it each
// time it looks; it stops at the first request that can still be served.
func (r *Router) pruneTail(g *Group, cands []scored, now time.Time) {
	q := &g.queue
	if q.n.Load() < 2 {
		return
	}
	q.mu.Lock()
	waiting := slices.DeleteFunc(slices.Clone(q.waiting), func(x *waiter) bool { return x.taking.Load() })
	q.mu.Unlock()
	tokens := make([]int64, len(waiting)+1) // tokens[i]: of those before i
	for i, w := range waiting {
		tokens[i+1] = tokens[i] + w.tokens
	}
	for i := len(waiting) - 1; i > 0; i-- {
		w := waiting[i]
		if w.late.Load() {
			continue
		}
		if !r.forecastLate(g.Deployments, cands, int64(i+1), tokens[i+1], w.reserve, now, w.deadline) {
			return
		}
		w.late.Store(true)
		w.kick()
	}
}

// supply is what the candidates' known windows let start from now until
// a given instant (see supplyOf).
type supply struct {
	requests, tokens           int64
	requestsBound, tokensBound bool // false: nothing known bounds the count
}

// supplyOf sums what the candidates' known windows let start from now
// until until, less each one's latency (so that an attempt started then
// still answers in time), leaving reserve unspent: this instance's share
// of them, or the fleet's whole windows (fleet: for a place counted
// fleet-wide).
func supplyOf(group []*Deployment, cands []scored, reserve float64, now, until time.Time, fleet bool) supply {
	s := supply{requestsBound: true, tokensBound: true}
	for _, c := range cands {
		end := until.Add(-seconds(c.f.Latency))
		forecast := group[c.i].State.Forecast
		if fleet {
			forecast = group[c.i].State.ForecastFleet
		}
		fr, ft := forecast(now, end, reserve)
		if fr < 0 {
			s.requestsBound = false
		}
		if ft < 0 {
			s.tokensBound = false
		}
		s.requests += max(fr, 0)
		s.tokens += max(ft, 0)
	}
	return s
}

// serves reports whether n requests of tokens tokens in all fit (enough),
// and whether the windows bound it at all (known: a deployment with
// nothing known may take any number).
func (s supply) serves(n, tokens int64) (enough, known bool) {
	if !s.requestsBound && !s.tokensBound {
		return true, false
	}
	return (!s.requestsBound || s.requests >= n) && (!s.tokensBound || s.tokens >= tokens), true
}

// forecast reports whether the candidates' known windows (the fleet's
// whole windows, fleet) let n requests of tokens tokens start from now
// until until (enough), and whether they bound it at all (known).
func forecast(group []*Deployment, cands []scored, n, tokens int64, reserve float64, now, until time.Time, fleet bool) (enough, known bool) {
	return supplyOf(group, cands, reserve, now, until, fleet).serves(n, tokens)
}

// forecastLate reports whether the known windows cannot serve n requests
// of tokens tokens before the deadline.
func (r *Router) forecastLate(group []*Deployment, cands []scored, n, tokens int64, reserve float64, now, deadline time.Time) bool {
	enough, known := forecast(group, cands, n, tokens, reserve, now, deadline, false)
	return known && !enough
}

// unservable is the answer to a request whose place in the queue cannot be
// served before its deadline: 429, with Retry-After until the forecast
// says it could be (502 when deployments are out for failures, as
// coolingError).
func (r *Router) unservable(group []*Deployment, cands []scored, n, tokens int64, reserve float64, now, deadline time.Time, fleet bool) error {
	hi := r.servableAt(group, cands, n, tokens, reserve, now, deadline, fleet)
	for _, c := range cands {
		if c.f.At.After(now) && c.f.Why != provider.RateLimited && c.f.Why != provider.QuotaExhausted {
			return failingError(cands, retryAfterSeconds(hi.Sub(now)))
		}
	}
	e := rateLimitedError(hi.Sub(now))
	e.Message = fmt.Sprintf("the deployments of this model cannot serve this request before its deadline (%d waiting before it); retry after the given time", n-1)
	if n == 1 {
		e.Message = "the deployments of this model cannot serve this request before its deadline; retry after the given time"
	}
	return e
}

// servableAt returns the earliest instant the candidates' windows forecast
// n requests of tokens tokens started (the fleet's whole windows, fleet),
// after from (an instant known not to suffice) and no earlier than the
// first deployment is back: doubling, then halving the step to within
// 10 ms; provider.MaxCooldown from now at most.
func (r *Router) servableAt(group []*Deployment, cands []scored, n, tokens int64, reserve float64, now, from time.Time, fleet bool) time.Time {
	lo := from
	if at := earliest(cands).f.At; at.After(lo) {
		lo = at
	}
	hi := lo
	for step := max(lo.Sub(now), time.Second); ; step *= 2 {
		if enough, _ := forecast(group, cands, n, tokens, reserve, now, hi, fleet); enough {
			break
		}
		if hi.Sub(now) >= provider.MaxCooldown {
			return hi // not even then
		}
		lo, hi = hi, now.Add(min(step, provider.MaxCooldown))
	}
	for hi.Sub(lo) > 10*time.Millisecond {
		mid := lo.Add(hi.Sub(lo) / 2)
		if enough, _ := forecast(group, cands, n, tokens, reserve, now, mid, fleet); enough {
			hi = mid
		} else {
			lo = mid
		}
	}
	return hi
}

// queueError answers a request that waited in the queue until its
// deadline: 429 when every deployment is rate-limited or out of quota (502
// when some are out for failures), with Retry-After until the first comes
// back; 504 when one has capacity or is only busy (the requests before it
// took the time).
func queueError(cands []scored, now time.Time) error {
	if len(cands) == 0 {
		return deadlineError()
	}
	c := earliest(cands)
	if !c.f.At.After(now) {
		return deadlineError()
	}
	return coolingError(cands, c, now)
}
