package router

// Adversarial tests of stream resumption (resume.go, stream.go,
// internal/wire/resume): hostile continuations and replays, repeated
// breaks, clients that leave, capacity claims and goroutines. Tests named
// TestBreaker... expose defects (they fail until fixed); the others
// pin behaviour that held under attack.

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/llmrouter/caddy-llm-router/internal/adapters"
	"github.com/llmrouter/caddy-llm-router/internal/capacity"
	"github.com/llmrouter/caddy-llm-router/internal/wire/messages/messagestest"
	"github.com/llmrouter/caddy-llm-router/internal/wire/responses"
	"github.com/llmrouter/caddy-llm-router/provider"
)

type replyFunc = func(*http.Request) (*http.Response, error)

func replies(fs ...replyFunc) *script { return &script{replies: fs} }

// endsInBand relays res's stream and fails t, naming the case (what),
// unless it ended with the in-band error and b was never asked: a stream
// that must not be resumed.
func endsInBand(t *testing.T, what string, res *Result, b *script) {
	t.Helper()
	if res.Stream == nil {
		t.Fatalf("%s: expected a's stream, got %v", what, res.Err)
	}
	got, err := relay(t, res.Stream)
	var se *StreamError
	if !errors.As(err, &se) || b.calls.Load() != 0 {
		t.Errorf("%s: expected the in-band error and no resume; got err %v, b asked %d times, client read %q", what, err, b.calls.Load(), got)
	}
}

// brkChunk is a chat.completion.chunk of stream id whose delta is raw
// JSON, as a provider may send it.
func brkChunk(id, delta string) string {
	return `data: {"id":"` + id + `","object":"chat.completion.chunk","created":7,"model":"up-` + id + `","choices":[{"index":0,"delta":` + delta + `,"finish_reason":null}]}`
}

// brkEv is a named Messages event.
func brkEv(name, data string) string { return "event: " + name + "\ndata: " + data }

func brkStart(id string, in int) string {
	return brkEv("message_start", `{"type":"message_start","message":{"id":"`+id+`","type":"message","role":"assistant","model":"claude-sonnet-4-5","content":[],"stop_reason":null,"usage":{"input_tokens":`+itoa(in)+`,"output_tokens":1}}}`)
}

func brkBlockStart(i int, typ string) string {
	cb := `{"type":"text","text":""}`
	switch typ {
	case "tool_use":
		cb = `{"type":"tool_use","id":"toolu_1","name":"get_weather","input":{}}`
	case "thinking":
		cb = `{"type":"thinking","thinking":""}`
	}
	return brkEv("content_block_start", `{"type":"content_block_start","index":`+itoa(i)+`,"content_block":`+cb+`}`)
}

func brkDelta(i int, s string) string {
	b, _ := json.Marshal(s)
	return brkEv("content_block_delta", `{"type":"content_block_delta","index":`+itoa(i)+`,"delta":{"type":"text_delta","text":`+string(b)+`}}`)
}

func brkJSONDelta(i int, s string) string {
	b, _ := json.Marshal(s)
	return brkEv("content_block_delta", `{"type":"content_block_delta","index":`+itoa(i)+`,"delta":{"type":"input_json_delta","partial_json":`+string(b)+`}}`)
}

func brkBlockStop(i int) string {
	return brkEv("content_block_stop", `{"type":"content_block_stop","index":`+itoa(i)+`}`)
}

func brkMsgDelta(stop string, out int) string {
	return brkEv("message_delta", `{"type":"message_delta","delta":{"stop_reason":"`+stop+`","stop_sequence":null},"usage":{"output_tokens":`+itoa(out)+`}}`)
}

var brkMsgStop = brkEv("message_stop", `{"type":"message_stop"}`)

// claude makes d an Anthropic deployment of a Claude model.
func claude(d *Deployment) *Deployment {
	d.Model = "claude-sonnet-4-5"
	d.Provider = &adapters.Anthropic{Endpoint: provider.Endpoint{BaseURL: "http://" + d.Name + ".invalid/v1", APIKey: "sk-ant-" + d.Name + "-0123456789abcdef"}}
	return d
}

func messagesReq() *Request {
	return &Request{Request: &provider.Request{Format: provider.Messages, Stream: true, Choices: 1,
		Body: []byte(`{"model":"claude","max_tokens":100,"stream":true,"messages":[{"role":"user","content":"weather in Paris?"}]}`)},
		Tokens: 100, PromptTokens: 10}
}

// relayMessages relays a Messages stream into SSE bytes.
func relayMessages(s *Stream) ([]byte, error) {
	var out []byte
	err := s.Relay(func(ev provider.Event, done bool) error {
		if !done {
			out = provider.AppendEvent(out, ev.Name, ev.Data)
		}
		return nil
	})
	return out, err
}

// inFlightZero fails t unless every deployment's claims were released.
func inFlightZero(t *testing.T, c *fakeClock, ds ...*Deployment) {
	t.Helper()
	for _, d := range ds {
		if s := d.State.Snapshot(c.Now()); s.InFlight != 0 {
			t.Errorf("%s: %d attempts still in flight", d.Name, s.InFlight)
		}
	}
}

// ---------------------------------------------------------------------
// Defects a breaker found, each seen failing before its fix
// ---------------------------------------------------------------------

// The client asked for n=2 and the stream broke after choice 0's first
// words, before any chunk of choice 1: the transcript has seen only index
// 0, so it takes the stream for resumable. docs/streams.md: "several choices
// (n > 1) ends with the in-band error". Here a continuation of the n=2
// request is spliced in, and its choice 1 (which continues "Hello" too) is
// relayed to the client with "Hello" cut off its start.
func TestBreakerNGreaterThanOneIsResumed(t *testing.T) {
	const body = `{"model":"fast","stream":true,"n":2,"messages":[{"role":"user","content":"say hello"}]}`
	choice := func(id string, i int, text string) string {
		b, _ := json.Marshal(text)
		return `data: {"id":"` + id + `","object":"chat.completion.chunk","created":7,"model":"m","choices":[{"index":` + itoa(i) + `,"delta":{"content":` + string(b) + `},"finish_reason":null}]}`
	}
	fin := func(id string, i int) string {
		return `data: {"id":"` + id + `","object":"chat.completion.chunk","created":7,"model":"m","choices":[{"index":` + itoa(i) + `,"delta":{},"finish_reason":"stop"}]}`
	}
	a := replies(cut(choice("a", 0, "Hello")))
	b := replies(sse(choice("b", 0, ", world"), choice("b", 1, ", there"), fin("b", 0), fin("b", 1), "data: [DONE]"))
	da, db := deployment("a", a), deployment("b", b)
	da.Quality = 1
	db.Provider.(*adapters.OpenAI).Continuation = provider.PrefixFlag
	r := newRouter(newFakeClock())
	r.Resume = ResumeAny
	req := &Request{Request: &provider.Request{Format: provider.Chat, Body: []byte(body), Stream: true, Choices: 2}, Tokens: 100}
	endsInBand(t, "n=2", r.Serve(context.Background(), []*Deployment{da, db}, req), b)
}

// A chunk whose delta the transcript cannot decode (content as an array
// of parts, as Mistral's reasoning models stream it) is dropped from the
// transcript although the client received it: the transcript's text is
// short of the client's, and a replay is then compared with (and spliced
// after) the wrong text. Here the client has "Hello, wo" (in array
// chunks); the transcript has "", so the replay's whole answer is passed
// on after what the client has: "Hello, woHello, world!", as a complete
// answer.
func TestBreakerUndecodableChunkRepeatsTextOnReplay(t *testing.T) {
	parts := func(id, text string) string {
		b, _ := json.Marshal(text)
		return brkChunk(id, `{"content":[{"type":"text","text":`+string(b)+`}]}`)
	}
	a := replies(cut(parts("a", "Hello, "), parts("a", "wo")))
	b := replies(sse(parts("b", "Hello, "), parts("b", "world!"), finalChunk("b"), "data: [DONE]"))
	da, db := deployment("a", a), deployment("b", b)
	da.Quality = 1
	r := newRouter(newFakeClock())
	res := r.Serve(context.Background(), []*Deployment{da, db}, streamReq(helloReq))
	if res.Stream == nil {
		t.Fatalf("expected a's stream, got %v", res.Err)
	}
	got, err := relay(t, res.Stream)
	var text strings.Builder
	for _, g := range got {
		var c struct {
			Choices []struct {
				Delta struct {
					Content []struct{ Text string } `json:"content"`
				} `json:"delta"`
			} `json:"choices"`
		}
		if json.Unmarshal([]byte(g), &c) == nil {
			for _, ch := range c.Choices {
				for _, p := range ch.Delta.Content {
					text.WriteString(p.Text)
				}
			}
		}
	}
	var se *StreamError
	if err == nil && text.String() != "Hello, world!" {
		t.Errorf("a complete answer must read as one: got %q (err %v)", text.String(), err)
	} else if err != nil && !errors.As(err, &se) {
		t.Errorf("expected a StreamError, got %v", err)
	}
}

// Reasoning the transcript cannot decode is not seen as reasoning: a
// Mistral reasoning model streams its thinking as content parts of type
// "thinking". The stream relayed thinking, yet is continued (docs/streams.md:
// "a stream that relayed ... reasoning or thinking ... ends with the
// in-band error").
func TestBreakerUndecodableReasoningIsResumed(t *testing.T) {
	think := brkChunk("a", `{"content":[{"type":"thinking","thinking":[{"type":"text","text":"The user wants a greeting."}]}]}`)
	a := replies(cut(think, textChunk("a", "Hello")))
	b := replies(sse(textChunk("b", ", world"), finalChunk("b"), "data: [DONE]"))
	da, db := deployment("a", a), deployment("b", b)
	da.Quality = 1
	db.Provider.(*adapters.OpenAI).Continuation = provider.PrefixFlag
	r := newRouter(newFakeClock())
	r.Resume = ResumeAny
	endsInBand(t, "a stream that relayed reasoning", r.Serve(context.Background(), []*Deployment{da, db}, streamReq(helloReq)), b)
}

// A replay chunk the splice cannot decode (here a delta with a "role"
// that is not a string: valid JSON, so the chat reader relays it) is
// "passed on as it came": its text is never compared with the client's,
// nor its finish_reason checked against the text still owed, nor its id
// rewritten. The replay below says something else entirely ("Goodbye."),
// yet it is spliced in and the stream ends as a complete answer, "Hello,
// woGoodbye.", with b's id.
func TestBreakerUndecodableReplayChunkSkipsTheComparison(t *testing.T) {
	odd := func(id, text string) string {
		b, _ := json.Marshal(text)
		return brkChunk(id, `{"role":1,"content":`+string(b)+`}`)
	}
	a := replies(cut(textChunk("a", "Hello, "), textChunk("a", "wo")))
	oddFinal := `data: {"id":"b","object":"chat.completion.chunk","created":7,"model":"up-b","choices":[{"index":0,"delta":{"role":1},"finish_reason":"stop"}]}`
	b := replies(sse(odd("b", "Goodbye."), oddFinal, "data: [DONE]"))
	da, db := deployment("a", a), deployment("b", b)
	da.Quality = 1
	r := newRouter(newFakeClock())
	res := r.Serve(context.Background(), []*Deployment{da, db}, streamReq(helloReq))
	got, err := relay(t, res.Stream)
	var se *StreamError
	if !errors.As(err, &se) {
		var text strings.Builder
		for _, g := range got {
			var c struct {
				Choices []struct {
					Delta struct{ Content string } `json:"delta"`
				} `json:"choices"`
			}
			_ = json.Unmarshal([]byte(g), &c)
			for _, ch := range c.Choices {
				text.WriteString(ch.Delta.Content)
			}
		}
		t.Errorf("a replay whose text departs from the client's must end in-band; got err %v, the client read %q", err, text.String())
	}
}

// A replay that ends (its terminator) while the client still has text
// it did not repeat: the replay's answer is "Hello", the client has
// "Hello, wo", and no attempt said that is the whole answer. With a
// finish_reason the splice calls it a divergence; with the terminator
// alone ([DONE] without a finish chunk, message_stop without
// message_delta) it is never asked, and the client's stream ends cleanly:
// a truncated answer presented as complete.
func TestBreakerReplayEndingInsideTheClientsTextEndsClean(t *testing.T) {
	t.Run("chat [DONE]", func(t *testing.T) {
		a := replies(cut(textChunk("a", "Hello, "), textChunk("a", "wo")))
		b := replies(sse(textChunk("b", "Hello"), "data: [DONE]"))
		da, db := deployment("a", a), deployment("b", b)
		da.Quality = 1
		r := newRouter(newFakeClock())
		res := r.Serve(context.Background(), []*Deployment{da, db}, streamReq(helloReq))
		got, err := relay(t, res.Stream)
		text, _, _, dones, _ := chatText(t, got)
		var se *StreamError
		if !errors.As(err, &se) || dones != 0 {
			t.Errorf("expected the in-band error; got err %v, %d [DONE], text %q", err, dones, text)
		}
	})
	t.Run("messages message_stop", func(t *testing.T) {
		// a and b refuse to continue (a 400): b replays.
		refusal := reply(400, `{"type":"error","error":{"type":"invalid_request_error","message":"prefill not supported"}}`)
		a := replies(cut(brkStart("msg_a", 10), brkBlockStart(0, "text"), brkDelta(0, "Hello, "), brkDelta(0, "wo")), refusal)
		b := replies(refusal, sse(brkStart("msg_b", 10), brkBlockStart(0, "text"), brkDelta(0, "Hello"), brkMsgStop))
		da, db := claude(deployment("a", a)), claude(deployment("b", b))
		da.Quality = 1
		r := newRouter(newFakeClock())
		res := r.Serve(context.Background(), []*Deployment{da, db}, messagesReq())
		if res.Stream == nil {
			t.Fatalf("expected a's stream, got %v", res.Err)
		}
		var dones int
		err := res.Stream.Relay(func(ev provider.Event, done bool) error {
			if done {
				dones++
			}
			return nil
		})
		var se *StreamError
		if !errors.As(err, &se) || dones != 0 || b.calls.Load() != 2 {
			t.Errorf("expected the in-band error after b's refusal and replay; got err %v, %d ends, b asked %d", err, dones, b.calls.Load())
		}
	})
}

// Claude continues a prefill that ends where it would call a tool with a
// tool_use block at index 0 (no text block: the prefilled text was the
// whole of its text). The splice takes the new stream's block 0 for the
// continuation of the client's open text block: it drops its
// content_block_start and relays the tool's input_json_delta into the
// text block. An Anthropic SDK then has a text block with JSON deltas and
// no tool_use block, and stop_reason tool_use: a garbled message.
func TestBreakerMessagesContinuationOpeningWithToolUse(t *testing.T) {
	a := replies(cut(brkStart("msg_a", 30), brkBlockStart(0, "text"), brkDelta(0, "Let me check "), brkDelta(0, "the weather.")))
	b := replies(sse(brkStart("msg_b", 35), brkBlockStart(0, "tool_use"), brkJSONDelta(0, `{"city":`), brkJSONDelta(0, `"Paris"}`),
		brkBlockStop(0), brkMsgDelta("tool_use", 9), brkMsgStop))
	da, db := claude(deployment("a", a)), claude(deployment("b", b))
	da.Quality = 1
	res := newRouter(newFakeClock()).Serve(context.Background(), []*Deployment{da, db}, messagesReq())
	if res.Stream == nil {
		t.Fatalf("expected a's stream, got %v", res.Err)
	}
	out, err := relayMessages(res.Stream)
	var se *StreamError
	if errors.As(err, &se) {
		return // refusing to splice is fine
	}
	if err != nil {
		t.Fatalf("unexpected %v", err)
	}
	m := messagestest.Assemble(t, out)
	ok := len(m.Blocks) == 2 && m.Blocks[0].Type == "text" && m.Blocks[0].Text == "Let me check the weather." && m.Blocks[0].Input == "" &&
		m.Blocks[1].Type == "tool_use" && m.Blocks[1].Input == `{"city":"Paris"}`
	if !ok {
		t.Errorf("expected a text block then a tool_use block (or an in-band error), got %+v\n%s", m.Blocks, out)
	}
}

// A replay may come from any deployment of the group; one that streams
// reasoning first (a reasoning model in the group) has its reasoning
// chunks relayed to the client in the middle of the answer it already
// has (they carry no text to compare), and the stream ends as one
// complete answer.
func TestBreakerReplayInjectsReasoningMidAnswer(t *testing.T) {
	a := replies(cut(textChunk("a", "Hello, "), textChunk("a", "wo")))
	b := replies(sse(brkChunk("b", `{"role":"assistant","reasoning_content":"The user wants a greeting."}`),
		textChunk("b", "Hello, world!"), finalChunk("b"), "data: [DONE]"))
	da, db := deployment("a", a), deployment("b", b)
	da.Quality = 1
	r := newRouter(newFakeClock())
	res := r.Serve(context.Background(), []*Deployment{da, db}, streamReq(helloReq))
	got, err := relay(t, res.Stream)
	if err != nil {
		return // ended in-band: nothing garbled presented as complete
	}
	for _, g := range got {
		if strings.Contains(g, "reasoning_content") {
			t.Errorf("a replay's reasoning was relayed after the client's text, as a complete answer: %s", g)
		}
	}
}

// ---------------------------------------------------------------------
// What held
// ---------------------------------------------------------------------

// A hostile continuation: another id, created and model, a second
// message_start-like role chunk, the text the client has with its
// trailing whitespace repeated, and unicode: the client reads one answer
// with a's id and model, no doubled whitespace.
func TestBreakerContinuationTakesTheClientsIdentity(t *testing.T) {
	a := replies(cut(roleChunk("a"), textChunk("a", "Grüße, "), textChunk("a", "日本語 ")))
	b := replies(sse(roleChunk("zzz"), `data: {"id":"zzz","object":"chat.completion.chunk","created":99,"model":"evil","system_fingerprint":"x","choices":[{"index":0,"delta":{"role":"assistant","content":" 🎉"},"finish_reason":null}]}`,
		roleChunk("zzz"), textChunk("zzz", "!"), finalChunk("zzz"), usageChunk("zzz", 3, 2), "data: [DONE]"))
	da, db := deployment("a", a), deployment("b", b)
	da.Quality = 1
	db.Provider.(*adapters.OpenAI).Continuation = provider.Prefill
	r := newRouter(newFakeClock())
	r.Resume = ResumeAny
	res := r.Serve(context.Background(), []*Deployment{da, db}, streamReq(helloReq))
	got, err := relay(t, res.Stream)
	text, ids, finishes, dones, _ := chatText(t, got)
	if err != nil || text != "Grüße, 日本語 🎉!" || len(ids) != 1 || !ids["a"] || finishes != 1 || dones != 1 {
		t.Errorf("got %q ids %v finishes %d dones %d err %v", text, ids, finishes, dones, err)
	}
	for _, g := range got {
		if strings.Contains(g, `"evil"`) || strings.Contains(g, `"created":99`) {
			t.Errorf("the continuation's model or created leaked: %s", g)
		}
	}
}

// A replay that matches the client's text up to the middle of a chunk and
// then departs ends in-band, never spliced; so does one whose text is a
// strict prefix of the client's and then finishes.
func TestBreakerReplayDivergingMidChunk(t *testing.T) {
	for name, events := range map[string][]string{
		"diverges mid-chunk": {textChunk("b", "Hello, wa"), textChunk("b", "lrus"), finalChunk("b"), "data: [DONE]"},
		"prefix then finish": {textChunk("b", "Hel"), textChunk("b", "lo"), finalChunk("b"), usageChunk("b", 1, 1), "data: [DONE]"},
		"unicode differs":    {textChunk("b", "Hello, wö"), finalChunk("b"), "data: [DONE]"},
	} {
		a := replies(cut(textChunk("a", "Hello, "), textChunk("a", "wo")))
		b := replies(sse(events...))
		da, db := deployment("a", a), deployment("b", b)
		da.Quality = 1
		r := newRouter(newFakeClock())
		r.MaxAttempts = 2
		c := r.Clock.(*fakeClock)
		res := r.Serve(context.Background(), []*Deployment{da, db}, streamReq(helloReq))
		got, err := relay(t, res.Stream)
		text, _, _, dones, _ := chatText(t, got)
		var se *StreamError
		if !errors.As(err, &se) || dones != 0 || text != "Hello, wo" {
			t.Errorf("%s: expected the in-band error after %q; got %q, %d [DONE], %v", name, "Hello, wo", text, dones, err)
		}
		inFlightZero(t, c, da, db)
	}
}

// Hostile first events of a resume's attempt: an error event right away,
// [DONE] with no content, a JSON error chunk, garbage that is not JSON.
// None reaches the client; each is a failed attempt, and the next
// deployment continues the stream.
func TestBreakerContinuationFailingBeforeContent(t *testing.T) {
	for name, bad := range map[string]replyFunc{
		"error event":  sse(`event: error` + "\n" + `data: {"error":{"message":"overloaded","type":"server_error"}}`),
		"[DONE] first": sse(roleChunk("b"), "data: [DONE]"),
		"error chunk":  sse(`data: {"error":{"message":"boom","type":"server_error","code":null}}`),
		"garbage":      sse(`data: {"id":"b","choices":[{"index":0,"delta":{"content":"x"`),
		"not json":     sse(`data: <html>502 Bad Gateway</html>`),
		"500":          reply(500, `{"error":{"message":"internal","type":"server_error"}}`),
	} {
		a := replies(cut(textChunk("a", "Hello")))
		b := replies(bad)
		c := replies(sse(textChunk("c", ", world"), finalChunk("c"), "data: [DONE]"))
		da, db, dc := deployment("a", a), deployment("b", b), deployment("c", c)
		da.Quality, db.Quality = 1, 0.9
		for _, d := range []*Deployment{db, dc} {
			d.Provider.(*adapters.OpenAI).Continuation = provider.PrefixFlag
		}
		clock := newFakeClock()
		r := newRouter(clock)
		r.Resume = ResumeAny
		res := r.Serve(context.Background(), []*Deployment{da, db, dc}, streamReq(helloReq))
		got, err := relay(t, res.Stream)
		text, ids, finishes, dones, _ := chatText(t, got)
		if err != nil || text != "Hello, world" || len(ids) != 1 || finishes != 1 || dones != 1 {
			t.Errorf("%s: expected c's continuation; got %q ids %v %d finishes %d [DONE] %v", name, text, ids, finishes, dones, err)
		}
		if b.calls.Load() != 1 || c.calls.Load() != 1 {
			t.Errorf("%s: expected b then c asked once, got %d, %d", name, b.calls.Load(), c.calls.Load())
		}
		inFlightZero(t, clock, da, db, dc)
	}
}

// A continuation that breaks in turn is continued again, from all the
// text the client has, until max_attempts: then the in-band error. Every
// attempt's claim is released; the text never repeats.
func TestBreakerRepeatedBreaksUpToMaxAttempts(t *testing.T) {
	var seen bodies
	a := replies(cut(textChunk("a", "One ")))
	b := replies(seen.keep(cut(textChunk("b", " two "))))
	c := replies(seen.keep(cut(textChunk("c", "three "))))
	d := replies(seen.keep(cut(textChunk("d", "four"))))
	da, db, dc, dd := deployment("a", a), deployment("b", b), deployment("c", c), deployment("d", d)
	da.Quality, db.Quality, dc.Quality = 1, 0.9, 0.8
	for _, x := range []*Deployment{db, dc, dd} {
		x.Provider.(*adapters.OpenAI).Continuation = provider.PrefixFlag
	}
	clock := newFakeClock()
	r := newRouter(clock)
	r.Resume = ResumeAny
	r.MaxAttempts = 5 // one attempt is kept for the replay
	obs := &countingObserver{unpredicted: map[string]int{}}
	r.Observer = obs
	res := r.Serve(context.Background(), []*Deployment{da, db, dc, dd}, streamReq(helloReq))
	got, err := relay(t, res.Stream)
	text, ids, _, dones, _ := chatText(t, got)
	var se *StreamError
	if !errors.As(err, &se) || dones != 0 || text != "One two three four" || len(ids) != 1 {
		t.Errorf("expected %q then the in-band error; got %q ids %v %d [DONE] %v", "One two three four", text, ids, dones, err)
	}
	if res.Stream.Resumes() != 3 || len(obs.resumes) != 3 {
		t.Errorf("expected 3 resumes, got %d %v", res.Stream.Resumes(), obs.resumes)
	}
	if n := len(seen.got); n < 3 || !strings.Contains(string(seen.got[2]), `"content":"One two three","prefix":true`) {
		t.Errorf("expected the third continuation to carry all the text, got %d bodies, last %s", n, seen.last())
	}
	// The attempt kept for the replay is not spent: past a few tokens of
	// text, a sampled replay cannot match.
	if legs := res.Stream.Legs(); len(legs) != 4 {
		t.Errorf("expected 4 legs (4 continued, no replay), got %d", len(legs))
	}
	inFlightZero(t, clock, da, db, dc, dd)
}

// Resume off: a cut stream ends in-band and nobody else is asked.
func TestBreakerResumeOffNeverAsks(t *testing.T) {
	a := replies(cut(textChunk("a", "Hello")))
	b := replies(sse(textChunk("b", "Hello, world"), finalChunk("b"), "data: [DONE]"))
	da, db := deployment("a", a), deployment("b", b)
	da.Quality = 1
	r := newRouter(newFakeClock())
	r.Resume = ResumeOff
	endsInBand(t, "resume off", r.Serve(context.Background(), []*Deployment{da, db}, streamReq(helloReq)), b)
}

// A stream whose answer had finished (finish_reason relayed) and broke
// before its usage chunk / [DONE] is never resumed.
func TestBreakerFinishedAnswerIsNotResumed(t *testing.T) {
	a := replies(cut(textChunk("a", "Hello"), finalChunk("a")))
	b := replies(sse(textChunk("b", "Hello"), finalChunk("b"), usageChunk("b", 1, 1), "data: [DONE]"))
	da, db := deployment("a", a), deployment("b", b)
	da.Quality = 1
	db.Provider.(*adapters.OpenAI).Continuation = provider.PrefixFlag
	r := newRouter(newFakeClock())
	r.Resume = ResumeAny
	res := r.Serve(context.Background(), []*Deployment{da, db}, streamReq(helloReq))
	got, err := relay(t, res.Stream)
	_, _, finishes, dones, _ := chatText(t, got)
	var se *StreamError
	if !errors.As(err, &se) || b.calls.Load() != 0 || finishes != 1 || dones != 0 {
		t.Errorf("got %v, b asked %d, %d finishes %d [DONE]", err, b.calls.Load(), finishes, dones)
	}
}

// The client's own prefill (its final assistant message) is extended
// with what it received, not repeated; a Messages client's tool_use
// stream and thinking stream are never resumed.
func TestBreakerMessagesClientPrefillAndNonText(t *testing.T) {
	var seen bodies
	a := replies(cut(brkStart("msg_a", 30), brkBlockStart(0, "text"), brkDelta(0, "\"city\": "), brkDelta(0, "\"Par")))
	b := replies(seen.keep(sse(brkStart("msg_b", 35), brkBlockStart(0, "text"), brkDelta(0, "is\"}"), brkBlockStop(0), brkMsgDelta("end_turn", 3), brkMsgStop)))
	da, db := claude(deployment("a", a)), claude(deployment("b", b))
	da.Quality = 1
	req := messagesReq()
	req.Body = []byte(`{"model":"claude","max_tokens":100,"stream":true,"messages":[{"role":"user","content":"JSON please"},{"role":"assistant","content":"{"}]}`)
	res := newRouter(newFakeClock()).Serve(context.Background(), []*Deployment{da, db}, req)
	out, err := relayMessages(res.Stream)
	if err != nil {
		t.Fatalf("expected the continuation, got %v", err)
	}
	m := messagestest.Assemble(t, out)
	if m.ID != "msg_a" || len(m.Blocks) != 1 || m.Blocks[0].Text != `"city": "Paris"}` || m.StopReason != "end_turn" {
		t.Errorf("got %+v", m)
	}
	if !strings.Contains(string(seen.last()), `{"content":"{\"city\": \"Par","role":"assistant"}`) {
		t.Errorf("expected the client's prefill extended, got %s", seen.last())
	}

	for name, events := range map[string][]string{
		"tool_use": {brkStart("msg_a", 30), brkBlockStart(0, "text"), brkDelta(0, "Checking."), brkBlockStop(0), brkBlockStart(1, "tool_use"), brkJSONDelta(1, `{"ci`)},
		"thinking": {brkStart("msg_a", 30), brkBlockStart(0, "thinking"), brkEv("content_block_delta", `{"type":"content_block_delta","index":0,"delta":{"type":"thinking_delta","thinking":"Hmm"}}`)},
	} {
		a := replies(cut(events...))
		b := replies(sse(brkStart("msg_b", 35), brkBlockStart(0, "text"), brkDelta(0, "x"), brkBlockStop(0), brkMsgDelta("end_turn", 3), brkMsgStop))
		da, db := claude(deployment("a", a)), claude(deployment("b", b))
		da.Quality = 1
		c := newFakeClock()
		res := newRouter(c).Serve(context.Background(), []*Deployment{da, db}, messagesReq())
		_, err := relayMessages(res.Stream)
		var se *StreamError
		if !errors.As(err, &se) || b.calls.Load() != 0 {
			t.Errorf("%s: expected the in-band error and no resume, got %v, b asked %d", name, err, b.calls.Load())
		}
		inFlightZero(t, c, da, db)
	}
}

// With extended thinking on, Claude deployments refuse a prefill at
// plan time: no continuation is sent; a replay is (and must match).
func TestBreakerThinkingRequestIsNotContinued(t *testing.T) {
	var seen bodies
	a := replies(cut(brkStart("msg_a", 30), brkBlockStart(0, "text"), brkDelta(0, "Hello")))
	b := replies(seen.keep(sse(brkStart("msg_b", 35), brkBlockStart(0, "text"), brkDelta(0, "Hello, world"), brkBlockStop(0), brkMsgDelta("end_turn", 3), brkMsgStop)))
	da, db := claude(deployment("a", a)), claude(deployment("b", b))
	da.Quality = 1
	req := messagesReq()
	req.Body = []byte(`{"model":"claude","max_tokens":2000,"stream":true,"thinking":{"type":"enabled","budget_tokens":1024},"messages":[{"role":"user","content":"hi"}]}`)
	res := newRouter(newFakeClock()).Serve(context.Background(), []*Deployment{da, db}, req)
	out, err := relayMessages(res.Stream)
	if err != nil {
		t.Fatalf("expected a replay, got %v", err)
	}
	if strings.Contains(string(seen.last()), `"assistant"`) {
		t.Errorf("a prefill was sent with thinking on: %s", seen.last())
	}
	if m := messagestest.Assemble(t, out); len(m.Blocks) != 1 || m.Blocks[0].Text != "Hello, world" {
		t.Errorf("got %+v", m)
	}
}

// The client goes away while a resume's attempt waits for its first
// content: Relay returns, the upstream attempt is cancelled, every claim
// released, no goroutine left behind.
func TestBreakerClientLeavesDuringResume(t *testing.T) {
	before := runtime.NumGoroutine()
	started := make(chan struct{})
	var once sync.Once
	b := replies(func(req *http.Request) (*http.Response, error) {
		once.Do(func() { close(started) })
		return hang(req)
	})
	a := replies(cut(textChunk("a", "Hello")))
	da, db := deployment("a", a), deployment("b", b)
	da.Quality = 1
	db.Provider.(*adapters.OpenAI).Continuation = provider.PrefixFlag
	clock := newFakeClock()
	r := newRouter(clock)
	r.Resume = ResumeAny
	ctx, cancel := context.WithCancel(context.Background())
	res := r.Serve(ctx, []*Deployment{da, db}, streamReq(helloReq))
	errc := make(chan error, 1)
	go func() { _, err := relay(t, res.Stream); errc <- err }()
	<-started
	cancel()
	select {
	case err := <-errc:
		if err == nil {
			t.Error("a stream whose client left mid-resume must not end clean")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Relay hung after the client left")
	}
	inFlightZero(t, clock, da, db)
	eventually(t, "goroutines back", func() bool { return runtime.NumGoroutine() <= before+1 })
}

// The resume's attempt (a replay) hangs without a byte: ttft_timeout ends
// it (the fake clock), and the stream ends in-band: no hang.
func TestBreakerSilentResumeIsBounded(t *testing.T) {
	a := replies(cut(textChunk("a", "Hello")))
	b := replies(hang)
	da, db := deployment("a", a), deployment("b", b)
	da.Quality, db.Model = 1, da.Model
	db.Provider.(*adapters.OpenAI).Continuation = provider.PrefixFlag
	clock := newFakeClock()
	r := newRouter(clock)
	r.Resume = ResumeAny
	r.MaxAttempts = 2
	res := r.Serve(context.Background(), []*Deployment{da, db}, streamReq(helloReq))
	errc := make(chan error, 1)
	go func() { _, err := relay(t, res.Stream); errc <- err }()
	eventually(t, "b asked", func() bool { return b.calls.Load() == 1 })
	for i := 0; i < 100; i++ {
		select {
		case err := <-errc:
			var se *StreamError
			if !errors.As(err, &se) {
				t.Errorf("expected the in-band error, got %v", err)
			}
			inFlightZero(t, clock, da, db)
			return
		default:
			clock.Advance(time.Second)
			time.Sleep(time.Millisecond)
		}
	}
	t.Fatal("Relay still waiting after 100 s of fake time")
}

// A resume whose group's budget is spent (the cut attempt held its worst
// case, 40 prompt and 10 output tokens, and its estimate spent more) finds
// no deployment: the in-band error, no attempt.
func TestBreakerResumeWhenTheGroupBudgetIsSpent(t *testing.T) {
	clock := newFakeClock()
	a := replies(cut(textChunk("a", strings.Repeat("word ", 200))))
	b := replies(sse(textChunk("b", "x"), finalChunk("b"), "data: [DONE]"))
	da, db := deployment("a", a), deployment("b", b)
	da.Quality, da.CostInput, da.CostOutput = 1, 1e6, 1e6 // $1 a token
	db.Provider.(*adapters.OpenAI).Continuation = provider.PrefixFlag
	g := &Group{Name: "fast", Deployments: []*Deployment{da, db}, Spending: capacity.NewSpending(capacity.SpendLimit{USD: 60, Period: time.Hour}, nil, "fast")}
	r := newRouter(clock)
	r.Resume = ResumeAny
	req := streamReq(helloReq)
	req.OutputTokens = 10
	endsInBand(t, "the group's budget spent", r.ServeGroup(context.Background(), g, req), b)
	inFlightZero(t, clock, da, db)
}

// A Pinned request's stream is resumed only on its pinned deployment.
func TestBreakerPinnedResumesOnlyOnItsDeployment(t *testing.T) {
	a := replies(cut(textChunk("a", "Hello")), sse(textChunk("a", ", world"), finalChunk("a"), "data: [DONE]"))
	b := replies(sse(textChunk("b", ", world"), finalChunk("b"), "data: [DONE]"))
	da, db := deployment("a", a), deployment("b", b)
	for _, d := range []*Deployment{da, db} {
		d.Provider.(*adapters.OpenAI).Continuation = provider.PrefixFlag
	}
	clock := newFakeClock()
	r := newRouter(clock)
	r.Resume = ResumeAny
	req := streamReq(helloReq)
	req.Pinned = da
	res := r.Serve(context.Background(), []*Deployment{da, db}, req)
	got, err := relay(t, res.Stream)
	text, _, _, _, _ := chatText(t, got)
	if b.calls.Load() != 0 {
		t.Errorf("a pinned request went to b")
	}
	if err == nil && text != "Hello, world" {
		t.Errorf("got %q", text)
	}
	inFlightZero(t, clock, da, db)
}

// A transcript keeps MaxText (256 KiB) of text at most, and a longer
// answer is not resumed (commit ce64517). The check is made before an
// event's text is added, so the text can pass MaxText by one event (up to
// provider.MaxEventSize, 1 MiB) and the stream is still resumed, its whole
// text sent again as the continuation's prefix. Here: five 64 KiB chunks
// (320 KiB) and the stream is continued.
func TestBreakerTextPastMaxTextIsResumed(t *testing.T) {
	big := strings.Repeat("x", 64<<10)
	events := []string{}
	for i := 0; i < 5; i++ {
		events = append(events, textChunk("a", big))
	}
	a := replies(cut(events...))
	b := replies(sse(textChunk("b", "y"), finalChunk("b"), "data: [DONE]"))
	da, db := deployment("a", a), deployment("b", b)
	da.Quality = 1
	db.Provider.(*adapters.OpenAI).Continuation = provider.PrefixFlag
	r := newRouter(newFakeClock())
	r.Resume = ResumeAny
	endsInBand(t, "text past MaxText", r.Serve(context.Background(), []*Deployment{da, db}, streamReq(helloReq)), b)
}

// Many streams break and resume at once on shared deployments (run with
// -race): each client reads its own whole answer, every claim released,
// no goroutine left.
func TestBreakerManyConcurrentResumes(t *testing.T) {
	before := runtime.NumGoroutine()
	a := &script{replies: []replyFunc{cut(roleChunk("a"), textChunk("a", "Hello, "), textChunk("a", "wor"))}}
	// b continues a continuation, and answers a request asked afresh
	// (a cooling after its cuts) whole.
	cont := sse(roleChunk("b"), textChunk("b", "ld"), textChunk("b", "!"), finalChunk("b"), usageChunk("b", 50, 2), "data: [DONE]")
	whole := sse(roleChunk("b"), textChunk("b", "Hello, world!"), finalChunk("b"), usageChunk("b", 50, 4), "data: [DONE]")
	b := &script{replies: []replyFunc{func(req *http.Request) (*http.Response, error) {
		body, _ := io.ReadAll(req.Body)
		if strings.Contains(string(body), `"prefix":true`) {
			return cont(req)
		}
		return whole(req)
	}}}
	da, db := deployment("a", a), deployment("b", b)
	da.Quality = 1
	db.Provider.(*adapters.OpenAI).Continuation = provider.PrefixFlag
	clock := newFakeClock()
	r := newRouter(clock)
	r.Resume = ResumeAny
	var rmu sync.Mutex
	r.Rand = func() float64 { rmu.Lock(); defer rmu.Unlock(); return 0 }
	const n = 64
	var wg sync.WaitGroup
	errs := make(chan string, n)
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res := r.Serve(context.Background(), []*Deployment{da, db}, streamReq(helloReq))
			if res.Stream == nil {
				errs <- "no stream: " + errString(res.Err)
				return
			}
			var got []string
			err := res.Stream.Relay(func(ev provider.Event, done bool) error {
				if done {
					got = append(got, "[DONE]")
				} else {
					got = append(got, string(ev.Data))
				}
				return nil
			})
			if err != nil {
				errs <- "relay: " + err.Error()
				return
			}
			text := ""
			for _, g := range got {
				var c struct {
					Choices []struct {
						Delta struct{ Content string } `json:"delta"`
					} `json:"choices"`
				}
				_ = json.Unmarshal([]byte(g), &c)
				for _, ch := range c.Choices {
					text += ch.Delta.Content
				}
			}
			if text != "Hello, world!" && !strings.HasPrefix("Hello, world!", text) {
				errs <- "garbled: " + text
			}
		}()
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		if strings.HasPrefix(e, "garbled") {
			t.Error(e)
		}
	}
	inFlightZero(t, clock, da, db)
	eventually(t, "goroutines back", func() bool { return runtime.NumGoroutine() <= before+2 })
}

func errString(err error) string {
	if err == nil {
		return "<nil>"
	}
	return err.Error()
}

// An error event mid-stream that echoes the provider's key is redacted
// from the StreamError the client is told of.
func TestBreakerStreamErrorRedactsTheKey(t *testing.T) {
	const key = "sk-a-0123456789abcdefghij"
	a := replies(sse(textChunk("a", "Hello"), `data: {"error":{"message":"bad key `+key+` for this org","type":"server_error"}}`))
	da := deployment("a", a)
	da.Provider.(*adapters.OpenAI).Endpoint.APIKey = key
	da.Secrets = []string{key}
	r := newRouter(newFakeClock())
	res := r.Serve(context.Background(), []*Deployment{da}, streamReq(helloReq))
	_, err := relay(t, res.Stream)
	if err == nil || strings.Contains(err.Error(), key) || strings.Contains(err.Error(), "0123456789abcdef") {
		t.Errorf("expected a redacted StreamError, got %v", err)
	}
}

// same_model, and the only deployment of the stream's model is the one
// that broke: it is asked to continue, fails (a 500, as an overloaded
// Claude does right after a cut), and is then retried with backoff
// (500 ms, 1 s, 2 s of silence mid-stream) until max_attempts is spent,
// so that the replay docs/streams.md promises ("Where no deployment
// continues it, the request is asked again from its start, only where its
// answer can be the same text: of a deployment of the same model") is
// never asked of b. The broken deployment should get one
// continuation attempt at most, leaving the attempts for the replay.
func TestBreakerContinuationRetriesTheBrokenDeploymentUntilAttemptsRunOut(t *testing.T) {
	a := replies(cut(textChunk("a", "Hello, "), textChunk("a", "wo")), reply(500, `{"error":{"message":"internal","type":"server_error"}}`))
	b := replies(sse(textChunk("b", "Hello, world!"), finalChunk("b"), "data: [DONE]"))
	da, db := deployment("a", a), deployment("b", b)
	da.Quality = 1
	da.Provider.(*adapters.OpenAI).Continuation = provider.PrefixFlag
	db.Model = da.Model // b cannot continue, but may replay
	clock := newFakeClock()
	r := newRouter(clock)
	res := r.Serve(context.Background(), []*Deployment{da, db}, streamReq(helloReq))
	got, err := relay(t, res.Stream)
	text, _, _, dones, _ := chatText(t, got)
	if b.calls.Load() != 1 || err != nil || text != "Hello, world!" || dones != 1 {
		t.Errorf("expected b's replay to finish the answer; got a asked %d times, b %d, waits %v, text %q, err %v",
			a.calls.Load(), b.calls.Load(), clock.Sleeps(), text, err)
	}
	inFlightZero(t, clock, da, db)
}

// A stream that broke and that no resume took up: resume() already moved
// the broken attempt into the done legs (with its stated or estimated
// usage), but the stream's usage counter is still that attempt's, so
// Legs() lists it a second time and Usage() sums it twice. The handler
// reports both to the access log (llm_input_tokens, llm_cost_usd) and to
// the tokens and cost metrics: a failed stream is billed double.
func TestBreakerUnresumedStreamCountsItsAttemptTwice(t *testing.T) {
	a := replies(cut(brkStart("msg_a", 30), brkBlockStart(0, "text"), brkDelta(0, "Hello")))
	b := replies(reply(500, `{"type":"error","error":{"type":"api_error","message":"internal"}}`))
	da, db := claude(deployment("a", a)), claude(deployment("b", b))
	da.Quality = 1
	clock := newFakeClock()
	r := newRouter(clock)
	r.MaxAttempts = 2
	res := r.Serve(context.Background(), []*Deployment{da, db}, messagesReq())
	if res.Stream == nil {
		t.Fatalf("expected a's stream, got %v", res.Err)
	}
	_, err := relayMessages(res.Stream)
	var se *StreamError
	if !errors.As(err, &se) || b.calls.Load() != 1 {
		t.Fatalf("expected the in-band error after b failed, got %v, b asked %d", err, b.calls.Load())
	}
	legs := res.Stream.Legs()
	u, _ := res.Stream.Usage()
	if len(legs) != 1 || u.InputTokens != 30 {
		t.Errorf("expected one leg (a's, 30 input tokens), got %d legs %+v, usage %+v", len(legs), legs, u)
	}
	inFlightZero(t, clock, da, db)
}

// Release is clamped at 0 in flight, so "InFlight == 0" cannot see a claim
// released twice. With one unrelated claim held on each deployment, a
// resumed stream (a cut, a refused continuation, a diverged replay, a
// continuation) must leave exactly that one in flight on each.
func TestBreakerResumeReleasesEachClaimOnce(t *testing.T) {
	a := replies(cut(textChunk("a", "Hello, "), textChunk("a", "wo")))
	b := replies(reply(400, `{"error":{"message":"prefix is not supported","type":"invalid_request_error"}}`), sse(textChunk("b", "Howdy"), finalChunk("b"), "data: [DONE]"))
	c := replies(sse(textChunk("c", "rld!"), finalChunk("c"), "data: [DONE]"))
	da, db, dc := deployment("a", a), deployment("b", b), deployment("c", c)
	da.Quality, db.Quality = 1, 0.9
	db.Provider.(*adapters.OpenAI).Continuation = provider.PrefixFlag
	dc.Provider.(*adapters.OpenAI).Continuation = provider.PrefixFlag
	dc.Model = "c-other"
	clock := newFakeClock()
	for _, d := range []*Deployment{da, db, dc} {
		if _, ok := d.State.AcquireFor(clock.Now(), capacity.Need{Tokens: 1}); !ok {
			t.Fatal("could not hold a claim")
		}
	}
	r := newRouter(clock)
	r.Resume = ResumeAny
	r.MaxAttempts = 6
	res := r.Serve(context.Background(), []*Deployment{da, db, dc}, streamReq(helloReq))
	got, err := relay(t, res.Stream)
	text, _, _, _, _ := chatText(t, got)
	if err != nil || text != "Hello, world!" {
		t.Errorf("expected c's continuation, got %q %v (b %d, c %d)", text, err, b.calls.Load(), c.calls.Load())
	}
	for _, d := range []*Deployment{da, db, dc} {
		if s := d.State.Snapshot(clock.Now()); s.InFlight != 1 {
			t.Errorf("%s: expected the held claim alone in flight, got %d", d.Name, s.InFlight)
		}
	}
}

// An audio answer (gpt-4o-audio: delta.audio with data and transcript,
// no content) is not text, but the transcript does not flag the key: the
// cut stream is taken for resumable, its text "" (docs/streams.md: "Only text is
// resumed"). The replay "begins with" that empty text, and the splice
// then drops each of its audio chunks as empty (no content, none of the
// members it knows): the client's audio stops where the cut left it,
// followed by the replay's finish_reason and [DONE] — a truncated answer
// presented as complete.
func TestBreakerAudioStreamIsResumedAndTruncated(t *testing.T) {
	audio := func(id, tr, data string) string {
		return brkChunk(id, `{"audio":{"id":"audio_1","transcript":"`+tr+`","data":"`+data+`"}}`)
	}
	a := replies(cut(roleChunk("a"), audio("a", "Hel", "AAAA"), audio("a", "lo", "BBBB")))
	b := replies(sse(roleChunk("b"), audio("b", "Hel", "AAAA"), audio("b", "lo", "BBBB"), audio("b", "!", "CCCC"), finalChunk("b"), "data: [DONE]"))
	da, db := deployment("a", a), deployment("b", b)
	da.Quality = 1
	r := newRouter(newFakeClock())
	endsInBand(t, "an audio stream", r.Serve(context.Background(), []*Deployment{da, db}, streamReq(helloReq)), b)
}

// A Chat client that did not ask for usage gets none after a resume
// either (the continuation's usage chunk, summed, is kept from it), and a
// ping, a second message_start and a message_start's usage in a Claude
// continuation do not break a Messages client's grammar.
func TestBreakerResumeKeepsTheClientsForm(t *testing.T) {
	a := replies(cut(textChunk("a", "Hello")))
	b := replies(sse(textChunk("b", ", world"), finalChunk("b"), usageChunk("b", 9, 9), "data: [DONE]"))
	da, db := deployment("a", a), deployment("b", b)
	da.Quality = 1
	db.Provider.(*adapters.OpenAI).Continuation = provider.PrefixFlag
	r := newRouter(newFakeClock())
	r.Resume = ResumeAny
	req := streamReq(`{"model":"fast","stream":true,"messages":[{"role":"user","content":"say hello"}]}`)
	req.IncludeUsage = false
	res := r.Serve(context.Background(), []*Deployment{da, db}, req)
	got, err := relay(t, res.Stream)
	text, _, _, dones, usage := chatText(t, got)
	if err != nil || text != "Hello, world" || dones != 1 || usage != nil {
		t.Errorf("got %q %v, %d [DONE], usage %v", text, err, dones, usage)
	}

	ping := brkEv("ping", `{"type":"ping"}`)
	ma := replies(cut(brkStart("msg_a", 30), ping, brkBlockStart(0, "text"), brkDelta(0, "The answer "), ping, brkDelta(0, "is 4")))
	mb := replies(sse(brkStart("msg_b", 35), ping, brkBlockStart(0, "text"), brkDelta(0, "2."), brkStart("msg_c", 99), ping,
		brkBlockStop(0), brkMsgDelta("end_turn", 2), brkMsgStop))
	dma, dmb := claude(deployment("a", ma)), claude(deployment("b", mb))
	dma.Quality = 1
	res = newRouter(newFakeClock()).Serve(context.Background(), []*Deployment{dma, dmb}, messagesReq())
	out, err := relayMessages(res.Stream)
	if err != nil {
		t.Fatalf("expected the continuation, got %v", err)
	}
	m := messagestest.Assemble(t, out)
	if m.ID != "msg_a" || len(m.Blocks) != 1 || m.Blocks[0].Text != "The answer is 42." || m.StopReason != "end_turn" {
		t.Errorf("got %+v", m)
	}
}

// A Responses client on a translated (Chat) deployment is continued: the
// continuation goes as Chat with the client's text as the final
// assistant message, flagged prefix.
func TestBreakerResponsesClientIsContinued(t *testing.T) {
	var seen bodies
	a := replies(cut(textChunk("a", "Hello, "), textChunk("a", "wor")))
	b := replies(seen.keep(sse(textChunk("b", "ld!"), finalChunk("b"), usageChunk("b", 5, 2), "data: [DONE]")))
	da, db := deployment("a", a), deployment("b", b)
	da.Quality = 1
	db.Provider.(*adapters.OpenAI).Continuation = provider.PrefixFlag
	r := newRouter(newFakeClock())
	r.Resume = ResumeAny
	req := &Request{Request: &provider.Request{Format: provider.Responses, Stream: true, Choices: 1, IncludeUsage: true,
		Body: []byte(`{"model":"fast","stream":true,"instructions":"be brief","input":"say hello"}`), ToChat: responses.ToChat}, Tokens: 100}
	res := r.Serve(context.Background(), []*Deployment{da, db}, req)
	if res.Stream == nil || res.Format != provider.Chat {
		t.Fatalf("expected a's Chat stream, got %v %v", res.Err, res.Format)
	}
	got, err := relay(t, res.Stream)
	text, ids, _, dones, _ := chatText(t, got)
	if err != nil || text != "Hello, world!" || len(ids) != 1 || dones != 1 {
		t.Errorf("got %q %v %v %d", text, err, ids, dones)
	}
	var body struct {
		Messages []struct {
			Role    string `json:"role"`
			Content any    `json:"content"`
			Prefix  bool   `json:"prefix"`
		} `json:"messages"`
	}
	if err := json.Unmarshal(seen.last(), &body); err != nil || len(body.Messages) == 0 {
		t.Fatalf("bad continuation body %s", seen.last())
	}
	last := body.Messages[len(body.Messages)-1]
	if last.Role != "assistant" || !last.Prefix || !strings.Contains(string(seen.last()), "Hello, wor") {
		t.Errorf("expected the final assistant message with the prefix, got %s", seen.last())
	}
}
