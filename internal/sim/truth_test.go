package sim

import (
	"testing"
	"time"

	"github.com/llmrouter/caddy-llm-router/internal/router"
)

// The simulation's truth is tested too: a wrong window or ideal would
// fail the router for the simulator's fault.

var epoch = time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)

func at(d time.Duration) time.Time { return epoch.Add(d) }

func TestWindowShapes(t *testing.T) {
	for _, c := range []struct {
		shape            shape
		roomAt5, roomAt9 int64         // after 10 taken at 1 s
		resetAt5         time.Duration // the countdown stated at 5 s
		earliestAt5      time.Duration // when one more fits, from 5 s
	}{
		{aligned, 0, 0, 5 * time.Second, 10 * time.Second},
		{fromFirst, 0, 0, 6 * time.Second, 11 * time.Second},
		{bucket, 4, 8, 6 * time.Second, 5 * time.Second},
	} {
		w := newWindow(requests(10, 10*time.Second, c.shape))
		for range 10 {
			w.take(at(time.Second), 1)
		}
		if got := w.reset(at(5 * time.Second)); got != c.resetAt5 {
			t.Errorf("%v: reset at 5 s = %v, want %v", c.shape, got, c.resetAt5)
		}
		if got := w.earliest(at(5*time.Second), 1).Sub(epoch); got != c.earliestAt5 {
			t.Errorf("%v: one more fits at %v, want %v", c.shape, got, c.earliestAt5)
		}
		if got := w.room(at(5 * time.Second)); got != c.roomAt5 {
			t.Errorf("%v: room at 5 s = %d, want %d", c.shape, got, c.roomAt5)
		}
		if got := w.room(at(9 * time.Second)); got != c.roomAt9 {
			t.Errorf("%v: room at 9 s = %d, want %d", c.shape, got, c.roomAt9)
		}
		if got := w.room(at(11 * time.Second)); got != 10 {
			t.Errorf("%v: room at 11 s = %d, want 10", c.shape, got)
		}
	}
}

// TestIdealServesWindowsInOrder: a burst of 30 on 10 requests per 10 s
// (aligned) with a 25 s deadline is served 10 at 0 s, 10 at 10 s and 10
// at 20 s; with a 15 s deadline, 20.
func TestIdealServesWindowsInOrder(t *testing.T) {
	for _, c := range []struct {
		deadline time.Duration
		want     int
	}{{25 * time.Second, 30}, {15 * time.Second, 20}, {5 * time.Second, 10}} {
		p := healthy("p", "gpt-sim", openAI{}, 100*time.Millisecond, requests(10, 10*time.Second, aligned))
		w := &world{start: epoch, sc: &setup{providers: []*provider{p}}}
		p.start(w)
		w.router = &router.Router{Deadline: c.deadline}
		w.snapshot()
		for i := range 30 {
			w.outcomes = append(w.outcomes, &outcome{id: i, tokens: 10, words: 8})
		}
		if got := w.ideal(); got != c.want {
			t.Errorf("deadline %v: ideal serves %d, want %d", c.deadline, got, c.want)
		}
	}
}
