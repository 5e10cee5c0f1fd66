package router

import (
	"context"
	"sync"
	"time"
)

// idleWatch bounds a stream leg's waits on its provider by idle_timeout
// with one timer for the whole leg, where a timer reset and stopped
// around every read cost a tenth of a relayed event's CPU (issue 32).
// Each wait notes when it began and what of idle_timeout it may use
// (begin), its end what the next may use (end). When the timer fires
// during a wait, it cancels the leg's attempt with errIdleTimeout if the
// wait has used what it may, and otherwise sets itself for what is left;
// when it fires between waits (the client was reading), the next wait
// sets it. It may fire early, never late: a wait may use no more than
// the timer was set for from its start, since what a wait may use only
// grows from one wait to the next, less the time the last one took.
type idleWatch struct {
	clock  Clock
	cancel context.CancelCauseFunc
	timer  Timer

	mu      sync.Mutex
	waiting bool
	armed   bool          // the timer is set
	since   time.Time     // when the wait in progress began
	left    time.Duration // what of idle_timeout that wait (or the next) may use
	done    bool          // stopped, or the attempt cancelled
}

// newIdleWatch returns the watch of a leg whose attempt cancel ends, its
// timer set for left, its first wait's.
func newIdleWatch(clock Clock, cancel context.CancelCauseFunc, left time.Duration) *idleWatch {
	w := &idleWatch{clock: clock, cancel: cancel, left: left, armed: true}
	w.mu.Lock() // fire reads w.timer
	w.timer = clock.AfterFunc(left, w.fire)
	w.mu.Unlock()
	return w
}

// begin notes that a wait that may use left begins at now.
func (w *idleWatch) begin(now time.Time, left time.Duration) {
	w.mu.Lock()
	w.waiting, w.since, w.left = true, now, left
	if !w.armed {
		w.armed = true
		w.timer.Reset(left)
	}
	w.mu.Unlock()
}

// end notes that the wait ended, and that the next may use left.
func (w *idleWatch) end(left time.Duration) {
	w.mu.Lock()
	w.waiting, w.left = false, left
	w.mu.Unlock()
}

// stop ends the watch: its timer cancels nothing from now on.
func (w *idleWatch) stop() {
	w.mu.Lock()
	w.done = true
	w.mu.Unlock()
	w.timer.Stop()
}

func (w *idleWatch) fire() {
	w.mu.Lock()
	rest := w.left - w.clock.Now().Sub(w.since)
	spent := w.waiting && !w.done && rest <= 0
	switch {
	case w.done:
	case !w.waiting:
		w.armed = false // the next wait sets it
	case spent:
		w.done = true
	default:
		w.timer.Reset(rest)
	}
	w.mu.Unlock()
	if spent {
		w.cancel(errIdleTimeout)
	}
}
