package capacity

import (
	"math"
	"testing"
	"time"

	"github.com/llmrouter/caddy-llm-router/provider"
)

func near(a, b float64) bool { return math.Abs(a-b) < 1e-9 }

// The ranking's inputs, each at a value worked out by hand: the headroom
// left after the request in every known window (stated and declared),
// clamped to 0..1; the latency of streams (time to first token) and of
// other answers; the time-decayed reliability with one virtual success;
// the load (in flight plus recent picks, decayed).
func TestFeaturesAreWhatTheRankingReads(t *testing.T) {
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	p := Policy{BackoffBase: time.Second, BackoffMax: time.Minute}

	s := NewState()
	if f := s.Features(now, 100, false); f.Headroom != provider.Unknown || f.Reliability != 1 || f.Latency != 0 || f.Load != 0 {
		t.Errorf("a new deployment: unknown headroom, reliable, no latency, no load; got %+v", f)
	}
	o := provider.NewObservation(provider.OK)
	o.Requests = provider.Window{Limit: 100, Remaining: 50, Reset: time.Minute}
	o.Tokens = provider.Window{Limit: 1000, Remaining: 400, Reset: time.Minute}
	if got := s.Observe(now, o, p); !got.Learned {
		t.Error("the first stated limits are learned")
	}
	if got := s.Observe(now, o, p); got.Learned {
		t.Error("the same limits again teach nothing")
	}
	for _, c := range []struct {
		tokens int64
		want   float64
	}{{100, 0.3}, {0, 0.4}, {5000, 0}} {
		// requests: (50-1)/100; tokens: (400-tokens)/1000; the smaller, in 0..1.
		if f := s.Features(now, c.tokens, false); !near(f.Headroom, c.want) {
			t.Errorf("stated windows, %d tokens: headroom %v, want %v", c.tokens, f.Headroom, c.want)
		}
	}

	// Where the requests bind: (10-1)/100 under (900-100)/1000; a spent
	// request window leaves no headroom.
	rb := NewState()
	o.Requests = provider.Window{Limit: 100, Remaining: 10, Reset: time.Minute}
	o.Tokens = provider.Window{Limit: 1000, Remaining: 900, Reset: time.Minute}
	rb.Observe(now, o, p)
	if f := rb.Features(now, 100, false); !near(f.Headroom, 0.09) {
		t.Errorf("requests binding: headroom %v, want 0.09", f.Headroom)
	}
	spent := NewState()
	o.Requests = provider.Window{Limit: 100, Remaining: 0, Reset: time.Minute}
	o.Tokens = provider.UnknownWindow
	spent.Observe(now, o, p)
	if f := spent.Features(now, 100, false); f.Headroom != 0 {
		t.Errorf("a spent window: headroom %v, want 0", f.Headroom)
	}

	// Declared limits: what the last minute sent, and this request.
	d := NewState()
	d.Declare(10, 1000)
	for range 3 {
		if _, ok := d.AcquireFor(now, Need{Tokens: 100}); !ok {
			t.Fatal("declared limits have room")
		}
	}
	for _, c := range []struct {
		tokens int64
		want   float64
	}{{100, 0.6}, {200, 0.5}, {0, 0.6}} {
		// rpm: (10-3-1)/10; tpm: (1000-300-tokens)/1000.
		if f := d.Features(now, c.tokens, false); !near(f.Headroom, c.want) {
			t.Errorf("declared, %d tokens: headroom %v, want %v", c.tokens, f.Headroom, c.want)
		}
	}
	// Load: 3 in flight and 3 recent picks; later, none in flight and the
	// picks halved by a half-life.
	if f := d.Features(now, 0, false); !near(f.Load, 6) || f.InFlight != 3 {
		t.Errorf("load: got %v (%d in flight), want 6 (3)", f.Load, f.InFlight)
	}
	for range 3 {
		d.Release()
	}
	if f := d.Features(now.Add(healthHalfLife), 0, false); !near(f.Load, 1.5) || f.InFlight != 0 {
		t.Errorf("load a half-life later: got %v (%d in flight), want 1.5", f.Load, f.InFlight)
	}

	// Latency: the EWMA of answers' totals, of streams' first tokens.
	l := NewState()
	l.RecordLatency(2*time.Second, 0)
	if f := l.Features(now, 0, true); !near(f.Latency, 2) {
		t.Errorf("a stream without a ttft measured reads the total: %v", f.Latency)
	}
	l.RecordLatency(0, 500*time.Millisecond)
	l.RecordLatency(time.Second, 0)
	l.RecordLatency(0, time.Second)
	if f := l.Features(now, 0, false); !near(f.Latency, 2+0.3*(1-2)) {
		t.Errorf("latency: %v, want 1.7", f.Latency)
	}
	if f := l.Features(now, 0, true); !near(f.Latency, 0.5+0.3*(1-0.5)) {
		t.Errorf("ttft: %v, want 0.65", f.Latency)
	}

	// Reliability: 3 successes of 4 attempts, plus one virtual success;
	// a half-life later both counts are halved.
	r := NewState()
	for range 3 {
		r.Observe(now, provider.NewObservation(provider.OK), p)
	}
	r.Observe(now, provider.NewObservation(provider.Server), p)
	if f := r.Features(now, 0, false); !near(f.Reliability, 4.0/5) {
		t.Errorf("reliability: %v, want 0.8", f.Reliability)
	}
	if f := r.Features(now.Add(healthHalfLife), 0, false); !near(f.Reliability, 2.5/3) {
		t.Errorf("reliability a half-life later: %v, want 0.8333", f.Reliability)
	}
	// The failure opened the circuit: no probe until its cooldown ends,
	// then the probe.
	if f := r.Features(now, 0, false); f.Probe || !f.At.After(now) {
		t.Errorf("cooling: expected no probe and a later At, got %+v", f)
	}
	if f := r.Features(now.Add(time.Minute), 0, false); !f.Probe || f.At.After(now.Add(time.Minute)) {
		t.Errorf("half-open: expected the probe, got %+v", f)
	}
}

// A censored latency (an attempt cancelled after d without answering)
// says the deployment is at least that slow: it sets an unmeasured EWMA,
// raises one below it as a sample would (weight 0.3), and leaves one above
// it alone; streams by time to first content, answers by total latency.
func TestACensoredLatencyOnlyRaisesTheEWMA(t *testing.T) {
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	s := NewState()
	s.RecordAtLeast(2*time.Second, 0)
	if f := s.Features(now, 10, false); !near(f.Latency, 2) {
		t.Errorf("unmeasured, then at least 2 s: expected 2, got %v", f.Latency)
	}
	s.RecordAtLeast(4*time.Second, 0)
	if f := s.Features(now, 10, false); !near(f.Latency, 2.6) {
		t.Errorf("2 s, then at least 4 s: expected 2 + 0.3 x 2 = 2.6, got %v", f.Latency)
	}
	s.RecordAtLeast(time.Second, 0)
	if f := s.Features(now, 10, false); !near(f.Latency, 2.6) {
		t.Errorf("2.6 s, then at least 1 s: expected 2.6 unchanged, got %v", f.Latency)
	}
	s.RecordAtLeast(0, 3*time.Second)
	if f := s.Features(now, 10, true); !near(f.Latency, 3) {
		t.Errorf("a stream's time to first content at least 3 s: expected 3, got %v", f.Latency)
	}
}

// An attempt that lost a hedge ran c without answering: its deployment
// is at least that slow now, not 30% of the way there. Folded in as one
// sample of weight 0.3, a deployment that had turned 6 s slow, hedged
// after 1 s and lost at 1.24 s, was recorded at 0.51 s after its first
// lost hedge and 1.1 s after its fifth (never above the 1.24 s its hedges
// proved), within a near tie of a 0.24 s peer, so that it was still
// chosen first (the simulation's hedge-slow, seed 23: 5 of 21).
func TestALostHedgeCountsAtLeastAsSlowAsItRan(t *testing.T) {
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	for _, stream := range []bool{false, true} {
		s := NewState()
		for range 5 {
			if stream {
				s.RecordLatency(0, 200*time.Millisecond)
			} else {
				s.RecordLatency(200*time.Millisecond, 0)
			}
		}
		lost := 1240 * time.Millisecond
		if stream {
			s.RecordLostHedge(0, lost)
		} else {
			s.RecordLostHedge(lost, 0)
		}
		if f := s.Features(now, 10, stream); f.Latency < lost.Seconds() {
			t.Errorf("stream %v: 0.2 s, then an attempt that ran 1.24 s without answering: latency %.3f s, want at least 1.24", stream, f.Latency)
		}
	}
}
