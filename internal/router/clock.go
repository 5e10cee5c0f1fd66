package router

import (
	"context"
	"time"
)

// Clock is the router's time source: the instant used for deadlines and
// capacity state, the waits between attempts, and the timers that bound an
// attempt (timeout, ttft_timeout, the deadline) and a stream's silences
// (idle_timeout). Tests inject a fake one so that waits are measured, not
// slept.
type Clock interface {
	Now() time.Time
	// Sleep waits d, or until ctx is done (returning ctx.Err()).
	Sleep(ctx context.Context, d time.Duration) error
	// AfterFunc calls f in its own goroutine once d has passed, unless the
	// timer is stopped first.
	AfterFunc(d time.Duration, f func()) Timer
}

// Timer is a timer made by Clock.AfterFunc.
type Timer interface {
	// Stop prevents the call, if it has not happened; it reports whether
	// it did prevent it.
	Stop() bool
	// Reset makes the timer call its function once d has passed from now.
	Reset(d time.Duration) bool
}

// RealClock is the wall clock; Sleep waits on a timer in a select with
// ctx.Done(), so a client that leaves ends the wait at once.
type RealClock struct{}

// Now implements Clock.
func (RealClock) Now() time.Time { return time.Now() }

// AfterFunc implements Clock with time.AfterFunc.
func (RealClock) AfterFunc(d time.Duration, f func()) Timer { return time.AfterFunc(d, f) }

// Sleep implements Clock.
func (RealClock) Sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
