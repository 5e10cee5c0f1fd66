package sim

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"math"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/llmrouter/caddy-llm-router/internal/api"
	"github.com/llmrouter/caddy-llm-router/internal/router"
	prov "github.com/llmrouter/caddy-llm-router/provider"
)

// clients is a scenario's traffic: n requests of the Chat Completions
// API, in a burst (spread 0) or arriving open-loop over spread (Poisson),
// a share of them streams, priorities drawn in 0..priorities-1.
type clients struct {
	n          int
	spread     time.Duration
	streams    float64
	maxTokens  int64
	prompt     int // characters of the prompt
	priorities int
	// sdk: each client retries as the official SDKs do (PROVIDERS.md,
	// "Clients' own retries"): twice, on 408, 409, 429 and 5xx, unless
	// x-should-retry says false, waiting Retry-After or 0.5 s doubling.
	sdk bool
	// messages is the share of requests in the Anthropic Messages API
	// (the others: Chat Completions).
	messages float64
	// greedy is the share of requests at temperature 0 (the others are
	// sampled: no two attempts write the same answer past its first
	// words).
	greedy float64
	// bigEvery: every bigEvery-th request (the first after bigEvery-1
	// others) has a prompt of bigPrompt characters instead (0: none).
	bigEvery, bigPrompt int
	// warm: one request per sized deployment first (outside the count),
	// then a wait for every window to renew, as the benchmark does.
	warm bool
}

// outcome is one client request as its client saw it.
type outcome struct {
	id        int
	stream    bool
	format    prov.Format
	arrival   time.Duration
	tokens    int64 // the provider's estimate of it
	words     int   // of its answer
	maxTokens int64
	status    int
	header    http.Header
	answered  time.Duration // the status (a stream's first byte)
	text      string
	complete  bool          // a 200 whose stream ended with [DONE], or an answer
	leaked    bool          // the answer holds a provider's API key
	inBand    bool          // a stream that ended with an error event
	maxGap    time.Duration // the longest silence of the stream
	tries     int
	first     time.Duration // until the first try's status (the SDK's retries aside)
}

// run sends the scenario's requests and waits for them all.
func (w *world) run(c clients) {
	if c.warm {
		w.warmUp(c)
	}
	w.mu.Lock()
	w.counted = true
	w.mu.Unlock()
	w.snapshot()
	base := w.elapsed()
	var wg sync.WaitGroup
	at := time.Duration(0)
	for i := range c.n {
		if c.spread > 0 {
			at += time.Duration(w.exp() * float64(c.spread) / float64(c.n))
		}
		q := query{id: i, stream: w.float() < c.streams, format: prov.Chat}
		if c.priorities > 1 {
			q.prio = int(w.float() * float64(c.priorities))
		}
		if c.messages > 0 && w.float() < c.messages {
			q.format = prov.Messages
		}
		arrival := base + at
		wg.Go(func() {
			time.Sleep(arrival - w.elapsed())
			w.client(q, c)
		})
	}
	wg.Wait()
}

// warmUp teaches the router each sized deployment's statement with one
// request pinned to it, then waits until every window renewed.
func (w *world) warmUp(c clients) {
	longest := time.Duration(0)
	for _, g := range w.groups {
		for _, d := range g.Deployments {
			p := d.Transport.(*provider)
			if !p.sized {
				continue
			}
			req := w.request(query{id: -1, format: prov.Chat}, c)
			req.Pinned = d
			res := w.router.ServeGroup(context.WithValue(context.Background(), requestKey{}, -1), g, req)
			w.logf("warm-up on %s: %d %v", p.name, res.Status, res.Err)
			for _, l := range p.limits {
				longest = max(longest, l.span)
			}
		}
	}
	time.Sleep(longest + time.Second)
}

// query is one client request: its number, whether it streams, its
// priority and its API (Chat Completions or Anthropic Messages).
type query struct {
	id, prio int
	stream   bool
	format   prov.Format
}

// apis are the client APIs the simulated clients speak.
var apis = map[prov.Format]api.API{prov.Chat: api.Chat{}, prov.Messages: api.Messages{}}

// maxTokens is q's max_tokens: the clients', or 256 for a Messages
// request (where it is required); 0 unset.
func (q query) maxTokens(c clients) int64 {
	if c.maxTokens == 0 && q.format == prov.Messages {
		return 256
	}
	return c.maxTokens
}

// body is q's body: its number first in the prompt, padded; temperature
// 0 for the greedy share (by number: the same on every try).
func (q query) body(c clients) []byte {
	size := c.prompt
	if c.bigEvery > 0 && q.id%c.bigEvery == c.bigEvery-1 {
		size = c.bigPrompt
	}
	prompt := fmt.Sprintf("r%d ", q.id) + strings.Repeat("x", max(size-8, 0))
	b := fmt.Sprintf(`{"model":"sim","messages":[{"role":"user","content":%q}],"stream":%t`, prompt, q.stream)
	if n := q.maxTokens(c); n > 0 {
		b += fmt.Sprintf(`,"max_tokens":%d`, n)
	}
	if float64(q.id%10) < 10*c.greedy {
		b += `,"temperature":0`
	}
	return []byte(b + "}")
}

// request is what q's client API makes of its body.
func (w *world) request(q query, c clients) *router.Request {
	req, _, e := apis[q.format].Parse(q.body(c), http.Header{"Anthropic-Version": {"2023-06-01"}})
	if e != nil {
		panic(e)
	}
	req.Priority = q.prio
	return req
}

// client sends q and reads its answer, as its client API writes it,
// retrying as an SDK when c.sdk; then checks what it got.
func (w *world) client(q query, c clients) {
	o := &outcome{id: q.id, stream: q.stream, format: q.format, arrival: w.elapsed()}
	u, _ := parseUpstream(q.body(c))
	o.tokens, o.maxTokens = u.tokens(), q.maxTokens(c)
	o.words = len(answer("", q.id, o.maxTokens, 0))
	ctx := context.WithValue(context.Background(), requestKey{}, q.id)
	w.yield(ctx) // a burst's clients arrive at one instant, and go on in turn
	w.logf("client r%d arrives (%v, stream %t, priority %d, %d tokens)", q.id, q.format, q.stream, q.prio, o.tokens)
	for {
		o.tries++
		rec := &recorder{w: w, header: http.Header{}}
		res := w.router.ServeGroup(ctx, w.groups[0], w.request(q, c))
		_ = apis[q.format].Write(rec, res)
		rec.read(o)
		w.yield(ctx) // after what the answer woke in the router, in turn
		if o.tries == 1 {
			o.first = o.answered - o.arrival
		}
		w.logf("client r%d got %d after %v (try %d, %d attempts, text %q, retry-after %q, x-should-retry %q)", q.id, o.status,
			o.answered-o.arrival, o.tries, res.Attempts, clip(o.text), o.header.Get("Retry-After"), o.header.Get("x-should-retry"))
		wait, again := sdkRetry(o, c)
		if !again {
			break
		}
		time.Sleep(w.after(wait))
	}
	w.mu.Lock()
	w.outcomes = append(w.outcomes, o)
	w.mu.Unlock()
	w.checkOutcome(o)
}

func clip(s string) string {
	if len(s) > 40 {
		return s[:20] + "..." + s[len(s)-17:]
	}
	return s
}

// sdkRetry is what an official SDK does after o's try: whether it tries
// again, and after how long (openai-node's and anthropic-sdk's rules).
func sdkRetry(o *outcome, c clients) (time.Duration, bool) {
	if !c.sdk || o.tries > 2 {
		return 0, false
	}
	switch o.header.Get("x-should-retry") {
	case "false":
		return 0, false
	case "true":
	default:
		if s := o.status; s != 408 && s != 409 && s != 429 && s < 500 {
			return 0, false
		}
	}
	if ra := o.header.Get("Retry-After"); ra != "" {
		if s, err := strconv.Atoi(ra); err == nil {
			return time.Duration(s) * time.Second, true
		}
		if t, err := http.ParseTime(ra); err == nil {
			return time.Until(t), true
		}
	}
	return time.Duration(float64(500*time.Millisecond) * math.Pow(2, float64(o.tries-1))), true
}

// recorder is the client's end of the router's answer: its status, headers
// and body, each write's instant.
type recorder struct {
	w         *world
	header    http.Header
	status    int
	answered  time.Duration
	last      time.Duration
	maxGap    time.Duration // the longest silence of the stream
	body      bytes.Buffer
	wroteHead bool
}

func (r *recorder) Header() http.Header { return r.header }

func (r *recorder) WriteHeader(status int) {
	if !r.wroteHead {
		r.status, r.answered, r.last, r.wroteHead = status, r.w.elapsed(), r.w.elapsed(), true
	}
}

func (r *recorder) Write(b []byte) (int, error) {
	r.WriteHeader(http.StatusOK)
	now := r.w.elapsed()
	r.maxGap, r.last = max(r.maxGap, now-r.last), now
	return r.body.Write(b)
}

func (r *recorder) Flush() {}

// read fills o from what was written: the answer's text, or the stream's
// text and how it ended, in o's API.
func (r *recorder) read(o *outcome) {
	o.status, o.header, o.answered, o.maxGap = r.status, r.header, r.answered, r.maxGap
	o.text, o.complete, o.inBand = "", false, false
	o.leaked = strings.Contains(r.body.String(), keyMark) || slices.ContainsFunc(slices.Collect(maps.Values(r.header)), func(v []string) bool {
		return strings.Contains(strings.Join(v, " "), keyMark)
	})
	if r.status != http.StatusOK {
		return
	}
	if !o.stream {
		o.text, o.complete = answerText(o.format, r.body.Bytes())
		return
	}
	var text strings.Builder
	event := ""
	for _, line := range strings.Split(r.body.String(), "\n") {
		if name, ok := strings.CutPrefix(line, "event: "); ok {
			event = name
			continue
		}
		data, ok := strings.CutPrefix(line, "data: ")
		switch {
		case !ok:
		case data == "[DONE]" || event == "message_stop":
			o.complete = true
		case event == "error" || o.format == prov.Chat && strings.Contains(data, `"error"`):
			o.inBand = true
		default:
			text.WriteString(deltaText(o.format, []byte(data)))
		}
	}
	o.text = text.String()
}

// answerText is the text of a non-streaming answer in format f, and
// whether it is one.
func answerText(f prov.Format, body []byte) (string, bool) {
	var a struct {
		Choices []struct {
			Message struct {
				Content string `json:"content"`
			} `json:"message"`
		} `json:"choices"`
		Content []struct {
			Text string `json:"text"`
		} `json:"content"`
	}
	if json.Unmarshal(body, &a) != nil {
		return "", false
	}
	if f == prov.Messages {
		var b strings.Builder
		for _, c := range a.Content {
			b.WriteString(c.Text)
		}
		return b.String(), len(a.Content) > 0
	}
	if len(a.Choices) != 1 {
		return "", false
	}
	return a.Choices[0].Message.Content, true
}

// deltaText is the text a stream event of format f adds.
func deltaText(f prov.Format, data []byte) string {
	var e struct {
		Choices []struct {
			Delta struct {
				Content string `json:"content"`
			} `json:"delta"`
		} `json:"choices"`
		Delta struct {
			Text string `json:"text"`
		} `json:"delta"`
	}
	switch {
	case json.Unmarshal(data, &e) != nil:
		return ""
	case f == prov.Messages:
		return e.Delta.Text
	case len(e.Choices) > 0:
		return e.Choices[0].Delta.Content
	}
	return ""
}
