package api

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/llmrouter/caddy-llm-router/internal/adapters"
	"github.com/llmrouter/caddy-llm-router/internal/jsonbody"
	"github.com/llmrouter/caddy-llm-router/internal/jsontest"
	"github.com/llmrouter/caddy-llm-router/internal/router"
	"github.com/llmrouter/caddy-llm-router/provider"
)

func TestChatParse(t *testing.T) {
	for _, tc := range []struct {
		name, body string
		status     int
		code       Code
		param      string
	}{
		{"not JSON", `{"model":`, 400, InvalidJSON, ""},
		{"an array", `[{"model":"m"}]`, 400, InvalidJSON, ""},
		{"model of another type", `{"model":42,"messages":[]}`, 400, InvalidJSON, "model"},
		{"duplicate model", `{"model":"m","model":"x","messages":[{"role":"user"}]}`, 400, InvalidJSON, ""},
		{"miscased stream", `{"model":"m","Stream":true,"messages":[{"role":"user"}]}`, 400, InvalidJSON, ""},
		{"messages not objects", `{"model":"m","messages":[1,"x",null]}`, 400, InvalidJSON, "messages"},
		{"no model", `{"messages":[{"role":"user"}]}`, 400, MissingParameter, "model"},
		{"no messages", `{"model":"m"}`, 400, MissingParameter, "messages"},
		{"empty messages", `{"model":"m","messages":[]}`, 400, MissingParameter, "messages"},
		{"a message without role", `{"model":"m","messages":[{"role":"user"},{"content":"x"}]}`, 400, InvalidValue, "messages[1]"},
		{"n out of range", `{"model":"m","n":0,"messages":[{"role":"user"}]}`, 400, InvalidValue, "n"},
	} {
		_, _, e := Chat{}.Parse([]byte(tc.body), nil)
		if e == nil || e.Status != tc.status || e.Code != tc.code || e.Param != tc.param || e.Message == "" {
			t.Errorf("%s: expected %d code %d param %q, got %+v", tc.name, tc.status, tc.code, tc.param, e)
		}
	}
	body := `{"model":"fast","stream":true,"n":2,"max_tokens":100,"max_completion_tokens":300,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"hi"}]}`
	req, model, e := Chat{}.Parse([]byte(body), http.Header{"Anthropic-Beta": {"x"}})
	if e != nil {
		t.Fatal(e)
	}
	prompt := int64(len(body))/4 + 1
	if model != "fast" || req.Format != provider.Chat || !req.Stream || req.Choices != 2 || !req.IncludeUsage ||
		req.OutputTokens != 300 || req.PromptTokens != prompt || req.Tokens != prompt+300 || req.Header != nil {
		t.Errorf("unexpected request %q %+v %+v", model, req, req.Request)
	}
	if chat, err := req.Chat(); err != nil || string(chat) != body {
		t.Errorf("expected the body as its own Chat form, got %s %v", chat, err)
	}
	// A max_tokens no model answers does not overflow the token count.
	req, _, e = Chat{}.Parse([]byte(`{"model":"m","max_tokens":9223372036854775800,"messages":[{"role":"user"}]}`), nil)
	if e != nil || req.OutputTokens != maxTokenEstimate || req.Tokens <= 0 {
		t.Errorf("expected the output tokens bounded, got %+v %v", req, e)
	}
}

func TestMessagesParse(t *testing.T) {
	body := `{"model":"fast","max_tokens":50,"stream":true,"system":"be brief","messages":[{"role":"user","content":"hi"}]}`
	h := http.Header{"Anthropic-Version": {"2023-06-01"}, "Anthropic-Beta": {"a", "b"}, "X-Api-Key": {"sk-client"}, "Authorization": {"Bearer c"}}
	req, model, e := Messages{}.Parse([]byte(body), h)
	if e != nil {
		t.Fatal(e)
	}
	want := http.Header{"Anthropic-Version": {"2023-06-01"}, "Anthropic-Beta": {"a", "b"}}
	if model != "fast" || req.Format != provider.Messages || !req.Stream || !req.IncludeUsage || req.Choices != 1 ||
		req.OutputTokens != 50 || !reflect.DeepEqual(req.Header, want) {
		t.Errorf("unexpected request %q %+v %+v", model, req, req.Request)
	}
	chat, err := req.Chat()
	if err != nil || !strings.Contains(string(chat), `"role":"system","content":"be brief"`) ||
		!strings.Contains(string(chat), `"include_usage":true`) {
		t.Errorf("expected the Chat form with the system prompt and usage asked, got %s %v", chat, err)
	}
	// What Chat Completions cannot express is found when a deployment asks.
	req, _, e = Messages{}.Parse([]byte(`{"model":"m","max_tokens":5,"tools":[{"type":"web_search_20250305","name":"web_search"}],"messages":[{"role":"user","content":"hi"}]}`), nil)
	if e != nil {
		t.Fatal(e)
	}
	if _, err := req.Chat(); err == nil || !strings.Contains(err.Error(), "web_search_20250305") {
		t.Errorf("expected the server tool to have no Chat form, got %v", err)
	}
	for _, bad := range []string{`{"model":"m","messages":[]}`, `{"model":"m","max_tokens":0,"messages":[{"role":"user","content":"x"}]}`,
		`{"max_tokens":5,"messages":[{"role":"user","content":"x"}]}`, `{"model":"m","model":"n","max_tokens":5,"messages":[{}]}`,
		`{"model":"m","max_tokens":5,"system":7,"messages":[{"role":"user","content":"x"}]}`,
		`{"model":"m","max_tokens":5,"stream":"yes","messages":[{"role":"user","content":"x"}]}`,
		`{"model":"m","max_tokens":"5","messages":[{"role":"user","content":"x"}]}`,
		`{"model":"m","max_tokens":5,"messages":{"role":"user","content":"x"}}`,
		`{"model":"m","max_tokens":5,"Messages":[],"messages":[{"role":"user","content":"x"}]}`} {
		if _, _, e := (Messages{}).Parse([]byte(bad), nil); e == nil || e.Status != 400 {
			t.Errorf("%s: expected a 400, got %+v", bad, e)
		}
	}
	// Each message is checked before any deployment is asked, and named.
	for bad, want := range map[string]string{
		`[{"role":"user","content":"x"},"hi"]`:                                "messages.1: Input should be a valid dictionary",
		`[{"role":5,"content":"x"}]`:                                          "messages.0.role: Input should be a non-empty string",
		`[{"role":"","content":"x"}]`:                                         "messages.0.role",
		`[{"content":"x"}]`:                                                   "messages.0.role",
		`[{"role":"user","content":"x"},{"role":"assistant","content":null}]`: "messages.1.content",
		`[{"role":"user"}]`:                                                   "messages.0.content",
		`[{"role":"user","content":{"type":"text"}}]`:                         "messages.0.content",
	} {
		body := `{"model":"m","max_tokens":5,"messages":` + bad + `}`
		if _, _, e := (Messages{}).Parse([]byte(body), nil); e == nil || e.Status != 400 || !strings.Contains(e.Message, want) {
			t.Errorf("%s: expected a 400 naming %q, got %+v", bad, want, e)
		}
	}
	// Roles are the provider's to judge: Claude Code sends "system" turns.
	body = `{"model":"m","max_tokens":5,"messages":[{"role":"user","content":[{"type":"text","text":"a"}]},{"role":"system","content":"be brief"},{"role":"assistant","content":"b"}]}`
	req, _, e = Messages{}.Parse([]byte(body), nil)
	if e != nil {
		t.Fatalf("expected block and string contents and a system turn accepted, got %+v", e)
	}
	if chat, err := req.Chat(); err != nil || !strings.Contains(string(chat), `{"role":"system","content":"be brief"}`) {
		t.Errorf("expected the system turn in the Chat form, got %s %v", chat, err)
	}
}

func TestEmbeddingsParse(t *testing.T) {
	req, model, e := Embeddings{}.Parse([]byte(`{"model":"emb","input":["a","b"]}`), nil)
	if e != nil || model != "emb" || req.Format != provider.Embeddings || req.Stream {
		t.Fatalf("unexpected %q %+v %v", model, req, e)
	}
	for body, param := range map[string]string{`{"model":"emb"}`: "input", `{"model":"emb","input":null}`: "input", `{"input":"x"}`: "model"} {
		if _, _, e := (Embeddings{}).Parse([]byte(body), nil); e == nil || e.Code != MissingParameter || e.Param != param {
			t.Errorf("%s: expected missing %s, got %+v", body, param, e)
		}
	}
}

// Each API writes refusals and the router's own errors in its format: one
// table per API.
func TestErrorBodies(t *testing.T) {
	for _, tc := range []struct {
		e              *Error
		chat, messages string
	}{
		{&Error{Status: 400, Code: InvalidJSON, Param: "model", Message: "bad"},
			`{"error":{"message":"bad","type":"invalid_request_error","param":"model","code":"invalid_json"}}`,
			`{"type":"error","error":{"type":"invalid_request_error","message":"bad"},"request_id":"req_x"}`},
		{fromRouter(&router.Error{Status: 429, Class: provider.RateLimited, Message: "all limited", RetryAfter: 20 * time.Second}),
			`{"error":{"message":"all limited","type":"rate_limit_error","param":null,"code":"rate_limit_exceeded"}}`,
			`{"type":"error","error":{"type":"rate_limit_error","message":"all limited"},"request_id":"req_x"}`},
		{fromRouter(&router.Error{Status: 502, Class: provider.Server, Message: "all failed"}),
			`{"error":{"message":"all failed","type":"server_error","param":null,"code":"upstream_unavailable"}}`,
			`{"type":"error","error":{"type":"api_error","message":"all failed"},"request_id":"req_x"}`},
		{fromRouter(&router.Error{Status: 504, Class: provider.Transport, Message: "late"}),
			`{"error":{"message":"late","type":"timeout","param":null,"code":"deadline_exceeded"}}`,
			`{"type":"error","error":{"type":"timeout_error","message":"late"},"request_id":"req_x"}`},
		{fromRouter(&router.Error{Status: 400, Class: provider.ClientError, Message: "n > 1 is not supported by anthropic"}),
			`{"error":{"message":"n > 1 is not supported by anthropic","type":"invalid_request_error","param":null,"code":"unsupported_request"}}`,
			`{"type":"error","error":{"type":"invalid_request_error","message":"n > 1 is not supported by anthropic"},"request_id":"req_x"}`},
		{fromRouter(&router.Error{Status: 413, Class: provider.ClientError, Message: "larger than every token window"}), // never retried
			`{"error":{"message":"larger than every token window","type":"invalid_request_error","param":null,"code":"unsupported_request"}}`,
			`{"type":"error","error":{"type":"request_too_large","message":"larger than every token window"},"request_id":"req_x"}`},
		{ModelNotFoundError("nope"),
			`{"error":{"message":"the model \"nope\" does not exist; GET /v1/models lists the model groups","type":"invalid_request_error","param":"model","code":"model_not_found"}}`,
			`{"type":"error","error":{"type":"not_found_error","message":"the model \"nope\" does not exist; GET /v1/models lists the model groups"},"request_id":"req_x"}`},
	} {
		for _, a := range []API{Chat{}, Messages{}} {
			w := httptest.NewRecorder()
			a.WriteError(w, tc.e)
			want := tc.chat
			if a.Format() == provider.Messages {
				want = tc.messages
			}
			if w.Code != tc.e.Status || !jsontest.Same(t, fixIDs(t, w.Body.Bytes()), want) || w.Header().Get("Content-Type") != "application/json" {
				t.Errorf("%T %+v: expected %d %s, got %d %s", a, tc.e, tc.e.Status, want, w.Code, w.Body)
			}
			if ra := w.Header().Get("Retry-After"); (tc.e.RetryAfter > 0) != (ra == "20") {
				t.Errorf("%T: expected Retry-After only with a wait, got %q", a, ra)
			}
		}
	}
}

// observe decodes a fixture of internal/adapters/testdata with the provider
// type that speaks its dialect.
func observe(t *testing.T, p provider.Provider, name string) (int, *provider.Observation) {
	t.Helper()
	status, o, _ := observeBody(t, p, name)
	return status, o
}

// observeBody is observe, with the fixture's body.
func observeBody(t *testing.T, p provider.Provider, name string) (int, *provider.Observation, []byte) {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join("..", "adapters", "testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(bytes.NewReader(raw)), nil)
	if err != nil {
		t.Fatal(err)
	}
	var body bytes.Buffer
	_, _ = body.ReadFrom(resp.Body)
	o := p.Observe(resp.StatusCode, resp.Header, body.Bytes(), time.Now())
	return resp.StatusCode, &o, body.Bytes()
}

// A client error from an OpenAI-compatible server that is not in OpenAI's
// error format (TGI, Ollama, a proxy's text or HTML page) reaches the
// client as an error its SDK reads, in its API's format: the status kept,
// the provider's message inside. One in OpenAI's format passes as it came.
func TestForeignErrorBodiesAreRestated(t *testing.T) {
	for file, msg := range map[string]string{
		"tgi-422-validation.http":        "Input validation error",
		"ollama-400-error-string.http":   "invalid character",
		"proxy-400-plain-text.http":      "Bad Request: request header too long",
		"proxy-413-html.http":            "an HTML page: 413 Request Entity Too Large",
		"openai-400-content-filter.http": "",
		"fastapi-422-detail.http":        "field required",
		"proxy-400-empty.http":           "answered 400 Bad Request without a message",
		"vllm-400-old-format.http":       "max_tokens must be at least 1",
	} {
		status, o, body := observeBody(t, &adapters.OpenAI{}, file)
		res := &router.Result{Status: status, Format: provider.Chat, Body: body, Error: o}
		for _, a := range []API{Chat{}, Messages{}} {
			w := httptest.NewRecorder()
			if err := a.Write(w, res); err != nil {
				t.Fatal(err)
			}
			got := w.Body.Bytes()
			var chatErr struct {
				Error *struct {
					Message string `json:"message"`
				} `json:"error"`
				Type string `json:"type"`
			}
			if err := json.Unmarshal(got, &chatErr); err != nil || chatErr.Error == nil || w.Code != status {
				t.Errorf("%s to %T: expected a %d error object, got %d %s", file, a, status, w.Code, got)
				continue
			}
			if _, isMessages := a.(Messages); isMessages && chatErr.Type != "error" {
				t.Errorf("%s to Messages: expected an Anthropic error, got %s", file, got)
			}
			if msg != "" && !strings.Contains(chatErr.Error.Message, msg) {
				t.Errorf("%s to %T: expected the provider's message %q inside, got %s", file, a, msg, got)
			}
			if _, isChat := a.(Chat); isChat && msg == "" && !bytes.Equal(got, body) {
				t.Errorf("%s: expected an OpenAI error object passed on as it came, got %s", file, got)
			}
		}
	}
}

// A provider's client error, passed on to a client of another format, is
// restated from what its provider type decoded of it.
func TestRestatedProviderErrors(t *testing.T) {
	status, o := observe(t, &adapters.Anthropic{}, "anthropic-400-prompt-too-long.http")
	if got, want := string(Chat{}.restate(status, o)),
		`{"error":{"message":"prompt is too long: 210000 tokens > 200000 maximum","type":"invalid_request_error","param":null,"code":"context_length_exceeded"}}`; !jsontest.Same(t, []byte(got), want) {
		t.Errorf("expected %s, got %s", want, got)
	}
	status, o = observe(t, &adapters.Gemini{}, "gemini-429-per-minute.http")
	var e struct {
		Error struct{ Message, Type, Code string }
	}
	if err := json.Unmarshal(Chat{}.restate(status, o), &e); err != nil || e.Error.Type != "rate_limit_error" ||
		e.Error.Code != "rate_limit_exceeded" || !strings.HasPrefix(e.Error.Message, "You exceeded your current quota") {
		t.Errorf("expected an OpenAI rate_limit_error, got %+v %v", e, err)
	}
	g := (&adapters.Gemini{}).Observe(400, http.Header{}, []byte(`{"error":{"code":400,"message":"bad field","status":"INVALID_ARGUMENT"}}`), time.Now())
	if got, want := string(Chat{}.restate(400, &g)),
		`{"error":{"message":"bad field","type":"invalid_request_error","param":null,"code":"invalid_argument"}}`; !jsontest.Same(t, []byte(got), want) {
		t.Errorf("expected %s, got %s", want, got)
	}
	status, o = observe(t, &adapters.OpenAI{}, "openai-400-context-length.http")
	if got := string(Messages{}.restate(status, o)); !strings.HasPrefix(got, `{"type":"error","error":{"type":"invalid_request_error","message":"This model's maximum context length`) {
		t.Errorf("expected an Anthropic invalid_request_error, got %s", got)
	}
}

func TestWriteResults(t *testing.T) {
	chatAnswer := `{"id":"c1","object":"chat.completion","created":1,"model":"up","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4}}`
	anthropicError := `{"type":"error","error":{"type":"invalid_request_error","message":"bad"},"request_id":"req_x"}`
	said := &provider.Observation{Class: provider.ClientError, Message: "bad"}
	for _, tc := range []struct {
		name   string
		a      API
		res    *router.Result
		status int
		body   string
	}{
		{"a chat answer to a chat client, as it came", Chat{},
			&router.Result{Status: 200, Format: provider.Chat, Body: []byte(chatAnswer)}, 200, chatAnswer},
		{"a chat answer to a messages client, translated", Messages{},
			&router.Result{Status: 200, Format: provider.Chat, Body: []byte(chatAnswer)}, 200,
			`{"id":"msg_x","type":"message","role":"assistant","model":"up","content":[{"type":"text","text":"hi"}],"stop_reason":"end_turn","stop_sequence":null,"usage":{"input_tokens":3,"cache_creation_input_tokens":0,"cache_read_input_tokens":0,"cache_creation":null,"output_tokens":1,"server_tool_use":null,"service_tier":null}}`},
		{"a native client error, as it came", Messages{},
			&router.Result{Status: 400, Format: provider.Messages, Body: []byte(anthropicError), Error: said}, 400, anthropicError},
		{"a translated provider's client error, restated", Chat{},
			&router.Result{Status: 400, Format: provider.Chat, Error: said}, 400,
			`{"error":{"message":"bad","type":"invalid_request_error","param":null,"code":null}}`},
		{"an answer that cannot be translated", Messages{},
			&router.Result{Status: 200, Format: provider.Chat, Body: []byte(`{"choices":[]}`)}, 502,
			`{"type":"error","error":{"type":"api_error","message":"the answer could not be translated"},"request_id":"req_x"}`},
		{"the client went away", Chat{}, &router.Result{Err: router.ErrClientGone}, 200, ""},
		{"a native client error that is no JSON, restated", Chat{},
			&router.Result{Status: 413, Format: provider.Chat, Body: []byte("<html>413 Request Entity Too Large</html>"),
				Error: &provider.Observation{Class: provider.ClientError, Message: "<html>413 Request Entity Too Large</html>"}}, 413,
			`{"error":{"message":"<html>413 Request Entity Too Large</html>","type":"invalid_request_error","param":null,"code":null}}`},
	} {
		w := httptest.NewRecorder()
		if err := tc.a.Write(w, tc.res); err != nil {
			t.Errorf("%s: %v", tc.name, err)
		}
		if got := fixIDs(t, w.Body.Bytes()); w.Code != tc.status || string(got) != tc.body {
			t.Errorf("%s: expected %d %s\ngot %d %s", tc.name, tc.status, tc.body, w.Code, got)
		}
	}
}

// Stream writers: the terminator once, an in-band error instead of it.
func TestStreamWriters(t *testing.T) {
	fail := &router.StreamError{Class: provider.Overloaded, Message: "stream failed: Overloaded"}
	chunk := provider.Event{Data: []byte(`{"id":"c","object":"chat.completion.chunk","model":"m","choices":[{"index":0,"delta":{"content":"Hi"},"finish_reason":null}]}`)}
	// write runs the writer's steps: an event, the end, or a failure.
	write := func(sw streamWriter, steps ...any) string {
		var b bytes.Buffer
		for _, st := range steps {
			var err error
			switch st := st.(type) {
			case provider.Event:
				err = sw.event(&b, st)
			case *router.StreamError:
				err = sw.failed(&b, st)
			default:
				err = sw.done(&b)
			}
			if err != nil {
				t.Fatal(err)
			}
		}
		return b.String()
	}

	if got, want := write(Chat{}.newStream(provider.Chat), chunk, "done"), "data: "+string(chunk.Data)+"\n\ndata: [DONE]\n\n"; got != want {
		t.Errorf("chat: expected %q, got %q", want, got)
	}
	if got, want := write(Chat{}.newStream(provider.Chat), chunk, fail), "data: "+string(chunk.Data)+"\n\n"+
		`data: {"error":{"message":"the upstream stream failed after it began: stream failed: Overloaded","type":"server_error","param":null,"code":"stream_interrupted"}}`+"\n\n"; got != want {
		t.Errorf("chat failure: expected %q, got %q", want, got)
	}

	// The router's own bound is said as it is: no upstream failed.
	cut := &router.StreamError{Class: provider.Server, Bounded: true, Message: "the answer was cut at the router's max_stream_bytes (4096 bytes)"}
	if got, want := write(Chat{}.newStream(provider.Chat), chunk, cut), "data: "+string(chunk.Data)+"\n\n"+
		`data: {"error":{"message":"the answer was cut at the router's max_stream_bytes (4096 bytes)","type":"server_error","param":null,"code":"stream_interrupted"}}`+"\n\n"; got != want {
		t.Errorf("chat cut: expected %q, got %q", want, got)
	}
	if got := write(Messages{}.newStream(provider.Messages), cut); !strings.Contains(got, `"message":"the answer was cut at the router's max_stream_bytes (4096 bytes)"`) {
		t.Errorf("messages cut: expected the bound's message as it is, got %q", got)
	}

	// Native Messages events pass as they came; the end is message_stop
	// (the decoder keeps the provider's to itself).
	delta := provider.Event{Name: "message_delta", Data: []byte("{\"type\":\"message_delta\",\n\"usage\":{\"output_tokens\":1}}")}
	got := write(Messages{}.newStream(provider.Messages), delta, "done")
	if want := "event: message_delta\ndata: {\"type\":\"message_delta\",\ndata: \"usage\":{\"output_tokens\":1}}\n\n" +
		"event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"; got != want {
		t.Errorf("native: expected %q, got %q", want, got)
	}
	if got := write(Messages{}.newStream(provider.Messages), fail); !strings.HasPrefix(got, "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\"") {
		t.Errorf("messages failure: expected an overloaded_error event, got %q", got)
	}

	// A Chat stream for a Messages client is translated.
	got = write(Messages{}.newStream(provider.Chat), chunk, "done")
	for _, ev := range []string{"message_start", "content_block_start", "content_block_delta", "content_block_stop", "message_delta", "message_stop"} {
		if !strings.Contains(got, "event: "+ev+"\n") {
			t.Errorf("translated: expected %s in %q", ev, got)
		}
	}
}

func TestReadBody(t *testing.T) {
	for _, tc := range []struct {
		name, body, encoding string
		status               int
	}{
		{"fits", `{"a":1}`, "", 0},
		{"too large", strings.Repeat("x", 11), "", 413},
		{"encoded", `{}`, "gzip", 415},
		{"identity is plain", `{}`, "identity", 0},
	} {
		r := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", strings.NewReader(tc.body))
		r.Header.Set("Content-Type", "application/json")
		if tc.encoding != "" {
			r.Header.Set("Content-Encoding", tc.encoding)
		}
		body, e := ReadBody(httptest.NewRecorder(), r, 10)
		switch {
		case tc.status == 0 && (e != nil || string(body) != tc.body):
			t.Errorf("%s: expected the body, got %q %+v", tc.name, body, e)
		case tc.status != 0 && (e == nil || e.Status != tc.status):
			t.Errorf("%s: expected %d, got %+v", tc.name, tc.status, e)
		}
	}
	// A chunked body over the limit (no Content-Length) is refused too.
	r := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", strings.NewReader(strings.Repeat("x", 20)))
	r.Header.Set("Content-Type", "application/json")
	r.ContentLength = -1
	if _, e := ReadBody(httptest.NewRecorder(), r, 10); e == nil || e.Code != BodyTooLarge {
		t.Errorf("expected 413 for a long chunked body, got %+v", e)
	}
}

// A body is read only when its Content-Type says JSON: application/json
// or a +json type, with any parameters. Anything else, and a body without
// one, is refused with a 415 in the client's format that names what was
// sent and what is accepted, before anything is read: a browser sends a
// cross-origin request without asking first (a CORS preflight) only with
// text/plain, multipart/form-data or application/x-www-form-urlencoded
// (curl -d's), or with none (fetch with a Blob or ArrayBuffer body).
func TestReadBodyTakesOnlyJSON(t *testing.T) {
	const body = `{"model":"fast","messages":[{"role":"user","content":"hi"}]}`
	for _, ct := range []string{"application/json", "application/json; charset=utf-8", "Application/JSON;charset=UTF-8",
		" application/json ", "application/vnd.api+json", "application/merge-patch+json; charset=utf-8"} {
		r := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", strings.NewReader(body))
		r.Header.Set("Content-Type", ct)
		if got, e := ReadBody(httptest.NewRecorder(), r, 1<<20); e != nil || string(got) != body {
			t.Errorf("Content-Type %q: expected the body, got %q %+v", ct, got, e)
		}
	}
	for _, ct := range []string{"", "text/plain", "text/plain;charset=UTF-8", "application/x-www-form-urlencoded",
		"multipart/form-data; boundary=x", "text/json", "application/jsonx", "application/json-patch", "json",
		"application/json, text/plain", "application/json; charset", "text/plain; a=application/json"} {
		r := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", strings.NewReader(body))
		if ct != "" {
			r.Header.Set("Content-Type", ct)
		}
		_, e := ReadBody(httptest.NewRecorder(), r, 1<<20)
		if e == nil || e.Status != http.StatusUnsupportedMediaType {
			t.Errorf("Content-Type %q: expected a 415, got %+v", ct, e)
			continue
		}
		sent := "no Content-Type"
		if ct != "" {
			sent = strconv.Quote(ct)
		}
		if !strings.Contains(e.Message, sent) || !strings.Contains(e.Message, "application/json") {
			t.Errorf("Content-Type %q: expected a message naming %s and application/json, got %q", ct, sent, e.Message)
		}
		for _, a := range []API{Chat{}, Messages{}, Embeddings{}, Responses{}, Completions{}} {
			w := httptest.NewRecorder()
			a.WriteError(w, e)
			var got struct {
				Type  string
				Error struct{ Type, Code, Message string }
			}
			if err := json.Unmarshal(w.Body.Bytes(), &got); err != nil || w.Code != 415 || got.Error.Message != e.Message ||
				w.Header().Get("X-Should-Retry") != "false" {
				t.Errorf("%T, Content-Type %q: expected a 415 error, got %d %s", a, ct, w.Code, w.Body)
				continue
			}
			want := got.Error.Code == "unsupported_content_type" && got.Error.Type == "invalid_request_error"
			if a.Format() == provider.Messages {
				want = got.Type == "error" && got.Error.Type == "invalid_request_error"
			}
			if !want {
				t.Errorf("%T, Content-Type %q: expected the API's invalid_request_error, got %s", a, ct, w.Body)
			}
		}
	}
}

func TestForPath(t *testing.T) {
	for path, want := range map[string]API{
		"/v1/chat/completions": Chat{}, "/openai/v1/chat/completions/": Chat{}, "/v1/embeddings": Embeddings{},
		"/v1/messages": Messages{}, "/v1/models": nil, "/v1/completions": Completions{}, "/v1/responses": Responses{},
		"/v1/messages/count_tokens": CountTokens{}, "/v1/audio/speech": nil,
	} {
		if got := ForPath(path); fmt.Sprintf("%T", got) != fmt.Sprintf("%T", want) {
			t.Errorf("%s: expected %T, got %T", path, want, got)
		}
	}
}

// FuzzChatParse: what the routing scan accepts, encoding/json reads alike
// (key by key, exactly spelled, as providers read them): the same model,
// stream mode, n and token counts.
func FuzzChatParse(f *testing.F) {
	for _, s := range []string{
		`{"model":"m","messages":[{"role":"user","content":"hi"}]}`,
		`{"model":"m\u00e9","stream":true,"n":2,"max_tokens":5,"max_completion_tokens":7,"stream_options":{"include_usage":true},"messages":[{"role":"user"}]}`,
		`{"model":"m","stream":null,"n":null,"messages":[{"role":"a"},null]}`,
		`{"model":"m","messages":[{"role":"x","content":[{"type":"text","text":"\"}]"}]}]}`,
		`{"model":1e3,"messages":[]}`, `[]`, `{"model":"m","messages":[{"role":"u"}],"n":1.5}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		req, model, e := Chat{}.Parse(body, nil)
		if e != nil {
			return
		}
		var top map[string]json.RawMessage
		if err := json.Unmarshal(body, &top); err != nil {
			t.Fatalf("accepted %q, which encoding/json refuses: %v", body, err)
		}
		var ref struct {
			model               string
			stream, usage       bool
			n                   *int
			maxTokens, maxCompl *int64
			opts                map[string]json.RawMessage
		}
		for k, dst := range map[string]any{"model": &ref.model, "stream": &ref.stream, "n": &ref.n,
			"max_tokens": &ref.maxTokens, "max_completion_tokens": &ref.maxCompl, "stream_options": &ref.opts} {
			if v, ok := top[k]; ok {
				if err := json.Unmarshal(v, dst); err != nil {
					t.Fatalf("%q: accepted %s of the wrong type: %v", body, k, err)
				}
			}
		}
		if v, ok := ref.opts["include_usage"]; ok {
			_ = json.Unmarshal(v, &ref.usage)
		}
		n := 1
		if ref.n != nil {
			n = *ref.n
		}
		out := int64(0)
		if ref.maxCompl != nil && *ref.maxCompl > 0 {
			out = *ref.maxCompl
		} else if ref.maxTokens != nil && *ref.maxTokens > 0 {
			out = *ref.maxTokens
		}
		out = min(out, maxTokenEstimate)
		if model != ref.model || req.Stream != ref.stream || req.Choices != n || req.OutputTokens != out || req.IncludeUsage != ref.usage {
			t.Fatalf("%q: scanned %q %v %d %d %v, encoding/json read %+v", body, model, req.Stream, req.Choices, req.OutputTokens, req.IncludeUsage, ref)
		}
	})
}

// BenchmarkChatParse reads the routing keys of a 1 KB Chat Completions
// body (the handler's share of a request's CPU).
func BenchmarkChatParse(b *testing.B) {
	body, _ := json.Marshal(map[string]any{"model": "fast", "max_tokens": 256, "stream": false, "messages": []map[string]string{
		{"role": "system", "content": "You are a careful assistant. " + strings.Repeat("Answer briefly. ", 40)},
		{"role": "user", "content": "Summarize the three main risks of the report in one paragraph each."},
		{"role": "assistant", "content": "Which format do you prefer?"},
		{"role": "user", "content": "Prose, please."}}})
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		if _, _, e := (Chat{}).Parse(body, nil); e != nil {
			b.Fatal(e)
		}
	}
}

// BenchmarkMessagesParse checks a 7.5 KB Messages body of 20 turns with
// content blocks, as coding agents send them.
func BenchmarkMessagesParse(b *testing.B) {
	var sb strings.Builder
	sb.WriteString(`{"model":"claude","max_tokens":1024,"system":"be brief","messages":[`)
	for i := range 20 {
		if i > 0 {
			sb.WriteString(",")
		}
		role := "user"
		if i%2 == 1 {
			role = "assistant"
		}
		sb.WriteString(`{"role":"` + role + `","content":[{"type":"text","text":"` + strings.Repeat("lorem ipsum dolor sit amet ", 12) + `"}]}`)
	}
	sb.WriteString(`]}`)
	body := []byte(sb.String())
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		if _, _, e := (Messages{}).Parse(body, nil); e != nil {
			b.Fatal(e)
		}
	}
}

// A provider's code restated for an OpenAI client is in snake case.
func TestSnakeCaseCodes(t *testing.T) {
	for code, want := range map[string]string{"ValidationException": "validation_exception", "INVALID_ARGUMENT": "invalid_argument",
		"context_length_exceeded": "context_length_exceeded", "ModelErrorException": "model_error_exception", "": ""} {
		if got := snakeCase(code); got != want {
			t.Errorf("%q: %q, want %q", code, got, want)
		}
	}
}

// fixIDs makes the fresh ids of a body the router wrote fixed, for a
// comparison: a Messages error's request_id "req_x", a translated
// message's id "msg_x".
func fixIDs(t *testing.T, body []byte) []byte {
	t.Helper()
	if !json.Valid(body) || len(body) == 0 || body[0] != '{' {
		return body
	}
	if id, ok := jsonbody.GetString(body, "request_id"); ok && strings.HasPrefix(id, "req_") {
		body = jsontest.Set(t, body, "request_id", "req_x")
	}
	if id, ok := jsonbody.GetString(body, "id"); ok && strings.HasPrefix(id, "msg_") {
		body = jsontest.Set(t, body, "id", "msg_x")
	}
	return body
}

// A Responses client whose request went to a Chat deployment reads its
// instructions, temperature and top_p restated in the translated
// response, as OpenAI's responses restate them (WithRequest), streamed or
// not.
func TestResponsesRestateTheirRequest(t *testing.T) {
	x := Responses{}.WithRequest([]byte(`{"model":"m","input":"hi","instructions":"Be brief.","temperature":0.2,"top_p":0.9}`))
	want := `"instructions":"Be brief.","temperature":0.2,"top_p":0.9`
	w := httptest.NewRecorder()
	answer := []byte(`{"id":"c","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}]}`)
	if err := x.Write(w, &router.Result{Status: 200, Format: provider.Chat, Body: answer}); err != nil || !strings.Contains(w.Body.String(), want) {
		t.Errorf("expected the answer to restate %s, got %s (%v)", want, w.Body, err)
	}
	s := x.newStream(provider.Chat)
	if tr, ok := s.(*translatedResponses); !ok || tr.enc == nil {
		t.Fatalf("expected a translated stream, got %T", s)
	}
	out := string(s.(*translatedResponses).enc.Chunk([]byte(`{"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":"Hi"},"finish_reason":null}]}`)))
	if !strings.Contains(out, want) {
		t.Errorf("expected the stream's response to restate %s, got %s", want, out)
	}
}
