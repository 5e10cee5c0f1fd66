package sim

import (
	"fmt"
	"net/http"
	"strings"
	"time"
)

// The invariants of issue 25, checked after each client's answer
// (checkOutcome) and each attempt's arrival at a provider (world.arrive),
// and over the run (finish).

// quick429 is how soon a request that cannot be served must be told.
const quick429 = 50 * time.Millisecond

// checkOutcome checks what one client got: by its deadline; no 429 or
// 5xx while a deployment it did not try had room for it; a 429 at once;
// a text that is one answer, whole or cut in-band, never spliced wrong.
func (w *world) checkOutcome(o *outcome) {
	deadline := w.router.Deadline
	if took := o.answered - o.arrival; took > deadline+time.Millisecond {
		w.violate("r%d answered %d after %v, past its deadline %v (%d tries)", o.id, o.status, took, deadline, o.tries)
	}
	if o.status == http.StatusTooManyRequests || o.status >= 500 {
		// A millisecond on, so that what the other requests of the same
		// instant sent has reached the providers (in virtual time every
		// goroutine has run by then): room they took is no room.
		time.Sleep(w.after(time.Millisecond))
		w.checkUntried(o)
	}
	if o.status == http.StatusTooManyRequests && w.sc.limitsStated && o.first > quick429 {
		w.violate("r%d told 429 after %v, not at once", o.id, o.first)
	}
	if o.status == http.StatusOK {
		w.checkText(o)
	}
	if o.leaked {
		w.violate("r%d's answer (%d) holds a provider's API key", o.id, o.status)
	}
}

// checkUntried: a deployment of any tier or fallback group that the
// request never reached, usable now with room for it and time for its
// answer before the deadline, should have been tried.
func (w *world) checkUntried(o *outcome) {
	w.mu.Lock()
	a := w.reqs[o.id]
	w.mu.Unlock()
	now := time.Now()
	by := w.start.Add(o.arrival + w.router.Deadline)
	for _, p := range w.sc.providers {
		w.mu.Lock()
		tried := a != nil && a.tried[p]
		w.mu.Unlock()
		if !tried && p.couldServe(o, now, by) {
			w.violate("r%d answered %d while %s, never tried, had room for it", o.id, o.status, p.name)
		}
	}
}

// couldServe reports whether p, as it truly is at now, would answer o
// before by: no fault certain now, no stated wait, room in every window.
func (p *provider) couldServe(o *outcome, now, by time.Time) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	t := now.Sub(p.w.start)
	for _, f := range p.faults {
		if f.active(t) && f.p == 0 && (f.kind <= hang || f.kind == slowed && now.Add(f.wait).After(by)) {
			return false // certain to fail it now
		}
	}
	if now.Before(p.cooldown) {
		return false
	}
	for _, win := range p.windows {
		if c := win.cost(o.tokens); !win.fits(c) || win.room(now) < c {
			return false
		}
	}
	return !now.Add(p.nominal(o)).After(by)
}

// checkText: an answer is the text one of its attempts told (a
// continuation's: with the text it continued); a stream ended in-band
// begins one.
func (w *world) checkText(o *outcome) {
	if !o.complete && !o.inBand {
		w.violate("r%d: a 200 that ended without its terminator or an error", o.id)
		return
	}
	w.mu.Lock()
	stories := w.stories[o.id]
	w.mu.Unlock()
	for _, told := range stories {
		if o.text == told || o.inBand && strings.HasPrefix(told, o.text) {
			return
		}
	}
	w.violate("r%d's text %q is none its attempts told: it repeats, loses or reorders one", o.id, o.text)
}

// finish checks the run as a whole: upstream 429s per served where limits
// are stated, served against the ideal, and the scenario's own checks.
func (w *world) finish() {
	served := 0
	for _, o := range w.outcomes {
		if o.status == http.StatusOK && o.complete {
			served++
		}
	}
	ideal := w.ideal()
	w.summary = fmt.Sprintf("%s: served %d of %d (ideal %d), upstream window 429s %d (%.3f per served), %s", w.describe(), served, len(w.outcomes), ideal,
		w.upstream429, float64(w.upstream429)/float64(max(served, 1)), w.perAnswer())
	w.logf("%s", w.summary)
	if w.sc.limitsStated && float64(w.upstream429) > 0.01*float64(max(served, 1)) {
		w.violate("%d upstream 429s for %d served (%.3f per served, at most 0.01)", w.upstream429, served,
			float64(w.upstream429)/float64(max(served, 1)))
	}
	if float64(served) < 0.99*float64(ideal) {
		w.violate("served %d, under 99%% of the ideal scheduler's %d", served, ideal)
	}
	for _, check := range w.sc.checks {
		if msg := check(w); msg != "" {
			w.violate("%s", msg)
		}
	}
}

// firstChoices counts, of the requests that arrived after from, those
// whose first attempt went to each provider.
func (w *world) firstChoices(from time.Duration) (map[string]int, int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	n, by := 0, map[string]int{}
	for _, o := range w.outcomes {
		if a := w.reqs[o.id]; a != nil && o.arrival >= from {
			by[a.first.name]++
			n++
		}
	}
	return by, n
}

// perAnswer is the upstream attempts per client request of a run.
func (w *world) perAnswer() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := 0
	for id, a := range w.reqs {
		if id >= 0 {
			n += a.n
		}
	}
	return fmt.Sprintf("%d attempts for %d requests", n, len(w.outcomes))
}

// describe is the run's providers as drawn.
func (w *world) describe() string {
	var parts []string
	for _, p := range w.sc.providers {
		d := fmt.Sprintf("%s %T %v", p.name, p.dialect, p.latency)
		for _, l := range p.limits {
			unit := "requests"
			if l.tokens {
				unit = "tokens"
			}
			d += fmt.Sprintf(" %d %s/%v %v", l.max, unit, l.span, l.shape)
		}
		parts = append(parts, strings.TrimPrefix(d, "sim."))
	}
	return strings.Join(parts, "; ")
}
