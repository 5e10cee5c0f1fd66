package capacity

import (
	"math"
	"time"

	"github.com/llmrouter/caddy-llm-router/provider"
)

// A provider-stated window (requests or tokens) is a budget the router
// spends locally: each attempt spends its share when it is sent, before its
// answer arrives, and each answer sets the count again from what the
// provider stated, less what was sent after the answered attempt and is
// still in flight (the provider had not counted it yet).
//
// Two kinds of window are told apart by what the provider states:
//
//   - a fixed window: the count only falls until the reset, then the window
//     is full again (limit, not unknown). The next reset is the last one
//     plus the window's span, the longest reset ever stated (a window's
//     first answer states nearly all of it); an answer in the new window
//     states the true one.
//   - a refilling window (a token bucket, as OpenAI's and Anthropic's): an
//     answer states a larger count than the last one before the stated
//     reset passed. Its count then grows continuously, at the rate the
//     statement implies ((limit - remaining) / reset), so that the router
//     spreads attempts over the window instead of sending a burst at its
//     reset.
//
// One statement does not tell the two apart: "9 left, full again in 1s"
// is a fixed window's of a second as well as a bucket's of one a second.
// The window is full again at a reset it stated, whichever it is; but a
// reset the router projects (the last one plus a span no window is
// shorter than) holds only for a fixed window. Until two statements imply
// rates no bucket states together (a fixed window's: 9 left in 10 s, 5
// left in 6 s), a projected reset refills the window only at the rate the
// statements imply (the pace), and, once they prove it fixed, the
// window holds what a fixed window of its span holds whatever its phase
// (its limit less what was sent in the last span: sliding) until an
// answer to an attempt sent at the pace states the window it spent. With
// answers slower than the window (20 s on 10 s), no answer says which it
// is before the projection passes: taken as fixed, each roll sent the
// whole limit to a bucket that had refilled a tenth of it; and the
// proof does not say where the windows start (taken to roll at the
// projection, an aligned window drew a 429 for each attempt sent in the
// part of its window before it).
//
// ResetMargin is added to every stated reset: a reset stated to the
// millisecond (rounded), or as an instant by a clock a little ahead of
// ours, must not let the router refill a window the provider has not.
//
// A reset stated as a countdown is anchored to when the provider made the
// statement: when it admitted the request, some time between the
// attempt's send and its first byte (PROVIDERS.md), not when the router
// reads it. The window is taken to be full again only at the latest
// instant the countdown allows (the read, plus the countdown, plus the
// margin), and what is sent from the earliest (the send, plus the
// countdown) is charged to the next window too (carry): the provider's
// window may have rolled already. Answers to attempts sent at different
// times narrow that interval: for a fixed window each one states the same
// instant, so the reset lies in every answer's interval.
const ResetMargin = 50 * time.Millisecond

type window struct {
	limit, remaining int64     // provider.Unknown until stated
	reset            time.Time // a fixed window: when it is full again, at the latest; zero = not stated
	// uncertain is how long before reset the provider's window may have
	// rolled already (the countdown's anchor: from the attempt's send to
	// its read, narrowed by later answers; ResetMargin at least): what is
	// spent from then on counts against the next window too.
	uncertain time.Duration
	span      time.Duration
	// gap is the shortest time seen between two stated resets of a fixed
	// window (from the earliest the first may have been to the latest the
	// next may be; 0 until seen): no window is longer, since a window that
	// starts with its first request may be idle in between. statedLo and
	// statedHi bound the last stated reset (projections aside).
	gap                time.Duration
	statedLo, statedHi time.Time
	// statedIn bounds the last stated countdown as the provider counted
	// it, from its admission of the attempt ([0] > 0; zero after a roll):
	// with stated, the rate a bucket's statement implies (bucketLike).
	statedIn [2]time.Duration
	// precise: a countdown finer than a millisecond was stated, so a
	// whole one ("10s") is exact, not rounded; rounded: a 429 stated the
	// window in whole units, so they may be rounded (see anchor).
	precise, rounded bool
	// longest is the longest countdown stated since the limits last
	// changed (gap dropped): no window is shorter.
	longest time.Duration
	// refills: the window proved to refill continuously, at rate units per
	// second (0 until a statement implies it); remaining is then the count
	// at at.
	refills bool
	rate    float64
	at      time.Time
	// pace is the rate (units per second) the statements imply for a
	// bucket, while each of them may be a bucket's as well as a fixed
	// window's (paceRates bounds the rate every one implies; 0: none
	// stated); fixed: two statements implied rates no bucket states
	// together, so the window refills whole at its reset (noteRate).
	pace      float64
	paceRates [2]float64
	fixed     bool
	// pacedFrom is when the router first sent at pace since the window
	// was last stated (zero: not pacing): once statements prove it fixed,
	// the pace ends with the first answer to an attempt sent since then,
	// which speaks of the window the pace spent; until then the window
	// holds what a span allows (sliding).
	pacedFrom time.Time
	// spent is what was sent in the last period, in the order sent, kept
	// while the window may be paced (pace > 0): a fixed window of unknown
	// phase holds its limit less it (sliding). A pointer, so that windows
	// compare (State.shareObserved) by what they state, not by it.
	spent *spentLog
	// projected: the reset is the router's projection (a roll), not a
	// statement; a bucket is full again at its stated reset, as a fixed
	// window is, but not at a projection of a fixed window's span.
	projected bool
	// carry is what was spent within uncertain before a fixed window's
	// reset: the provider's window may have ended already, so it counts
	// against the next one too.
	carry  int64
	stated int64  // the provider's last stated remaining, for refill detection
	seq    uint64 // the attempt whose answer set the count last (0: none)
	// ratio is what the provider counts of an attempt per unit the router
	// estimated (0: not learned, taken as 1): a token window counts the
	// tokens an answer used where the router estimates prompt plus
	// max_tokens. Learned from answers that no other attempt overlapped.
	ratio float64
	// ratioCap bounds the ratio from above until it is learned (0: no
	// bound, taken as 1): an answer that no other attempt overlapped
	// states at most limit - remaining counted in its window, its own
	// attempt included, so a window that admitted an attempt estimated
	// above its whole limit does not count the estimate.
	ratioCap float64
	// share is this instance's part of what the fleet spends of the window
	// (fleet mode; 0: not learned, taken as 1): a forecast of what the
	// window lets this instance start counts only that part. own is what
	// this instance spent of the fleet's window that resets at ownReset.
	share    float64
	own      int64
	ownReset time.Time
	// offline is this instance's share of a bucket's rate, or of a
	// fixed window that renews, while the fleet cannot answer (0: none;
	// see unanswered); fleetN is how many instances spent the fleet's
	// window at its last answer.
	offline float64
	fleetN  int
	// spanSeen is the longest reset stated since the window last rolled
	// over; the roll makes it the span, so that one odd statement (a reset
	// of hours) weighs on one window, not on every one after it.
	spanSeen time.Duration
	// rolledAt is when the router last started a new span of the window:
	// an answer to an attempt sent before speaks of the window before.
	rolledAt time.Time
	// firstRate is the rate a window's first statement implies, (limit -
	// remaining) / countdown, when that statement's reset lies strictly
	// between two whole seconds (0 otherwise, and once a second statement
	// came): no window aligned to the clock is full again then, so it is
	// forecast as the bucket it implies (see offTheClock).
	firstRate  float64
	statements int // stated resets read, up to 2
	// holding: a window of known limit whose reset passed while its span
	// is unknown (an instant already past when it was read: an Anthropic
	// bucket read after it was full again). The router rolled it to its
	// limit and counts down from there, since no window shape admits a
	// burst larger than its limit; the count holds, without a reset,
	// until an answer states the window again or nothing is in flight
	// to state it (unhold).
	holding bool
}

// holdWait is how long an attempt waits for a holding window's answers
// before it looks again (an answer wakes the queue before that).
const holdWait = time.Second

// update folds what an answer stated of the window at now. since is the
// share of the attempts that the provider may have counted after it
// answered: those in flight when the answered attempt was sent, and those
// sent since. The provider's count is the truth, but it is as old as the
// answer: the window holds no more than it stated (less what refilled
// since, for a refilling window), and no less than it stated less since;
// within those bounds the router's own count, which spends each attempt
// when it is sent, stands. A statement of an earlier window (an answer
// that comes after the router started the next one) changes no count.
func (w *window) update(now, sent time.Time, o provider.Window, since, estimate int64) {
	// A limit of 0 would block the deployment for good (no attempt, no
	// answer to say otherwise): a provider that allows nothing says so
	// with its errors, not with a budget.
	if o.Limit > 0 {
		w.limit = o.Limit
		o.Remaining = min(o.Remaining, o.Limit)
	}
	if sent.Before(w.rolledAt) && w.current(now) >= 0 {
		return // it speaks of the window before this one
	}
	if o.Reset >= 0 {
		d := min(o.Reset, provider.MaxCooldown)
		w.spanSeen = max(w.spanSeen, d)
		if w.span <= 0 {
			w.span = d
		}
		w.longest = max(w.longest, d)
		if w.gap > 0 && d > w.gap+ResetMargin {
			w.gap = 0 // a window longer than the bound: the limits changed, measure again
			w.longest = d
		}
	}
	reset, uncertain := time.Time{}, w.uncertain // a count without a reset is only good for this instant...
	if o.Reset >= 0 {
		reset, uncertain = w.anchor(now, sent, o)
		w.noteFirst(reset.Add(-uncertain), reset, o)
	} else if w.reset.After(now) {
		reset = w.reset // ...unless the window's reset is known
	}
	if o.Remaining < 0 {
		if o.Reset >= 0 {
			w.reset, w.uncertain, w.projected = reset, uncertain, false
		}
		return
	}
	local := w.current(now)
	fixed := !w.refilling() && !w.reset.IsZero() && !reset.IsZero() && w.span > 0
	// A count larger than the last stated one (by more than answers out of
	// order explain) before the stated reset, with a reset that did not
	// move a whole window later (a fixed window that rolled over early
	// would): the provider refills continuously.
	if !w.fixed && w.stated >= 0 && w.reset.After(now) && o.Remaining > w.stated+since && o.Reset > 0 &&
		now.Add(o.Reset).Before(w.reset.Add(now.Sub(w.at))) {
		w.refills = true
	}
	if w.refills && w.limit > 0 && o.Reset > 0 && o.Remaining < w.limit {
		w.rate = float64(w.limit-o.Remaining) / o.Reset.Seconds()
	}
	if since == 0 && estimate > 0 && w.limit > 0 && o.Remaining < w.limit {
		c := max(float64(w.limit-o.Remaining)/float64(estimate), minRatio)
		if c < 1 && (w.ratioCap == 0 || c < w.ratioCap) {
			w.ratioCap = c
		}
	}
	// What the provider counted of this attempt, when nothing overlapped
	// it: the drop from the last statement of the same window.
	if since == 0 && estimate > 0 && w.stated >= 0 && o.Remaining <= w.stated && w.reset.After(now) &&
		!reset.After(w.reset.Add(w.span/2)) && !w.refilling() {
		r := min(float64(w.stated-o.Remaining)/float64(estimate), 1)
		if w.ratio == 0 {
			w.ratio = max(r, minRatio)
		} else {
			w.ratio = max(w.ratio+ratioWeight*(r-w.ratio), minRatio)
		}
	}
	lower, upper := max(o.Remaining-since, 0), o.Remaining
	if w.refilling() && now.After(sent) {
		// what refilled since the earliest the statement was made
		upper = min(satAdd(upper, int64(math.Ceil(w.rate*now.Sub(sent).Seconds()))), w.limit)
	}
	switch {
	case local < 0 || reset.IsZero() || (fixed && reset.After(w.reset.Add(w.span/2))):
		w.remaining = lower // a first statement, or a new window: the safe side
		w.carry = 0
	default:
		w.remaining = min(max(local, lower), upper)
	}
	w.stated = o.Remaining
	w.at = now
	if o.Reset >= 0 {
		w.projected = false
		if w.fixed {
			w.pace, w.pacedFrom = 0, time.Time{}
		}
	}
	w.reset, w.uncertain = reset, uncertain
	if !reset.IsZero() {
		w.holding = false
	}
}

// anchor returns when a window whose reset o states (Reset >= 0) is full
// again at the latest, and how long before that it may have rolled
// already (see ResetMargin): a countdown counts from some instant between
// sent and now, an instant only has the margin. For a fixed window whose
// current reset is known, a statement whose interval overlaps it speaks
// of the same instant: the reset lies in both, so the two narrow each
// other; one that does not overlap is a new window (or a refilling one:
// its reset moves with each statement), and stands alone.
func (w *window) anchor(now, sent time.Time, o provider.Window) (reset time.Time, uncertain time.Duration) {
	if !o.Instant && o.Resolution == 0 && o.Reset > 0 {
		w.precise = true
	}
	reset, uncertain, in := w.read(now, sent, o)
	lo := reset.Add(-uncertain)
	defer func() {
		w.statedLo, w.statedHi = reset.Add(-uncertain), reset
		w.statedIn = in
	}()
	if w.refilling() {
		return reset, uncertain
	}
	if o.Reset > 0 && !w.fixed && w.bucketLike(lo, reset, in, o.Remaining) {
		w.refills = true
		return reset, uncertain
	}
	if r := o.Resolution; r > 0 && !o.Instant && !w.rounded && !w.precise && w.tooClose(lo, reset) != 0 {
		// Two resets of a fixed window too close to be exact countdowns
		// (a statement at 1.3 s of a window ending at 10 s says "8", one
		// at 11.1 s of the next "8" again): its whole countdowns are
		// rounded, learned before its first 429 would teach it.
		w.learnRounded(r)
		reset, uncertain = reset.Add(r), uncertain+2*r
		lo = reset.Add(-uncertain)
	}
	if !w.statedLo.IsZero() && lo.After(w.statedHi) {
		// A later window: the time from the last stated reset bounds the
		// span from above (a window of unknown span is projected with it).
		// One that is surely longer than the bound proves it stale.
		if g := reset.Sub(w.statedLo); g > 0 && (w.gap == 0 || g < w.gap || lo.Sub(w.statedHi) > w.gap) {
			w.gap = g
		}
	}
	// Narrowed only by what was stated: a reset the router projected
	// (nextReset, at a roll) is its guess, not the provider's word, and
	// may be early for a provider that rounds.
	oldLo, oldHi := w.statedLo, w.statedHi
	if oldHi.IsZero() || !oldHi.After(now) || lo.After(oldHi) || reset.Before(oldLo) {
		return reset, uncertain
	}
	hi := reset
	if oldHi.Before(hi) {
		hi = oldHi
	}
	if oldLo.After(lo) {
		lo = oldLo
	}
	return hi, max(hi.Sub(lo), ResetMargin)
}

// read returns where a stated reset o (Reset >= 0), read at now of an
// attempt sent at sent, lies by itself, before other statements narrow it
// (anchor): the window is full again at reset at the latest, and may have
// rolled from uncertain before it; in bounds the countdown from the
// provider's admission of the attempt. An instant that had passed when
// the answer was given (o.Passed) is anchored where it was stated: the
// window was full again then, before the read; at the send at the
// earliest (one before it is clock skew; a later reset is the safe side).
func (w *window) read(now, sent time.Time, o provider.Window) (reset time.Time, uncertain time.Duration, in [2]time.Duration) {
	d := min(o.Reset, provider.MaxCooldown)
	if o.Instant && o.Passed > 0 && d == 0 {
		d = -min(o.Passed, max(now.Sub(sent), 0))
	}
	reset, uncertain = now.Add(d+ResetMargin), ResetMargin
	if !o.Instant && sent.Before(now) {
		uncertain += now.Sub(sent)
	}
	switch r := o.Resolution; {
	case r <= 0:
	case o.Instant:
		// An instant in whole units (an RFC 3339 time in whole seconds)
		// read against a Date of the same resolution: up to a unit
		// early for each; late no more than the Date's truncation makes
		// up for.
		uncertain += 2 * r
	case w.rounded && !w.precise:
		// A countdown in whole units ("8s", "8") from a provider that
		// never stated a finer one and answered 429 once the router took
		// its window to be full again: it rounds, down (the reset is up
		// to a unit later) or up (up to a unit earlier). Until such a
		// 429, a whole countdown is taken as exact (one that states
		// "9.994987887s" as well states "10s" exactly).
		reset = reset.Add(r)
		uncertain += 2 * r
	}
	// The countdown from the provider's admission: a countdown is stated
	// then, to its resolution; an instant is read against the answer's
	// Date (both to theirs), and the admission was at the send at the
	// earliest.
	in = [2]time.Duration{d - o.Resolution, d + o.Resolution}
	if o.Instant {
		in = [2]time.Duration{d - 2*o.Resolution, d + 2*o.Resolution + max(now.Sub(sent), 0)}
	}
	return reset, uncertain, in
}

// noteFirst counts a statement whose reset lies in [lo, hi], and keeps
// the rate the window's first one implies when it is offTheClock.
func (w *window) noteFirst(lo, hi time.Time, o provider.Window) {
	w.statements = min(w.statements+1, 2)
	w.firstRate = 0
	if w.statements == 1 && offTheClock(lo, hi, o) && w.limit > 0 && o.Remaining >= 0 && o.Remaining < w.limit {
		w.firstRate = float64(w.limit-o.Remaining) / o.Reset.Seconds()
	}
}

// offTheClock reports whether a countdown o, whose reset lies in [lo,
// hi], is surely no fixed window's aligned to the clock: stated finer
// than a second, it puts the reset, widened by its resolution (a
// countdown rounded to the millisecond, taken as exact otherwise, is up
// to one off), strictly between two whole seconds,
// where no window of whole seconds aligned to the clock (PROVIDERS.md:
// the compatible servers that use fixed windows align them to clock
// minutes) is full again. A bucket's reset falls anywhere (OpenAI's and
// Anthropic's refill continuously). A first statement so placed is the
// bucket it implies: its count, and a whole window of it in
// (limit - remaining) / countdown, not a window of that countdown that
// is full again every countdown; a window of its countdown that starts
// with its first request (a shape PROVIDERS.md does not name) is
// forecast short until its next statement.
func offTheClock(lo, hi time.Time, o provider.Window) bool {
	if o.Instant || o.Reset <= 0 || o.Resolution >= time.Second || o.Reset > provider.MaxCooldown {
		return false
	}
	lo, hi = lo.Add(-o.Resolution), hi.Add(o.Resolution)
	sec := lo.Truncate(time.Second)
	return lo.After(sec) && hi.Before(sec.Add(time.Second))
}

// bucketLike reports whether a stated reset in [lo, hi], a countdown
// from the admission within in, with remaining left, proves the window refills
// continuously, against the last stated one. A bucket's statement implies
// its rate, (limit - remaining) / countdown, both stated at one instant
// (its admission), so two statements imply the same rate (within a unit
// of the count, which a provider floors, and the countdown's resolution),
// while each admission moves its "full again" instant later by 1/rate
// (OpenAI's and Anthropic's resets, PROVIDERS.md), as a burst's answers
// state (remaining 9, reset 1s; 8, 2s; ...). Two resets of a fixed window
// are the same instant (their anchors overlap) or a whole window apart
// (no window is shorter than the longest countdown stated), and the rates
// its statements imply differ (9 left in 10 s, 5 left in 4 s). So a reset
// surely later than the last one, surely closer to it than the longest
// countdown, stated with less left, at the same rate, is a bucket's.
// Anchors are widened by a rounding provider's unit (anchor); a reset of
// 0 (a window just over, or a bucket full) proves nothing.
func (w *window) bucketLike(lo, hi time.Time, in [2]time.Duration, remaining int64) bool {
	if w.statedIn[1] <= 0 || in[1] <= 0 || w.stated < 0 || remaining < 0 || w.limit <= 0 || w.longest <= 0 {
		return false
	}
	aLo, aHi := w.impliedRates(w.stated, w.statedIn)
	bLo, bHi := w.impliedRates(remaining, in)
	if max(aLo, bLo) >= min(aHi, bHi) {
		return false // not one rate
	}
	switch w.tooClose(lo, hi) {
	case 1:
		return remaining < w.stated
	case -1:
		return w.stated < remaining
	}
	return false
}

// impliedRates bounds the rate, in units per second, that a bucket's
// statement of left remaining, full again a countdown within in after its
// admission, implies: (limit - left) / countdown, within a unit of the
// count (a provider floors it) and the countdown's bounds.
func (w *window) impliedRates(left int64, in [2]time.Duration) (lo, hi float64) {
	lo, hi = float64(w.limit-left-1)/in[1].Seconds(), math.Inf(1)
	if in[0] > 0 {
		hi = float64(w.limit-left) / in[0].Seconds()
	}
	return lo, hi
}

// noteStatement folds what statement o, of an attempt sent at sent and
// read at now, says of a bucket's rate (noteRate), whichever window it
// speaks of and whether or not its count is stale: a bucket's rate is the
// same in each, so that an answer read after the router rolled the window
// (a generation longer than its span) still tells a fixed window from a
// bucket. State.observe calls it for every answer, before update.
func (w *window) noteStatement(now, sent time.Time, o provider.Window) {
	if o.Limit > 0 && o.Limit != w.limit {
		if w.limit > 0 {
			w.pace, w.paceRates, w.fixed, w.pacedFrom = 0, [2]float64{}, false, time.Time{} // another limit: another window
		}
		w.limit = o.Limit
	}
	if o.Reset <= 0 || o.Remaining < 0 {
		return
	}
	_, _, in := w.read(now, sent, o)
	countdown := min(o.Reset, provider.MaxCooldown) // a countdown's reading
	if o.Instant {
		countdown = in[1] // an instant's longest
	}
	w.noteRate(o.Remaining, in, countdown)
	if w.fixed && !w.pacedFrom.IsZero() && !sent.Before(w.pacedFrom) {
		// A fixed window, stated by an attempt sent at its pace: the
		// window it speaks of is the paced one, and it ends the pace.
		w.pace, w.pacedFrom = 0, time.Time{}
	}
}

// noteRate folds a statement of left remaining, a countdown within in
// from its admission (in[1] > 0), into what the window's statements say
// of a bucket: if every one states the same rate (each a bucket's
// statement implies, impliedRates), pace is the last one's, taken at its
// stated countdown (a countdown's reading, an instant's longest); once two
// imply rates no bucket states together, the window is fixed (no bucket),
// and refills whole at its reset.
func (w *window) noteRate(left int64, in [2]time.Duration, countdown time.Duration) {
	if w.fixed || w.limit <= 0 || left < 0 || left >= w.limit || in[1] <= 0 || countdown <= 0 {
		return
	}
	lo, hi := w.impliedRates(left, in)
	if w.paceRates[1] > 0 {
		lo, hi = max(lo, w.paceRates[0]), min(hi, w.paceRates[1])
		if lo > hi*(1+1e-9) { // a point is a rate: a statement exact to the unit
			w.fixed = true
			return
		}
	}
	w.paceRates = [2]float64{lo, hi}
	w.pace = float64(w.limit-left) / countdown.Seconds()
}

// paced reports whether the window's refill at a reset passed is bounded
// by pace: the reset is the router's projection of a span (a bucket is
// full again at a reset it stated, as a fixed window is), its limit is
// known, and its statements are a bucket's as well as a fixed window's
// (noteRate), so that the projection may find it refilled only by what
// the bucket's rate refilled since, not by its limit.
func (w *window) paced() bool {
	return w.projected && w.pace > 0 && (!w.fixed || !w.pacedFrom.IsZero()) && !w.refilling() && w.limit > 0 && !w.holding
}

// tooClose compares a stated reset in [lo, hi] with the last stated one:
// 1 when it is surely later and surely closer to it than the longest
// countdown stated, -1 when surely earlier and as close, 0 otherwise. Two
// resets of a fixed window whose countdowns are exact are the same
// instant or a whole window apart, so that one too close is a bucket's
// (bucketLike) or a rounded countdown's.
func (w *window) tooClose(lo, hi time.Time) int {
	switch {
	case w.statedLo.IsZero() || w.longest <= 0:
	case lo.After(w.statedHi) && hi.Sub(w.statedLo)+ResetMargin < w.longest:
		return 1
	case w.statedLo.After(hi) && w.statedHi.Sub(lo)+ResetMargin < w.longest:
		return -1
	}
	return 0
}

// noteStale reads what a stale answer (one that came after a later
// attempt's, so that its count is older than the window's: State.observe
// does not count it) says of the provider's window: whether it refills
// (noteRefills), else whether its countdowns are rounded (noteRounding).
func (w *window) noteStale(now, sent time.Time, o provider.Window) {
	w.noteRefills(now, sent, o)
	w.noteRounding(now, sent, o)
}

// noteRefills reads a stale answer's evidence of a bucket: a reset that
// is bucketLike against the last stated one (surely earlier and closer to
// it than the longest countdown, with more left, at the same rate) proves
// the window refills, as it would have proved it answered in order. A
// burst sent at one instant is answered in any order: on a bucket whose
// resets are instants in whole seconds (Anthropic's, each read to within
// ±2 s), the first answer states "1153 left, full at 19 s" and a later
// one, sent before it, "3051, 14 s"; skipped whole, it left the window
// read as fixed, full again only at 19 s, and four attempts went into it
// then, where three fitted. The rate is the stale statement's (limit -
// remaining over its countdown, as update takes it); the count stays the
// last one counted, refilled at that rate from then on.
func (w *window) noteRefills(now, sent time.Time, o provider.Window) {
	if w.refilling() || w.fixed || o.Reset <= 0 || o.Remaining < 0 || w.limit <= 0 || o.Remaining >= w.limit {
		return
	}
	reset, uncertain, in := w.read(now, sent, o)
	if !w.bucketLike(reset.Add(-uncertain), reset, in, o.Remaining) {
		return
	}
	w.refills = true
	w.rate = float64(w.limit-o.Remaining) / min(o.Reset, provider.MaxCooldown).Seconds()
}

// noteRounding reads what a stale answer says of the provider's
// rounding: a countdown in whole units whose reset is too close to the
// last stated one to be exact (tooClose), and not a bucket's, teaches
// that they are rounded, as in anchor. A burst a microsecond apart on a server that
// floors reads "9" (9.999999 s) for its second request and "10" for its
// first; answered in the other order, the "10" was skipped, its evidence
// with it, and the roll at the "9" drew a 429 for each attempt sent in
// the second it hid.
func (w *window) noteRounding(now, sent time.Time, o provider.Window) {
	r := o.Resolution
	if r <= 0 || o.Instant || o.Reset <= 0 || w.rounded || w.precise || w.refilling() {
		return
	}
	d := min(o.Reset, provider.MaxCooldown)
	hi := now.Add(d + ResetMargin)
	lo := hi.Add(-ResetMargin - max(now.Sub(sent), 0))
	if w.bucketLike(lo, hi, [2]time.Duration{d - r, d + r}, o.Remaining) || w.tooClose(lo, hi) == 0 {
		return
	}
	w.learnRounded(r)
}

// learnRounded notes a 429 that stated the window in whole units of r:
// unless the provider stated finer countdowns, its whole ones may be
// rounded (see anchor), and the reset held, taken as exact, is widened
// as anchor would have.
func (w *window) learnRounded(r time.Duration) {
	if r <= 0 || w.rounded || w.precise {
		return
	}
	w.rounded = true
	if !w.reset.IsZero() {
		w.reset = w.reset.Add(r)
		w.uncertain += 2 * r
	}
	if !w.statedHi.IsZero() {
		// The statements read as exact are widened too: narrowed by them,
		// the next statement's reset fell back to the exact reading.
		w.statedLo, w.statedHi = w.statedLo.Add(-r), w.statedHi.Add(r)
	}
}

// period is what a fixed window's resets are projected with once the
// stated one passed: the shortest gap seen between two stated resets
// when one was (no window is longer), else the span (the longest
// countdown stated, which no window is shorter than). A window that grows
// past the gap is found by its first 429, whose statement corrects it.
func (w *window) period() time.Duration {
	if w.gap > 0 {
		return w.gap
	}
	return w.span
}

// forecastPeriod is the span a forecast counts the windows after the
// next reset with: the longest countdown stated (no window is shorter; a
// window's first request states all of a window that starts with it),
// bounded by the period. The router starts each of them when it learns
// the last one ended (a statement anchors it), not at its projection.
func (w *window) forecastPeriod() time.Duration {
	if p := w.period(); w.longest > 0 && w.longest < p {
		return w.longest
	}
	return w.period()
}

// form is what a window is proved to be, which its forecast counts
// the windows after its count by: a bucket (then at a rate, not by
// windows), fixed, or forecast as the bucket its first statement
// implies. A statement that changes it changes what the window serves
// before a deadline (State.observe's Learned); one that only moves the
// count, the rate or a period does not (each answer may: the queue looks
// again as attempts end).
type form struct{ refills, fixed, firstRate bool }

// form returns the window's form.
func (w *window) form() form {
	return form{refills: w.refilling(), fixed: w.fixed, firstRate: w.firstRate > 0}
}

// ratioWeight is the weight of a new sample of window.ratio; minRatio its
// floor, so that a window that counted nothing of a few attempts is not
// taken to count nothing of the next ones.
const (
	ratioWeight = 0.3
	minRatio    = 0.01
)

// expected returns what the provider is expected to count of an attempt
// the router estimates at n units.
func (w *window) expected(n int64) int64 {
	if w.ratio <= 0 || n <= 0 {
		return n
	}
	return max(int64(math.Ceil(float64(n)*w.ratio)), 1)
}

// refilling reports whether the window refills continuously.
func (w *window) refilling() bool { return w.refills && w.rate > 0 && w.limit > 0 }

// current returns the count that holds at now, or provider.Unknown when none
// does (never stated, or stated without a reset, or a window of unknown
// limit that was reset).
func (w *window) current(now time.Time) int64 {
	switch {
	case w.remaining < 0:
		return provider.Unknown
	case w.refilling():
		if !now.After(w.at) {
			return w.remaining
		}
		add := w.refillRate() * now.Sub(w.at).Seconds()
		if add >= float64(w.limit-w.remaining) {
			return w.limit
		}
		return w.remaining + int64(add)
	case w.reset.IsZero():
		if w.holding {
			return w.remaining
		}
		return provider.Unknown
	case w.sliding():
		return max(w.limit-w.spentSince(now.Add(-w.slide())), 0)
	case w.reset.After(now):
		return w.remaining
	case w.paced():
		// A bucket's as well: what its rate refilled since the last count.
		return min(max(w.limit-w.carry, 0), satAdd(w.remaining, int64(min(w.pace*now.Sub(w.at).Seconds(), math.MaxInt64/4))))
	case w.limit >= 0:
		full := max(w.limit-w.carry, 0) // a new window, full
		if w.offline > 0 {
			return int64(float64(full) * w.offline) // renewed while the fleet cannot answer: a share (unanswered)
		}
		return full
	}
	return provider.Unknown
}

// nextReset returns when a fixed window is next full again after now: its
// stated reset, or, once that passed, the next one a span later (zero when
// the span is not known).
func (w *window) nextReset(now time.Time) time.Time {
	if w.reset.IsZero() || w.reset.After(now) {
		return w.reset
	}
	span := w.period()
	if span <= 0 {
		return time.Time{}
	}
	// A window aligned to the clock ends a span after the last one; one
	// that starts with its first request after the last one ended (the
	// router's own, sent at now) ends a span after that request: the
	// later of the two, so that neither shape is refilled early.
	// The latter's span is the longest countdown its last window stated
	// (its first request's states the whole span), no longer than the
	// period.
	whole := w.span
	if w.spanSeen > 0 {
		whole = w.spanSeen
	}
	next := w.reset.Add(span + ResetMargin)
	if alt := now.Add(min(whole, span) + ResetMargin); alt.After(next) {
		return alt
	}
	return next
}

// sent is what one attempt spent of a window, and when (window.spent).
type sent struct {
	at time.Time
	n  int64
}

// spentLog is a window's spends of its last period, in the order sent.
type spentLog struct{ e []sent }

// maxSpent bounds window.spent: past it the two oldest entries are one,
// at the later one's time (it leaves the span later: the safe side).
const maxSpent = 128

// sliding reports whether the window holds what a span allows: it is
// proved fixed (noteRate) while the phase of its windows is not known
// yet (the reset is the router's projection, and no answer to an
// attempt sent at the pace came: pacedFrom). A fixed window of the
// window's span, whatever its phase, lies within some span before now,
// so the limit less what was sent in the last span fits in it; the
// bucket's pace (a tenth of that, for "9 left, 10s" on a 10 s window)
// served 12 of the 21 that fit this way before the pace's answer came.
func (w *window) sliding() bool {
	return w.fixed && !w.pacedFrom.IsZero() && w.projected && w.pace > 0 && !w.refilling() &&
		w.limit > 0 && !w.holding && w.period() > 0
}

// slide is the span a sliding window counts what was sent in: its
// period and a margin.
func (w *window) slide() time.Duration { return w.period() + ResetMargin }

// spentSince is what was sent after from (window.spent).
func (w *window) spentSince(from time.Time) int64 {
	var n int64
	if w.spent == nil {
		return 0
	}
	for _, e := range w.spent.e {
		if e.at.After(from) {
			n += e.n
		}
	}
	return n
}

// slidingAt is when a sliding window holds need: when enough of what was
// sent in the last span has left it (a span from now at the latest).
func (w *window) slidingAt(now time.Time, need int64) time.Time {
	from := now.Add(-w.slide())
	in := w.spentSince(from)
	if w.spent == nil {
		return now
	}
	for _, e := range w.spent.e {
		if !e.at.After(from) {
			continue
		}
		if in -= e.n; w.limit-in >= need {
			return e.at.Add(w.slide())
		}
	}
	return now.Add(w.slide())
}

// logSpent notes n spent at now in window.spent while the window may be
// paced (pace > 0: every statement was a bucket's as well as a fixed
// window's), and drops what left the span; nothing otherwise.
func (w *window) logSpent(now time.Time, n int64) {
	if w.pace <= 0 || w.refilling() || w.period() <= 0 {
		w.spent = nil
		return
	}
	if w.spent == nil {
		w.spent = &spentLog{}
	}
	l, from, k := w.spent, now.Add(-w.slide()), 0
	for k < len(l.e) && !l.e[k].at.After(from) {
		k++
	}
	l.e = append(l.e[:0], l.e[k:]...)
	if len(l.e) >= maxSpent {
		l.e[1].n += l.e[0].n
		l.e = append(l.e[:0], l.e[1:]...)
	}
	l.e = append(l.e, sent{at: now, n: n})
}

// keep is the share of the limit an attempt must leave unspent (reserve).
func (w *window) keep(reserve float64) int64 {
	if reserve <= 0 || w.limit <= 0 {
		return 0
	}
	return int64(reserve * float64(w.limit)) // whole units: no reserve of a window of 1
}

// availableAt returns when n units (leaving the reserve unspent) are there:
// now, the next reset, or, for a refilling window, when enough has
// refilled. An attempt larger than what the window may ever give goes when
// the window is full (alone). A window with nothing known holds nothing
// back.
func (w *window) availableAt(now time.Time, n int64, reserve float64) time.Time {
	if w.remaining < 0 {
		return now // never stated (the common case: no lookup of the clock)
	}
	return w.availableAtCur(now, w.current(now), n, reserve)
}

// availableAtCur is availableAt with the window's current count at now.
func (w *window) availableAtCur(now time.Time, cur, n int64, reserve float64) time.Time {
	if cur < 0 {
		return now
	}
	need := w.expected(n)
	need += w.keep(reserve)
	if w.limit >= 0 {
		need = min(need, w.limit) // more than the window holds: it goes on a full window
	}
	if cur >= max(need, 1) {
		return now
	}
	if w.refilling() {
		secs := min(float64(max(need, 1)-cur)/w.refillRate(), provider.MaxCooldown.Seconds())
		return now.Add(time.Duration(math.Ceil(secs * float64(time.Second))))
	}
	if w.sliding() {
		return w.slidingAt(now, max(need, 1))
	}
	if w.paced() && !w.reset.After(now) {
		secs := min(float64(max(need, 1)-cur)/w.pace, provider.MaxCooldown.Seconds())
		return now.Add(time.Duration(math.Ceil(secs * float64(time.Second))))
	}
	if r := w.nextReset(now); r.After(now) {
		return r
	}
	if w.holding {
		return now.Add(holdWait)
	}
	return now
}

// unhold ends a holding window's count when no attempt is in flight to
// state it again: the next attempt goes, and its answer says.
func (w *window) unhold() {
	if w.holding {
		w.holding, w.remaining = false, provider.Unknown
	}
}

// spend takes n from the window at now (the count never goes below 0), so
// that concurrent attempts do not all count on the same last unit. A fixed
// window whose reset passed starts its next span.
func (w *window) spend(now time.Time, n int64) {
	cur := w.current(now)
	if cur < 0 {
		return
	}
	if !w.refilling() {
		if !w.holding && !w.reset.After(now) {
			// The provider's window is taken to be full, as far as the
			// router knows (none of what it spent lately may count).
			if w.paced() && w.pacedFrom.IsZero() {
				w.pacedFrom = now
			}
			w.reset, w.projected = w.nextReset(now), true
			if w.reset.IsZero() && w.limit > 0 {
				w.holding = true // span unknown: the limit bounds the burst
			}
			w.rolledAt = now
			if w.spanSeen > 0 {
				w.span, w.spanSeen = w.spanSeen, 0
			}
			w.stated, w.statedIn = provider.Unknown, [2]time.Duration{}
			if w.carry == 0 {
				w.stated = w.limit
			}
			w.carry = 0
		} else if !w.reset.IsZero() && !now.Before(w.reset.Add(-max(w.uncertain, ResetMargin))) {
			w.carry += n // within the uncertainty before a known reset (a holding window has none)
		}
	}
	w.remaining, w.at = max(cur-w.expected(n), 0), now
	w.logSpent(now, w.expected(n))
}

// forecast returns how many units the window lets start from now until
// until, leaving the reserve unspent: what is left now, plus each refill
// before until; this instance's share of them in fleet mode, or all of
// them (whole: the fleet's, for a place counted fleet-wide). provider.Unknown when the window holds nothing back, or when
// it cannot tell (the span of a fixed window is unknown).
func (w *window) forecast(now, until time.Time, reserve float64, whole bool) int64 {
	cur := w.current(now)
	if cur < 0 {
		return provider.Unknown
	}
	keep := w.keep(reserve)
	total := max(cur-keep, 0)
	share := w.shareOf
	if whole {
		share = func(n int64) int64 { return n }
	}
	if !until.After(now) {
		return share(total)
	}
	if w.refilling() {
		f := satAdd(total, int64(min(w.refillRate()*until.Sub(now).Seconds(), math.MaxInt64/4)))
		if !whole && w.offline == 0 && w.fleetN > 1 {
			// The fleet's bucket (its count and whole rate, spentFleet):
			// this instance's equal share of it, as while the fleet cannot
			// answer (unanswered), where a fixed window's share is learned.
			f /= int64(w.fleetN)
		}
		return f
	}
	if w.firstRate > 0 {
		return satAdd(total, int64(min(w.firstRate*until.Sub(now).Seconds(), math.MaxInt64/4)))
	}
	if w.sliding() {
		// What leaves the span by until, and a limit each span after.
		back := w.limit - w.spentSince(now.Add(-w.slide())) - w.spentSince(until.Add(-w.slide()))
		spans := int64(until.Sub(now) / w.slide())
		return share(satAdd(total+max(back, 0), spans*max(w.limit-keep, 0)))
	}
	r := w.nextReset(now)
	switch {
	case r.IsZero():
		return provider.Unknown
	case r.After(until):
		return share(total)
	case w.span <= 0 || w.limit < 0:
		return provider.Unknown // a window of unknown limit: after its reset, who knows
	}
	// Each later reset comes a span and a margin after the one before, as
	// nextReset rolls the window: the provider's next window starts with
	// the first request after its reset.
	resets := int64(until.Sub(r)/(w.forecastPeriod()+ResetMargin)) + 1
	per := max(w.limit-keep, 0)
	if resets > 0 && per > (math.MaxInt64/4)/resets {
		return math.MaxInt64 / 4 // more than anyone will ask
	}
	return share(satAdd(total, resets*per-w.carry))
}

// satAdd adds two counts, saturating at a quarter of the int64 range.
func satAdd(a, b int64) int64 {
	if a > math.MaxInt64/4-b {
		return math.MaxInt64 / 4
	}
	return a + b
}

// shareOf is this instance's part of n units of a window the fleet shares.
func (w *window) shareOf(n int64) int64 {
	if w.share <= 0 || w.share >= 1 {
		return n
	}
	return int64(float64(n) * w.share)
}

// forecastUnits is forecast in the router's estimate units: what the
// window lets start, divided by what it counts per unit estimated. Until
// that ratio is learned it is taken as 1, or as the bound an answer set
// (ratioCap), when lower: providers admit a request on an estimate made
// from the request itself, its characters and its max_tokens, before any
// token is generated (OpenAI; Anthropic's output tokens likewise,
// PROVIDERS.md), which is what the router's estimate, prompt bytes / 4
// plus max_tokens, counts; a window that counts what answers used says so
// with its first answer. So a request that the window cannot start before
// its deadline is told at once, not when the deadline passes; once
// learned, the ratio corrects the forecast.
func (w *window) forecastUnits(now, until time.Time, reserve float64, whole bool) int64 {
	f := w.forecast(now, until, reserve, whole)
	r := w.ratio
	if r <= 0 {
		r = w.ratioCap
	}
	if f < 0 || r <= 0 {
		return f
	}
	return int64(float64(f) / r)
}
