package router

import (
	"context"
	"time"
)

// Clock is the router's time source: the instant used for deadlines and
// capacity state, and the waits between attempts. Tests inject a fake one so
// that waits are measured, not slept.
type Clock interface {
	Now() time.Time
	// Sleep waits d, or until ctx is done (returning ctx.Err()).
	Sleep(ctx context.Context, d time.Duration) error
}

// RealClock is the wall clock; Sleep waits on a timer in a select with
// ctx.Done(), so a client that leaves ends the wait at once.
type RealClock struct{}

// Now implements Clock.
func (RealClock) Now() time.Time { return time.Now() }

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
