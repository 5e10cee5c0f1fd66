package capacity

import (
	"testing"
	"time"

	"github.com/llmrouter/caddy-llm-router/provider"
)

// The declared limits' sliding minute, worked out by hand: what is in it,
// the limits a reserve leaves, when a request fits, what a time ahead
// holds.
func TestDeclaredMinute(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	sec := func(n float64) time.Time { return t0.Add(time.Duration(n * float64(time.Second))) }

	// Five requests a second apart; a minute and a half second on, the first
	// has left the minute (the log keeps the others from its head on).
	d := &declared{rpm: 100, tpm: 10000}
	for i := range 5 {
		d.record(sec(float64(i)), 10)
	}
	if n, tk := d.requestsIn(sec(60.5)), d.tokensIn(sec(60.5)); n != 4 || tk != 40 {
		t.Errorf("in the minute: %d requests, %d tokens; want 4, 40", n, tk)
	}
	if n := d.requestsIn(sec(63.5)); n != 1 {
		t.Errorf("later: %d requests, want 1", n)
	}

	for _, c := range []struct {
		d                declared
		reserve          float64
		wantRPM, wantTPM int64
	}{
		{declared{rpm: 10, tpm: 1000}, 0, 10, 1000},
		{declared{rpm: 10, tpm: 1000}, 0.25, 7, 750}, // ceil(2.5) = 3 requests kept
		{declared{rpm: 1, tpm: 1000}, 0.99, 1, 10},   // never below 1
		{declared{rpm: 0, tpm: 100}, 0.5, 0, 50},     // no rpm stays none
		{declared{rpm: 10, tpm: 0}, 0.5, 5, 0},
	} {
		if rpm, tpm := c.d.limits(c.reserve); rpm != c.wantRPM || tpm != c.wantTPM {
			t.Errorf("limits(%v) of %d/%d: %d/%d, want %d/%d", c.reserve, c.d.rpm, c.d.tpm, rpm, tpm, c.wantRPM, c.wantTPM)
		}
	}

	// tpm 1000 with 400 tokens at t0 and 400 at t0+10s; at t0+20s.
	tok := &declared{tpm: 1000}
	tok.record(t0, 400)
	tok.record(sec(10), 400)
	now := sec(20)
	for _, c := range []struct {
		tokens int64
		want   time.Time
	}{
		{100, now},      // 900: fits
		{200, now},      // exactly 1000: fits
		{300, sec(60)},  // fits once the first 400 leave
		{600, sec(60)},  // exactly 1000 once the first leave
		{700, sec(70)},  // needs both gone
		{5000, sec(70)}, // never fits: when the minute is empty
	} {
		if at := tok.availableAt(now, c.tokens, 0); !at.Equal(c.want) {
			t.Errorf("%d tokens: available at +%v, want +%v", c.tokens, at.Sub(t0), c.want.Sub(t0))
		}
	}

	// Forecasts: rpm 10, tpm 1000; 100 tokens at t0, t0+10s, t0+20s; from
	// t0+30s.
	f := &declared{rpm: 10, tpm: 1000}
	for _, s := range []float64{0, 10, 20} {
		f.record(sec(s), 100)
	}
	for _, c := range []struct {
		until            time.Time
		requests, tokens int64
	}{
		{sec(65), 10 - 3 + 1, 1000 - 300 + 100},         // t0's expires by then
		{sec(150), 10 - 3 + 3 + 2*10, 700 + 300 + 2000}, // all three, and two whole minutes
		{sec(30), 7, 700},
	} {
		if r, tk := f.forecast(sec(30), c.until, 0); r != c.requests || tk != c.tokens {
			t.Errorf("forecast to +%v: %d requests, %d tokens; want %d, %d", c.until.Sub(t0), r, tk, c.requests, c.tokens)
		}
	}
	tpmOnly := &declared{tpm: 1000}
	tpmOnly.record(t0, 100)
	if r, tk := tpmOnly.forecast(sec(30), sec(30), 0); r != provider.Unknown || tk != 900 {
		t.Errorf("tpm only: %d requests, %d tokens; want unknown, 900", r, tk)
	}
	rpmOnly := &declared{rpm: 5}
	rpmOnly.record(t0, 100)
	if r, tk := rpmOnly.forecast(sec(30), sec(30), 0); r != 4 || tk != provider.Unknown {
		t.Errorf("rpm only: %d requests, %d tokens; want 4, unknown", r, tk)
	}
}

// The edges of the backoff, a spent quota's cooldown, and the ledger's
// minutes and classes.
func TestPolicyAndLedgerEdges(t *testing.T) {
	// Without a cap set the backoff stays at its base (never 0).
	if d := (Policy{BackoffBase: time.Second}).Backoff(3); d != time.Second {
		t.Errorf("backoff(3) without a cap = %v, want 1s", d)
	}
	// A spent quota that states no reset is avoided for Long.
	p := Policy{BackoffBase: time.Second, BackoffMax: time.Minute, Long: time.Hour}
	if d := p.Cooldown(provider.NewObservation(provider.QuotaExhausted), 1); d != time.Hour {
		t.Errorf("quota without a reset: %v, want 1h", d)
	}
	s := NewState()
	t0 := time.Date(2026, 11, 30, 10, 0, 30, 0, time.UTC)
	s.RecordUsage(t0, provider.Usage{InputTokens: 10}, 0)
	if r := s.Usage(t0); r.LastHour.Answers != 1 {
		t.Errorf("the current minute is in the last hour: %+v", r.LastHour)
	}
	// A class the ledger has no slot for is not counted (and does not panic).
	s.RecordFailover(provider.Class(16))
	s.RecordFailover(provider.Class(255))
	if r := s.Usage(t0); len(r.Failovers) != 0 {
		t.Errorf("unknown classes counted: %v", r.Failovers)
	}
}
