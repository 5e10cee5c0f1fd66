package sim

import (
	"math"
	"time"
)

// shape is how a provider's window renews (PROVIDERS.md, "When a
// rate-limit statement is made").
type shape uint8

const (
	// aligned: fixed windows back to back from the epoch (clock minutes):
	// the count is back to its limit at each boundary.
	aligned shape = iota
	// fromFirst: a fixed window that starts with the first request after
	// the last one ended.
	fromFirst
	// bucket: refilled continuously, limit per span (OpenAI, Anthropic).
	bucket
)

func (s shape) String() string { return [...]string{"aligned", "from-first", "bucket"}[s] }

// limit is one of a provider's true windows: limit requests (or tokens)
// per span.
type limit struct {
	tokens bool // counts tokens (the request's estimate); else requests
	max    int64
	span   time.Duration
	shape  shape
}

// window is a limit's state: for a fixed window its start and what it
// used, for a bucket its level at an instant.
type window struct {
	limit
	start time.Time // fixed: the window's start (zero: none yet)
	used  int64     // fixed
	level float64   // bucket: what is left at at
	at    time.Time // bucket
}

func newWindow(l limit) *window { return &window{limit: l, level: float64(l.max)} }

// roll brings the window to now.
func (w *window) roll(now time.Time) {
	switch w.shape {
	case aligned:
		if start := now.Truncate(w.span); start != w.start {
			w.start, w.used = start, 0
		}
	case fromFirst:
		if !w.start.IsZero() && !now.Before(w.start.Add(w.span)) {
			w.start, w.used = time.Time{}, 0
		}
	case bucket:
		if !w.at.IsZero() {
			rate := float64(w.max) / float64(w.span)
			w.level = math.Min(float64(w.max), w.level+rate*float64(now.Sub(w.at)))
		}
		w.at = now
	}
}

// room is what the window admits at now.
func (w *window) room(now time.Time) int64 {
	w.roll(now)
	if w.shape == bucket {
		return int64(w.level)
	}
	return w.max - w.used
}

// take spends n at now (room must be checked first).
func (w *window) take(now time.Time, n int64) {
	w.roll(now)
	switch w.shape {
	case bucket:
		w.level -= float64(n)
	case fromFirst:
		if w.start.IsZero() {
			w.start = now
		}
		fallthrough
	default:
		w.used += n
	}
}

// cost is what a request of tokens costs the window.
func (w *window) cost(tokens int64) int64 {
	if w.tokens {
		return tokens
	}
	return 1
}

// reset is the countdown a provider states at now: until the window is
// back to its limit (a fixed window's end; a bucket full again).
func (w *window) reset(now time.Time) time.Duration {
	w.roll(now)
	switch {
	case w.shape == bucket:
		rate := float64(w.max) / float64(w.span)
		return time.Duration(math.Ceil((float64(w.max) - w.level) / rate))
	case w.start.IsZero():
		return 0
	}
	return w.start.Add(w.span).Sub(now)
}

// fits reports whether a request of n can ever pass the window.
func (w *window) fits(n int64) bool { return n <= w.max }

// earliest is the first instant from now at which the window admits n
// (n must fit).
func (w *window) earliest(now time.Time, n int64) time.Time {
	if w.room(now) >= n {
		return now
	}
	if w.shape == bucket {
		rate := float64(w.max) / float64(w.span)
		return now.Add(time.Duration(math.Ceil((float64(n) - w.level) / rate)))
	}
	return w.start.Add(w.span)
}

// clone is a copy of the window's state.
func (w *window) clone() *window { c := *w; return &c }
