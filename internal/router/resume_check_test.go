package router

// A resume's continuation checked before it is spliced, providers that
// refuse prefill remembered, and resumes bounded by idle_timeout and tried
// only where they can match. The fakes are built from how providers
// continue an answer (PROVIDERS.md, "Continuing an answer"): Claude 4.5
// and earlier honour a prefill; Claude 4.6 and later refuse it with 400;
// several Anthropic-compatible APIs and proxies accept it and answer from
// the beginning.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llmrouter/caddy-llm-router/internal/wire/messages/messagestest"
	"github.com/llmrouter/caddy-llm-router/provider"
)

// prefillOf returns the text of a Messages body's final assistant message
// (a prefill: its text blocks joined), ok false when the body ends with
// the user's.
func prefillOf(body []byte) (text string, ok bool) {
	var b struct {
		Messages []struct {
			Role    string          `json:"role"`
			Content json.RawMessage `json:"content"`
		} `json:"messages"`
	}
	if json.Unmarshal(body, &b) != nil || len(b.Messages) == 0 || b.Messages[len(b.Messages)-1].Role != "assistant" {
		return "", false
	}
	last := b.Messages[len(b.Messages)-1].Content
	if json.Unmarshal(last, &text) == nil {
		return text, true
	}
	var blocks []struct{ Type, Text string }
	_ = json.Unmarshal(last, &blocks)
	for _, bl := range blocks {
		text += bl.Text
	}
	return text, true
}

// claudeStream is a whole Messages stream of message id: one text block
// in pieces.
func claudeStream(id string, pieces ...string) replyFunc {
	evs := []string{brkStart(id, 10), brkBlockStart(0, "text")}
	for _, p := range pieces {
		evs = append(evs, brkDelta(0, p))
	}
	evs = append(evs, brkBlockStop(0), brkMsgDelta("end_turn", 5), brkMsgStop)
	return sse(evs...)
}

// asked counts the requests a fake Claude was sent: continuations (a
// final assistant message) and the others.
type asked struct{ continuations, fresh atomic.Int32 }

// note counts req, then answers it with next (which may read its body
// again).
func (a *asked) note(next func(req *http.Request, prefill string, continues bool) (*http.Response, error)) replyFunc {
	return func(req *http.Request) (*http.Response, error) {
		body, _ := io.ReadAll(req.Body)
		p, ok := prefillOf(body)
		if ok {
			a.continuations.Add(1)
		} else {
			a.fresh.Add(1)
		}
		return next(req, p, ok)
	}
}

// honoursPrefill is Claude 4.5 or earlier: a prefill is continued, so its
// answer is what of answer follows the prefill (the whole answer when it
// does not begin with it), in two pieces.
func (a *asked) honoursPrefill(id, answer string) replyFunc {
	return a.note(func(req *http.Request, prefill string, _ bool) (*http.Response, error) {
		rest := strings.TrimPrefix(answer, prefill)
		half := len(rest) / 2
		return claudeStream(id, rest[:half], rest[half:])(req)
	})
}

// ignoresPrefill is an Anthropic-compatible API that accepts a prefill
// and answers from the beginning: pieces whatever it was asked.
func (a *asked) ignoresPrefill(id string, pieces ...string) replyFunc {
	return a.note(func(req *http.Request, _ string, _ bool) (*http.Response, error) {
		return claudeStream(id, pieces...)(req)
	})
}

// refusesPrefill is Claude 4.6 or later: a prefill gets refusal (a 400);
// a request that ends with the user's is answered with pieces.
func (a *asked) refusesPrefill(refusal replyFunc, id string, pieces ...string) replyFunc {
	return a.note(func(req *http.Request, _ string, continues bool) (*http.Response, error) {
		if continues {
			return refusal(req)
		}
		return claudeStream(id, pieces...)(req)
	})
}

// fromFixture answers with testdata/name, a response as it came over the
// wire.
func fromFixture(t *testing.T, name string) replyFunc {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return func(req *http.Request) (*http.Response, error) {
		return http.ReadResponse(bufio.NewReader(bytes.NewReader(raw)), req)
	}
}

// cutClaude is a Claude stream cut after pieces of text.
func cutClaude(id string, pieces ...string) replyFunc {
	evs := []string{brkStart(id, 10), brkBlockStart(0, "text")}
	for _, p := range pieces {
		evs = append(evs, brkDelta(0, p))
	}
	return cut(evs...)
}

// A provider that ignores the prefill answers the continuation from the
// beginning. Its answer is checked before it is spliced: one that repeats
// the client's text is spliced as a replay (only what follows that text
// reaches the client); one that repeats its first words and then departs
// (sampling) can be neither matched nor told apart from a continuation:
// the stream ends in-band, never as a whole answer.
func TestAFreshAnswerToAContinuationIsChecked(t *testing.T) {
	const had = "Crash testing a gateway means "
	for _, tc := range []struct {
		name   string
		pieces []string
		want   string
		clean  bool
	}{
		{"repeats", []string{"Crash testing", " a gateway means sending", " it faults on purpose."}, had + "sending it faults on purpose.", true},
		{"repeats in one piece", []string{had + "sending it faults."}, had + "sending it faults.", true},
		{"departs", []string{"Crash testing a gateway", " is breaking it on purpose."}, had, false},
		{"departs within the probe", []string{"Crash tests are fun."}, had, false},
	} {
		var seen asked
		a := replies(cutClaude("msg_a", "Crash testing", " a gateway means "))
		b := replies(seen.ignoresPrefill("msg_b", tc.pieces...))
		da, db := claude(deployment("a", a)), claude(deployment("b", b))
		da.Quality = 1
		r := newRouter(newFakeClock())
		obs := &countingObserver{unpredicted: map[string]int{}}
		r.Observer = obs
		res := r.Serve(context.Background(), []*Deployment{da, db}, messagesReq())
		if res.Stream == nil {
			t.Fatalf("%s: expected a's stream, got %v", tc.name, res.Err)
		}
		var out []byte
		stopped := false
		err := res.Stream.Relay(func(ev provider.Event, done bool) error {
			if stopped = done; !done {
				out = provider.AppendEvent(out, ev.Name, ev.Data)
			}
			return nil
		})
		m := messagestest.Assemble(t, out)
		text := ""
		if len(m.Blocks) > 0 {
			text = m.Blocks[0].Text
		}
		var se *StreamError
		switch {
		case seen.continuations.Load() != 1:
			t.Errorf("%s: expected b asked to continue once, got %d", tc.name, seen.continuations.Load())
		case text != tc.want || len(m.Blocks) != 1:
			t.Errorf("%s: expected the client to read %q in one block, got %q (%d blocks)", tc.name, tc.want, text, len(m.Blocks))
		case tc.clean && (err != nil || !stopped || m.ID != "msg_a"):
			t.Errorf("%s: expected a whole answer msg_a, got %v, events %v", tc.name, err, m.Events)
		case tc.clean && (len(obs.resumes) != 1 || obs.resumes[0] != "a>b replayed"):
			t.Errorf("%s: expected one resume a>b told as a replay, got %v", tc.name, obs.resumes)
		case !tc.clean && (!errors.As(err, &se) || stopped):
			t.Errorf("%s: expected the in-band error, got %v, events %v", tc.name, err, m.Events)
		}
	}
}

// A deployment that refuses prefill (Claude 4.6 and later, in either of
// Anthropic's wordings) is remembered as such: the next request's resume
// does not ask it to continue again, and goes straight to one that does.
// A 400 that refuses only that request's continuation is not remembered.
func TestAPrefillRefusalIsRemembered(t *testing.T) {
	for _, tc := range []struct {
		fixture string
		refusal replyFunc
		asked   int32
	}{
		{"anthropic-400-prefill-unsupported.http", fromFixture(t, "anthropic-400-prefill-unsupported.http"), 1},
		{"anthropic-400-prefilling-not-supported.http", fromFixture(t, "anthropic-400-prefilling-not-supported.http"), 1},
		{"a refusal of this request only", reply(400, `{"type":"error","error":{"type":"invalid_request_error","message":"final assistant content cannot end with trailing whitespace"}}`), 2},
	} {
		fixture := tc.fixture
		var new46, old45 asked
		b := replies(new46.refusesPrefill(tc.refusal, "msg_b", "The weather in Paris is mild."))
		c := replies(old45.honoursPrefill("msg_c", "The weather in Paris is mild."))
		db, dc := claude(deployment("b", b)), claude(deployment("c", c))
		db.Model, db.Quality, dc.Quality = "claude-opus-4-6", 0.5, 0
		r := newRouter(newFakeClock())
		r.Resume = ResumeAny
		for i := range 2 {
			// Each request's stream breaks on a fresh deployment ranked first.
			a := replies(cutClaude("msg_a", "The weather", " in Paris is"))
			da := claude(deployment("a"+itoa(i), a))
			da.Quality = 1
			res := r.Serve(context.Background(), []*Deployment{da, db, dc}, messagesReq())
			if res.Stream == nil {
				t.Fatalf("%s: request %d: expected a's stream, got %v", fixture, i, res.Err)
			}
			out, err := relayMessages(res.Stream)
			if m := messagestest.Assemble(t, out); err != nil || m.Blocks[0].Text != "The weather in Paris is mild." {
				t.Errorf("%s: request %d: expected c's continuation, got %q %v", fixture, i, m.Blocks[0].Text, err)
			}
		}
		if n := new46.continuations.Load(); n != tc.asked {
			t.Errorf("%s: expected the deployment that refused asked to continue %d times, got %d", fixture, tc.asked, n)
		}
		if n := old45.continuations.Load(); n != 2 {
			t.Errorf("%s: expected c to continue both streams, got %d", fixture, n)
		}
	}
}

// A resume does not wait for a cooling deployment past the broken
// deployment's idle_timeout: with the only other deployment back in 20 s
// and idle_timeout 5 s, the stream ends in-band within 5 s of the break,
// and the cooling one is never asked.
func TestAResumeWaitsNoLongerThanIdleTimeout(t *testing.T) {
	a := replies(cut(textChunk("a", "Hello, "), textChunk("a", "wo")), reply(500, `{"error":{"message":"down"}}`))
	b := replies(sse(textChunk("b", "Hello, world!"), finalChunk("b"), "data: [DONE]"))
	da, db := deployment("a", a), deployment("b", b)
	da.Quality, da.IdleTimeout = 1, 5*time.Second
	db.Model = da.Model // a replay could match
	clock := newFakeClock()
	r := newRouter(clock)
	db.State.Observe(clock.Now(), provider.Observation{Class: provider.RateLimited, RetryAfter: 20 * time.Second}, r.Policy)
	res := r.Serve(context.Background(), []*Deployment{da, db}, streamReq(helloReq))
	if res.Stream == nil {
		t.Fatalf("expected a's stream, got %v", res.Err)
	}
	broke := clock.Now()
	_, err := relay(t, res.Stream)
	var se *StreamError
	if !errors.As(err, &se) || b.calls.Load() != 0 {
		t.Errorf("expected the in-band error and b never asked, got %v, b asked %d times", err, b.calls.Load())
	}
	if waited := clock.Now().Sub(broke); waited > 5*time.Second {
		t.Errorf("expected the resume given up within idle_timeout (5s), it took %v (sleeps %v)", waited, clock.Sleeps())
	}
}

// A replay is tried only where it can reproduce the client's text: a
// deployment of the same model, and either temperature 0 or a text of a
// few tokens (past them, sampling makes a fresh answer differ). Elsewhere
// it is not asked, and the stream ends in-band at once.
func TestAReplayIsTriedOnlyWhereItCanMatch(t *testing.T) {
	const long = "Crash testing a gateway means sending it "
	for _, tc := range []struct {
		name      string
		sameModel bool
		temp      string
		had       []string
		asked     bool
	}{
		{"another model at temperature 0", false, `"temperature":0,`, []string{long}, false},
		{"same model, sampled, long text", true, ``, []string{long}, false},
		{"same model, temperature 1, long text", true, `"temperature":1,`, []string{long}, false},
		{"same model at temperature 0", true, `"temperature":0,`, []string{long}, true},
		{"same model, sampled, a few tokens", true, ``, []string{"Crash "}, true},
	} {
		had := strings.Join(tc.had, "")
		a := replies(cut(textChunk("a", had)))
		b := replies(sse(textChunk("b", had+"faults."), finalChunk("b"), "data: [DONE]"))
		da, db := deployment("a", a), deployment("b", b)
		da.Quality = 1
		if tc.sameModel {
			db.Model = da.Model
		}
		r := newRouter(newFakeClock())
		r.MaxAttempts = 2
		body := `{"model":"fast","stream":true,` + tc.temp + `"messages":[{"role":"user","content":"what is crash testing?"}]}`
		res := r.Serve(context.Background(), []*Deployment{da, db}, streamReq(body))
		got, err := relay(t, res.Stream)
		text, _, _, dones, _ := chatText(t, got)
		var se *StreamError
		switch {
		case tc.asked && (b.calls.Load() != 1 || err != nil || text != had+"faults." || dones != 1):
			t.Errorf("%s: expected the replay spliced in, got b asked %d, %q %v", tc.name, b.calls.Load(), text, err)
		case !tc.asked && (b.calls.Load() != 0 || !errors.As(err, &se)):
			t.Errorf("%s: expected no replay asked and the in-band error, got b asked %d, %v", tc.name, b.calls.Load(), err)
		}
	}
}

// slowReplay answers with a stream of first, then chunks of text, each
// after its gap on clock; broke is set when it is asked. A chunk that may
// come past idle_timeout (wait) first gives the router's timer (which the
// fake clock runs on a goroutine) its chance to end the attempt.
func slowReplay(clock *fakeClock, broke *time.Time, first string, chunks ...timedChunk) replyFunc {
	return func(req *http.Request) (*http.Response, error) {
		steps := []func() ([]byte, error){func() ([]byte, error) { *broke = clock.Now(); return evE(textChunk("b", first)), nil }}
		for _, c := range chunks {
			steps = append(steps, func() ([]byte, error) {
				clock.Advance(c.gap)
				if c.wait {
					select {
					case <-req.Context().Done():
						return nil, req.Context().Err()
					case <-time.After(2 * time.Second):
					}
				}
				return evE(textChunk("b", c.text)), nil
			})
		}
		steps = append(steps, func() ([]byte, error) { return append(evE(finalChunk("b")), evE("data: [DONE]")...), nil })
		return streamOfE(&readsE{steps: steps}, req)
	}
}

type timedChunk struct {
	gap  time.Duration
	text string
	wait bool // the router's timer may end the attempt by then: give it its chance
}

// A replay's repeat of the client's text gives the client nothing new: it
// does not count as content for idle_timeout (5 s), counted from the
// break. b's replay that reaches new text only 6 s after the break ends
// in-band at 5 s, and b is not blamed for it; one that reaches it at 4 s
// goes on, with idle_timeout counted afresh from there.
func TestAReplayGivingNothingNewIsBoundedByIdleTimeout(t *testing.T) {
	for _, tc := range []struct {
		name   string
		chunks []timedChunk
		want   string
		clean  bool
	}{
		{"new text at 6 s", []timedChunk{{3 * time.Second, ", ", false}, {3 * time.Second, "world!", true}}, "Hello, wo", false},
		{"new text at 4 s", []timedChunk{{4 * time.Second, ", world", false}, {4 * time.Second, "!", true}}, "Hello, world!", true},
	} {
		clock := newFakeClock()
		var broke time.Time
		a := replies(cut(textChunk("a", "Hello, "), textChunk("a", "wo")))
		b := replies(slowReplay(clock, &broke, "Hello", tc.chunks...))
		da, db := deployment("a", a), deployment("b", b)
		da.Quality, db.Model = 1, da.Model
		da.IdleTimeout, db.IdleTimeout = 5*time.Second, 5*time.Second
		r := newRouter(clock)
		res := r.Serve(context.Background(), []*Deployment{da, db}, streamReq(helloReq))
		got, err := relay(t, res.Stream)
		text, _, _, dones, _ := chatText(t, got)
		var se *StreamError
		switch {
		case text != tc.want || b.calls.Load() != 1:
			t.Errorf("%s: expected %q from b's replay, got %q %v, b asked %d", tc.name, tc.want, text, err, b.calls.Load())
		case tc.clean && (err != nil || dones != 1):
			t.Errorf("%s: expected the whole answer, got %v, %d [DONE]", tc.name, err, dones)
		case !tc.clean && (!errors.As(err, &se) || dones != 0):
			t.Errorf("%s: expected the in-band error, got %v, %d [DONE]", tc.name, err, dones)
		case !tc.clean && clock.Now().Sub(broke) > 6*time.Second:
			t.Errorf("%s: expected the replay ended by its next read after idle_timeout, it ran %v", tc.name, clock.Now().Sub(broke))
		}
		if s := db.State.Snapshot(clock.Now()); s.ConsecutiveFailures != 0 {
			t.Errorf("%s: expected b not blamed for the resume's silence, got %d failures", tc.name, s.ConsecutiveFailures)
		}
	}
}
