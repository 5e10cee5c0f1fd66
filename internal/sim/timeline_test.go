package sim

import (
	"context"
	"slices"
	"testing/synctest"
	"time"

	"github.com/llmrouter/caddy-llm-router/internal/router"
)

// timeline gives every timer of a run (a provider's delivery or stream
// word, an SDK's retry, the router's waits and timers through its Clock)
// an instant of its own: the first free nanosecond at or after
// the one asked. In a synctest bubble, timers that fire at one instant
// wake their goroutines together, to run in any order; with no two
// timers at one instant, each wakes alone, and a seed replays the same
// trace (TESTING.md, "Determinism"). A few nanoseconds late is no change
// a provider or the router could see. What wakes at one instant anyway
// (a burst's arrivals, the waiters one kick wakes) goes on through yield.
type timeline struct {
	taken map[int64]bool // the instants (UnixNano) given, from now on
	given int            // how many since the last pruning
}

// slot takes the first free instant at or after t; w.mu is held.
func (tl *timeline) slot(t, now time.Time) time.Time {
	if tl.taken == nil {
		tl.taken = map[int64]bool{}
	}
	if tl.given++; tl.given >= 4096 { // forget the instants past
		tl.given = 0
		for at := range tl.taken {
			if at < now.UnixNano() {
				delete(tl.taken, at)
			}
		}
	}
	at := max(t.UnixNano(), now.UnixNano()+1)
	for tl.taken[at] {
		at++
	}
	tl.taken[at] = true
	return time.Unix(0, at)
}

// after is how long from now until the instant of its own that is d
// from now.
func (w *world) after(d time.Duration) time.Duration {
	now := time.Now()
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.timeline.slot(now.Add(d), now).Sub(now)
}

// sleep waits d (to an instant of its own) or until ctx ends; it reports
// whether d passed.
func (w *world) sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(w.after(d))
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// requestKey is the context key of a client request's number.
type requestKey struct{}

// turnstile lets the goroutines that yield at one instant go on one at a
// time, in the order of their requests' numbers (w.mu).
type turnstile struct {
	waiting []turn
	turning bool // a release runs
}

// turn is a goroutine waiting in the turnstile: its request's number,
// closed when it may go on.
type turn struct {
	id   int
	next chan struct{}
}

// yield waits, at this instant, until every goroutine of the run that
// yields now is waiting or blocked, then goes on in its turn: by the
// number of the request of ctx (requestKey; the warm-up's is -1), each
// when the one before has blocked again. Goroutines that one event woke
// together (the waiters a queue kicks at once, a client and the router
// finishing its request) so go on in a determined order, whatever order
// they ran in to get here.
func (w *world) yield(ctx context.Context) {
	id, _ := ctx.Value(requestKey{}).(int)
	t := turn{id: id, next: make(chan struct{})}
	w.mu.Lock()
	w.turns.waiting = append(w.turns.waiting, t)
	start := !w.turns.turning
	w.turns.turning = true
	w.mu.Unlock()
	if start {
		go w.release()
	}
	<-t.next
}

// release lets the turnstile's goroutines go, the lowest number first,
// each once every other goroutine is durably blocked (synctest.Wait): the
// only caller of synctest.Wait in a run, one at a time.
func (w *world) release() {
	for {
		synctest.Wait()
		w.mu.Lock()
		if len(w.turns.waiting) == 0 {
			w.turns.turning = false
			w.mu.Unlock()
			return
		}
		k := 0
		for i, t := range w.turns.waiting {
			if t.id < w.turns.waiting[k].id {
				k = i
			}
		}
		t := w.turns.waiting[k]
		w.turns.waiting = slices.Delete(w.turns.waiting, k, k+1)
		w.mu.Unlock()
		close(t.next)
	}
}

// clock is the router's Clock in a run: the bubble's time, each wait and
// timer at an instant of its own.
type clock struct{ w *world }

func (c clock) Now() time.Time { return time.Now() }

// Sleep waits to an instant of its own; a wait that ctx ends (a queue's
// kick, a request given up) then yields: waiters kicked at once go on one
// at a time, in the order of their requests' numbers.
func (c clock) Sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	if !c.w.sleep(ctx, d) {
		c.w.yield(ctx)
		return ctx.Err()
	}
	return nil
}

func (c clock) AfterFunc(d time.Duration, f func()) router.Timer {
	return timer{w: c.w, t: time.AfterFunc(c.w.after(d), f)}
}

// timer is a clock's AfterFunc: Reset, too, to an instant of its own.
type timer struct {
	w *world
	t *time.Timer
}

func (t timer) Stop() bool { return t.t.Stop() }

func (t timer) Reset(d time.Duration) bool { return t.t.Reset(t.w.after(d)) }
