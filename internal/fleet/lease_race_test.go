package fleet

import (
	"testing"
	"time"

	"github.com/llmrouter/caddy-llm-router/internal/capacity"
)

// An attempt's grant covers what its slice lacked when it asked; another
// attempt that spent from the slice while the call was in flight leaves
// the slice short of the first one's need when the grant lands. The first
// then goes only if the slice holds its need, never on units the window
// did not grant (before: a window of 400 granted, 500 spent).
func TestAGrantSpendsOnlyWhatTheSliceHolds(t *testing.T) {
	t0 := time.Unix(1_800_000_000, 0)
	f := &fakeWindow{left: 1000, reset: t0.Add(60 * time.Second).UnixMilli()}
	l := &leaser{}
	bu := capacity.Budget{Requests: capacity.BudgetWindow{Limit: 1000, N: 1}, Tokens: capacity.BudgetWindow{Limit: -1}}
	for range 1000 { // a demand the allowance covers: none of it bounds this test
		l.want(t0, [2]int64{1, -1}, bu)
	}
	f.grant(l, t0, [2]int64{0, -1}, [2]int64{250, 0}, [2]int64{}, 1) // a slice of 250
	if got := l.w[0].left(t0); got != 250 {
		t.Fatalf("expected a slice of 250, holds %d", got)
	}
	// A needs 400: its call asks for the 150 the slice lacks.
	a := [2]int64{400, -1}
	miss, _ := l.asks(t0, a)
	if miss[0] != 150 {
		t.Fatalf("expected A to miss 150, misses %d", miss[0])
	}
	l.stating(t0, a, miss)
	// B spends 100 of the slice while A's call is in flight.
	if ok, _ := l.take(t0, [2]int64{100, -1}); !ok {
		t.Fatal("expected B served from the slice")
	}
	// The window grants A just what it asked.
	f.left -= 150
	rep := grantReply{ok: true, asked: [2]bool{true, false}, reset: [2]int64{f.reset, 0}, instances: 1,
		now: t0.UnixMilli(), kept: true, granted: [2]int64{150, 0}, left: [2]int64{f.left, 0}}
	ok := l.applyFor(t0, rep, a)
	sl := l.w[0]
	t.Logf("A served %v; the slice granted %d, spent %d", ok, sl.granted, sl.spent)
	if sl.spent > sl.granted {
		t.Errorf("expected no more spent than the window granted (%d), spent %d", sl.granted, sl.spent)
	}
	if ok {
		t.Error("expected A not served on the 400 the slice no longer held (300)")
	}
	if got := l.w[0].left(t0); got != 300 {
		t.Errorf("expected the slice to keep the 300 it holds for A's next look, holds %d", got)
	}
}
