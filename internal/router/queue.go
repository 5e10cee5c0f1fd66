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
	// router's deadline and the group's deployments, which takes past it
	// every place the known windows serve before its deadline (joinQueue).
	MaxQueued int
	queue     queue
	// observeMu orders the queue-length reports (observeQueue): two that
	// read the length in one order and reported it in the other left the
	// gauge at a length the queue no longer had (1 for an empty queue).
	observeMu sync.Mutex
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
// request holds its body (up to max_body) and its connection. Past it, a
// place the known windows serve in time still waits (joinQueue): the
// forecast bounds that queue.
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
	// JoinAll adds requests waiting here (FleetJoin: each one's
	// arguments) in one step, and answers each one in place: its member,
	// and its place counting every other request there, the others of
	// joins included. A Redis round trip for the lot, not one per request
	// (joinFleet). A request of a consumer (Weight more than 0: consumers
	// are configured) is placed among its priority by its consumer's fair
	// share fleet-wide (weighted fair queueing, as this instance's queue:
	// fairTag), not by arrival.
	JoinAll(joins []FleetJoin)
	// Ahead returns how many requests wait before member, fleet-wide, and
	// (withTokens) their tokens; an error when the store cannot tell or no
	// longer holds member (the request joins again at its next look).
	Ahead(member string, withTokens bool) (ahead, tokensAhead int64, err error)
	// Leave takes member out: it is served (its turn taken), or it joins
	// again at its next look.
	Leave(member string)
	// LeaveUnserved takes member out of a request that leaves unserved
	// (a 429, its deadline, its client gone, its fallback group): a
	// consumer's turn in the fair order is given back, as this instance's
	// queue gives it back (unspend).
	LeaveUnserved(member string)
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
	// joinMu guards joining and joinBusy: the requests that wait to join
	// the fleet's queue (Group.Fleet) together, and whether a join is in
	// flight (joinFleet).
	joinMu   sync.Mutex
	joining  []*fleetJoining
	joinBusy bool
	// latest is the latest arrival time: a request that joins later is
	// given no earlier one (its clock was read before another's joined),
	// so that arrival times and numbers agree, as the fleet's queue
	// orders by the one, then the other.
	latest time.Time
	// vtime is the fair queueing's virtual time of each priority (the
	// start tag of the last request of that priority served from the
	// queue), and finish each consumer's last finish tag at a priority
	// (fairTag): each priority shares by weight among its own consumers,
	// so that a higher priority's turns do not move a lower one's clock.
	vtime  [MaxPriority + 1]float64
	finish map[fairKey]float64
	// sends is when each consumer's requests of a priority joined
	// (fairDemand's forecast of those to come), kept as long as finish.
	sends map[fairKey]*sending
}

// vslot is priority p's virtual time's index (a priority out of range
// shares its nearest bound's).
func vslot(p int) int { return min(max(p, MinPriority), MaxPriority) }

// fairKey names a consumer's requests of one priority in the fair share.
type fairKey struct {
	priority int
	consumer string
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
	// counts: it is a count of tokens (Request.CountTokens), which waits
	// for its deployments' CountState where they have one; apart: each
	// of its group's deployments that counts has one, so that it and the
	// other requests wait for capacity they do not share (separate).
	counts, apart bool
	reserve       float64
	since         time.Time
	deadline      time.Time
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
	// refused: it left the fleet's queue served to claim capacity and the
	// claim was refused (take): its next join gives its consumer's turn
	// back first (FleetJoin.GiveBack).
	refused bool
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
// (all requests anonymous) the order is arrival's. In fleet mode the
// fleet's queue tags them the same way, fleet-wide (FleetQueue.JoinAs).
func (q *queue) fairTag(w *waiter) {
	if q.finish == nil {
		q.finish = map[fairKey]float64{}
	}
	k := fairKey{w.priority, w.consumer}
	w.start = max(q.vtime[vslot(w.priority)], q.finish[k])
	w.end = w.start + 1/weightOf(w.weight)
	q.finish[k] = w.end
}

// served advances the virtual time of w's priority to w's start (the
// head's of that priority when w went past it): w leaves the queue to
// take capacity.
func (q *queue) served(w *waiter) {
	q.mu.Lock()
	defer q.mu.Unlock()
	w.served = true
	at := w.start
	if i := slices.IndexFunc(q.waiting, func(x *waiter) bool { return x.priority == w.priority }); i >= 0 && q.waiting[i] != w {
		// It went past a blocked head (bypass): the virtual time is the
		// head's, which is still to be served.
		at = min(at, q.waiting[i].start)
	}
	q.vtime[vslot(w.priority)] = max(q.vtime[vslot(w.priority)], at)
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
	for k, f := range q.finish {
		if f <= q.vtime[vslot(k.priority)] {
			delete(q.finish, k)
		}
	}
	for k := range q.sends {
		if _, ok := q.finish[k]; !ok {
			delete(q.sends, k)
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
// capacity of its own, and the deployments of group it waits for
// (waitsFor) as a request behind it, a count of tokens or not (counts),
// sees them: w may take capacity of the others, and of those whose
// capacity it does not share with the head (a count of tokens and another
// request, on a deployment whose counts have their own CountState).
func (q *queue) headBlocked(w *waiter, counts bool, group []*Deployment, now time.Time) (uint64, bool) {
	if q.n.Load() == 0 {
		return 0, false
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(q.waiting) == 0 || q.waiting[0] == w || q.waiting[0].blockedUntil.Load() <= now.UnixNano() {
		return 0, false
	}
	head := q.waiting[0]
	waitsFor := head.waitsFor.Load()
	if head.counts != counts {
		for i, d := range group[:min(len(group), 64)] {
			if d.CountState != nil {
				waitsFor &^= 1 << uint(i)
			}
		}
	}
	return waitsFor, true
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
	q.arrived(w)
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
	k := fairKey{w.priority, w.consumer}
	if f, ok := q.finish[k]; ok && f >= w.end {
		q.finish[k] = f - d
	}
	moved := false
	for _, x := range q.waiting {
		if x.consumer == w.consumer && x.priority == w.priority && x.start > w.start {
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
	return q.count(w, nil)
}

// placeOf is req's place in g's queue (place): me's when it waits; when
// it has not joined (me nil), every waiting request it would join behind.
// Either way those that wait for capacity req does not share (separate: a
// count of tokens waiting for its own limit, for a Messages request) are
// no demand on it.
func (g *Group) placeOf(me *waiter, req *Request) (ahead int64, tokens int64) {
	if me == nil {
		me = &waiter{counts: req.CountTokens, apart: req.CountTokens && countsApart(g.Deployments)} // not in the queue: all before it
	}
	return g.queue.place(me)
}

// count counts the requests before w that are not taking capacity (place),
// or, with outside (not nil), only those of them in it (outsideFleet).
func (q *queue) count(w *waiter, outside map[*waiter]bool) (ahead int64, tokens int64) {
	q.mu.Lock()
	defer q.mu.Unlock()
	for _, x := range q.waiting {
		if x == w {
			break
		}
		if x.taking.Load() || outside != nil && !outside[x] || w != nil && separate(x, w) {
			continue
		}
		ahead++
		tokens += x.tokens
	}
	return ahead, tokens
}

// outsideFleet is the set of the waiting requests not in the fleet's
// queue, those joining in batch excepted (the fleet's answer counts them).
func (q *queue) outsideFleet(batch []*fleetJoining) map[*waiter]bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	out := make(map[*waiter]bool, len(q.waiting))
	for _, x := range q.waiting {
		if !x.inFleet.Load() {
			out[x] = true
		}
	}
	for _, j := range batch {
		delete(out, j.w)
	}
	return out
}

// separate reports whether waiters x and w wait for capacity they do not
// share: one is a count of tokens apart (waiter.apart), the other not. One
// is then no demand on what the other waits for, in its place or its
// forecast.
func separate(x, w *waiter) bool { return x.counts != w.counts && (x.apart || w.apart) }

// fairDemand returns how many requests, and their tokens, the queue is
// to serve up to and including w when the consumers waiting at w's
// priority each take their weight's share (fairTag): those of a higher
// priority before it, then w's consumer's own up to w (j of them), and
// for each other consumer waiting at its priority j times its weight over
// w's, the requests to come that the fair order puts before w, not only
// those already before it; but a consumer that no longer sends (its last
// arrival longer ago than twice its usual interval: keepsSending) has no
// more to come than what it has waiting, a backlog that drains. With one
// consumer waiting it is w's place plus one. Those taking capacity are
// not counted; ahead and aheadTokens are w's place (place), read at the
// same instant, now.
func (q *queue) fairDemand(w *waiter, now time.Time) (ahead, aheadTokens, n, tokens int64) {
	q.mu.Lock()
	defer q.mu.Unlock()
	var hi, hiTokens, own, ownTokens int64
	others := map[string]*backlog{}
	mine := false
	for _, x := range q.waiting {
		if x.taking.Load() && x != w || separate(x, w) {
			continue
		}
		switch {
		case x.priority > w.priority && !mine:
			hi++
			hiTokens += x.tokens
		case x.priority != w.priority:
		case x.consumer == w.consumer:
			if !mine {
				own++
				ownTokens += x.tokens
			}
		default:
			b := others[x.consumer]
			if b == nil {
				b = &backlog{}
				others[x.consumer] = b
			}
			b.weight = weightOf(x.weight)
			b.n++
			b.tokens += x.tokens
		}
		if mine = mine || x == w; !mine {
			ahead++
			aheadTokens += x.tokens
		}
	}
	nf, tf := float64(own), float64(ownTokens)
	for who, b := range others {
		scale := b.weight / weightOf(w.weight)
		rn, rt := float64(own)*scale, float64(ownTokens)*scale
		if !q.keepsSending(fairKey{w.priority, who}, now) {
			rn, rt = min(rn, float64(b.n)), min(rt, float64(b.tokens))
		}
		nf, tf = nf+rn, tf+rt
	}
	return ahead, aheadTokens, hi + int64(math.Ceil(nf-1e-9)), hiTokens + int64(math.Ceil(tf-1e-9))
}

// backlog is what one consumer has waiting at a priority (fairDemand):
// its weight, its requests and their tokens.
type backlog struct {
	weight    float64
	n, tokens int64
}

// sending is when a consumer's requests of a priority joined the queue:
// the last one, and a moving average of the intervals between them
// (sendingWeight), over n arrivals.
type sending struct {
	last  time.Time
	every time.Duration
	n     int
}

// sendingWeight is a new interval's weight in sending.every.
const sendingWeight = 0.25

// arrived counts w's arrival in its consumer's sending, under q.mu.
func (q *queue) arrived(w *waiter) {
	if q.sends == nil {
		q.sends = map[fairKey]*sending{}
	}
	k := fairKey{w.priority, w.consumer}
	s := q.sends[k]
	if s == nil {
		s = &sending{}
		q.sends[k] = s
	}
	switch gap := w.since.Sub(s.last); s.n {
	case 0:
	case 1:
		s.every = gap
	default:
		s.every += time.Duration(sendingWeight * float64(gap-s.every))
	}
	s.last = w.since
	s.n++
}

// keepsSending reports whether consumer k still sends at now, under q.mu:
// its last arrival no longer ago than twice its usual interval, or too
// few arrivals known to tell (then it is taken to keep sending, the
// cautious side: its requests to come would push others past their
// deadlines, and these are told at once).
func (q *queue) keepsSending(k fairKey, now time.Time) bool {
	s := q.sends[k]
	return s == nil || s.n < 2 || now.Sub(s.last) <= 2*s.every
}

// weightOf is a waiter's weight in the fair share: 1 when unset.
func weightOf(weight float64) float64 {
	if !(weight > 0) {
		return 1
	}
	return weight
}

// waited reports whether w slept in the queue at least once.
func (w *waiter) waited() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.slept
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
	// Its place, and its consumer's share: what the other waiting
	// consumers' weights take before it, those to come included
	// (fairDemand), so that a request its share cannot serve in time is
	// told now, not after its wait.
	ahead, tokensAhead, n, tok := g.queue.fairDemand(me, now) // here: it is the head when none is ahead
	fleetAhead, fleetTokens := ahead, tokensAhead
	if fleet && !s.past(ahead+1, tokensAhead+me.tokens) {
		// A place this instance's queue alone puts past the fleet's
		// windows is told without asking the fleet's queue.
		if n, tok, ok := r.fleetPlace(g, me, s.tokensBound, now, deadline); ok {
			// Its place in the fleet, against the fleet's windows.
			fleetAhead, fleetTokens = n, tok
		} else {
			fleet = false
			s = supplyOf(g.Deployments, cands, need.Reserve, now, deadline, false)
		}
	}
	if me.waited() {
		// Once placed, its place decides: a consumer that sends now and
		// then (below its share) must not push what already waits out.
		n, tok = 0, 0
	}
	n, tok = max(n, fleetAhead+1), max(tok, fleetTokens+me.tokens)
	if s.past(n, tok) {
		r.debug("the request's place cannot be served before its deadline", zap.String("group", g.Name),
			zap.Int64("ahead", fleetAhead), zap.Int64("fair_demand", n), zap.Int64("requests_forecast", s.requests), zap.Int64("tokens_forecast", s.tokens),
			zap.Duration("waited", now.Sub(me.since)), zap.Duration("left", deadline.Sub(now)))
		if ahead == 0 {
			r.pruneTail(g, me, cands, now, fleetAhead, fleetTokens, fleet) // those behind it are further back still
		}
		return r.unservable(g.Deployments, cands, n, tok, need.Reserve, now, deadline, fleet)
	}
	me.late.Store(false)
	if ahead == 0 {
		r.pruneTail(g, me, cands, now, fleetAhead, fleetTokens, fleet)
	}
	if ahead > 0 || ready > 0 {
		if waitsFor, blocked := g.queue.headBlocked(me, me.counts, g.Deployments, now); ready > 0 && blocked && bypass(cands, ready, waitsFor) > 0 {
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
	if fleet {
		// Its place again shortly, and those behind it pruned from it.
		wait = min(wait, fleetLook)
	}
	return me.sleep(ctx, r.Clock, wait)
}

// fleetLook is how often the head of a queue whose places are counted
// fleet-wide looks at its place again while it waits: another
// instance's requests that join before them (an earlier arrival, a higher
// priority) push them back, past what the windows serve before their
// deadlines, and they learn it from the head's look (pruneTail), not at the
// next window.
const fleetLook = 20 * time.Millisecond

// fleetPlace returns how many requests wait before me in the fleet's queue
// (g.Fleet), joining it first when me is not there (its first look, or its
// member was refused or lost); ok false when the store cannot tell.
func (r *Router) fleetPlace(g *Group, me *waiter, withTokens bool, now, deadline time.Time) (ahead, tokensAhead int64, ok bool) {
	if me.member == "" {
		j := g.joinFleet(me, withTokens, deadline.Sub(now))
		if j.Err != nil {
			return 0, 0, false
		}
		me.member, me.joined, me.fleetAhead, me.fleetTokens = j.Member, true, j.Ahead, j.TokensAhead
		me.refused = false // its turn given back with the join
	}
	if me.joined {
		me.joined = false
		return me.fleetAhead, me.fleetTokens, true
	}
	n, tok, err := g.Fleet.Ahead(me.member, withTokens)
	if err != nil {
		leaveFleet(g, me, false) // it joins again at its next look
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

// leaveFleet takes me out of the fleet's queue, if it is there; unserved:
// it leaves without its turn (FleetQueue.LeaveUnserved).
func leaveFleet(g *Group, me *waiter, unserved bool) {
	if me.member != "" {
		if unserved {
			g.Fleet.LeaveUnserved(me.member)
		} else {
			g.Fleet.Leave(me.member)
		}
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
// a fleet took its share, or its requests joined before them; a window was
// smaller than stated), so that they get their 429 now rather than at
// their deadline. The head calls it each time it looks, with its own place:
// ahead requests of tokensAhead tokens before it, fleet-wide and against
// the fleet's whole windows when fleet (those behind it are at least that
// far back, and those between them further); it stops at the first request
// that can still be served. Those that wait for capacity the head does
// not share (separate) are neither counted nor woken.
func (r *Router) pruneTail(g *Group, head *waiter, cands []scored, now time.Time, ahead, tokensAhead int64, fleet bool) {
	q := &g.queue
	if q.n.Load() < 2 {
		return
	}
	q.mu.Lock()
	waiting := slices.DeleteFunc(slices.Clone(q.waiting), func(x *waiter) bool { return x.taking.Load() || separate(x, head) })
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
		if !forecastLate(g.Deployments, cands, ahead+int64(i+1), tokensAhead+tokens[i+1], w.reserve, now, w.deadline, fleet) {
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
// fleet-wide). A count of tokens's candidates are forecast from their
// CountState where they have one (scored.counts), as they claim it.
func supplyOf(group []*Deployment, cands []scored, reserve float64, now, until time.Time, fleet bool) supply {
	s := supply{requestsBound: true, tokensBound: true}
	for _, c := range cands {
		end := until.Add(-seconds(c.f.Latency))
		st := group[c.i].State
		if c.counts {
			st = group[c.i].CountState
		}
		forecast := st.Forecast
		if fleet {
			forecast = st.ForecastFleet
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

// past reports whether the windows bound the supply and n requests of
// tokens tokens do not fit it.
func (s supply) past(n, tokens int64) bool {
	enough, known := s.serves(n, tokens)
	return known && !enough
}

// forecast reports whether the candidates' known windows (the fleet's
// whole windows, fleet) let n requests of tokens tokens start from now
// until until (enough), and whether they bound it at all (known).
func forecast(group []*Deployment, cands []scored, n, tokens int64, reserve float64, now, until time.Time, fleet bool) (enough, known bool) {
	return supplyOf(group, cands, reserve, now, until, fleet).serves(n, tokens)
}

// forecastLate reports whether the known windows (the fleet's whole
// windows, fleet) cannot serve n requests of tokens tokens before the
// deadline.
func forecastLate(group []*Deployment, cands []scored, n, tokens int64, reserve float64, now, deadline time.Time, fleet bool) bool {
	return supplyOf(group, cands, reserve, now, deadline, fleet).past(n, tokens)
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
