package fleet

import (
	"context"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"

	"github.com/llmrouter/caddy-llm-router/internal/capacity"
)

// A provider window that starts at its first request (llm_mock's, and
// many providers'; PROVIDERS.md) began when the first request after the
// last one ended was sent, not a span after that last reset: the fleet's
// budget rolls a window whose reset passed to a span after the call for
// its next attempt, as one instance alone does (capacity's nextReset, the
// later of the two). Here the warm-up's window
// of 10 requests per 10 s ended 9.8 s ago; two instances then spend the
// next window from its first request: the window of 10 is full, and 0.5 s
// later (the provider's window has 9.5 s to go) the fleet still holds it
// spent. Rolled a span after the old reset, it was full again 0.25 s after
// the first request, and the fleet granted 20 within the provider's window
// of 10 (issue 30's burst: 379 sent in the first 300 ms of a window of
// 200).
func TestARolledWindowStartsAtItsFirstRequest(t *testing.T) {
	backends(t, func(t *testing.T, url string, m *miniredis.Miniredis) {
		const span = 10 * time.Second
		bs := endedWindow(t, url, 3, 9800*time.Millisecond)
		// Each instance's own window: rolled at its first attempt, a
		// span after it (capacity's nextReset).
		spend := func(n int) (int, time.Duration) {
			return spendAlternately(t, bs, capacity.Budget{Requests: statedWindow(10, span), Tokens: capacity.BudgetWindow{Limit: -1}}, n)
		}
		first := time.Now() // the provider's window starts with the first request
		if served, _ := spend(20); served != 10 {
			t.Fatalf("expected the new window's 10 served, got %d", served)
		}
		time.Sleep(time.Until(first.Add(500 * time.Millisecond)))
		served, wait := spend(20)
		if served != 0 {
			t.Errorf("expected nothing more within the provider's window (it ends 10 s after its first request), got %d more", served)
		}
		if left := time.Until(first.Add(span)); wait < left-time.Second {
			t.Errorf("expected a refusal until the provider's window ends (%v), got %v", left, wait)
		}
	})
}

// endedWindow returns two instances' bindings on one budget hash that
// holds a warm-up's window of 10 requests, left as it was when it ended
// ago (on Redis' clock).
func endedWindow(t *testing.T, url string, left int64, ago time.Duration) []*binding {
	t.Helper()
	bs := patientBindings(t, url, 2)
	ended := time.Now().Add(-ago)
	if err := bs[0].s.client.HSet(context.Background(), bs[0].budgetKey, "r_left", left, "r_reset", ended.UnixMilli()).Err(); err != nil {
		t.Fatal(err)
	}
	return bs
}

// spendAlternately spends n attempts of bu, one instance after the other,
// and returns how many were served and the last refusal's wait.
func spendAlternately(t *testing.T, bs []*binding, bu capacity.Budget, n int) (served int, wait time.Duration) {
	t.Helper()
	for i := range n {
		w, _, err := bs[i%len(bs)].Spend(bu)
		if err != nil {
			t.Fatalf("spend: %v", err)
		}
		if w == 0 {
			served++
		} else {
			wait = w
		}
	}
	return served, wait
}

// What an instance knows of the window after the one that ended holds in
// the fleet's budget when the script rolls it: the instance counts 2 of
// its last attempts against it (sent within the uncertainty of the old
// reset: the provider's window may have rolled before them), and projects
// its end 300 ms later than the script would. The roll took neither (the
// instance's reset was compared with the hash's before it): 10 served,
// and the window's end a span from now.
func TestARolledWindowTakesTheInstancesCount(t *testing.T) {
	backends(t, func(t *testing.T, url string, m *miniredis.Miniredis) {
		const span = 10 * time.Second
		bs := endedWindow(t, url, 3, 9800*time.Millisecond)
		w := statedWindow(10, span+300*time.Millisecond)
		w.Remaining, w.Span = 8, span
		start := time.Now()
		served, wait := spendAlternately(t, bs, capacity.Budget{Requests: w, Tokens: capacity.BudgetWindow{Limit: -1}}, 20)
		if served != 8 {
			t.Errorf("expected the 8 the instance counts left of the new window served, got %d", served)
		}
		if end := time.Until(start.Add(span + 300*time.Millisecond)); wait < end-100*time.Millisecond {
			t.Errorf("expected a refusal until the instance's later reset (%v), got %v", end, wait)
		}
	})
}

// Only a call that asks for a window starts its next span: a background
// call that renews another window (tokens) while the requests window's
// reset passed leaves the requests window as it is, since its first
// request may come much later. Here it came 1.2 s after such a call, on
// a window of 2 s; rolled by that call, the window was full again 2.05 s
// after it, within the provider's window that the first request started,
// and the fleet granted it twice.
func TestOnlyAnAttemptsCallRollsItsWindow(t *testing.T) {
	backends(t, func(t *testing.T, url string, m *miniredis.Miniredis) {
		const span = 2 * time.Second
		bs := endedWindow(t, url, 0, 100*time.Millisecond)
		old := capacity.BudgetWindow{Limit: 10, Remaining: 0, Reset: time.Now().Add(-100 * time.Millisecond), Span: span, N: 1}
		tokens := capacity.BudgetWindow{Limit: 10_000, Remaining: 10_000, Reset: time.Now().Add(span), Span: span, N: 100}
		if _, err := bs[0].grant(context.Background(), capacity.Budget{Requests: old, Tokens: tokens},
			[2]int64{0, 0}, [2]int64{0, 100}, [2]int64{}, [2]int64{}, [2]int64{-1, -1}); err != nil {
			t.Fatal(err)
		}
		time.Sleep(1200 * time.Millisecond)
		first := time.Now() // the provider's window starts with the first request
		bu := capacity.Budget{Requests: statedWindow(10, span), Tokens: capacity.BudgetWindow{Limit: -1}}
		if served, _ := spendAlternately(t, bs, bu, 20); served != 10 {
			t.Fatalf("expected the new window's 10 served, got %d", served)
		}
		time.Sleep(time.Until(first.Add(1300 * time.Millisecond)))
		if served, _ := spendAlternately(t, bs, bu, 20); served != 0 {
			t.Errorf("expected nothing more within the provider's window (it ends 2 s after its first request), got %d more", served)
		}
	})
}
