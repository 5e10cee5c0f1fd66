package router

import (
	"context"
	"errors"
	"time"

	"go.uber.org/zap"

	"github.com/llmrouter/caddy-llm-router/internal/capacity"
	"github.com/llmrouter/caddy-llm-router/provider"
)

// Hedging (Router.HedgeAfter): an attempt that has produced no content
// after HedgeAfter gets a twin on the next best deployment that has
// capacity now; the first of the two to produce content answers.

// errHedgeLost cancels the attempt of a hedged pair that did not answer.
var errHedgeLost = errors.New("the other attempt answered first")

// Hedge values of Result.Hedge.
const (
	// HedgeLost: a hedge was started, and the first attempt answered.
	HedgeLost = "lost"
	// HedgeWon: a hedge was started, and it answered.
	HedgeWon = "won"
)

// exchanged is one attempt's outcome, with its deployment's index in the
// group.
type exchanged struct {
	i   int
	a   *attempt
	out *outcome
}

// final reports whether an outcome ends the request: an answer, a
// provider's client error passed on, the client gone, the deadline past.
func (e exchanged) final() bool {
	return e.out.end == clientGone || e.out.end == pastDeadline ||
		e.out.end == answered && (e.out.obs.Class == provider.OK || e.out.obs.Class == provider.ClientError)
}

// exchange sends attempt a (on deployment i) and returns the outcomes to
// settle, in order. Without hedging, or when a answers within HedgeAfter,
// that is a's alone. Otherwise a hedge starts (hedge, when the group has
// a deployment with capacity now and nobody waits in its queue), and the
// first outcome that ends the request wins: the other attempt is
// cancelled, its claim released, and only the winner is returned. A
// failure is returned first, and the other attempt's outcome after it.
func (r *Router) exchange(ctx context.Context, g *Group, req *Request, res *Result, w *walk, i int, a *attempt,
	need capacity.Need, deadline time.Time, buf []exchanged) []exchanged {
	if r.HedgeAfter <= 0 || req.resume != nil || req.NoHedge || res.Hedge != "" {
		return append(buf, exchanged{i, a, a.exchange(req)})
	}
	done := make(chan exchanged, 2)
	fire := make(chan struct{})
	// The timer is set before the attempt is sent: HedgeAfter counts from
	// the send, whatever the scheduler does.
	timer := r.Clock.AfterFunc(r.HedgeAfter, func() { close(fire) })
	go func() { done <- exchanged{i, a, a.exchange(req)} }()
	select {
	case e := <-done:
		timer.Stop()
		return append(buf, e)
	case <-fire:
	}
	h, j := r.hedge(ctx, g, req, res, w, i, need, deadline)
	if h == nil {
		return append(buf, <-done)
	}
	res.Hedge = HedgeLost
	go func() { done <- exchanged{j, h, h.exchange(req)} }()
	first := <-done
	if first.final() {
		loser := a
		if first.a == a {
			loser = h
		}
		loser.cancel(errHedgeLost)
		r.drop(res, <-done, req.Stream)
		buf = append(buf, first)
	} else {
		buf = append(buf, first, <-done) // the failure, then the other
	}
	if last := buf[len(buf)-1]; last.a == h && last.out.end == answered && last.out.obs.Class == provider.OK {
		res.Hedge = HedgeWon
		if r.Observer != nil {
			r.Observer.HedgeWon(g, h.d)
		}
	}
	return buf
}

// hedge starts the twin of the attempt on deployment i: on the best
// candidate other than i with capacity now, when no request waits in g's
// queue (capacity is theirs first). It returns nil when there is none.
func (r *Router) hedge(ctx context.Context, g *Group, req *Request, res *Result, w *walk, i int,
	need capacity.Need, deadline time.Time) (*attempt, int) {
	if g.Queued() > 0 || !r.attemptsLeft(res) {
		return nil, -1
	}
	now := r.Clock.Now()
	if !now.Before(deadline) || ctx.Err() != nil {
		return nil, -1
	}
	var buf [16]scored
	cands, _ := candidates(buf[:0], g.Deployments, w, now, deadline, req, need)
	for k := 0; k < len(cands); k++ {
		if cands[k].i == i || cands[k].f.Probe {
			cands = append(cands[:k], cands[k+1:]...)
			k--
		}
	}
	if len(cands) == 0 {
		return nil, -1
	}
	cands = r.readers(g, cands, w.per, nil, req, need, now, deadline)
	cands = r.tiered(g, cands, w.per, nil, req, need, now, deadline)
	ready := readyFirst(cands, now)
	if ready == 0 {
		return nil, -1
	}
	r.score(g.Deployments, cands[:ready])
	k := r.pick(g.Deployments, cands[:ready])
	j, d := cands[k].i, g.Deployments[cands[k].i]
	a, ok := r.plan(ctx, d, req, deadline)
	if !ok {
		w.per[j].excluded, w.unplanned = true, a.out
		return nil, -1
	}
	held, refused := r.hold(d, g, req, now)
	if refused != nil {
		a.finish()
		return nil, -1 // no hedge its budgets cannot hold
	}
	st := d.stateFor(req)
	claim, ok := st.AcquireFor(now, need)
	if !ok {
		held.release(now, d, g)
		a.finish()
		return nil, -1
	}
	a.out.claimed(claim, st, g, held, need)
	a.out.span = startSpan(ctx, d, req, a.plan, res.Attempts+1, provider.OK, r.Clock.Now().Sub(res.lastEnd))
	res.Attempts++
	w.per[j].tried = true
	if r.Observer != nil {
		r.Observer.Hedge(g, d)
	}
	r.debug("hedging a slow attempt", zap.String("group", g.Name), zap.String("with", d.Name),
		zap.Duration("after", r.HedgeAfter))
	return a, j
}

// lostHedge records the attempt of a hedged pair that the other one won
// before it answered: its deployment is at least as slow as it ran (to
// its first content, for a stream; capacity.State.RecordLostHedge).
func (o *outcome) lostHedge(stream bool) {
	if stream {
		o.state().RecordLostHedge(0, o.took)
	} else {
		o.state().RecordLostHedge(o.took, 0)
	}
}

// drop ends the attempt of a hedged pair that did not answer: an answer
// that came anyway is observed (what it says of capacity is true, and it
// spent what it used), one cut before it answered charged its prompt and
// max_tokens (chargeLeft), a stream closed (Stream.charge); its claim is
// released either way.
// One cancelled before it answered is a censored latency sample (stream:
// of time to first content): its deployment took at least that long, so
// that one slower than its peers stops ranking first.
func (r *Router) drop(res *Result, e exchanged, stream bool) {
	out := e.out
	lost := errors.Is(context.Cause(e.a.ctx), errHedgeLost)
	if lost && out.obs.Class != provider.OK {
		out.lostHedge(stream)
	}
	if out.end == answered && !lost {
		out.state().ObserveAttempt(out.claim, r.Clock.Now(), out.obs, r.Policy)
	}
	if ok := out.end == answered && out.obs.Class == provider.OK; ok && out.stream == nil {
		if u, stated := provider.UsageOf(out.format, out.body); stated {
			r.spend(r.Clock.Now(), out.d, out.group, u, out.holds) // it answered, and was billed, even if too late
			res.others = append(res.others, Leg{Deployment: out.d, Usage: u})
		}
	} else if lost {
		r.chargeLeft(res, out) // cut while its provider worked
	}
	if out.stream != nil {
		out.stream.span = out.span // ended with it
		out.stream.Close()
		res.others = append(res.others, out.stream.Legs()...)
		return
	}
	endSpan(out.span, provider.OK, "", provider.Usage{}, false, nil, "")
	out.release(r.Clock.Now())
}
