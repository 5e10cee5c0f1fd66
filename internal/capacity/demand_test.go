package capacity

import (
	"math"
	"testing"
	"time"
)

// A demand is what was asked per second, weighted over DemandTau: 10
// units at once are a rate of 10/s that falls to 10/e a DemandTau later,
// and what is expected over a span is that rate times the span.
func TestDemandDecaysOverItsTau(t *testing.T) {
	var d Demand
	t0 := time.Unix(1_000, 0)
	if d.Rate(t0) != 0 || d.Over(t0, time.Second) != 0 {
		t.Fatalf("the zero demand: expected 0, got %v", d.Rate(t0))
	}
	d.Add(t0, 10)
	if got := d.Rate(t0); got != 10 {
		t.Errorf("at once: expected a rate of 10/s, got %v", got)
	}
	later := t0.Add(DemandTau)
	if got, want := d.Rate(later), 10/math.E; math.Abs(got-want) > 1e-9 {
		t.Errorf("a tau later: expected %v/s, got %v", want, got)
	}
	if got, want := d.Over(later, 3*time.Second), 3*10/math.E; math.Abs(got-want) > 1e-9 {
		t.Errorf("over 3 s: expected %v, got %v", want, got)
	}
	d.Add(later, 5)
	if got, want := d.Rate(later), 10/math.E+5; math.Abs(got-want) > 1e-9 {
		t.Errorf("after 5 more: expected %v/s, got %v", want, got)
	}
	if got := d.Rate(t0); got != d.Rate(later) {
		t.Errorf("a time before the last: the rate as it was last, got %v", got)
	}
}
