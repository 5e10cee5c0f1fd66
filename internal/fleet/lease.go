package fleet

import (
	"context"
	"math"
	"sync"
	"time"

	"github.com/llmrouter/caddy-llm-router/internal/capacity"
)

// Leased budgets. A deployment's stated windows (requests r, tokens t) are
// one budget for the fleet (the budget hash, see leaseScript), but an
// instance does not ask Redis for each attempt: it leases a slice of each
// window and spends it locally (Spend answers from memory). The script
// takes a slice from the window's remainder when it grants it, so that
// the slices the instances hold never add up to more than the window holds:
// the fleet never overspends a window, whichever instance spends. Each
// slice is sized from the instance's recent demand (an exponentially
// weighted rate, capacity.DemandTau) for leaseHorizon, and no larger than an equal
// share of the remainder among the instances active in it; the instance
// asks for the next one in the background once its slice holds less than
// leaseLowWater of its demand, and gives back what it will not spend before
// the window ends (its demand until then), so that the rest of the fleet
// can spend the whole window. A request waits on Redis (within Timeout)
// only when the slice it needs is spent: at the first attempt of a window,
// or when demand rose faster than the slice.
//
// While Redis cannot answer, an instance spends the slice it holds and no
// more (Spend refuses until the slice's window ends); only an instance that
// holds none falls back to local state.

// Lease sizing, see above.
const (
	leaseHorizon  = 3 * time.Second
	leaseLowWater = 750 * time.Millisecond
	// leaseTick is how often the store looks at the slices (in memory)
	// for one to renew or give back.
	leaseTick = 50 * time.Millisecond
	// leaseEntryTTL is how long an instance's statement of the slices it
	// holds counts in the budget hash (each grant call renews it): an
	// attempt another instance's slice would hold is told to try again
	// in leaseSliceRetry, not to wait for the window, while it counts.
	leaseEntryTTL   = 2 * leaseHorizon
	leaseSliceRetry = time.Second
)

// A slice is stated with what the instance may spend of it before it
// states it again (its allowance: its demand over leaseHorizon, what its
// next renewal is sized for); the rest is parked. An instance spends no
// more than its allowance until a later call states its slices again, and
// nothing of them once its last such call is leaseEntryTTL old (measured
// from when it was sent: the entry, renewed when the script ran, outlives
// it on any clock): the script may then give what the stale entry parked
// back to the window it was granted in, whether the instance died or only
// lost Redis. What it may have spent of its allowance is not given back:
// a slice being spent goes back no sooner than its window.

// forfeited reports whether the slices are forfeited at now (the last call
// that stated them leaseEntryTTL old or more); under l.mu.
func (l *leaser) forfeited(now time.Time) bool {
	return !l.stated.IsZero() && !now.Before(l.stated.Add(leaseEntryTTL))
}

// holding is what window i's slice holds at now (0 forfeited); under l.mu.
func (l *leaser) holding(now time.Time, i int) int64 {
	if l.forfeited(now) {
		return 0
	}
	return l.w[i].left(now)
}

// spendable is what may be spent of window i's slice at now: what it
// holds, within the allowance; under l.mu.
func (l *leaser) spendable(now time.Time, i int) int64 {
	return min(l.holding(now, i), max(l.w[i].allow, 0))
}

// stating returns what a call sent at now states of the slices (what they
// hold, less what an attempt spends of them once the call lands: spend,
// -1 none, of which miss is asked of the window) and their allowances,
// and notes the call in flight.
func (l *leaser) stating(now time.Time, spend, miss [2]int64) (held, allow [2]int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for i := range l.w {
		w := &l.w[i]
		held[i] = w.left(now) // a forfeited slice too: the script takes it back unless its entry still counts
		if spend[i] >= 0 && miss[i] >= 0 {
			held[i] = max(held[i]-spend[i]+miss[i], 0)
		}
		allow[i] = w.demand.over(now, leaseHorizon)
		w.flightSpent = 0
	}
	l.statedAllow, l.inCall = allow, true
	return held, allow
}

// stated folds the end of the call in flight, sent at called: answered
// (ok), its statement replaced the last one (the slices held, unless the
// script took them back: kept false); else the allowances of both hold
// (the call may have been applied); under l.mu.
func (l *leaser) statedLocked(called time.Time, ok, kept bool) {
	for i := range l.w {
		w := &l.w[i]
		a := l.statedAllow[i] - w.flightSpent
		switch {
		case ok && !kept:
			w.granted, w.spent, w.allow = 0, 0, a
		case ok:
			w.allow = a
		default:
			w.allow = min(w.allow, a)
		}
	}
	if ok {
		l.stated = called
	}
	l.inCall = false
}

// callFailed ends the call in flight without an answer.
func (l *leaser) callFailed() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.statedLocked(time.Time{}, false, false)
}

// demand is capacity.Demand in whole units.
type demand struct{ capacity.Demand }

func (d *demand) add(now time.Time, n int64) { d.Add(now, float64(n)) }

// over returns the demand expected over span (at least 1 unit).
func (d *demand) over(now time.Time, span time.Duration) int64 {
	return max(int64(math.Ceil(d.Over(now, span))), 1)
}

// slice is one instance's lease of one window.
type slice struct {
	granted, spent int64
	// expires is when the window ends, by the local clock (a lease
	// never outlives it: the next window is leased anew); reset names
	// the window in the script's replies (Unix ms, Redis' clock).
	expires time.Time
	reset   int64
	// fleetLeft is what the window held unleased at the last grant.
	fleetLeft int64
	demand    demand
	// bucket: the window refills continuously (bucket.go); expires is
	// then the lease's end, which each grant moves later.
	bucket bool
	// allow is what may still be spent of the slice before the instance
	// states it again (see leaser.stated); flightSpent, what was spent of
	// it since the call in flight was sent.
	allow, flightSpent int64
}

func (s *slice) left(now time.Time) int64 {
	if !now.Before(s.expires) {
		return 0
	}
	return max(s.granted-s.spent, 0)
}

// same reports whether reset names the slice's window: within half a span
// of its reset (an answer may state a later reset of the same window).
func (s *slice) same(reset int64, span time.Duration) bool {
	return s.reset != 0 && 2*time.Duration(max(reset-s.reset, s.reset-reset))*time.Millisecond <= span
}

// grant folds a grant of window reset, made at called, into the slice:
// the same window adds to it, another replaces it. A bucket's grant adds
// to a slice whose lease has not ended (of the bucket, or of the fixed
// window it proved to be); one that ended is spent or lost, never
// revived (the fleet's count no longer holds it back).
func (s *slice) grant(called time.Time, bucket bool, reset int64, span time.Duration, expires time.Time, n, fleetLeft int64) {
	switch {
	case bucket && !called.Before(s.expires), !bucket && !s.same(reset, span):
		s.granted, s.spent = 0, 0
	}
	s.reset, s.bucket = reset, bucket
	s.granted += n
	s.expires, s.fleetLeft = expires, fleetLeft
}

// leaser holds a deployment's slices (requests, tokens) on one instance.
type leaser struct {
	mu        sync.Mutex
	w         [2]slice
	instances int
	last      capacity.Budget // the windows as the last attempt knew them (for the background's calls)
	lastAt    time.Time       // when
	flight    inFlight        // the grant in flight
	// wanted: an attempt decided without Redis (spendLate) lacked a
	// slice; the background asks for one (upkeep) even of a window it
	// holds none of.
	wanted bool
	// stated is when the last call that renewed this instance's statement
	// of its slices (the budget hash's 'h:' entry, which counts
	// leaseEntryTTL on Redis' clock) was sent, by the local clock: the
	// slices are forfeited leaseEntryTTL after it, before the entry can
	// expire, and what it parked goes back to the window then (see
	// leaseScript). stating is the allowance the call in flight states
	// (inCall).
	stated      time.Time
	statedAllow [2]int64
	inCall      bool
}

// grantReply is leaseScript's reply.
type grantReply struct {
	ok          bool
	wait        time.Duration
	asked       [2]bool
	left, reset [2]int64 // each window's remainder unleased, and its reset (Redis' Unix ms)
	granted     [2]int64
	instances   int
	now         int64   // Redis' clock (Unix ms)
	bucket      [2]bool // the window is a bucket in the fleet's budget (bucket.go)
	// kept: the call's statement renewed the instance's entry (or it held
	// nothing); false, the entry had expired (its parked slices given
	// back) or was gone, and the instance's slices are taken back.
	kept bool
}

// want counts an attempt's need in the demand of each window, whether the
// slices hold it or not, and keeps the windows as it knows them.
func (l *leaser) want(now time.Time, need [2]int64, bu capacity.Budget) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for i, n := range need {
		if n >= 0 {
			l.w[i].demand.add(now, max(n, 1))
		}
	}
	l.last, l.lastAt = bu, now
}

// lastWant returns when the last attempt's windows were kept.
func (l *leaser) lastWant() time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.lastAt
}

// inFlight is the one call to Redis in flight for a leaser's slices or a
// binding's places, under its owner's mutex: the attempts that need it
// meanwhile wait for it to land instead of each making their own.
type inFlight struct {
	done chan struct{} // closed when the call lands (nil: none in flight)
}

// join makes the caller the call in flight (lead), or returns the channel
// closed when the one in flight lands.
func (f *inFlight) join() (flight <-chan struct{}, lead bool) {
	if f.done != nil {
		return f.done, false
	}
	f.done = make(chan struct{})
	return nil, true
}

// land ends the call in flight.
func (f *inFlight) land() {
	close(f.done)
	f.done = nil
}

// join makes the caller the one call in flight (lead), or returns the
// channel closed when that call lands.
func (l *leaser) join() (flight <-chan struct{}, lead bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.flight.join()
}

// land ends the call in flight.
func (l *leaser) land() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.flight.land()
}

// applyFor folds a grant for an attempt's need into the slices and spends
// need from it in the same step (rep.ok), so that no other attempt's take
// spends what was granted for this one in between (both then went out on
// one unit: a window of 300 served 301); it reports whether the attempt
// may go. The grant covers what the slices lacked of need when the call
// was sent: an attempt that spent from them while it was in flight may
// have left them short of need, and then this one does not go (its
// caller looks again; what was granted stays in the slice), never on
// units no grant gave (TestAGrantSpendsOnlyWhatTheSliceHolds: 500 spent
// of 400 granted).
func (l *leaser) applyFor(called time.Time, rep grantReply, need [2]int64) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.applyLocked(called, rep)
	if !rep.ok {
		return false
	}
	now := time.Now()
	for i, n := range need {
		if n >= 0 && rep.asked[i] && l.holding(now, i) < max(n, 1) {
			return false
		}
	}
	l.spendLocked(need)
	return true
}

// applyLocked folds a reply to a call made at called into the slices,
// under l.mu: each window's end by the local clock is called plus what
// Redis' clock had left of it (the instances' clocks do not matter).
func (l *leaser) applyLocked(called time.Time, rep grantReply) {
	l.statedLocked(called, true, rep.kept)
	l.instances = rep.instances
	spans := [2]time.Duration{l.last.Requests.Span, l.last.Tokens.Span}
	for i := range l.w {
		if rep.asked[i] {
			expires := called.Add(time.Duration(rep.reset[i]-rep.now) * time.Millisecond)
			l.w[i].grant(called, rep.bucket[i], rep.reset[i], spans[i], expires, rep.granted[i], rep.left[i])
		}
	}
}

// spendLocked spends need from what was just granted for it; under l.mu.
func (l *leaser) spendLocked(need [2]int64) {
	for i, n := range need {
		if n > 0 {
			l.w[i].spent += n
		}
	}
}

// need is what an attempt needs of each window: -1 when it is not asked
// (no stated window the fleet can hold), else its share (at least 1 of a
// window is needed to start).
func needs(bu capacity.Budget) [2]int64 {
	n := [2]int64{-1, -1}
	for i, w := range []capacity.BudgetWindow{bu.Requests, bu.Tokens} {
		if w.Limit >= 0 {
			n[i] = max(w.N, 0)
		}
	}
	return n
}

// take spends need from the slices when each holds it (at least 1), and
// reports whether it did and whether a slice ran low (renew it).
func (l *leaser) take(now time.Time, need [2]int64) (ok, low bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for i, n := range need {
		if n >= 0 && l.spendable(now, i) < max(n, 1) {
			return false, false
		}
	}
	for i, n := range need {
		if n < 0 {
			continue
		}
		w := &l.w[i]
		w.spent += n
		w.allow -= n
		if l.inCall {
			w.flightSpent += n
		}
		low = low || l.spendable(now, i) < w.demand.over(now, leaseLowWater)
	}
	return true, low
}

// asks returns what a request-path grant must get of each window (what the
// slice lacks of need; 0: the slice holds it, -1: not asked) and what to
// ask (a slice sized for leaseHorizon of demand, the need included).
func (l *leaser) asks(now time.Time, need [2]int64) (miss, ask [2]int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for i, n := range need {
		miss[i], ask[i] = -1, 0
		if n < 0 {
			continue
		}
		w := &l.w[i]
		miss[i] = max(max(n, 1)-l.holding(now, i), 0)
		if miss[i] > 0 {
			ask[i] = miss[i] + w.demand.over(now, leaseHorizon)
		}
	}
	return miss, ask
}

// upkeep returns, for the background, what to ask of each window (a slice
// that runs low while demand goes on) and what to give back: what exceeds
// the demand until the window ends (or over two slices' time) by more than
// as much again, or, within leaseHorizon of the end, by a quarter.
func (l *leaser) upkeep(now time.Time) (ask, give [2]int64, reset [2]int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for i := range l.w {
		w := &l.w[i]
		left := w.left(now)
		reset[i] = w.reset
		if w.expires.IsZero() || !now.Before(w.expires) {
			continue
		}
		until := w.expires.Sub(now)
		switch keep := w.demand.over(now, min(until, 2*leaseHorizon)); {
		case w.bucket && until < leaseLowWater && left > 0:
			// A bucket's lease ends with units left: renewed while they
			// are in use, else they go back.
			if w.demand.Rate(now)*capacity.DemandTau.Seconds() >= 0.5 {
				ask[i] = w.demand.over(now, leaseHorizon)
			} else {
				give[i] = left
			}
		case l.renews(now, i, leaseLowWater):
			ask[i] = w.demand.over(now, leaseHorizon)
		case left > 2*keep, until < leaseHorizon && left-keep > max(keep/4, 0):
			give[i] = left - keep
		}
	}
	if l.wanted {
		l.askWanted(now, &ask)
	}
	// One call renews both: the other window is topped up too when it
	// holds less than half a slice.
	for i := range l.w {
		if ask[i] == 0 && ask[1-i] > 0 && l.renews(now, i, leaseHorizon/2) {
			ask[i] = l.w[i].demand.over(now, leaseHorizon)
		}
	}
	return ask, give, reset
}

// askWanted asks, for an attempt that lacked a slice while Redis answers
// late (wanted), a slice of each window the last attempt needs whose
// slice holds less than leaseLowWater of demand, whatever the window held
// at the last grant (it may be a new one); under l.mu.
func (l *leaser) askWanted(now time.Time, ask *[2]int64) {
	for i, w := range []capacity.BudgetWindow{l.last.Requests, l.last.Tokens} {
		if ask[i] == 0 && w.Limit >= 0 && l.spendable(now, i) < l.w[i].demand.over(now, leaseLowWater) {
			ask[i] = l.w[i].demand.over(now, leaseHorizon)
		}
	}
}

// lacking notes that an attempt of need lacked a slice while Redis answers
// late (wanted: the background asks for one) and returns how long it is
// refused: retry, or, for a window that held no more than its slice at the
// last grant, until leaseSliceRetry or its end, whichever is sooner.
func (l *leaser) lacking(now time.Time, need [2]int64, retry time.Duration) time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.wanted = true
	wait := retry
	for i, n := range need {
		w := &l.w[i]
		if n >= 0 && l.spendable(now, i) < max(n, 1) && now.Before(w.expires) && w.fleetLeft <= 0 {
			wait = max(wait, min(leaseSliceRetry, w.expires.Sub(now)))
		}
	}
	return wait
}

// renews reports whether window i's slice, in use, holds less than its
// demand over d (and the window has more to lease).
func (l *leaser) renews(now time.Time, i int, d time.Duration) bool {
	w := &l.w[i]
	if w.expires.IsZero() || !now.Before(w.expires) || w.fleetLeft <= 0 {
		return false
	}
	return w.demand.Rate(now)*capacity.DemandTau.Seconds() >= 0.5 && l.spendable(now, i) < w.demand.over(now, min(d, w.expires.Sub(now)))
}

// gave takes what is given back of window i's slice out of it, if the
// slice is still of window reset, and returns how much it took (never more
// than the slice holds).
func (l *leaser) gave(now time.Time, i int, reset, n int64) int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	w := &l.w[i]
	if w.reset != reset {
		return 0
	}
	n = min(n, w.left(now))
	w.granted -= n
	return n
}

// held returns, when a slice that the attempt needs is spent, how long
// until its window ends, if a slice was held in it; false when the
// instance holds no slice of a window the attempt needs.
func (l *leaser) held(now time.Time, need [2]int64) (time.Duration, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	wait := time.Duration(0)
	for i, n := range need {
		if n < 0 || l.spendable(now, i) >= max(n, 1) {
			continue
		}
		if !now.Before(l.w[i].expires) {
			return 0, false
		}
		wait = max(wait, l.w[i].expires.Sub(now))
	}
	return wait, true
}

// budget is what the fleet's windows hold as this instance knows them: the
// remainder unleased at the last grant and its own slice.
func (l *leaser) budget(now time.Time, bu capacity.Budget) capacity.Budget {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := capacity.Budget{Instances: l.instances}
	for i, w := range []capacity.BudgetWindow{bu.Requests, bu.Tokens} {
		bw := capacity.BudgetWindow{Limit: -1}
		if w.Limit >= 0 && !l.w[i].expires.IsZero() {
			sl := &l.w[i]
			bw = capacity.BudgetWindow{Limit: w.Limit, Remaining: sl.fleetLeft + l.holding(now, i), Reset: sl.expires, Span: w.Span, Rate: w.Rate}
		}
		if i == 0 {
			out.Requests = bw
		} else {
			out.Tokens = bw
		}
	}
	return out
}

// kickLeases wakes the lease loop (a slice ran low).
func (s *Store) kickLeases() {
	select {
	case s.leaseNow <- struct{}{}:
	default:
	}
}

// leaseLoop renews the slices that run low and gives back what will not be
// spent, every leaseTick or when a request finds its slice low.
func (s *Store) leaseLoop() {
	defer s.wg.Done()
	t := time.NewTicker(leaseTick)
	defer t.Stop()
	for {
		select {
		case <-s.ctx.Done():
			return
		case <-t.C:
		case <-s.leaseNow:
		}
		if s.health.Load() != healthUp {
			continue // the slices held are spent, and no more
		}
		for _, b := range s.snapshotBindings() {
			b.upkeep(time.Now(), false)
			b.upkeepPlaces(time.Now(), false)
			b.reportOffline(time.Now())
		}
		for _, b := range s.snapshotConsumers() {
			b.upkeepPlaces(time.Now(), false)
			b.reportOffline(time.Now())
		}
		s.upkeepFlights(time.Now(), false)
	}
}

// upkeep renews b's slices or gives back what they hold beyond demand
// (all when closing), in one call, unless a request's call is in flight.
func (b *binding) upkeep(now time.Time, closing bool) {
	l := &b.lease
	ask, give, reset := l.upkeep(now)
	if closing {
		ask, give = [2]int64{}, l.all(now)
	}
	if ask == [2]int64{} && give == [2]int64{} {
		return
	}
	if _, lead := l.join(); !lead {
		return
	}
	defer l.land()
	for i, n := range give {
		if n > 0 {
			give[i] = l.gave(now, i, reset[i], n) // out of the slice first: a lost reply loses it, never spends it twice
		}
	}
	l.mu.Lock()
	bu := l.last
	l.mu.Unlock()
	s := b.s
	ctx, cancel := b.bgContext(closing)
	defer cancel()
	called := time.Now()
	rep, err := b.grant(ctx, bu, [2]int64{0, 0}, ask, give, reset, [2]int64{-1, -1})
	if err != nil {
		l.callFailed()
		s.callFailed("spend", err, called)
		return
	}
	b.answeredLate(called)
	l.mu.Lock()
	l.wanted = false
	l.applyLocked(called, rep)
	l.mu.Unlock()
}

// bgContext bounds a background call by the store's background timeout.
func (b *binding) bgContext(closing bool) (context.Context, context.CancelFunc) {
	parent := b.s.ctx
	if closing {
		parent = context.Background() // the store's own context has ended
	}
	return context.WithTimeout(parent, b.s.bgTimeout)
}

// all returns what the slices hold.
func (l *leaser) all(now time.Time) (give [2]int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for i := range l.w {
		give[i] = l.w[i].left(now)
	}
	return give
}
