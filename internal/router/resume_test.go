package router

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/llmrouter/caddy-llm-router/internal/adapters"
	"github.com/llmrouter/caddy-llm-router/internal/wire/messages/messagestest"
	"github.com/llmrouter/caddy-llm-router/provider"
)

// bodies keeps the bodies a fake provider was sent.
type bodies struct {
	mu  sync.Mutex
	got [][]byte
}

func (b *bodies) keep(next func(*http.Request) (*http.Response, error)) func(*http.Request) (*http.Response, error) {
	return func(req *http.Request) (*http.Response, error) {
		body, _ := io.ReadAll(req.Body)
		b.mu.Lock()
		b.got = append(b.got, body)
		b.mu.Unlock()
		return next(req)
	}
}

func (b *bodies) last() []byte {
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.got) == 0 {
		return nil
	}
	return b.got[len(b.got)-1]
}

// textChunk is a chat.completion.chunk with text, of the stream id.
func textChunk(id, text string) string {
	b, _ := json.Marshal(map[string]any{"id": id, "object": "chat.completion.chunk", "created": 7, "model": "up-" + id,
		"choices": []map[string]any{{"index": 0, "delta": map[string]string{"content": text}, "finish_reason": nil}}})
	return "data: " + string(b)
}

func roleChunk(id string) string {
	return `data: {"id":"` + id + `","object":"chat.completion.chunk","created":7,"model":"up-` + id + `","choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}`
}

func finalChunk(id string) string {
	return `data: {"id":"` + id + `","object":"chat.completion.chunk","created":7,"model":"up-` + id + `","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}`
}

func usageChunk(id string, in, out int) string {
	u, _ := json.Marshal(map[string]int{"prompt_tokens": in, "completion_tokens": out, "total_tokens": in + out})
	return `data: {"id":"` + id + `","object":"chat.completion.chunk","created":7,"model":"up-` + id + `","choices":[],"usage":` + string(u) + `}`
}

// cut is a stream of events that ends mid-event: the connection broke.
func cut(events ...string) func(*http.Request) (*http.Response, error) {
	return reply(200, strings.Join(events, "\n\n")+"\n\n"+`data: {"id":"x","obj`, "Content-Type", "text/event-stream")
}

// chatText reads what a Chat Completions client got: its text, the
// chunks' ids, its finish reasons, how many [DONE], its usage.
func chatText(t *testing.T, got []string) (text string, ids map[string]bool, finishes, dones int, usage map[string]int) {
	t.Helper()
	ids = map[string]bool{}
	for _, g := range got {
		if g == "[DONE]" {
			dones++
			continue
		}
		var c struct {
			ID      string `json:"id"`
			Choices []struct {
				Delta        struct{ Content string } `json:"delta"`
				FinishReason *string                  `json:"finish_reason"`
			} `json:"choices"`
			Usage map[string]int `json:"usage"`
		}
		if err := json.Unmarshal([]byte(g), &c); err != nil {
			t.Fatalf("not a chunk: %s", g)
		}
		ids[c.ID] = true
		for _, ch := range c.Choices {
			text += ch.Delta.Content
			if ch.FinishReason != nil {
				finishes++
			}
		}
		if c.Usage != nil {
			usage = c.Usage
		}
	}
	return
}

func streamReq(body string) *Request {
	return &Request{Request: &provider.Request{Format: provider.Chat, Body: []byte(body), Stream: true, Choices: 1, IncludeUsage: true},
		Tokens: 100, PromptTokens: 40}
}

const helloReq = `{"model":"fast","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"say hello"}]}`

// A stream cut after its first words is continued by a deployment of the
// same model that takes a prefix: the client reads one answer (one text,
// one id, one finish, one [DONE], usage summed), and the continuation was
// asked with the text the client had as the assistant's, flagged prefix.
func TestACutStreamIsContinued(t *testing.T) {
	var seen bodies
	a := &script{replies: []func(*http.Request) (*http.Response, error){cut(roleChunk("a"), textChunk("a", "Hello, "), textChunk("a", "wor"))}}
	b := &script{replies: []func(*http.Request) (*http.Response, error){seen.keep(sse(roleChunk("b"), textChunk("b", "ld"), textChunk("b", "!"),
		finalChunk("b"), usageChunk("b", 50, 2), "data: [DONE]"))}}
	da, db := deployment("a", a), deployment("b", b)
	da.Model, db.Model = "claude-sonnet-4-5-20250929", "us.anthropic.claude-sonnet-4-5-20250929-v1:0"
	db.Provider.(*adapters.OpenAI).Continuation = provider.PrefixFlag
	da.Quality = 1
	obs := &countingObserver{unpredicted: map[string]int{}}
	r := newRouter(newFakeClock())
	r.Observer = obs
	res := r.Serve(context.Background(), []*Deployment{da, db}, streamReq(helloReq))
	if res.Stream == nil || res.Deployment != da {
		t.Fatalf("expected a's stream, got %v", res.Err)
	}
	got, err := relay(t, res.Stream)
	if err != nil {
		t.Fatalf("expected the stream resumed, got %v (%q)", err, got)
	}
	text, ids, finishes, dones, usage := chatText(t, got)
	if text != "Hello, world!" || finishes != 1 || dones != 1 || len(ids) != 1 || !ids["a"] {
		t.Errorf("expected one answer %q with a's id, one finish, one [DONE]; got %q ids %v, %d finishes, %d [DONE]", "Hello, world!", text, ids, finishes, dones)
	}
	// a stated no usage before it broke: its prompt (40) and the text it
	// relayed (9 bytes: 3 tokens) are estimated.
	if usage["prompt_tokens"] != 90 || usage["completion_tokens"] != 5 || usage["total_tokens"] != 95 {
		t.Errorf("expected usage summed over both attempts (90 in, 5 out), got %v", usage)
	}
	if u, ok := res.Stream.Usage(); !ok || u.InputTokens != 90 || u.OutputTokens != 5 {
		t.Errorf("expected Stream.Usage 90/5, got %+v %v", u, ok)
	}
	if legs := res.Stream.Legs(); len(legs) != 2 || legs[0].Deployment != da || legs[0].Stated || legs[1].Deployment != db || !legs[1].Stated {
		t.Errorf("expected a's estimated leg then b's stated one, got %+v", legs)
	}
	var body struct {
		Messages []struct {
			Role    string `json:"role"`
			Content string `json:"content"`
			Prefix  bool   `json:"prefix"`
		} `json:"messages"`
	}
	if err := json.Unmarshal(seen.last(), &body); err != nil || len(body.Messages) != 2 {
		t.Fatalf("expected the continuation's two messages, got %s", seen.last())
	}
	if m := body.Messages[1]; m.Role != "assistant" || m.Content != "Hello, wor" || !m.Prefix {
		t.Errorf("expected the assistant's %q with prefix, got %+v", "Hello, wor", m)
	}
	if len(obs.resumes) != 1 || obs.resumes[0] != "a>b continued" || res.Stream.Resumes() != 1 {
		t.Errorf("expected one resume a>b continued, got %v", obs.resumes)
	}
	if a.calls.Load() != 1 || b.calls.Load() != 1 {
		t.Errorf("expected one attempt each, got a %d, b %d", a.calls.Load(), b.calls.Load())
	}
}

// The text's trailing whitespace is left out of the continuation's prefix
// (Anthropic refuses a prefill that ends in it), and the continuation's
// repeat of it is dropped: no doubled space. One that does not repeat it
// stands as it is.
func TestAContinuationOwesNoWhitespace(t *testing.T) {
	for _, tc := range []struct{ next, want string }{{" world", "Hello, world"}, {"world", "Hello, world"}, {"  world", "Hello,  world"}} {
		var seen bodies
		a := &script{replies: []func(*http.Request) (*http.Response, error){cut(textChunk("a", "Hello, "))}}
		b := &script{replies: []func(*http.Request) (*http.Response, error){seen.keep(sse(textChunk("b", tc.next), finalChunk("b"), "data: [DONE]"))}}
		da, db := deployment("a", a), deployment("b", b)
		da.Quality = 1
		db.Provider.(*adapters.OpenAI).Continuation = provider.ContinueFinalMessage
		r := newRouter(newFakeClock())
		r.Resume = ResumeAny
		res := r.Serve(context.Background(), []*Deployment{da, db}, streamReq(helloReq))
		got, err := relay(t, res.Stream)
		text, _, _, dones, _ := chatText(t, got)
		if err != nil || text != tc.want || dones != 1 {
			t.Errorf("%q: expected %q, got %q %v", tc.next, tc.want, text, err)
		}
		if !bytes.Contains(seen.last(), []byte(`"content":"Hello,"`)) || !bytes.Contains(seen.last(), []byte(`"continue_final_message":true`)) ||
			!bytes.Contains(seen.last(), []byte(`"add_generation_prompt":false`)) {
			t.Errorf("expected the prefix without its space, with vLLM's flags, got %s", seen.last())
		}
	}
}

// same_model continues only on a deployment of the same model (as the
// clouds name it); a deployment of another model is left alone, and the
// stream ends in-band. any takes it.
func TestResumeModes(t *testing.T) {
	if !SameModel("claude-sonnet-4-5-20250929", "us.anthropic.claude-sonnet-4-5-20250929-v1:0") ||
		!SameModel("claude-sonnet-4-5@20250929", "global.anthropic.claude-sonnet-4-5-20250929-v1:0") ||
		!SameModel("claude-sonnet-4-5", "claude-sonnet-4-5-latest") ||
		SameModel("claude-sonnet-4-5", "claude-opus-4-1") || SameModel("gpt-4o", "gpt-4o-mini") {
		t.Error("SameModel: wrong on the clouds' names")
	}
	for _, tc := range []struct {
		mode    ResumeMode
		resumed bool
		bAsked  int32
	}{{ResumeSameModel, false, 0}, {ResumeAny, true, 1}, {ResumeOff, false, 0}} {
		var seen bodies
		a := &script{replies: []func(*http.Request) (*http.Response, error){cut(textChunk("a", "Hello"))}}
		b := &script{replies: []func(*http.Request) (*http.Response, error){seen.keep(sse(textChunk("b", ", world"), finalChunk("b"), "data: [DONE]"))}}
		da, db := deployment("a", a), deployment("b", b)
		da.Model, db.Model, da.Quality = "claude-sonnet-4-5", "gpt-4o", 1
		db.Provider.(*adapters.OpenAI).Continuation = provider.Prefill
		r := newRouter(newFakeClock())
		r.Resume = tc.mode
		res := r.Serve(context.Background(), []*Deployment{da, db}, streamReq(helloReq))
		got, err := relay(t, res.Stream)
		text, _, _, dones, _ := chatText(t, got)
		var se *StreamError
		switch {
		case tc.resumed && (err != nil || text != "Hello, world" || dones != 1):
			t.Errorf("%s: expected the stream continued on b, got %q %v", tc.mode, text, err)
		case !tc.resumed && (!errors.As(err, &se) || dones != 0 || text != "Hello"):
			t.Errorf("%s: expected an in-band error after %q, got %q %v, %d [DONE]", tc.mode, "Hello", text, err, dones)
		}
		// same_model does not ask b, of another model, even for a replay
		// (another model's answer cannot begin with the client's text); off
		// not at all.
		if n := b.calls.Load(); n != tc.bAsked {
			t.Errorf("%s: expected b asked %d times, got %d", tc.mode, tc.bAsked, n)
		}
		if tc.mode == ResumeSameModel && bytes.Contains(seen.last(), []byte(`"assistant"`)) {
			t.Errorf("%s: expected b asked the request from its start, got %s", tc.mode, seen.last())
		}
	}
}

// Where no deployment continues text, the request is asked again from its
// start (of a deployment of the same model, whatever the mode): its text
// goes on past what the client has; one that departs from it ends the
// stream in-band, never as a complete answer.
func TestAReplayGoesOnOnlyFromTheSameText(t *testing.T) {
	for _, tc := range []struct {
		name  string
		b     []string
		text  string
		clean bool
	}{
		{"same", []string{roleChunk("b"), textChunk("b", "Hello, "), textChunk("b", "world!"), finalChunk("b"), "data: [DONE]"}, "Hello, world!", true},
		{"one chunk", []string{textChunk("b", "Hello, world!"), finalChunk("b"), "data: [DONE]"}, "Hello, world!", true},
		{"departs", []string{textChunk("b", "Hi there"), finalChunk("b"), "data: [DONE]"}, "Hello, wo", false},
		{"shorter", []string{textChunk("b", "Hello"), finalChunk("b"), "data: [DONE]"}, "Hello, wo", false},
	} {
		a := &script{replies: []func(*http.Request) (*http.Response, error){cut(textChunk("a", "Hello, "), textChunk("a", "wo"))}}
		b := &script{replies: []func(*http.Request) (*http.Response, error){sse(tc.b...)}}
		da, db := deployment("a", a), deployment("b", b)
		da.Quality = 1
		db.Model = da.Model // a replay is asked of a deployment of the same model
		obs := &countingObserver{unpredicted: map[string]int{}}
		r := newRouter(newFakeClock())
		r.Observer = obs
		r.MaxAttempts = 2
		res := r.Serve(context.Background(), []*Deployment{da, db}, streamReq(helloReq))
		got, err := relay(t, res.Stream)
		text, ids, _, dones, _ := chatText(t, got)
		if text != tc.text {
			t.Errorf("%s: expected %q, got %q", tc.name, tc.text, text)
		}
		if tc.clean && (err != nil || dones != 1 || len(ids) != 1 || len(obs.resumes) != 1 || obs.resumes[0] != "a>b replayed") {
			t.Errorf("%s: expected a clean replay, got %v, %d [DONE], ids %v, resumes %v", tc.name, err, dones, ids, obs.resumes)
		}
		var se *StreamError
		if !tc.clean && (!errors.As(err, &se) || dones != 0) {
			t.Errorf("%s: expected an in-band error, got %v with %d [DONE]", tc.name, err, dones)
		}
	}
}

// A deployment that refuses a continuation (400: a model without
// prefill) is not asked for another in the request: the next one is.
func TestARefusedContinuationIsNotAskedAgain(t *testing.T) {
	refuse := reply(400, `{"error":{"message":"prefix is not supported","type":"invalid_request_error"}}`)
	a := &script{replies: []func(*http.Request) (*http.Response, error){cut(textChunk("a", "Hello"))}}
	b := &script{replies: []func(*http.Request) (*http.Response, error){refuse}}
	c := &script{replies: []func(*http.Request) (*http.Response, error){sse(textChunk("c", ", world"), finalChunk("c"), "data: [DONE]")}}
	da, db, dc := deployment("a", a), deployment("b", b), deployment("c", c)
	da.Quality, db.Quality = 1, 0.5
	for _, d := range []*Deployment{db, dc} {
		d.Provider.(*adapters.OpenAI).Continuation = provider.PrefixFlag
	}
	r := newRouter(newFakeClock())
	r.Resume = ResumeAny
	res := r.Serve(context.Background(), []*Deployment{da, db, dc}, streamReq(helloReq))
	got, err := relay(t, res.Stream)
	text, _, _, dones, _ := chatText(t, got)
	if err != nil || text != "Hello, world" || dones != 1 {
		t.Errorf("expected c's continuation, got %q %v", text, err)
	}
	if b.calls.Load() != 1 || c.calls.Load() != 1 {
		t.Errorf("expected b asked once, c once; got b %d, c %d", b.calls.Load(), c.calls.Load())
	}
}

// What is not text is never resumed: a tool call cut mid-arguments ends
// in-band, and no other deployment is asked.
func TestAToolCallIsNotResumed(t *testing.T) {
	tool := `data: {"id":"a","object":"chat.completion.chunk","model":"up","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"name":"f","arguments":"{\"ci"}}]},"finish_reason":null}]}`
	a := &script{replies: []func(*http.Request) (*http.Response, error){cut(tool)}}
	b := &script{replies: []func(*http.Request) (*http.Response, error){sse(textChunk("b", "x"), finalChunk("b"), "data: [DONE]")}}
	da, db := deployment("a", a), deployment("b", b)
	da.Quality = 1
	db.Provider.(*adapters.OpenAI).Continuation = provider.Prefill
	r := newRouter(newFakeClock())
	r.Resume = ResumeAny
	endsInBand(t, "a tool call cut mid-arguments", r.Serve(context.Background(), []*Deployment{da, db}, streamReq(helloReq)), b)
}

// A Messages stream from Claude is continued by another Claude deployment
// with prefill: its message and its open text block go on (no second
// message_start, no second block), usage summed in message_delta, as an
// SDK assembles it.
func TestAMessagesStreamIsContinuedWithPrefill(t *testing.T) {
	ev := func(name, data string) string { return "event: " + name + "\ndata: " + data }
	start := func(id string, in int) string {
		return ev("message_start", `{"type":"message_start","message":{"id":"`+id+`","type":"message","role":"assistant","model":"claude-sonnet-4-5","content":[],"stop_reason":null,"usage":{"input_tokens":`+
			strings.Repeat("", 0)+itoa(in)+`,"output_tokens":1}}}`)
	}
	blockStart := ev("content_block_start", `{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}`)
	delta := func(s string) string {
		b, _ := json.Marshal(s)
		return ev("content_block_delta", `{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":`+string(b)+`}}`)
	}
	var seen bodies
	a := &script{replies: []func(*http.Request) (*http.Response, error){cut(start("msg_a", 30), blockStart, delta("The answer "), delta("is 4"))}}
	b := &script{replies: []func(*http.Request) (*http.Response, error){seen.keep(sse(start("msg_b", 35), blockStart, delta("2."),
		ev("content_block_stop", `{"type":"content_block_stop","index":0}`),
		ev("message_delta", `{"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},"usage":{"output_tokens":2}}`),
		ev("message_stop", `{"type":"message_stop"}`)))}}
	da, db := deployment("a", a), deployment("b", b)
	da.Model, db.Model, da.Quality = "claude-sonnet-4-5", "claude-sonnet-4-5@20250929", 1
	for _, d := range []*Deployment{da, db} {
		d.Provider = &adapters.Anthropic{Endpoint: provider.Endpoint{BaseURL: "http://" + d.Name + ".invalid/v1", APIKey: "k"}}
	}
	req := &Request{Request: &provider.Request{Format: provider.Messages, Stream: true, Choices: 1,
		Body: []byte(`{"model":"claude","max_tokens":100,"stream":true,"messages":[{"role":"user","content":"6 times 7?"}]}`)}, Tokens: 100, PromptTokens: 10}
	res := newRouter(newFakeClock()).Serve(context.Background(), []*Deployment{da, db}, req)
	if res.Stream == nil {
		t.Fatalf("expected a's stream, got %v", res.Err)
	}
	var out []byte
	err := res.Stream.Relay(func(ev provider.Event, done bool) error {
		if !done {
			out = provider.AppendEvent(out, ev.Name, ev.Data)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("expected the stream resumed, got %v", err)
	}
	m := messagestest.Assemble(t, out)
	if m.ID != "msg_a" || len(m.Blocks) != 1 || m.Blocks[0].Text != "The answer is 42." || m.StopReason != "end_turn" {
		t.Errorf("expected msg_a with one block %q, got %+v", "The answer is 42.", m)
	}
	// a stated 30 input tokens and relayed 14 bytes (4 tokens): the client
	// reads 30 + 35 in, 4 + 2 out.
	if m.InputTokens != 65 || m.OutputToks != 6 {
		t.Errorf("expected usage 65 in, 6 out, got %d, %d", m.InputTokens, m.OutputToks)
	}
	var body struct {
		Messages []struct {
			Role    string          `json:"role"`
			Content json.RawMessage `json:"content"`
		} `json:"messages"`
	}
	err = json.Unmarshal(seen.last(), &body)
	if err != nil || len(body.Messages) != 2 || body.Messages[1].Role != "assistant" ||
		string(body.Messages[1].Content) != `[{"text":"The answer is 4","type":"text"}]` {
		t.Errorf("expected Claude asked to continue %q, got %s", "The answer is 4", seen.last())
	}
}

func itoa(n int) string { b, _ := json.Marshal(n); return string(b) }

// statesNoContinuation is a provider type that says its models continue
// nothing, whatever its Plan would make of a continuation.
type statesNoContinuation struct{ *adapters.OpenAI }

func (statesNoContinuation) ContinuationFor(string) provider.Continuation {
	return provider.NoContinuation
}

// A deployment whose provider type states that its model continues nothing
// (provider.Continuer) is neither planned nor tried for a continuation: the
// next one that can continues the stream.
func TestAStatedNoContinuationIsNotTried(t *testing.T) {
	a := &script{replies: []func(*http.Request) (*http.Response, error){cut(textChunk("a", "Hello"))}}
	b := &script{replies: []func(*http.Request) (*http.Response, error){sse(textChunk("b", ", there"), finalChunk("b"), "data: [DONE]")}}
	c := &script{replies: []func(*http.Request) (*http.Response, error){sse(textChunk("c", ", world"), finalChunk("c"), "data: [DONE]")}}
	da, db, dc := deployment("a", a), deployment("b", b), deployment("c", c)
	da.Quality, db.Quality = 1, 0.5
	for _, d := range []*Deployment{db, dc} {
		d.Provider.(*adapters.OpenAI).Continuation = provider.PrefixFlag
	}
	db.Provider = statesNoContinuation{db.Provider.(*adapters.OpenAI)}
	r := newRouter(newFakeClock())
	r.Resume = ResumeAny
	res := r.Serve(context.Background(), []*Deployment{da, db, dc}, streamReq(helloReq))
	if res.Stream == nil || res.Deployment != da {
		t.Fatalf("expected a's stream, got %v", res.Err)
	}
	got, err := relay(t, res.Stream)
	text, _, _, dones, _ := chatText(t, got)
	if err != nil || text != "Hello, world" || dones != 1 {
		t.Errorf("expected c's continuation %q, got %q %v", "Hello, world", text, err)
	}
	if b.calls.Load() != 0 || c.calls.Load() != 1 {
		t.Errorf("expected b never asked, c once; got b %d, c %d", b.calls.Load(), c.calls.Load())
	}
}
