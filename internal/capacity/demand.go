package capacity

import (
	"math"
	"time"
)

// DemandTau is the time constant of Demand's weighting: a rate seen
// DemandTau ago counts 1/e as much as one seen now.
const DemandTau = time.Second

// Demand is an exponentially weighted rate of what an instance asks for
// (requests, tokens or USD, per second), weighted over about DemandTau:
// what leased slices are sized from (fleet mode's windows, declared limits
// and budgets). The zero value is no demand. Not safe for concurrent use.
type Demand struct {
	rate float64
	at   time.Time
}

// Rate is the demand per second at now.
func (d *Demand) Rate(now time.Time) float64 {
	if d.at.IsZero() || !now.After(d.at) {
		return d.rate
	}
	return d.rate * math.Exp(-now.Sub(d.at).Seconds()/DemandTau.Seconds())
}

// Add counts n units asked for at now.
func (d *Demand) Add(now time.Time, n float64) {
	d.rate = d.Rate(now) + n/DemandTau.Seconds()
	if now.After(d.at) {
		d.at = now
	}
}

// Over is the demand expected over span from now, at now's rate.
func (d *Demand) Over(now time.Time, span time.Duration) float64 {
	return d.Rate(now) * span.Seconds()
}
