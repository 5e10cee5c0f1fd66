package router

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/llmrouter/caddy-llm-router/internal/capacity"
	"github.com/llmrouter/caddy-llm-router/provider"
)

// manualClock is a Clock whose time moves only when a test advances it:
// Sleep blocks until then (or until its context ends), so that many
// requests can wait at once and the test runs them as a discrete-event
// simulation (simulate).
type manualClock struct {
	mu     sync.Mutex
	now    time.Time
	timers []*manualTimer
	sleeps map[*manualSleep]bool
}

// manualSleep is a Sleep under way.
type manualSleep struct {
	ctx context.Context
	t   *manualTimer
}

type manualTimer struct {
	c   *manualClock
	at  time.Time
	f   func()
	set bool
}

func newManualClock() *manualClock {
	return &manualClock{now: time.Date(2025, 8, 21, 12, 40, 0, 0, time.UTC), sleeps: map[*manualSleep]bool{}}
}

func (c *manualClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *manualClock) AfterFunc(d time.Duration, f func()) Timer {
	c.mu.Lock()
	defer c.mu.Unlock()
	t := &manualTimer{c: c, at: c.now.Add(d), f: f, set: true}
	c.timers = append(c.timers, t)
	return t
}

func (t *manualTimer) Stop() bool {
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	was := t.set
	t.set = false
	return was
}

func (t *manualTimer) Reset(d time.Duration) bool {
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	was := t.set
	t.at, t.set = t.c.now.Add(d), true
	if !slices.Contains(t.c.timers, t) {
		t.c.timers = append(t.c.timers, t)
	}
	return was
}

func (c *manualClock) Sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	done := make(chan struct{})
	t := c.AfterFunc(d, func() { close(done) }).(*manualTimer)
	sl := &manualSleep{ctx: ctx, t: t}
	c.mu.Lock()
	c.sleeps[sl] = true
	c.mu.Unlock()
	select {
	case <-done:
	case <-ctx.Done():
	}
	t.Stop()
	c.mu.Lock()
	delete(c.sleeps, sl)
	c.mu.Unlock()
	return ctx.Err()
}

// next returns the earliest set timer's instant.
func (c *manualClock) next() (time.Time, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	var at time.Time
	ok := false
	for _, t := range c.timers {
		if t.set && (!ok || t.at.Before(at)) {
			at, ok = t.at, true
		}
	}
	return at, ok
}

// advanceTo moves the clock to at and fires the timers due.
func (c *manualClock) advanceTo(at time.Time) {
	c.mu.Lock()
	if at.After(c.now) {
		c.now = at
	}
	var due []func()
	kept := c.timers[:0]
	for _, t := range c.timers {
		switch {
		case !t.set:
		case !t.at.After(c.now):
			t.set = false
			due = append(due, t.f)
		default:
			kept = append(kept, t)
		}
	}
	c.timers = kept
	c.mu.Unlock()
	for _, f := range due {
		f()
	}
}

// simulate runs n requests (serve(i), each in its own goroutine) to their
// end: whenever every unfinished one sleeps, it moves the clock to the next
// timer.
func simulate(t testing.TB, c *manualClock, n int, serve func(i int)) {
	t.Helper()
	var finished sync.WaitGroup
	var mu sync.Mutex
	left := n
	for i := range n {
		finished.Add(1)
		go func() {
			defer finished.Done()
			serve(i)
			mu.Lock()
			left--
			mu.Unlock()
		}()
	}
	quiet := func() (int, bool) {
		mu.Lock()
		l := left
		mu.Unlock()
		// Asleep: a Sleep whose timer is still set and whose context is
		// live (one that was woken is about to run).
		c.mu.Lock()
		s := 0
		for sl := range c.sleeps {
			if sl.t.set && sl.ctx.Err() == nil {
				s++
			}
		}
		c.mu.Unlock()
		return l, s == l
	}
	stop := time.Now().Add(20 * time.Second)
	for time.Now().Before(stop) {
		l, q := quiet()
		if l == 0 {
			finished.Wait()
			return
		}
		if !q {
			time.Sleep(200 * time.Microsecond)
			continue
		}
		time.Sleep(time.Millisecond) // still quiet a moment later?
		if _, q := quiet(); !q {
			continue
		}
		at, ok := c.next()
		if !ok {
			t.Fatalf("every request sleeps and no timer is set: %d left", l)
		}
		c.advanceTo(at)
	}
	t.Fatal("the simulation did not end in 20 s")
}

// windowed is a provider with a fixed window (limit requests per span,
// the window starting with the first request after the last one ended),
// stating it in OpenAI's x-ratelimit headers, and answering 429 with
// Retry-After once it is spent (not counted), on the clock c.
type windowed struct {
	c              *manualClock
	limit          int
	span           time.Duration
	mu             sync.Mutex
	w              fixedSpan
	served, got429 int
	order          []string // the request bodies' "user" field, in the order served
}

// fixedSpan is a provider's fixed window that starts with the first
// request after the last one ended: what is used of it since start.
type fixedSpan struct {
	start time.Time
	used  int64
}

// take decides a request of cost units arriving at now on a window of
// limit per span: it reports the window's headers for the answer (unit
// "requests" or "tokens") and whether it fits (counted then); a refusal
// carries Retry-After in whole seconds, rounded up.
func (w *fixedSpan) take(now time.Time, span time.Duration, limit, cost int64, unit string) (http.Header, bool) {
	if w.start.IsZero() || !now.Before(w.start.Add(span)) {
		w.start, w.used = now, 0
	}
	reset := w.start.Add(span).Sub(now)
	h := http.Header{"Content-Type": {"application/json"}}
	h.Set("x-ratelimit-limit-"+unit, strconv.FormatInt(limit, 10))
	h.Set("x-ratelimit-reset-"+unit, reset.String())
	ok := w.used+cost <= limit
	if ok {
		w.used += cost
	} else {
		h.Set("Retry-After", strconv.Itoa(int((reset+time.Second-1)/time.Second)))
	}
	h.Set("x-ratelimit-remaining-"+unit, strconv.FormatInt(limit-w.used, 10))
	return h, ok
}

func (p *windowed) RoundTrip(req *http.Request) (*http.Response, error) {
	body, _ := io.ReadAll(req.Body)
	p.mu.Lock()
	defer p.mu.Unlock()
	h, ok := p.w.take(p.c.Now(), p.span, int64(p.limit), 1, "requests")
	if !ok {
		p.got429++
		return &http.Response{StatusCode: 429, Header: h, Body: io.NopCloser(strings.NewReader(rateLimited)), Request: req}, nil
	}
	p.served++
	if i := strings.Index(string(body), `"user":"`); i >= 0 {
		u := string(body[i+8:])
		p.order = append(p.order, u[:strings.IndexByte(u, '"')])
	}
	return &http.Response{StatusCode: 200, Header: h, Body: io.NopCloser(strings.NewReader(okBody)), Request: req}, nil
}

// manualGroup is a router on c (near-ties to the first, 8 attempts) and a
// group "limited" of one deployment whose provider is t.
func manualGroup(c *manualClock, t http.RoundTripper, deadline time.Duration) (*Router, *Group) {
	d := deployment("a", nil)
	d.Transport = t
	r := New()
	r.Clock, r.Rand = c, func() float64 { return 0 }
	r.Deadline, r.MaxAttempts = deadline, 8
	return r, NewGroup("limited", []*Deployment{d})
}

// limitedGroup is a group of one deployment on a windowed provider (10 per
// 10 s), its limit taught by one request, and the clock just after the
// start of the next window.
func limitedGroup(t *testing.T) (*Router, *Group, *windowed, *manualClock) {
	t.Helper()
	return limitedGroupOf(t, 10)
}

// limitedGroupOf is limitedGroup on a window of limit requests per 10 s.
func limitedGroupOf(t *testing.T, limit int) (*Router, *Group, *windowed, *manualClock) {
	t.Helper()
	c := newManualClock()
	p := &windowed{c: c, limit: limit, span: 10 * time.Second}
	r, g := manualGroup(c, p, 25*time.Second)
	if res := r.ServeGroup(context.Background(), g, chatReq); res.Err != nil {
		t.Fatalf("warm-up: %v", res.Err)
	}
	// Past the router's margin on the warm-up's reset: a burst at the very
	// instant the provider's window rolls over meets the router still in
	// the old window, and its first answers from the new one are read on
	// the safe side (one unit may go unspent; see window.update).
	c.advanceTo(c.Now().Add(10*time.Second + 2*capacity.ResetMargin))
	p.served = 0
	return r, g, p, c
}

func userReq(user string, priority int) *Request {
	body := fmt.Sprintf(`{"model":"limited","user":%q,"messages":[{"role":"user","content":"hi"}]}`, user)
	return &Request{Request: wire([]byte(body), false), Tokens: 10, Priority: priority}
}

type served struct {
	status int
	at     time.Duration // after the burst began
	retry  time.Duration
}

func outcomeOf(res *Result, since time.Duration) served {
	var e *Error
	switch {
	case errors.As(res.Err, &e):
		return served{status: e.Status, at: since, retry: e.RetryAfter}
	case res.Err != nil:
		return served{status: -1, at: since}
	}
	return served{status: res.Status, at: since}
}

// The scenario on the fake clock: a burst of 35 on 10 per 10 s,
// deadline 25 s. The ideal: 10 now, 10 at the next window (10 s), 10 at
// the one after (20 s); the last 5 are told at once when they could come
// back (the window at 30 s).
func TestABurstIsServedWindowByWindowWithoutA429(t *testing.T) {
	r, g, p, c := limitedGroup(t)
	start := c.Now()
	out := make([]served, 35)
	simulate(t, c, len(out), func(i int) {
		res := r.ServeGroup(context.Background(), g, userReq(strconv.Itoa(i), DefaultPriority))
		out[i] = outcomeOf(res, c.Now().Sub(start))
	})
	ok, early := 0, 0
	for i, o := range out {
		switch o.status {
		case 200:
			ok++
			if o.at > r.Deadline {
				t.Errorf("request %d served after the deadline (%v)", i, o.at)
			}
		case 429:
			early++
			if o.at != 0 {
				t.Errorf("request %d: its 429 came after %v, not at once", i, o.at)
			}
			if o.retry < 25*time.Second || o.retry > 31*time.Second {
				t.Errorf("request %d: expected Retry-After at the window after the deadline (30 s), got %v", i, o.retry)
			}
		default:
			t.Errorf("request %d: unexpected %+v", i, o)
		}
	}
	if ok != 30 || early != 5 || p.got429 != 0 {
		t.Errorf("expected 30 served, 5 answered 429 at once and no upstream 429, got %d, %d and %d", ok, early, p.got429)
	}
	// The 20 served by the next windows waited; the 5 answered at once did
	// not (one served at once may have been woken in the queue on its way).
	if n, total := g.Waits(); n < 20 || n > 22 || total < 20*5*time.Second {
		t.Errorf("expected 20 waits of 10 s or 20 s, got %d totalling %v", n, total)
	}
}

// Waiting requests are served in their order of arrival, and a higher
// priority before a lower one.
func TestTheQueueIsFirstComeFirstServedWithinAPriority(t *testing.T) {
	r, g, p, c := limitedGroup(t)
	// Spend this window so that everyone below waits in the queue.
	for range 10 {
		if res := r.ServeGroup(context.Background(), g, chatReq); res.Err != nil {
			t.Fatal(res.Err)
		}
	}
	p.order = nil
	// They arrive one by one (a goroutine each, in order), low priority
	// first, then high.
	reqs := []*Request{}
	for i := range 6 {
		reqs = append(reqs, userReq(fmt.Sprintf("low%d", i), 2))
	}
	for i := range 6 {
		reqs = append(reqs, userReq(fmt.Sprintf("high%d", i), 8))
	}
	simulate(t, c, len(reqs), func(i int) {
		for g.Queued() < i { // join in index order
			time.Sleep(50 * time.Microsecond)
		}
		r.ServeGroup(context.Background(), g, reqs[i])
	})
	// The next window serves the six high-priority requests and the four
	// first low-priority ones (within a window, attempts run concurrently:
	// the provider may see them in any order); the window after, the rest.
	if len(p.order) != 12 {
		t.Fatalf("expected 12 served, got %v", p.order)
	}
	first, second := slices.Sorted(slices.Values(p.order[:10])), slices.Sorted(slices.Values(p.order[10:]))
	want := []string{"high0", "high1", "high2", "high3", "high4", "high5", "low0", "low1", "low2", "low3"}
	if !slices.Equal(first, want) || !slices.Equal(second, []string{"low4", "low5"}) {
		t.Errorf("expected the next window to serve\n%v\nthen %v, got\n%v", want, []string{"low4", "low5"}, p.order)
	}
	if p.got429 != 0 {
		t.Errorf("expected no upstream 429, got %d", p.got429)
	}
}

// With 30% of each window reserved for priority 7 and above, a burst of
// low-priority requests takes 7 per window; the high-priority requests
// that come later in the window still find capacity at once.
func TestReserveKeepsAWindowShareForHighPriorities(t *testing.T) {
	r, g, p, c := limitedGroup(t)
	r.Reserve = Reserve{Share: 0.3, MinPriority: 7}
	r.Deadline = 5 * time.Second // one window
	lows := make([]served, 12)
	simulate(t, c, len(lows), func(i int) {
		lows[i] = outcomeOf(r.ServeGroup(context.Background(), g, userReq("low", 1)), 0)
	})
	count := func(out []served, status int) int {
		n := 0
		for _, o := range out {
			if o.status == status {
				n++
			}
		}
		return n
	}
	low := count(lows, 200)
	if low > 7 || low < 6 {
		t.Errorf("expected 7 low-priority requests served (10 less 30%%; 6 when an answer's count is taken on the safe side), got %d", low)
	}
	if n := count(lows, 429); n != 12-low {
		t.Errorf("expected the %d others answered 429, got %d", 12-low, n)
	}
	highs := make([]served, 4)
	simulate(t, c, len(highs), func(i int) {
		highs[i] = outcomeOf(r.ServeGroup(context.Background(), g, userReq("high", 9)), 0)
	})
	if n := count(highs, 200); n != 10-low {
		t.Errorf("expected the reserve and what the low priorities left (%d) served to high priorities, got %d", 10-low, n)
	}
	if p.got429 != 0 {
		t.Errorf("expected no upstream 429, got %d", p.got429)
	}
}

// A request whose client leaves while it waits leaves the queue: the ones
// behind it are served in its place.
func TestALeavingClientLeavesTheQueue(t *testing.T) {
	r, g, p, c := limitedGroup(t)
	for range 10 {
		r.ServeGroup(context.Background(), g, chatReq)
	}
	ctx, cancel := context.WithCancel(context.Background())
	gone := make(chan *Result, 1)
	go func() { gone <- r.ServeGroup(ctx, g, userReq("gone", DefaultPriority)) }()
	for g.Queued() != 1 {
		time.Sleep(100 * time.Microsecond)
	}
	cancel()
	if res := <-gone; res.Err != ErrClientGone {
		t.Fatalf("expected ErrClientGone, got %v", res.Err)
	}
	if g.Queued() != 0 {
		t.Errorf("expected the queue empty, got %d", g.Queued())
	}
	p.order = nil
	simulate(t, c, 1, func(int) { r.ServeGroup(context.Background(), g, userReq("next", DefaultPriority)) })
	if !slices.Equal(p.order, []string{"next"}) {
		t.Errorf("expected the next request served, got %v", p.order)
	}
}

// Open-loop arrivals at twice the capacity (one every 0.5 s on 10 per 10 s,
// deadline 25 s): every request is served before its deadline or told at
// its arrival, never after a wait; none draws a 429 from the provider,
// and the ideal number is served. (The forecast's drift of a margin per
// window, which made the bench's open-loop run answer one 429 after 955
// ms, is TestForecast's: on this clock no deadline falls in that gap.)
func TestOpenLoopArrivalsAreToldAtOnce(t *testing.T) {
	r, g, p, c := limitedGroup(t)
	start := c.Now()
	const n, every, offset = 80, 500 * time.Millisecond, 120 * time.Millisecond
	type arrival struct {
		status    int
		arrived   time.Duration
		answered  time.Duration
		retryWait time.Duration
	}
	out := make([]arrival, n)
	simulate(t, c, n, func(i int) {
		_ = c.Sleep(context.Background(), time.Duration(i)*every+offset)
		arrived := c.Now().Sub(start)
		o := outcomeOf(r.ServeGroup(context.Background(), g, userReq(strconv.Itoa(i), DefaultPriority)), c.Now().Sub(start))
		out[i] = arrival{status: o.status, arrived: arrived, answered: o.at, retryWait: o.retry}
	})
	served := 0
	for i, o := range out {
		switch o.status {
		case 200:
			served++
			if o.answered-o.arrived > r.Deadline {
				t.Errorf("request %d served after its deadline (%v)", i, o.answered-o.arrived)
			}
		case 429:
			if o.answered != o.arrived {
				t.Errorf("request %d (arrived at %v): its 429 came after %v, not at once", i, o.arrived, o.answered-o.arrived)
			}
		default:
			t.Errorf("request %d: unexpected status %d", i, o.status)
		}
	}
	// Windows every 10.05 s from 0 to the last deadline (64.6 s): 7 of 10,
	// the last one with 9 arrivals left that it can serve in time.
	if served != 69 || p.got429 != 0 {
		t.Errorf("expected the ideal 69 served and no upstream 429, got %d served and %d upstream 429s", served, p.got429)
	}
}

// fakeFleetQueue is a fleet's queue with others' requests in it: each
// member's place is others plus this instance's members before it.
type fakeFleetQueue struct {
	mu       sync.Mutex
	others   int64
	members  []string
	fail     bool
	left     int // unserved of them by LeaveUnserved
	unserved int
	seq      int
	// sweep: every Ahead finds its member gone (its instance missed
	// heartbeats); joins counts the Joins.
	sweep       bool
	joins, lost int
	// consumers are the consumers and weights the Joins named;
	// giveBacks counts the Joins that gave their consumer's turn back
	// (FleetJoin.GiveBack).
	consumers []string
	giveBacks int
}

// JoinAll puts every join in place, then answers each one's place.
func (q *fakeFleetQueue) JoinAll(joins []FleetJoin) {
	q.mu.Lock()
	defer q.mu.Unlock()
	for k := range joins {
		j := &joins[k]
		if q.fail {
			j.Err = errors.New("store down")
			continue
		}
		q.seq++
		q.joins++
		if j.GiveBack {
			q.giveBacks++
		}
		q.consumers = append(q.consumers, fmt.Sprintf("%s:%v", j.Consumer, j.Weight))
		// In place as the fleet's queue orders them: by priority, arrival,
		// then the instance's own order (the tests' priorities are one).
		j.Member = fmt.Sprintf("m-%020d-%016x-%d", j.Arrival.UnixNano(), j.Order, q.seq)
		i, _ := slices.BinarySearch(q.members, j.Member)
		q.members = slices.Insert(q.members, i, j.Member)
	}
	for k := range joins {
		if j := &joins[k]; j.Err == nil {
			i, _ := slices.BinarySearch(q.members, j.Member)
			j.Ahead = q.others + int64(i)
			j.TokensAhead = 10 * j.Ahead
		}
	}
}

func (q *fakeFleetQueue) Ahead(member string, withTokens bool) (int64, int64, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.fail {
		return 0, 0, errors.New("store down")
	}
	i := slices.Index(q.members, member)
	if i < 0 {
		return 0, 0, errors.New("no such member")
	}
	if q.sweep {
		q.lost++
		q.members = slices.Delete(q.members, i, i+1)
		return 0, 0, errors.New("no such member")
	}
	n := q.others + int64(i)
	return n, 10 * n, nil
}

func (q *fakeFleetQueue) Leave(member string) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if i := slices.Index(q.members, member); i >= 0 {
		q.members = slices.Delete(q.members, i, i+1)
		q.left++
	}
}

func (q *fakeFleetQueue) LeaveUnserved(member string) {
	q.Leave(member)
	q.mu.Lock()
	defer q.mu.Unlock()
	q.unserved++
}

// Fleet mode: a place is counted in the fleet's queue, against the fleet's
// whole windows. With 15 requests of other instances ahead on 10 per 10 s
// (deadline 25 s: windows at 10 and 20 s hold 20), 15 of a burst of 20
// here are told at once; the first 5 wait, and take no capacity while
// the others' requests are ahead of them fleet-wide (the others' requests
// here never leave, so the 5 are told at 20 s that the window after,
// at 30 s, is past their deadline). A store that cannot answer leaves the
// instance to its own queue.
func TestAPlaceIsCountedFleetWide(t *testing.T) {
	r, g, p, c := limitedGroup(t)
	fq := &fakeFleetQueue{others: 15}
	g.Fleet = fq
	// This window is this instance's: spend it so that all 20 queue.
	for range 10 {
		r.ServeGroup(context.Background(), g, chatReq)
	}
	p.served = 0
	out := make([]served, 20)
	start := c.Now()
	simulate(t, c, len(out), func(i int) {
		out[i] = outcomeOf(r.ServeGroup(context.Background(), g, userReq(strconv.Itoa(i), DefaultPriority)), c.Now().Sub(start))
	})
	ok, early, at20 := 0, 0, 0
	for i, o := range out {
		switch {
		case o.status == 200:
			ok++
		case o.status == 429 && o.at == 0:
			early++
		case o.status == 429 && o.at >= 20*time.Second && o.at < 21*time.Second:
			at20++
		default:
			t.Errorf("request %d: unexpected %+v", i, o)
		}
	}
	if ok != 0 || early != 15 || at20 != 5 || p.got429 != 0 {
		t.Errorf("expected 15 told at once and 5 at 20 s, none served, got %d, %d and %d served (upstream 429s %d)", early, at20, ok, p.got429)
	}
	if len(fq.members) != 0 || fq.left < 20 {
		t.Errorf("expected every request out of the fleet's queue, %d left and %d still in", fq.left, len(fq.members))
	}

	// The store down: the instance's own queue and its share (all of it).
	r, g, _, c = limitedGroup(t)
	g.Fleet = &fakeFleetQueue{others: 15, fail: true}
	for range 10 {
		r.ServeGroup(context.Background(), g, chatReq)
	}
	out = out[:0]
	out = make([]served, 20)
	simulate(t, c, len(out), func(i int) {
		out[i] = outcomeOf(r.ServeGroup(context.Background(), g, userReq(strconv.Itoa(i), DefaultPriority)), 0)
	})
	ok = 0
	for _, o := range out {
		if o.status == 200 {
			ok++
		}
	}
	if ok != 20 {
		t.Errorf("store down: expected the 20 served by this instance's windows, got %d", ok)
	}
}

// Fleet mode: a waiting request takes capacity only when the fleet's
// queue has fewer requests before it than the window lets start now, so
// that those ahead of it on other instances are served first. With 3
// requests of other instances ahead (which here never leave) and a burst
// of 20 on 10 per 10 s (deadline 35 s), this instance takes 7 of the
// window at 10 s, leaving 3 for the others, and the rest at 20 and 30 s.
func TestAFleetTurnLeavesRoomForThoseAhead(t *testing.T) {
	r, g, p, c := limitedGroup(t)
	r.Deadline = 35 * time.Second
	r.FleetNaps = 0 // naps move with the manual clock's steps: their effect is measured by the bench
	g.Fleet = &fakeFleetQueue{others: 3}
	for range 10 {
		r.ServeGroup(context.Background(), g, chatReq)
	}
	p.served = 0
	out := make([]served, 20)
	start := c.Now()
	simulate(t, c, len(out), func(i int) {
		out[i] = outcomeOf(r.ServeGroup(context.Background(), g, userReq(strconv.Itoa(i), DefaultPriority)), c.Now().Sub(start))
	})
	at := map[time.Duration]int{}
	ok := 0
	for _, o := range out {
		if o.status == 200 {
			ok++
			at[o.at.Truncate(10*time.Second)]++
		}
	}
	if at[10*time.Second] != 7 || at[20*time.Second] != 7 || at[30*time.Second] != 6 || p.got429 != 0 {
		t.Errorf("expected 7, 7 and 6 served at 10, 20 and 30 s, got %v (upstream 429s %d)", at, p.got429)
	}
}

// A request whose member the fleet's queue lost (its instance was taken
// for dead while cut from Redis) joins again at its next look, and is
// served as before: the burst of 20 on 10 per 10 s (deadline 25 s) is
// served whole, each request left the fleet's queue, and none was counted
// against a share of the windows (the fleet's windows are this instance's
// here).
func TestALostFleetPlaceIsJoinedAgain(t *testing.T) {
	r, g, p, c := limitedGroup(t)
	fq := &fakeFleetQueue{sweep: true}
	g.Fleet = fq
	for range 10 {
		r.ServeGroup(context.Background(), g, chatReq)
	}
	p.served = 0
	out := make([]served, 20)
	simulate(t, c, len(out), func(i int) {
		out[i] = outcomeOf(r.ServeGroup(context.Background(), g, userReq(strconv.Itoa(i), DefaultPriority)), 0)
	})
	ok := 0
	for _, o := range out {
		if o.status == 200 {
			ok++
		}
	}
	if ok != 20 || p.got429 != 0 {
		t.Errorf("expected the 20 served without an upstream 429, got %d (%d upstream 429s)", ok, p.got429)
	}
	if fq.lost == 0 {
		t.Error("expected a request to look again and find its member lost")
	}
	if len(fq.members) != 0 {
		t.Errorf("expected every request out of the fleet's queue, %d still in", len(fq.members))
	}

	// Look by look: the first joins (and its place comes with the Join),
	// the second asks and finds the member lost (local place for now),
	// the third joins again.
	fq = &fakeFleetQueue{others: 3, sweep: true}
	g.Fleet = fq
	me := &waiter{priority: DefaultPriority, since: c.Now(), deadline: c.Now().Add(time.Minute)}
	if n, tok, ok := r.fleetPlace(g, me, true, c.Now(), me.deadline); !ok || n != 3 || tok != 30 || fq.joins != 1 {
		t.Errorf("first look: expected 3 ahead (30 tokens) from the Join, got %d (%d) %v (%d joins)", n, tok, ok, fq.joins)
	}
	if _, _, ok := r.fleetPlace(g, me, true, c.Now(), me.deadline); ok || me.member != "" {
		t.Errorf("second look: expected the lost member dropped, got ok %v, member %q", ok, me.member)
	}
	if n, _, ok := r.fleetPlace(g, me, true, c.Now(), me.deadline); !ok || n != 3 || fq.joins != 2 {
		t.Errorf("third look: expected a new Join, got %d %v (%d joins)", n, ok, fq.joins)
	}
}

// countingObserver counts what the router reports.
type countingObserver struct {
	mu          sync.Mutex
	unpredicted map[string]int
	queued      []int
	waits       int
	resumes     []string // "from>to how"
	hedges      []string // "deployment" for each hedge, "won deployment" for each win
}

func (o *countingObserver) Attempt(*Deployment, provider.Class, time.Duration) {}
func (o *countingObserver) FirstToken(*Deployment, time.Duration)              {}
func (o *countingObserver) Failover(*Deployment, provider.Class)               {}
func (o *countingObserver) Queue(_ *Group, n int) {
	o.mu.Lock()
	o.queued = append(o.queued, n)
	o.mu.Unlock()
}
func (o *countingObserver) QueueWait(*Group, time.Duration) {
	o.mu.Lock()
	o.waits++
	o.mu.Unlock()
}
func (o *countingObserver) Hedge(_ *Group, d *Deployment) {
	o.mu.Lock()
	o.hedges = append(o.hedges, d.Name)
	o.mu.Unlock()
}
func (o *countingObserver) HedgeWon(_ *Group, d *Deployment) {
	o.mu.Lock()
	o.hedges = append(o.hedges, "won "+d.Name)
	o.mu.Unlock()
}
func (o *countingObserver) Resume(from, to *Deployment, how string) {
	o.mu.Lock()
	o.resumes = append(o.resumes, from.Name+">"+to.Name+" "+how)
	o.mu.Unlock()
}
func (o *countingObserver) Unpredicted(d *Deployment) {
	o.mu.Lock()
	o.unpredicted[d.Name]++
	o.mu.Unlock()
}

// A 429 the budget did not predict (someone else spent the account) is
// counted, logged at debug level with what the router believed, and sets
// the budget from the provider's count: the next request does not try the
// deployment again before the reset.
func TestAnUnpredicted429CorrectsTheBudget(t *testing.T) {
	r, g, p, c := limitedGroup(t)
	core, logs := observer.New(zapcore.DebugLevel)
	r.Logger = zap.New(core)
	obs := &countingObserver{unpredicted: map[string]int{}}
	r.Observer = obs
	p.mu.Lock()
	p.w = fixedSpan{start: c.Now(), used: 7} // another client of the account took 7
	p.mu.Unlock()
	for range 3 {
		if res := r.ServeGroup(context.Background(), g, chatReq); res.Err != nil {
			t.Fatalf("expected 3 served, got %v", res.Err)
		}
	}
	r.Deadline = 5 * time.Second
	res := r.ServeGroup(context.Background(), g, chatReq)
	var e *Error
	if !errors.As(res.Err, &e) || e.Status != 429 {
		t.Fatalf("expected a 429 at once, got %+v", res)
	}
	if obs.unpredicted["a"] != 0 || p.got429 != 0 {
		t.Fatalf("the answers stated the window: expected no unpredicted 429, got %v (provider %d)", obs.unpredicted, p.got429)
	}
	// Now the provider's window is spent by someone else without any
	// answer saying so: the budget believes 10 are left.
	c.advanceTo(c.Now().Add(10*time.Second + time.Second))
	p.mu.Lock()
	p.w = fixedSpan{start: c.Now(), used: 10}
	p.mu.Unlock()
	res = r.ServeGroup(context.Background(), g, chatReq)
	if !errors.As(res.Err, &e) || e.Status != 429 || res.Attempts != 1 {
		t.Fatalf("expected one attempt and a 429, got %+v", res)
	}
	if obs.unpredicted["a"] != 1 || p.got429 != 1 {
		t.Errorf("expected the provider's 429 counted as unpredicted once, got %v (provider %d)", obs.unpredicted, p.got429)
	}
	lines := logs.FilterMessage("rate-limited although the budget had room").All()
	if len(lines) != 1 || lines[0].ContextMap()["believed_requests"] != int64(10) {
		t.Errorf("expected one debug line with the budget believed (10), got %+v", lines)
	}
	if snap := g.Deployments[0].State.Snapshot(c.Now()); snap.RemainingRequests != 0 {
		t.Errorf("expected the budget set from the provider's count (0), got %d", snap.RemainingRequests)
	}
	res = r.ServeGroup(context.Background(), g, chatReq)
	if !errors.As(res.Err, &e) || e.Status != 429 || res.Attempts != 0 || p.got429 != 1 {
		t.Errorf("expected the next request answered without an attempt, got %+v (provider 429s %d)", res, p.got429)
	}
}

// byBody answers by the request's body: tooLong for one that says "long".
type byBody struct {
	long, short func(*http.Request) (*http.Response, error)
}

func (b byBody) RoundTrip(req *http.Request) (*http.Response, error) {
	body, _ := io.ReadAll(req.Body)
	req.Body = io.NopCloser(strings.NewReader(string(body)))
	if strings.Contains(string(body), "long") {
		return b.long(req)
	}
	return b.short(req)
}

// A head that waits for capacity of its own (only the large deployment
// takes its prompt, and that one's window is spent) does not hold back the
// requests behind it that a free deployment can serve.
func TestAHeadWaitingForItsOwnCapacityDoesNotBlockOthers(t *testing.T) {
	c := newManualClock()
	small := deployment("small", nil)
	small.ContextWindow = 1000
	small.Transport = byBody{
		long:  reply(400, `{"error":{"message":"too long","type":"invalid_request_error","code":"context_length_exceeded"}}`),
		short: reply(200, okBody),
	}
	small.Quality = 1 // tried first
	large := deployment("large", nil)
	lp := &windowed{c: c, limit: 1, span: 20 * time.Second}
	large.Transport = lp
	r := New()
	r.Clock, r.Rand = c, func() float64 { return 0 }
	r.Deadline, r.MaxAttempts = 30*time.Second, 8
	g := NewGroup("mixed", []*Deployment{small, large})
	// Spend large's window: it states 1 per 20 s.
	large.State.Observe(c.Now(), provider.Observation{Class: provider.OK, RetryAfter: provider.Unknown, Tokens: provider.UnknownWindow,
		Requests: provider.Window{Limit: 1, Remaining: 0, Reset: 20 * time.Second}}, r.Policy)
	out := make([]served, 4)
	simulate(t, c, len(out), func(i int) {
		for g.Queued() < min(i, 1) { // the long one first, then the short ones
			time.Sleep(50 * time.Microsecond)
		}
		if i > 0 {
			for g.Queued() < 1 {
				time.Sleep(50 * time.Microsecond)
			}
		}
		req := userReq("short", DefaultPriority)
		if i == 0 {
			req = userReq("long", DefaultPriority)
		}
		start := c.Now()
		out[i] = outcomeOf(r.ServeGroup(context.Background(), g, req), c.Now().Sub(start))
	})
	if out[0].status != 200 || out[0].at < 20*time.Second {
		t.Errorf("the long request: expected 200 from large after its reset, got %+v", out[0])
	}
	for i, o := range out[1:] {
		if o.status != 200 || o.at != 0 {
			t.Errorf("short request %d: expected 200 at once from small, got %+v", i+1, o)
		}
	}
}

// A 429 tells the client that the providers' limits are spent: a request
// that ran out of time while a deployment had capacity, or was only busy
// with the router's own pacing (slow start), gets a 504 instead.
func TestNoA429WhenADeploymentHasCapacity(t *testing.T) {
	now := time.Date(2025, 8, 21, 12, 40, 0, 0, time.UTC)
	limited := scored{f: capacity.Features{At: now.Add(10 * time.Second), Why: provider.RateLimited}}
	busy := scored{f: capacity.Features{At: now.Add(100 * time.Millisecond), Why: provider.OK}}
	free := scored{f: capacity.Features{At: now, Why: provider.OK}}
	for _, c := range []struct {
		name  string
		cands []scored
		want  int
	}{
		{"all rate-limited", []scored{limited}, 429},
		{"one free", []scored{limited, free}, 504},
		{"one busy", []scored{limited, busy}, 504},
	} {
		var e *Error
		if err := queueError(c.cands, now); !errors.As(err, &e) || e.Status != c.want {
			t.Errorf("%s: expected %d, got %v", c.name, c.want, err)
		}
	}
}

// A request behind a blocked head may not take the capacity the head waits
// for: a large request waiting for a token window is not starved by small
// ones that would fit what is left of it.
func TestABlockedHeadIsNotStarved(t *testing.T) {
	c := newManualClock()
	start := c.Now()
	var mu sync.Mutex
	sent := map[string]time.Time{} // when each was sent, on the clock
	a := deployment("a", nil)
	a.Transport = roundTripFunc(func(req *http.Request) (*http.Response, error) {
		body, _ := io.ReadAll(req.Body)
		name := "small"
		if strings.Contains(string(body), "large") {
			name = "large"
		}
		mu.Lock()
		sent[name] = c.Now()
		mu.Unlock()
		return reply(200, okBody)(req)
	})
	r := New()
	r.Clock, r.Rand = c, func() float64 { return 0 }
	r.Deadline = 30 * time.Second
	g := NewGroup("tokens", []*Deployment{a})
	tok := provider.NewObservation(provider.OK)
	tok.Tokens = provider.Window{Limit: 1000, Remaining: 100, Reset: 10 * time.Second}
	a.State.Observe(c.Now(), tok, r.Policy)
	simulate(t, c, 2, func(i int) {
		req := userReq("large", DefaultPriority)
		req.Tokens = 500
		if i == 1 {
			for g.Queued() < 1 { // behind the large one
				time.Sleep(50 * time.Microsecond)
			}
			req = userReq("small", DefaultPriority)
			req.Tokens = 50
		}
		if res := r.ServeGroup(context.Background(), g, req); res.Err != nil {
			t.Errorf("request %d: %v", i, res.Err)
		}
	})
	// Both go at the reset (the renewed window holds both), in either
	// order on the wire; the small one never before it, on what is left.
	reset := start.Add(10 * time.Second)
	if large, small := sent["large"], sent["small"]; large.Before(reset) || small.Before(large) {
		t.Errorf("expected the large request sent at the reset (%v, or just after) and the small one not before it, got large at %v, small at %v",
			reset.Sub(start), large.Sub(start), small.Sub(start))
	}
}

// roundTripFunc is an http.RoundTripper of a function.
type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(req *http.Request) (*http.Response, error) { return f(req) }

// Fleet mode: a request's first place in the fleet's queue counts this
// instance's requests before it that have not joined the fleet's queue yet
// (they join after it, and go before it there): with 3 of other instances
// in the fleet's queue, one of its own joined and one not yet, it has 5
// before it (50 tokens), not 4.
func TestAFirstFleetPlaceCountsThoseNotJoinedYet(t *testing.T) {
	r, g, _, c := limitedGroup(t)
	fq := &fakeFleetQueue{others: 3}
	g.Fleet = fq
	now := c.Now()
	deadline := now.Add(r.Deadline)
	joined, notYet, me := &waiter{tokens: 10, since: now}, &waiter{tokens: 10, since: now}, &waiter{tokens: 10, since: now}
	for _, w := range []*waiter{joined, notYet, me} {
		g.queue.join(w, 1<<30)
	}
	if n, _, ok := r.fleetPlace(g, joined, true, now, deadline); !ok || n != 3 {
		t.Fatalf("the first joins behind the 3 of other instances, got %d (%v)", n, ok)
	}
	n, tok, ok := r.fleetPlace(g, me, true, now, deadline)
	if !ok || n != 5 || tok != 50 {
		t.Errorf("expected 5 before it (3 of other instances, 2 of its own), 50 tokens, got %d and %d (%v)", n, tok, ok)
	}
	leaveFleet(g, joined, false)
	if joined.inFleet.Load() || len(fq.members) != 1 {
		t.Errorf("a request that left the fleet's queue is no longer in it: %v, %d members", joined.inFleet.Load(), len(fq.members))
	}
}

// A window that resets past MaxCooldown serves nothing before it: the
// instant the request is servable is told as MaxCooldown from now (the
// longest Retry-After the router gives), and the search ends there.
func TestServableAtPastMaxCooldown(t *testing.T) {
	r, g, c := cRouterC(1)
	now := c.Now()
	cRequestsC(r, g.Deployments[0], now, 1, 0, 30*24*time.Hour) // 1 a month, spent
	cands := []scored{cCandC(0, now.Add(time.Second), provider.RateLimited, 0)}
	done := make(chan time.Time, 1)
	go func() { done <- r.servableAt(g.Deployments, cands, 1, 10, 0, now, now, false) }()
	select {
	case at := <-done:
		if at.Sub(now) != provider.MaxCooldown {
			t.Errorf("expected MaxCooldown (%v) from now, got %v", provider.MaxCooldown, at.Sub(now))
		}
	case <-time.After(10 * time.Second):
		t.Fatal("servableAt did not return within 10 s")
	}
}
