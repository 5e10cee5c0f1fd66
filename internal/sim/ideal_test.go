package sim

import (
	"slices"
	"time"
)

// snapshot keeps the sized providers' true windows as the counted
// requests find them, for the ideal scheduler.
func (w *world) snapshot() {
	w.truth = map[*provider][]*window{}
	for _, p := range w.sc.providers {
		if !p.sized {
			continue
		}
		p.mu.Lock()
		for _, win := range p.windows {
			w.truth[p] = append(w.truth[p], win.clone())
		}
		p.mu.Unlock()
	}
}

// ideal is how many requests an ideal scheduler serves: each, in order
// of arrival, takes the earliest instant at which a sized provider's true
// windows admit it (each provider's requests in order) and its answer
// (at the provider's nominal latency) comes before its deadline.
func (w *world) ideal() int {
	if len(w.truth) == 0 {
		return 0
	}
	os := slices.Clone(w.outcomes)
	slices.SortFunc(os, func(a, b *outcome) int { return int(a.arrival - b.arrival) })
	last := map[*provider]time.Time{}
	served := 0
	for _, o := range os {
		arrival := w.start.Add(o.arrival)
		by := arrival.Add(w.router.Deadline)
		var best *provider
		var bestAt time.Time
		for p, ws := range w.truth {
			from := arrival
			if last[p].After(from) {
				from = last[p]
			}
			at, ok := admits(ws, from, o.tokens)
			if ok && !at.Add(p.nominal(o)).After(by) && (best == nil || at.Before(bestAt) || at.Equal(bestAt) && p.name < best.name) {
				best, bestAt = p, at
			}
		}
		if best == nil {
			continue
		}
		for _, win := range w.truth[best] {
			win.take(bestAt, win.cost(o.tokens))
		}
		last[best] = bestAt
		served++
	}
	return served
}

// admits is the first instant from at when every window of ws admits a
// request of tokens; false if one never does. It asks copies: a window
// rolled to a later instant cannot be asked of an earlier one.
func admits(ws []*window, at time.Time, tokens int64) (time.Time, bool) {
	ws = slices.Clone(ws)
	for i := range ws {
		ws[i] = ws[i].clone()
	}
	for range 64 {
		next := at
		for _, win := range ws {
			c := win.cost(tokens)
			if !win.fits(c) {
				return at, false
			}
			if e := win.earliest(at, c); e.After(next) {
				next = e
			}
		}
		if next.Equal(at) {
			return at, true
		}
		at = next
	}
	return at, false
}

// nominal is how long p may take to answer o (its latency's longest
// draw): to the first byte of a stream, the whole generation otherwise.
func (p *provider) nominal(o *outcome) time.Duration {
	d := p.latency * 11 / 10
	if !o.stream {
		d += p.perWord * time.Duration(o.words)
	}
	return d
}
