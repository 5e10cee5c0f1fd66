package capacity

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/llmrouter/caddy-llm-router/provider"
)

// Ranking reads every deployment's features for every attempt: once the
// state is read, reading it again takes no lock, so that a request holding
// a deployment's lock (an answer being observed) holds no ranking up.
func TestReadFeaturesTakesNoLock(t *testing.T) {
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	s := NewState()
	o := provider.NewObservation(provider.OK)
	o.Requests = provider.Window{Limit: 100, Remaining: 50, Reset: time.Minute}
	s.Observe(now, o, DefaultPolicy)
	var f Features
	s.ReadFeatures(&f, now, 100, false)
	s.ReadFeatures(&f, now, 100, false) // read again unchanged: publishes the state's view
	s.mu.Lock()
	done := make(chan Features, 1)
	go func() {
		var g Features
		s.ReadFeatures(&g, now.Add(time.Second), 100, false)
		done <- g
	}()
	select {
	case g := <-done:
		if !near(g.Headroom, 0.49) {
			t.Errorf("expected headroom (50-1)/100 read without the lock, got %+v", g)
		}
	case <-time.After(5 * time.Second):
		t.Error("ReadFeatures waited 5 s for the state's lock")
	}
	s.mu.Unlock()
}

// What the lock-free read gives is what the locked read gives, after every
// kind of change to the state: a change that left an old view published
// would show here.
func TestFeaturesViewMatchesLockedRead(t *testing.T) {
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	rng := rand.New(rand.NewPCG(32, 1))
	classes := []provider.Class{provider.OK, provider.RateLimited, provider.Server, provider.Overloaded}
	s := NewState()
	var held []Attempt
	for step := range 2000 {
		switch rng.IntN(9) {
		case 0, 1:
			if a, ok := s.AcquireAttempt(now, int64(rng.IntN(3000))); ok {
				held = append(held, a)
			}
		case 2:
			if len(held) > 0 {
				s.ReleaseAttempt(held[0])
				held = held[1:]
			}
		case 3, 4:
			o := provider.NewObservation(classes[rng.IntN(len(classes))])
			if rng.IntN(2) == 0 {
				o.Requests = provider.Window{Limit: 100, Remaining: int64(rng.IntN(101)), Reset: time.Duration(rng.IntN(60)+1) * time.Second}
				o.Tokens = provider.Window{Limit: 10000, Remaining: int64(rng.IntN(10001)), Reset: time.Minute}
			}
			s.Observe(now, o, DefaultPolicy)
		case 5:
			s.RecordLatency(time.Duration(rng.IntN(2000))*time.Millisecond, time.Duration(rng.IntN(500))*time.Millisecond)
		case 6:
			s.Disable(now, rng.IntN(4) == 0)
		case 7:
			now = now.Add(time.Duration(rng.IntN(5000)) * time.Millisecond)
			s.Disabled() // reads that keep the view
			s.FitsTokens(int64(rng.IntN(20000)))
		case 8:
			if rng.IntN(50) == 0 {
				s.Reset(now)
			}
		}
		n := Need{Tokens: int64(rng.IntN(3000)), Reserve: float64(rng.IntN(3)) / 10}
		stream := rng.IntN(2) == 0
		var got, again, want Features
		s.ReadFeaturesFor(&got, now, n, stream)
		s.ReadFeaturesFor(&again, now, n, stream) // read again: from the view
		s.mu.Lock()
		s.readFeatures(&want, now, n, stream)
		s.mu.Unlock()
		if got != want || again != want {
			t.Fatalf("step %d: the reads gave %+v and %+v, the locked read %+v", step, got, again, want)
		}
	}
}
