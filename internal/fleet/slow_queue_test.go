package fleet

import (
	"slices"
	"sync"
	"testing"
	"time"
)

// A Redis that answers the queue's calls late, about the store's timeout
// (as TestALateRedisHoldsNoRequestPastTimeout's): 16 requests join the
// fleet's queue together and look at their places every 20 ms, 10 times,
// as waiting requests do. Each waits on Redis one timeout and slack at
// most in all: once a call answered late, the looks that follow are
// answered at once (each its last place: TestALateLookIsAnsweredItsLastPlace)
// and a probe goes to Redis instead, until a call answers sooner.
func TestALateRedisHoldsNoQueuedRequestPastTimeout(t *testing.T) {
	for name, h := range lateReplies {
		t.Run(name, func(t *testing.T) {
			b := lateBinding(t, h)
			q := b.s.Queue("limited", []string{testIdentity})
			atStore := make([]time.Duration, 16)
			joins := make([]Joining, len(atStore))
			for i := range joins {
				joins[i] = Joining{Priority: 0, MaxPriority: 10, Arrival: time.Now(), Order: uint64(i), Wait: 10 * time.Second}
			}
			start := time.Now()
			q.JoinAll(joins)
			joined := time.Since(start)
			var wg sync.WaitGroup
			for i := range atStore {
				atStore[i] = joined
				wg.Go(func() {
					for range 10 {
						if joins[i].Err == nil {
							start := time.Now()
							_, _, _ = q.Ahead(joins[i].Member, false)
							atStore[i] += time.Since(start)
						}
						time.Sleep(20 * time.Millisecond)
					}
					if joins[i].Err == nil {
						q.Leave(joins[i].Member)
					}
				})
			}
			wg.Wait()
			t.Logf("longest time at the store for one request: %v (timeout %v)", slices.Max(atStore), stallTimeout)
			for i, d := range atStore {
				if d > stallTimeout+35*time.Millisecond {
					t.Errorf("request %d waited %v on Redis in all for its place (timeout %v)", i, d, stallTimeout)
				}
			}
		})
	}
}

// While Redis answers late, a waiting request's look is answered the
// place it was last told, not "the store cannot tell": the request goes
// on counting its place fleet-wide (its router then forecasts the fleet's
// whole windows for it, not this instance's share of them, which told
// requests the fleet could serve 429 early: trial38b). A member that left
// is not answered a place.
func TestALateLookIsAnsweredItsLastPlace(t *testing.T) {
	b := patientBindings(t, realRedisURL(t), 1)[0]
	b.s.timeout = stallTimeout
	q := b.s.Queue("limited", []string{testIdentity})
	joins := make([]Joining, 3)
	for i := range joins {
		joins[i] = Joining{MaxPriority: 10, Arrival: time.Now(), Order: uint64(i), Wait: 10 * time.Second}
	}
	q.JoinAll(joins)
	for i, j := range joins {
		if j.Err != nil || j.Ahead != int64(i) {
			t.Fatalf("join %d: expected place %d, got %d (%v)", i, i, j.Ahead, j.Err)
		}
	}
	b.s.client.AddHook(lateReplies["within timeout"])
	if n, _, err := q.Ahead(joins[2].Member, false); err != nil || n != 2 {
		t.Fatalf("the late look itself: expected place 2, got %d (%v)", n, err)
	}
	start := time.Now()
	n, _, err := q.Ahead(joins[2].Member, false)
	if took := time.Since(start); err != nil || n != 2 || took > 10*time.Millisecond {
		t.Errorf("expected the look after a late one answered its last place (2) at once, got %d (%v) in %v", n, err, took)
	}
	q.Leave(joins[1].Member)
	if _, _, err := q.Ahead(joins[1].Member, false); err == nil {
		t.Error("expected a member that left answered no place")
	}
}
