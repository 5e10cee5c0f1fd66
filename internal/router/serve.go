package router

import (
	"cmp"
	"context"
	"math"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/llmrouter/caddy-llm-router/internal/capacity"
	"github.com/llmrouter/caddy-llm-router/internal/jsonbody"
	"github.com/llmrouter/caddy-llm-router/provider"
)

// attemptState is what one request learned about a deployment.
type attemptState struct {
	excluded bool // never again in this request (context_length, too_large, auth, quota, cannot express)
	tooSmall bool // its context_window is smaller than the request's estimate: never tried
	tooLarge bool // the request is larger than its token window's whole limit (stated, or too_large)
	silent   bool // timed out: only if nothing else is left
	failed   bool // it failed this request: tried again only if nothing else is left
	tried    bool // an attempt went out to it
}

// walk is one request's way through its group: what it learned of each
// deployment, and where it stands.
type walk struct {
	// waited is the time spent in the queue since the walk last told its
	// Result (Result.Waited).
	waited     time.Duration
	per        []attemptState
	last       *outcome       // the last failed attempt
	unplanned  *outcome       // the last deployment that could not express the request
	budget     *budgetRefusal // the last deployment whose budget could not hold the request
	failures   int
	limited    int      // failures that were rate limits or spent quotas
	refusedKey int      // failures that were the provider refusing the key (auth)
	minContext int64    // after a context_length failure: only larger windows; -1 none
	pending    *outcome // a failed attempt not yet logged (logPending)
	// widen: the deployments it has not tried cannot serve it in time, so
	// those it failed on are candidates again (see candidates).
	widen bool
	// prior is the last failed attempt of the group this one falls back
	// from: the first attempt here is its failover.
	prior *outcome
}

// serve is ServeGroup's loop over one group: it returns res once
// answered or failed. Each turn takes the candidates still eligible
// (candidates), those that can read the request and the tiers it may use
// (readers, tiered), and its turn in the queue; then it waits (await) when
// none may go now, or chooses a deployment (choose), plans the attempt
// (planAttempt), holds and claims its capacity (take), and sends it
// (send).
func (r *Router) serve(ctx context.Context, g *Group, req *Request, res *Result, w *walk, deadline time.Time) *Result {
	group := g.Deployments
	need := capacity.Need{Tokens: req.Tokens, Output: req.OutputTokens, Prefixes: req.CachePrefixes(),
		Reserve: r.Reserve.share(req.Priority)}
	now := r.Clock.Now() // one clock read for every deployment's budget, not one each
	if err := r.groupBudget(g, req, need, now, deadline); err != nil {
		r.debug("the group's budget cannot hold the request", zap.String("group", g.Name), zap.String("why", err.Message))
		return res.fail(err, w)
	}
	for _, d := range group {
		r.checkBudget(d, now)
	}
	var me *waiter // while the request waits in g's queue
	defer func() {
		if me != nil {
			w.waited += r.leaveQueue(g, me)
		}
		res.Waited, w.waited = res.Waited+w.waited, 0
	}()
	var candBuf [16]scored
	for {
		if ctx.Err() != nil {
			return res.fail(ErrClientGone, w)
		}
		now := r.Clock.Now()
		if !r.attemptsLeft(res) {
			return r.giveUp(res, w, group, now, req)
		}
		cands, retry := candidates(candBuf[:0], group, w, now, deadline, req, need)
		if !now.Before(deadline) {
			if me != nil {
				return res.fail(queueError(cands, now), w) // waited its turn until the deadline
			}
			return res.fail(deadlineError(), w)
		}
		if len(cands) == 0 {
			return r.giveUp(res, w, group, now, req)
		}
		if retry && fallbackLeft(g, req, need, now, deadline) {
			// Only deployments that failed it or cool past its deadline are
			// left here: the fallback group, untried, before any of them.
			if w.last == nil {
				return res.fail(coolingError(cands, earliest(cands), now), w)
			}
			return r.giveUp(res, w, group, now, req)
		}
		cands = r.readers(g, cands, w.per, me, req, need, now, deadline)
		cands = r.tiered(g, cands, w.per, me, req, need, now, deadline)
		ready := readyFirst(cands, now)
		free := ready
		if ready > 0 && !g.queue.first(me, req.Priority) {
			// Others wait before it: it may go only past a head blocked for
			// capacity of its own, to deployments that head does not wait for.
			ready = 0
			if waitsFor, blocked := g.queue.headBlocked(me, req.CountTokens, group, now); blocked {
				ready = bypass(cands, free, waitsFor)
			}
		}
		if ready == 0 {
			if err := r.await(ctx, g, &me, req, cands, free, retry, w, need, now, deadline); err != nil {
				return res.fail(err, w)
			}
			continue
		}
		if me != nil && g.Fleet != nil {
			// Its turn in the fleet's queue, not only in this instance's.
			if ok, err := r.fleetTurn(ctx, g, me, cands[:ready], need, now, deadline); err != nil {
				return res.fail(err, w)
			} else if !ok {
				continue
			}
		}
		i := r.choose(group, cands, ready, req, res.Attempts+1, now)
		a, ok := r.planAttempt(ctx, group[i], req, deadline)
		if !ok {
			w.per[i].excluded, w.unplanned = true, a.out
			continue
		}
		if taken, err := r.take(ctx, g, &me, req, w, i, a, need, now, deadline); err != nil {
			return res.fail(err, w)
		} else if !taken {
			continue
		}
		if answered := r.send(ctx, g, req, res, w, i, a, need, deadline); answered {
			return res
		}
	}
}

// await is the loop's step when no candidate may take the request now
// (none is ready, or others wait before it in g's queue): it joins the
// queue (me, nil until then) and looks again, waits there for its turn or
// for capacity (wait), or widens the walk to the deployments the request
// failed on (w.widen) when those it has not tried cannot serve it in time
// and no fallback group is left. Its error ends the request: a fallback
// group rather than a wait (coolingError), a full queue (queueFullError),
// or what the wait answered.
func (r *Router) await(ctx context.Context, g *Group, me **waiter, req *Request, cands []scored, free int, retry bool,
	w *walk, need capacity.Need, now, deadline time.Time) error {
	if free == 0 && recovering(cands, w.per, now) && fallbackLeft(g, req, need, now, deadline) {
		// Its deployments cool down after failures, or failed this
		// request: the fallback group, rather than a wait for a
		// retry that may fail again.
		return coolingError(cands, earliest(cands), now)
	}
	if *me == nil {
		var limit int
		if *me, limit = r.joinQueue(g, req, cands, need, now, deadline); *me == nil {
			return queueFullError(g, cands, limit, now)
		}
		// Its tiers and its turn again, from its place: others
		// may have joined the queue since it chose them.
		return nil
	}
	if err := r.wait(ctx, g, *me, cands, free, w, need, now, deadline); err != nil {
		if _, late := err.(*Error); late && !retry && !w.widen && !fallbackLeft(g, req, need, now, deadline) && widens(g, w, req, need, now, deadline) {
			// Those it has not tried cannot serve it before its
			// deadline, and no fallback group is left: those it
			// failed on may.
			w.widen = true
			return nil
		}
		return err
	}
	return nil
}

// widens reports whether widening w (w.widen) adds candidates: deployments
// the request failed on, or that cool past its deadline. When it adds
// none, the late answer stands: a second look would give it again, a round
// trip to the fleet's queue later.
func widens(g *Group, w *walk, req *Request, need capacity.Need, now, deadline time.Time) bool {
	var buf [16]scored
	narrow, _ := candidates(buf[:0], g.Deployments, w, now, deadline, req, need)
	n := len(narrow)
	w.widen = true
	wide, _ := candidates(buf[:0], g.Deployments, w, now, deadline, req, need)
	w.widen = false
	return len(wide) > n
}

// choose returns the index in group of the deployment to try among the
// first ready candidates: a half-open circuit's that waits for its probe,
// else the request's preferred deployment (affinity) when it may take it,
// else the ranking's pick (score, pick). It logs the decision at debug
// level, as attempt number attempt.
func (r *Router) choose(group []*Deployment, cands []scored, ready int, req *Request, attempt int, now time.Time) int {
	k := awaitingProbe(cands[:ready])
	if k < 0 && req.Prefer != nil {
		k = r.preferred(group, cands[:ready], req)
	}
	if k < 0 {
		r.score(group, cands[:ready])
		k = r.pick(group, cands[:ready])
	}
	i := cands[k].i
	if ce := r.Logger.Check(zapcore.DebugLevel, "routing decision"); ce != nil {
		ce.Write(zap.Int("attempt", attempt), zap.String("chose", group[i].Name),
			zap.String("candidates", describe(group, cands, now)))
	}
	return i
}

// planAttempt plans an attempt on d (plan). It reports false, with the
// attempt's outcome saying why, when d cannot take the request: its
// provider cannot express it, or, for a resume's request, it answers in
// another format than the stream's.
func (r *Router) planAttempt(ctx context.Context, d *Deployment, req *Request, deadline time.Time) (*attempt, bool) {
	a, ok := r.plan(ctx, d, req, deadline)
	if ok && req.resume != nil && a.out.format != req.resume.format {
		// A resume reads on in the stream's format.
		a.finish()
		a.out.obs = provider.NewObservation(provider.ClientError)
		a.out.obs.Message = "the deployment answers in " + a.out.format.String() + ", the stream is in " + req.resume.format.String()
		ok = false
	}
	return a, ok
}

// take readies the planned attempt a on deployment i to be sent: it holds
// the request's worst case of its budgets (hold), claims the deployment's
// capacity and takes the request out of g's queue (me) if it waited
// there; true once a may go. Otherwise, with a finished, false: the
// deployment's budget cannot hold the request (it is out of the request),
// the group's cannot now (waitBudget waited, or its error ends the
// request), or the claim was refused (a half-open circuit's probe was
// taken meanwhile, or the fleet's budget).
func (r *Router) take(ctx context.Context, g *Group, me **waiter, req *Request, w *walk, i int, a *attempt,
	need capacity.Need, now, deadline time.Time) (bool, error) {
	d := g.Deployments[i]
	// Its worst case held of its budgets before it is sent.
	held, refused := r.hold(d, g, req, now)
	if refused != nil {
		a.finish()
		if !refused.group {
			// Its deployment's budget cannot take it: another may.
			w.per[i].excluded, w.budget = true, refused
			return false, nil
		}
		return false, r.waitBudget(ctx, g, me, req, need, refused, now, deadline)
	}
	a.out.holds = held
	// Claimed only for an attempt that goes out: a request the
	// provider cannot express spends none of its windows.
	left := false
	if *me != nil {
		(*me).taking.Store(true)
		// Out of the fleet's queue before it spends, as out of this
		// instance's places (taking): never counted twice.
		left = (*me).member != ""
		leaveFleet(g, *me, false)
	}
	st := d.stateFor(req)
	claim, ok := st.AcquireFor(now, need)
	if !ok {
		if *me != nil {
			// Back in its place with its fair tag (in the fleet's at its
			// next look, which gives back the turn its served leave took:
			// one turn charged for one request served).
			(*me).taking.Store(false)
			(*me).refused = (*me).refused || left
		}
		held.release(now, d, g)
		a.finish()
		return false, nil // a half-open circuit's probe was taken meanwhile, or the fleet's budget
	}
	if *me != nil {
		g.queue.served(*me)
		w.waited += r.leaveQueue(g, *me) // its turn came: the next one may look
		*me = nil
	}
	a.out.claimed(claim, st, g, held, need)
	return true, nil
}

// send makes the attempt a on deployment i, and its hedge if one starts
// (exchange), counts it, tells of the failover that led to it, and
// settles its outcomes: it reports whether the request is answered.
func (r *Router) send(ctx context.Context, g *Group, req *Request, res *Result, w *walk, i int, a *attempt,
	need capacity.Need, deadline time.Time) bool {
	d := g.Deployments[i]
	r.logPending(w, d)
	from := provider.OK
	if last := cmp.Or(w.last, w.prior); last != nil {
		from = last.obs.Class
	}
	a.out.span = startSpan(ctx, d, req, a.plan, res.Attempts+1, from, r.Clock.Now().Sub(res.lastEnd))
	res.Attempts++
	w.per[i].tried = true
	var xbuf [2]exchanged
	outs := r.exchange(ctx, g, req, res, w, i, a, need, deadline, xbuf[:0])
	res.lastEnd = r.Clock.Now()
	if last := cmp.Or(w.last, w.prior); last != nil {
		last.state().RecordFailover(last.obs.Class)
		if r.Observer != nil {
			r.Observer.Failover(last.d, last.obs.Class)
		}
	}
	w.prior = nil
	for _, e := range outs {
		if done := r.settle(res, w, req, e.i, e.out); done {
			return true
		}
	}
	return false
}

// joinQueue puts req in this instance's queue of g unless it is full
// (the fleet's queue at its first look: wait) and returns its place; nil
// and the queue's bound (max_queued) when it is full. The default bound
// holds while nothing known bounds what cands serve (windowsBound): where
// their windows are known, the forecast bounds the queue, and tells each
// place it cannot serve before its deadline at its first look.
func (r *Router) joinQueue(g *Group, req *Request, cands []scored, need capacity.Need, now, deadline time.Time) (*waiter, int) {
	me := &waiter{priority: req.Priority, tokens: req.Tokens, counts: req.CountTokens, reserve: need.Reserve, since: now, deadline: deadline}
	me.apart = req.CountTokens && countsApart(g.Deployments)
	if g.Fleet == nil || req.Weight > 0 {
		// Consumers (a weight): the fleet's queue orders by their fair share too (FleetQueue.JoinAs).
		me.consumer, me.weight = req.Consumer, req.Weight
	}
	limit := g.maxQueued(r.Deadline)
	joined := g.queue.join(me, limit)
	if !joined && g.MaxQueued == 0 && windowsBound(g, cands, need, now, deadline) {
		joined = g.queue.join(me, math.MaxInt)
	}
	if !joined {
		r.debug("the group's queue is full", zap.String("group", g.Name), zap.Int("max_queued", limit))
		return nil, limit
	}
	r.observeQueue(g)
	return me, 0
}

// windowsBound reports whether the known windows of cands (the fleet's,
// in fleet mode) bound what they serve before deadline.
func windowsBound(g *Group, cands []scored, need capacity.Need, now, deadline time.Time) bool {
	if len(cands) == 0 {
		return false
	}
	_, known := forecast(g.Deployments, cands, 1, 0, need.Reserve, now, deadline, g.Fleet != nil)
	return known
}

// awaitingProbe returns the first candidate whose half-open circuit waits
// for its probe, -1 when none does: a deployment that failed ranks low on
// reliability, and would never be found back if its probe had to win the
// ranking.
func awaitingProbe(cands []scored) int {
	for k := range cands {
		if cands[k].f.Probe {
			return k
		}
	}
	return -1
}

// leaveQueue takes me out of g's queue and reports its wait, if it waited
// (a request answered 429 when it joined did not), and returns it (0
// when it did not).
func (r *Router) leaveQueue(g *Group, me *waiter) (waited time.Duration) {
	g.queue.leave(me)
	if !me.served && me.refused && me.member == "" && me.weight > 0 && g.Fleet != nil {
		// Its claim refused after its served leave, and gone unserved
		// before it joined again: its turn back, by a join that gives
		// the served leave's back (FleetJoin.GiveBack), left unserved.
		if j := g.joinFleet(me, false, time.Second); j.Err == nil {
			me.member = j.Member
		}
	}
	leaveFleet(g, me, !me.served)
	me.mu.Lock()
	slept := me.slept
	me.mu.Unlock()
	if slept {
		waited = r.Clock.Now().Sub(me.since)
		g.waits.Add(1)
		g.waited.Add(int64(waited))
		if r.Observer != nil {
			r.Observer.QueueWait(g, waited)
		}
	}
	r.observeQueue(g)
	return waited
}

// observeQueue reports g's queue length, read and reported under
// g.observeMu, so that the last report is of the length after every
// join and leave before it.
func (r *Router) observeQueue(g *Group) {
	if r.Observer != nil {
		g.observeMu.Lock()
		defer g.observeMu.Unlock()
		r.Observer.Queue(g, g.Queued())
	}
}

// settle folds an attempt's outcome into the request and the deployment's
// state: it reports whether the request is answered (res is set).
func (r *Router) settle(res *Result, w *walk, req *Request, i int, out *outcome) bool {
	if out.end == clientGone || out.end == pastDeadline {
		r.cutShort(res, w, out)
		return true
	}
	d := out.d
	out.redact(d.Secrets)
	class := out.obs.Class
	if r.Observer != nil {
		r.Observer.Attempt(d, class, out.took)
	}
	observed := out.state().ObserveAttempt(out.claim, r.Clock.Now(), out.obs, r.Policy)
	if observed.Learned && out.queue != nil {
		out.queue.kickAllBut(nil) // forecasts that could not tell may now
	}
	if out.stream == nil {
		defer out.release(r.Clock.Now()) // after its answer is spent; a stream releases when it ends
	}
	switch class {
	case provider.OK:
		r.recordAnswer(res, out)
		res.succeed(out, w)
		return true
	case provider.ClientError:
		endSpan(out.span, class, out.obs.Message, provider.Usage{}, false, nil, "")
		if req.refusedBound(out) {
			// It could not read state another organization minted: once
			// more without any of it, elsewhere while another is left.
			r.noteFailure(w, out, observed)
			w.last, w.per[i].failed = out, true
			w.failures++
			return false
		}
		res.passOn(out, w)
		return true
	}
	endSpan(out.span, class, out.obs.Message, provider.Usage{}, false, nil, "")
	if class == provider.RateLimited {
		r.unpredicted(out)
	}
	r.noteFailure(w, out, observed)
	w.last = out
	w.learn(res, i, out)
	return false
}

// cutShort ends the request whose attempt out the request itself cut
// before an answer: its client gone, or its deadline past. An attempt
// that ran out most of the deadline is observed as failed; one that is no
// stream is charged what its provider billed (chargeLeft) and released.
func (r *Router) cutShort(res *Result, w *walk, out *outcome) {
	if out.end == pastDeadline && out.took >= r.Deadline/2 {
		// It ran out most of the request's deadline without an
		// answer: a hang, a failure as a timeout is (by default no
		// timeout is set, and the deadline is the only bound).
		out.state().ObserveAttempt(out.claim, r.Clock.Now(), out.obs, r.Policy)
	}
	if out.stream == nil {
		r.chargeLeft(res, out)
		out.release(r.Clock.Now()) // the attempt ended unobserved
	}
	endSpan(out.span, provider.Transport, map[ending]string{clientGone: "the client went away", pastDeadline: "the request's deadline passed"}[out.end],
		provider.Usage{}, false, nil, "")
	if out.end == clientGone {
		res.fail(ErrClientGone, w)
	} else {
		res.fail(deadlineError(), w)
	}
}

// recordAnswer records what a successful attempt's answer used and ends
// its span: a whole answer's usage, as its provider stated it, spent
// against its deployment's and group's budgets and its prompt cache; a
// stream's span is handed to the stream, which ends it.
func (r *Router) recordAnswer(res *Result, out *outcome) {
	if out.stream != nil {
		out.stream.span = out.span // ended with the stream
		return
	}
	if res.Usage, res.UsageStated = provider.UsageOf(out.format, out.body); res.UsageStated {
		r.spend(r.Clock.Now(), out.d, out.group, res.Usage, out.holds)
		out.d.State.RecordCache(r.Clock.Now(), out.prefixes, res.Usage)
	}
	if out.span != nil { // the answer read again only for a trace
		model, _ := jsonbody.GetString(out.body, "model")
		endSpan(out.span, provider.OK, "", res.Usage, res.UsageStated, provider.FinishReasons(out.format, out.body), model)
	}
}

// learn notes what the failed attempt out, on deployment i, tells the
// request of that deployment: excluded for its context window, its token
// window, its key or its quota (the last three certain refusals: no
// attempt of MaxAttempts spent, res.refused); else failed, and silent when
// it timed out.
func (w *walk) learn(res *Result, i int, out *outcome) {
	switch out.obs.Class {
	case provider.ContextLength:
		w.per[i].excluded = true
		w.minContext = max(w.minContext, out.d.ContextWindow)
	case provider.TooLarge:
		// Larger than its window's whole limit: elsewhere, or the 413. It
		// failed nothing (no cooldown) and was certain: no attempt spent.
		w.per[i].excluded, w.per[i].tooLarge = true, true
		res.refused++
	case provider.Auth, provider.QuotaExhausted:
		w.per[i].excluded = true
		w.failures++
		res.refused++ // certain, and the deployment is out: no attempt spent
		if out.obs.Class == provider.QuotaExhausted {
			w.limited++
		} else {
			w.refusedKey++
		}
	case provider.RateLimited:
		w.per[i].failed = true
		w.failures++
		w.limited++
	default:
		if out.end == timedOut {
			w.per[i].silent = true
		}
		w.per[i].failed = true
		w.failures++
	}
}

// attemptsLeft reports whether res may make another attempt: MaxAttempts
// bounds those made, less the certain refusals (a revoked key, a spent
// quota, too_large), which another deployment's attempt must not pay for. Each
// deployment refuses a request once at most (it is then excluded), so the
// attempts stay bounded by MaxAttempts plus the number of deployments.
func (r *Router) attemptsLeft(res *Result) bool {
	return res.Attempts-res.refused < r.MaxAttempts
}

// candidates collects into buf the deployments still eligible for the
// request of walk w, with their features. The retries (deployments that
// failed this request or cool past its deadline) are left out while any
// other remains, unless w.widen, and those that timed out on it (silent)
// while any retry remains; retry reports that retries are in.
func candidates(buf []scored, group []*Deployment, w *walk, now, deadline time.Time, req *Request, need capacity.Need) (cands []scored, retry bool) {
	cands = buf
	per, minContext := w.per, w.minContext
	pass := 0
	if w.widen {
		pass = 1
	}
	for ; pass < 3 && len(cands) == 0; pass++ {
		retry = pass > 0
		for i, d := range group {
			if per[i].excluded || !retry && per[i].failed || pass < 2 && per[i].silent || !req.servedBy(d) ||
				req.Pinned != nil && d != req.Pinned || req.resume != nil && req.resume.allow != nil && !req.resume.allow(d) {
				continue
			}
			if minContext >= 0 && d.ContextWindow != 0 && d.ContextWindow <= minContext {
				// Known to be no larger than one that was too small. An unknown
				// window may be larger: worth an attempt.
				continue
			}
			if !req.fitsContext(d) {
				per[i].tooSmall = true // the pre-check: it cannot take the request
				continue
			}
			cands = append(cands, scored{i: i, cost: estimateCost(d, req), counts: req.CountTokens && d.CountState != nil})
			f := &cands[len(cands)-1].f
			d.stateFor(req).ReadFeaturesFor(f, now, need, req.Stream)
			per[i].tooLarge = per[i].tooLarge || f.TooLarge // no wait would let it through there
			if f.Disabled || f.TooLarge || !retry && !f.At.Before(deadline) {
				cands = cands[:len(cands)-1] // drained by an operator, too large, or a retry
			}
		}
	}
	return cands, retry
}

// readyFirst moves the candidates usable at now to the front and returns
// how many there are.
func readyFirst(cands []scored, now time.Time) int {
	n := 0
	for k := range cands {
		if !cands[k].f.At.After(now) {
			cands[n], cands[k] = cands[k], cands[n]
			n++
		}
	}
	return n
}

// earliest returns the candidate that comes back first.
func earliest(cands []scored) scored {
	e := cands[0]
	for _, c := range cands[1:] {
		if c.f.At.Before(e.f.At) {
			e = c
		}
	}
	return e
}
