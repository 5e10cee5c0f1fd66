package sim

import (
	"net/http"
	"testing"
	"testing/synctest"
	"time"
)

// twin is two true windows that state the same headers to a scenario's
// warm-up, made at the run's start (a clock boundary: synctest's clock
// starts at midnight), so that no scheduler that sees only the wire can
// tell them apart until the burst's first answer comes, a latency (90 ms
// at least: 0.9 of the scenarios' 100 ms) after the burst arrived; yet the ideal scheduler serves
// the burst differently on each. Every request a run cannot serve must be
// told within quick429 of its arrival (before that first answer), and
// served must reach 99% of the ideal: a deterministic router makes one
// decision for both, and fails on one of the two (see knownFailing).
type twin struct {
	name     string
	dl       dialect
	a, b     limit
	cost     int64         // what a request costs the windows (the warm-up's too)
	n        int           // requests in the burst
	deadline time.Duration // the router's
	idealA   int           // what the ideal serves on a
	idealB   int           // and on b
}

// twins are the failing seeds of rounded-resets, token-window and
// window-roll's 100 ms answers, each with its twin (the scenario's own
// draws: the dialect, the shape).
var twins = []twin{
	// window-roll, bucket, 100 ms answers (seed 19): "9 left, 1s" is a
	// bucket's of 10 per 10 s, one a second (the burst at 11.1 s: the
	// 10 it holds, then one a second to the 30.1 s deadline), and the
	// first request's of a window of 10 per second that starts with it
	// (every one of the 60).
	{name: "window-roll bucket/from-first 1 s, OpenAI", dl: openAI{},
		a: requests(10, 10*time.Second, bucket), b: requests(10, time.Second, fromFirst),
		cost: 1, n: 60, deadline: 30*time.Second + 100*time.Millisecond, idealA: 39, idealB: 60},
	// rounded-resets, aligned: the warm-up at the window's boundary
	// states "10" as a from-first window's first request does. Aligned:
	// the burst at 11.1 s is served at 11.1, 20, 30 and 40 s (40); from
	// the first: at 11.1, 21.1 and 31.1 s, the next window at the
	// deadline (30).
	{name: "rounded-resets aligned/from-first", dl: floorSecs{plain: true},
		a: requests(10, 10*time.Second, aligned), b: requests(10, 10*time.Second, fromFirst),
		cost: 1, n: 60, deadline: 30 * time.Second, idealA: 40, idealB: 30},
	{name: "rounded-resets aligned/from-first, Go durations", dl: floorSecs{},
		a: requests(10, 10*time.Second, aligned), b: requests(10, 10*time.Second, fromFirst),
		cost: 1, n: 60, deadline: 30 * time.Second, idealA: 40, idealB: 30},
	// token-window, aligned: the same with 949-token requests, four to
	// a 4,000-token window, 20 s deadline: 12 against 8.
	{name: "token-window aligned/from-first, OpenAI", dl: openAI{},
		a: tokens(4000, 10*time.Second, aligned), b: tokens(4000, 10*time.Second, fromFirst),
		cost: 949, n: 30, deadline: 20 * time.Second, idealA: 12, idealB: 8},
	{name: "token-window aligned/from-first, Anthropic", dl: anthropic{},
		a: tokens(4000, 10*time.Second, aligned), b: tokens(4000, 10*time.Second, fromFirst),
		cost: 949, n: 30, deadline: 20 * time.Second, idealA: 12, idealB: 8},
	// token-window, bucket, Anthropic: its reset is an instant in whole
	// seconds, "full at 00:00:03" both for a bucket of 4,000 per 10 s
	// (949 in 2.37 s) and for one of 4,000 per 12.5 s (2.97 s): 12
	// against 10.
	{name: "token-window bucket 10 s/12.5 s, Anthropic", dl: anthropic{},
		a: tokens(4000, 10*time.Second, bucket), b: tokens(4000, 12500*time.Millisecond, bucket),
		cost: 949, n: 30, deadline: 20 * time.Second, idealA: 12, idealB: 10},
	// token-window, bucket, OpenAI: "3051 left, 2.373s" is a bucket's
	// 949 tokens at 400 per second, and the first request of a window of
	// 4,000 per 2.3725 s that starts with it (a shape PROVIDERS.md does
	// not name; the simulation's windows from the first request are 10 s
	// long, which the router does not know): 12 against every one. The
	// router takes PROVIDERS.md's side (offTheClock): these seeds pass.
	{name: "token-window bucket/from-first 2.3725 s, OpenAI", dl: openAI{},
		a: tokens(4000, 10*time.Second, bucket), b: tokens(4000, 2372500*time.Microsecond, fromFirst),
		cost: 949, n: 30, deadline: 20 * time.Second, idealA: 12, idealB: 30},
}

// TestTwinsTheWireCannotTellApart checks the premises of knownFailing's
// proof: each twin's warm-up statements are the same, byte for byte, and
// its ideal counts differ as stated.
func TestTwinsTheWireCannotTellApart(t *testing.T) {
	for _, tw := range twins {
		t.Run(tw.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				start := time.Now()
				a, b := newWindow(tw.a), newWindow(tw.b)
				ha, hb := warmUpStatement(tw.dl, a, start, tw.cost), warmUpStatement(tw.dl, b, start, tw.cost)
				for k := range ha {
					if ha.Get(k) != hb.Get(k) {
						t.Errorf("%s: %q against %q: the wire tells them apart", k, ha.Get(k), hb.Get(k))
					}
				}
				if len(ha) != len(hb) || len(ha) == 0 {
					t.Errorf("statements %v and %v", ha, hb)
				}
				// The burst, as warmUp sends it: a span and a second after
				// the warm-up's answer (100 ms at least).
				burst := start.Add(100*time.Millisecond + 11*time.Second)
				if got := idealOf(a, burst, tw); got != tw.idealA {
					t.Errorf("ideal on %v: %d, want %d", tw.a.shape, got, tw.idealA)
				}
				if got := idealOf(b, burst, tw); got != tw.idealB {
					t.Errorf("ideal on %v: %d, want %d", tw.b.shape, got, tw.idealB)
				}
			})
		})
	}
}

// warmUpStatement is what w states to a warm-up of cost admitted at at.
func warmUpStatement(dl dialect, w *window, at time.Time, cost int64) http.Header {
	h := http.Header{}
	w.take(at, cost)
	dl.state(h, []*window{w}, at)
	return h
}

// idealOf is how many of tw's burst, arriving at burst, the ideal serves
// on w, each answered 200 ms after it starts (the scenarios' 100 ms
// latency and 16 or fewer words, at most).
func idealOf(w *window, burst time.Time, tw twin) int {
	ws := []*window{w.clone()}
	last, served := burst, 0
	for range tw.n {
		at, ok := admits(ws, last, tw.cost)
		if !ok || at.Add(200*time.Millisecond).After(burst.Add(tw.deadline)) {
			continue
		}
		ws[0].take(at, tw.cost)
		last, served = at, served+1
	}
	return served
}
