package router

import (
	"context"
	"errors"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/llmrouter/caddy-llm-router/internal/jsonbody"
	"github.com/llmrouter/caddy-llm-router/internal/wire/resume"
	"github.com/llmrouter/caddy-llm-router/provider"
)

// ResumeMode says which deployments may take up a stream whose provider
// failed after the client began to read it (Router.Resume).
type ResumeMode uint8

const (
	// ResumeOff: a broken stream ends with an in-band error.
	ResumeOff ResumeMode = iota
	// ResumeSameModel: a deployment of the stream's group that serves the
	// same model as the one that broke (see SameModel) may continue it.
	ResumeSameModel
	// ResumeAny: any deployment of the stream's group may continue it.
	ResumeAny
)

var resumeNames = [...]string{ResumeOff: "off", ResumeSameModel: "same_model", ResumeAny: "any"}

// String returns the Caddyfile's name of m: "off", "same_model", "any".
func (m ResumeMode) String() string {
	if int(m) < len(resumeNames) {
		return resumeNames[m]
	}
	return "unknown"
}

// ParseResumeMode reads a ResumeMode's name (see String).
func ParseResumeMode(s string) (ResumeMode, bool) {
	i := slices.Index(resumeNames[:], s)
	return ResumeMode(max(i, 0)), i >= 0
}

// resumeSpec narrows a resume's attempts: the format the stream is in
// (an attempt must plan its answer in it), and which deployments may
// serve (nil: any of the group).
type resumeSpec struct {
	format provider.Format
	allow  func(*Deployment) bool
}

// modelNoise is what the clouds add to a model's name: Bedrock's
// geography and "anthropic." prefixes and "-v1:0" suffix, a dated
// version ("-20250929", Vertex's "@20250929"), "-latest".
var modelNoise = regexp.MustCompile(`^((us|eu|apac|global|us-gov|jp|au|ca)\.)?(anthropic\.|models/|publishers/[^/]+/models/)?|(-v\d+(:\d+)?)?$|[-@]\d{8}|-latest$`)

// SameModel reports whether two upstream model names name the same model,
// as Anthropic, Bedrock and Vertex name one Claude model
// ("claude-sonnet-4-5-20250929", "us.anthropic.claude-sonnet-4-5-20250929-v1:0",
// "claude-sonnet-4-5@20250929"): compared without case, the clouds'
// prefixes and suffixes, and dates.
func SameModel(a, b string) bool {
	norm := func(s string) string { return modelNoise.ReplaceAllString(strings.ToLower(s), "") }
	return a == b || norm(a) == norm(b)
}

// prefillRefusal matches a provider's message refusing a continuation
// because its model takes no prefill at all, not because of this
// request: Claude Opus 4.6, Sonnet 4.6, Opus 4.7 and later answer 400
// "This model does not support assistant message prefill. The
// conversation must end with a user message." or "Prefilling assistant
// messages is not supported for this model"; a prefix flag's server
// "prefix is not supported".
var prefillRefusal = regexp.MustCompile(`(?i)\b(prefill|prefix)\w*\b[^.]*\bnot\s+supported|does\s+not\s+support\b[^.]*\b(prefill|prefix)|must\s+end\s+with\s+a\s+user\s+message`)

// prepareResume readies a stream that is req's answer to be resumed:
// ctx is the client's request, attempts those made so far.
func (s *Stream) prepareResume(ctx context.Context, req *Request, attempts int) {
	if s.r.Resume == ResumeOff || req.Choices > 1 {
		return // several choices: never resumed
	}
	s.req, s.parent, s.attempts, s.model = req, ctx, attempts, s.d.Model
	s.transcript = resume.New(s.format)
}

// resume takes up the stream after its current attempt broke (se, already
// observed on its deployment) with another attempt: first a
// continuation, a request that ends with the text the client has, on a
// deployment that continues text it did not write (the Resume mode says
// which; one that refuses a continuation is not asked again in this
// request, one whose model takes no prefill in no later one); else a replay of the request from its start
// where it can match (replayMatches), whose text must begin with exactly
// what the client has. Both have the broken deployment's idle_timeout
// (the router's deadline when shorter or unset) from the moment the stream
// broke until new text reaches the client, and the request's attempts
// left. It reports whether the stream goes on; false leaves the broken
// attempt closed, for an in-band error.
func (s *Stream) resume(se *StreamError) bool {
	r := s.r
	if s.req == nil || s.parent.Err() != nil {
		return false
	}
	if err := s.transcript.Resumable(); err != nil {
		r.debug("stream not resumed", zap.String("deployment", s.d.Name), zap.String("why", err.Error()))
		return false
	}
	// The broken attempt: what it used, as stated, or estimated for what
	// it relayed.
	from := s.d
	s.cutLeg(false) // it broke: ended on its provider's side
	var prior provider.Usage
	for _, l := range s.done {
		prior = addUsage(prior, l.Usage)
	}
	// The client's stream is silent from the break: the resume has what
	// idle_timeout allows it until new text reaches the client.
	deadline := r.Clock.Now().Add(r.Deadline)
	if idle := from.IdleTimeout; idle > 0 && idle < r.Deadline {
		deadline = r.Clock.Now().Add(idle)
	}
	before := s.attempts
	next, splice, how := s.continuation(prior, deadline)
	replays := s.replayMatches()
	if next == nil && s.transcript.CanReplay() && s.attempts < r.MaxAttempts && s.parent.Err() == nil &&
		slices.ContainsFunc(s.group.Deployments, replays) {
		if res := s.serveResume(s.req.Request, replays, deadline, 0); res.Stream != nil {
			next, splice, how = res.Stream, s.transcript.Replay(prior), "replayed"
		}
	}
	if next == nil {
		fields := []zap.Field{zap.String("deployment", from.Name), zap.Int("attempts", s.attempts), zap.String("message", se.Message)}
		if s.attempts == before {
			r.debug("broken stream not resumed: no deployment could take it up", fields...)
		} else {
			r.Logger.Info("broken stream not resumed: the attempts to take it up failed", fields...)
		}
		return false
	}
	s.leg, s.pending, s.pendingBytes, s.first = next.leg, next.pending, next.pendingBytes, next.first
	s.splice, s.textAt = splice, len(s.transcript.Text())
	if s.d.IdleTimeout > 0 {
		// Until the new attempt gives the client new text, its silence is
		// what is left of the resume's (see Stream.next).
		s.idleLeft = min(s.d.IdleTimeout, max(deadline.Sub(r.Clock.Now()), time.Nanosecond))
	}
	s.pendingResume = &pendingResume{from: from, how: how, failure: se.Message}
	return true
}

// replayMatches returns which deployments a replay may be asked of: those
// whose answer can begin with exactly the text the client has. Sampling
// makes a fresh answer depart from the first after a few tokens unless
// temperature is 0, and another model's answer is another text: a
// deployment of the same model (SameModel) as the stream's first attempt,
// when the request asks for temperature 0 or the client has at most
// resume.RestartProbe bytes (about 4 tokens) of text.
func (s *Stream) replayMatches() func(*Deployment) bool {
	few := len(s.transcript.Text()) <= resume.RestartProbe
	greedy := false
	if start, end, err := jsonbody.FindMember(s.req.Body, "temperature"); err == nil && start >= 0 {
		t, err := strconv.ParseFloat(string(s.req.Body[start:end]), 64)
		greedy = err == nil && t == 0
	}
	return func(d *Deployment) bool { return (few || greedy) && SameModel(d.Model, s.model) }
}

// pendingResume is a resume told (metrics, log) once its attempt's answer
// has been spliced in: new text reached the client, or it ended whole.
type pendingResume struct {
	from         *Deployment
	how, failure string
}

// announce tells of the resume under way, once.
func (s *Stream) announce() {
	p := s.pendingResume
	if p == nil || s.splice.Owes() {
		return
	}
	s.pendingResume = nil
	s.resumes++
	if s.splice.Restarted() {
		p.how = "replayed" // a continuation's answer that began again
	}
	if s.r.Observer != nil {
		s.r.Observer.Resume(p.from, s.d, p.how)
	}
	s.r.Logger.Info("broken stream resumed", zap.String("from", p.from.Name), zap.String("to", s.d.Name),
		zap.String("how", p.how), zap.String("failure", p.failure), zap.Int("text_bytes", s.textAt))
}

// continuation asks for the rest of the answer after the text the client
// has, on the deployments the Resume mode allows that have not refused
// one.
func (s *Stream) continuation(prior provider.Usage, deadline time.Time) (*Stream, *resume.Splice, string) {
	r := s.r
	prefix, splice := s.transcript.Prefix(prior)
	if prefix == "" {
		return nil, nil, ""
	}
	body, err := resume.Body(s.req.Format, s.req.Body, prefix)
	if err != nil {
		r.debug("no continuation of this request", zap.Error(err))
		return nil, nil, ""
	}
	creq := s.req.Continued(body)
	// Which deployments can continue it is their provider type's to say
	// (provider.Continuer, then its plan): asked of each once, so that
	// none is waited for that cannot.
	capable := map[*Deployment]bool{}
	for _, d := range s.group.Deployments {
		if !d.refusesPrefill.Load() && (r.Resume == ResumeAny || SameModel(d.Model, s.model)) && continues(d) {
			p, err := d.Provider.Plan(s.parent, d.Model, creq)
			capable[d] = err == nil && p != nil && p.Format() == s.format
		}
	}
	allow := func(d *Deployment) bool { return capable[d] && !slices.Contains(s.refused, d) }
	// One attempt is kept for the replay, when one could be spliced in.
	reserve := 0
	if s.transcript.CanReplay() {
		reserve = 1
	}
	for s.attempts+reserve < r.MaxAttempts && s.parent.Err() == nil {
		if !slices.ContainsFunc(s.group.Deployments, allow) {
			return nil, nil, ""
		}
		res := s.serveResume(creq, allow, deadline, reserve)
		if res.Stream != nil {
			return res.Stream, splice, "continued"
		}
		if res.Error == nil || res.Error.Class != provider.ClientError || res.Deployment == nil {
			return nil, nil, ""
		}
		// A provider that refuses a continuation: not asked for another in
		// this request; in none when it says its model takes no prefill.
		learned := prefillRefusal.MatchString(res.Error.Message)
		if learned {
			res.Deployment.refusesPrefill.Store(true)
		}
		r.Logger.Info("deployment refused to continue a broken stream", zap.String("deployment", res.Deployment.Name),
			zap.Int("status", res.Status), zap.String("message", res.Error.Message), zap.Bool("remembered", learned))
		s.refused = append(s.refused, res.Deployment)
	}
	return nil, nil, ""
}

// continues reports whether d's model may continue text it did not write:
// false only when its provider type says it continues nothing
// (provider.Continuer); a type that does not say is asked by its plan.
func continues(d *Deployment) bool {
	c, ok := d.Provider.(provider.Continuer)
	return !ok || c.ContinuationFor(d.Model) != provider.NoContinuation
}

// serveResume serves one of a resume's requests from the stream's group
// (serve: as many attempts as the request has left, less reserve, kept for
// what may follow): a stream in the stream's format, or why none came.
func (s *Stream) serveResume(pr *provider.Request, allow func(*Deployment) bool, deadline time.Time, reserve int) *Result {
	r, g := s.r, s.group
	req := &Request{Request: pr, Tokens: s.req.Tokens, PromptTokens: s.req.PromptTokens, OutputTokens: s.req.OutputTokens,
		Priority: s.req.Priority, Consumer: s.req.Consumer, Weight: s.req.Weight, Pinned: s.req.Pinned, Bound: s.req.Bound, resume: &resumeSpec{format: s.format, allow: allow}}
	req.unbound.Store(s.req.unbound.Load())
	res := &Result{Attempts: s.attempts + reserve, lastEnd: r.Clock.Now()}
	w := walk{per: make([]attemptState, len(g.Deployments)), minContext: -1}
	for i, d := range g.Deployments {
		// The deployments that broke the stream: only when no other is left.
		w.per[i].silent = slices.ContainsFunc(s.done, func(l Leg) bool { return l.Deployment == d }) // the current one is done already
	}
	r.serve(s.parent, g, req, res, &w, deadline)
	r.logPending(&w, nil)
	s.attempts = res.Attempts - reserve
	if res.Stream != nil {
		res.Stream.group = s.group
	}
	if res.Err != nil && !errors.Is(res.Err, ErrClientGone) {
		r.debug("a resume's attempts found no stream", zap.Error(res.Err))
	}
	return res
}
