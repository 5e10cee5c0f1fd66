package sim

import (
	"cmp"
	"context"
	"fmt"
	"hash/fnv"
	"io"
	"maps"
	"math/rand/v2"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	prov "github.com/llmrouter/caddy-llm-router/provider"
)

// faultKind is a way a provider fails an attempt.
type faultKind uint8

const (
	failStatus faultKind = iota // an error status (status, kind: see dialect.errorBody) after wait
	limited                     // a 429 with Retry-After wait, its windows unstated
	hang                        // no answer until the attempt gives up (a timeout)
	cut                         // a stream's connection lost after `after` words
	stall                       // a stream silent for `wait` after `after` words
	midError                    // a stream's in-band error after `after` words
	slowed                      // wait more to the first byte (a deployment that got slow)
)

// fault is a failure of a provider in [from, until) of the run (until 0:
// to its end), on each attempt with probability p (0: every one).
type fault struct {
	kind         faultKind
	status       int
	errKind, msg string
	wait         time.Duration
	after        int
	from, until  time.Duration
	p            float64
}

// continuation is what a provider does with a final assistant message
// (PROVIDERS.md, "Continuing an answer").
type continuation uint8

const (
	honours continuation = iota // continues the text (Claude 4.5, vLLM, Mistral)
	refuses                     // 400: Claude 4.6 and later
	afresh                      // answers from the beginning (some compatible APIs)
)

// refusal is Claude 4.6's answer to a prefill.
const refusal = "This model does not support assistant message prefill. The conversation must end with a user message."

// provider is a simulated deployment's provider: its true windows,
// dialect, latency and faults. It decides and states its limits when an
// attempt arrives, and delivers the statement after the generation (a
// non-streaming answer) or at the first byte (a stream).
type provider struct {
	name    string
	family  string // the model's text: deployments of one family write the same answer
	dialect dialect
	limits  []limit
	retry   retryAfter
	// latency is the time to the first byte, perWord between words (a
	// non-streaming answer comes after both); drift grows them by that
	// share per simulated minute.
	latency, perWord time.Duration
	drift            float64
	faults           []fault
	cont             continuation
	// sized: the ideal scheduler counts it (limited by its windows alone).
	sized bool
	// The deployment: its group (0 the one asked, each falling back to
	// the next), tier, continuation (an OpenAI-format type's), timeout (0:
	// the default).
	group, tier int
	continues   prov.Continuation
	timeout     time.Duration
	idle        time.Duration // idle_timeout (0: the default)
	price       float64       // USD per 1M tokens, in and out (0: 2)

	refusals []time.Time     // when it refused each prefill
	answered []time.Duration // when each of its answers (200) came (a stream's first byte), into the run
	w        *world
	mu       sync.Mutex
	windows  []*window
	cooldown time.Time // the end of the latest wait a delivered 429 stated
	stated   time.Time // when that 429 was delivered
}

// errLatency is how long an error takes to come back (no generation).
const errLatency = 20 * time.Millisecond

// reply is what admission decided of an attempt.
type reply struct {
	status     int
	header     http.Header
	body       string
	words      []string
	delay      time.Duration // until the headers
	fault      *fault        // of a stream: how it breaks
	hang       bool
	in, out    int64
	retryUntil time.Time // a stated wait (429)
	window     bool      // a window's 429 (not a fault's)
}

func (p *provider) RoundTrip(hr *http.Request) (*http.Response, error) {
	raw, err := io.ReadAll(hr.Body)
	if err != nil {
		return nil, err
	}
	u, err := parseUpstream(raw)
	if err != nil {
		return nil, fmt.Errorf("sim: unreadable body: %w", err)
	}
	u.key = cmp.Or(hr.Header.Get("x-api-key"), strings.TrimPrefix(hr.Header.Get("Authorization"), "Bearer "))
	at := time.Now()
	n := p.w.arrive(p, u, at)
	a := p.admit(u, at, n)
	p.w.logf("provider %s r%d admitted: %d, delivered in %v%s", p.name, u.id, a.status, a.delay, statement(a.header))
	ctx := hr.Context()
	if a.hang {
		<-ctx.Done()
		p.w.leave(p, u.id, nil)
		return nil, ctx.Err()
	}
	if !p.w.sleep(ctx, a.delay) {
		p.w.leave(p, u.id, nil)
		return nil, ctx.Err()
	}
	a.header.Set("Date", time.Now().UTC().Format(http.TimeFormat))
	resp := &http.Response{StatusCode: a.status, Header: a.header, Request: hr, Body: io.NopCloser(strings.NewReader(a.body))}
	if a.status != http.StatusOK || !u.stream {
		p.w.leave(p, u.id, &a)
		return resp, nil
	}
	pr, pw := io.Pipe()
	resp.Body = pr
	go p.write(ctx, pw, u, a)
	return resp, nil
}

// statement is the rate-limit headers of h, for the trace.
func statement(h http.Header) string {
	var b strings.Builder
	for _, k := range slices.Sorted(maps.Keys(h)) {
		if lk := strings.ToLower(k); strings.Contains(lk, "ratelimit") || lk == "retry-after" {
			fmt.Fprintf(&b, " %s=%s", lk, h[k][0])
		}
	}
	return b.String()
}

// admit decides an attempt at its arrival: a fault, a refused prefill, a
// request too large for a window, a window without room, or an answer.
// n is the attempt's number in its request (its random draws are the
// attempt's own, whatever order concurrent attempts arrive in).
func (p *provider) admit(u upstream, at time.Time, n int) reply {
	p.mu.Lock()
	defer p.mu.Unlock()
	a := reply{header: http.Header{"Content-Type": {"application/json"}}, delay: errLatency}
	a.in = (u.prompt + 3) / 4
	var extra time.Duration
	if f := p.fault(at, u.id, n); f != nil {
		switch f.kind {
		case failStatus:
			// {key}: the key it got, echoed as some providers do; wait:
			// how long the error takes (0: errLatency).
			a.status, a.body = f.status, p.dialect.errorBody(f.errKind, strings.ReplaceAll(f.msg, "{key}", u.key))
			a.delay = cmp.Or(f.wait, errLatency)
			return a
		case limited:
			a.status, a.body = http.StatusTooManyRequests, p.dialect.errorBody("limited", "Rate limit reached. Please try again later.")
			setRetryAfter(a.header, retrySeconds, at, f.wait)
			a.retryUntil = at.Add(f.wait)
			return a
		case hang:
			a.hang = true
			return a
		case slowed:
			extra = f.wait
		default:
			if u.stream {
				a.fault = f
			}
		}
	}
	if u.prefill != "" && p.cont == refuses {
		p.refusals = append(p.refusals, at)
		a.status, a.body = http.StatusBadRequest, p.dialect.errorBody("refused", refusal)
		return a
	}
	if a.status = p.take(u, at, &a); a.status != http.StatusOK {
		return a
	}
	var story string
	a.words, story = p.words(u, n)
	p.w.told(u.id, story)
	a.out = int64(len(a.words))
	slow := 1 + p.drift*at.Sub(p.w.start).Minutes()
	a.delay = time.Duration(float64(p.latency)*slow*(0.9+0.2*p.chance(u.id, n, -1))) + extra
	if !u.stream {
		a.delay += time.Duration(float64(p.perWord)*slow) * time.Duration(len(a.words))
		a.body = p.dialect.answer(fmt.Sprint(u.id), p.family, strings.Join(a.words, ""), a.in, a.out)
	}
	p.answered = append(p.answered, at.Add(a.delay).Sub(p.w.start))
	return a
}

// take spends the attempt's place in every window, or answers 429 for the
// first one without room (every window stated either way).
func (p *provider) take(u upstream, at time.Time, a *reply) int {
	defer p.dialect.state(a.header, p.windows, at)
	a.window = true
	n := u.tokens()
	var wait time.Duration
	for _, w := range p.windows {
		c := w.cost(n)
		if !w.fits(c) {
			a.body = p.dialect.errorBody("tokens", fmt.Sprintf("Request too large for %s in organization org-sim on tokens per min (TPM): Limit %d, Requested %d. The input or output tokens must be reduced in order to run successfully.", p.family, w.max, c))
			return http.StatusTooManyRequests
		}
		wait = max(wait, w.earliest(at, c).Sub(at))
	}
	if wait > 0 {
		a.body = p.dialect.errorBody("limited", fmt.Sprintf("Rate limit reached for %s. Please try again in %v.", p.family, wait))
		setRetryAfter(a.header, p.retry, at, wait)
		if p.retry != retryNone {
			a.retryUntil = at.Add(wait)
		}
		return http.StatusTooManyRequests
	}
	for _, w := range p.windows {
		w.take(at, w.cost(n))
	}
	return http.StatusOK
}

// fault is the fault active at at for attempt n of request id, if any.
func (p *provider) fault(at time.Time, id, n int) *fault {
	t := at.Sub(p.w.start)
	for i := range p.faults {
		if f := &p.faults[i]; f.active(t) && (f.p == 0 || p.chance(id, n, i) < f.p) {
			return f
		}
	}
	return nil
}

// active reports whether f is on at t into the run.
func (f *fault) active(t time.Duration) bool { return t >= f.from && (f.until == 0 || t < f.until) }

// chance is a random number in [0, 1) of attempt n of request id at p,
// for draw salt: from the seed, p's name and those alone.
func (p *provider) chance(id, n, salt int) float64 {
	h := fnv.New64a()
	fmt.Fprintf(h, "%s/%d/%d/%d", p.name, id, n, salt)
	return rand.New(rand.NewPCG(p.w.seed, h.Sum64())).Float64()
}

// words is the answer to attempt n of u, and the whole text it tells
// (its story): the family's answer, or what follows the prefill when the
// provider continues it (the story then begins with the prefill).
func (p *provider) words(u upstream, n int) ([]string, string) {
	var sample uint64
	if !u.greedy {
		h := fnv.New64a()
		fmt.Fprintf(h, "%s/%d/%d", p.name, u.id, n)
		sample = h.Sum64() | 1
	}
	full := answer(p.family, u.id, u.maxTokens, sample)
	if u.prefill == "" || p.cont == afresh {
		return full, strings.Join(full, "")
	}
	// It goes on after the prefill's words; a prefill without its
	// trailing space (as providers require) is continued with one.
	rest := slices.Clone(full[min(len(strings.Fields(u.prefill)), len(full)):])
	if len(rest) > 0 && !strings.HasSuffix(u.prefill, " ") {
		rest[0] = " " + rest[0]
	}
	return rest, u.prefill + strings.Join(rest, "")
}

// stableWords is how many words every attempt at a request begins with,
// sampled or not.
const stableWords = 2

// answer is family's answer to request id: 8 to 16 words, at most
// maxTokens (0: unset), that differ by family and request. After the
// first stableWords, an attempt's sample (0: temperature 0) draws them:
// sampling makes a fresh answer differ from the first one after a few
// tokens unless temperature is 0 (PROVIDERS.md).
func answer(family string, id int, maxTokens int64, sample uint64) []string {
	n := 8 + id%9
	if maxTokens > 0 {
		n = min(n, int(maxTokens))
	}
	words := make([]string, n)
	for k := range words {
		v := (id*7 + k*13) % 100
		if sample != 0 && k >= stableWords {
			v = 100 + int((sample>>8+uint64(k)*2654435761)%900) // never a greedy word
		}
		words[k] = fmt.Sprintf("%s%d ", family, v)
	}
	return words
}

// write streams a's words, breaking as its fault says. The attempt
// leaves the provider before its last event: the router may send the next
// one as soon as it reads it.
func (p *provider) write(ctx context.Context, pw *io.PipeWriter, u upstream, a reply) {
	end := func(last string, err error) {
		p.w.leave(p, u.id, nil)
		if last != "" {
			_, _ = io.WriteString(pw, last)
		}
		pw.CloseWithError(err)
	}
	evs := p.dialect.events(fmt.Sprint(u.id), p.family, a.words, a.in, a.out)
	for i, ev := range evs {
		word := i - p.dialect.head()
		if f := a.fault; f != nil && word == f.after {
			switch f.kind {
			case cut:
				p.w.logf("provider %s r%d stream cut after %d words", p.name, u.id, word)
				end("", io.ErrUnexpectedEOF)
				return
			case midError:
				p.w.logf("provider %s r%d stream error after %d words", p.name, u.id, word)
				end(p.dialect.failure(), nil)
				return
			case stall:
				p.w.logf("provider %s r%d stream stalls %v after %d words", p.name, u.id, f.wait, word)
				if !p.w.sleep(ctx, f.wait) {
					end("", ctx.Err())
					return
				}
			}
		}
		if word == 0 {
			p.w.began(u.id)
		}
		if word > 0 && word <= len(a.words) && !p.w.sleep(ctx, p.perWord) {
			end("", ctx.Err())
			return
		}
		if i == len(evs)-1 {
			end(ev, nil)
			return
		}
		if _, err := io.WriteString(pw, ev); err != nil {
			end("", err) // the router closed the body
			return
		}
	}
}

// start readies the provider for a run of w.
func (p *provider) start(w *world) {
	p.w = w
	p.windows = nil
	for _, l := range p.limits {
		p.windows = append(p.windows, newWindow(l))
	}
}
