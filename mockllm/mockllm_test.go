package mockllm

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws/protocol/eventstream"
	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

// fakeClock drives rate-limit windows and fault From/For windows.
type fakeClock struct{ ns atomic.Int64 }

func newFakeClock() *fakeClock {
	c := new(fakeClock)
	c.ns.Store(time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano())
	return c
}

func (c *fakeClock) now() time.Time          { return time.Unix(0, c.ns.Load()) }
func (c *fakeClock) advance(d time.Duration) { c.ns.Add(int64(d)) }

// served is a mock behind an httptest server, with a signal for every
// handler invocation that returned (panicked ones included).
type served struct {
	h        *Handler
	srv      *httptest.Server
	returned chan struct{}
}

func serve(t *testing.T, cfg Handler, clock *fakeClock) *served {
	t.Helper()
	h := new(Handler)
	*h = cfg
	if clock != nil {
		h.now = clock.now
	}
	if err := h.Setup(); err != nil {
		t.Fatalf("setup: %v", err)
	}
	s := &served{h: h, returned: make(chan struct{}, 1000)}
	inner := h.HTTPHandler()
	s.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer func() { s.returned <- struct{}{} }()
		inner.ServeHTTP(w, r)
	}))
	t.Cleanup(func() {
		_ = h.Close()
		s.srv.Close()
	})
	return s
}

const chatBody = `{"model":"gpt-test","messages":[{"role":"user","content":"hi"}]}`
const streamBody = `{"model":"gpt-test","stream":true,"messages":[{"role":"user","content":"hi"}]}`

func tokensOf(body string) int { return (len(body) + 3) / 4 }

func (s *served) post(t *testing.T, path, body string, hdr ...string) *http.Response {
	t.Helper()
	return s.postCtx(t, context.Background(), path, body, hdr...)
}

func (s *served) postCtx(t *testing.T, ctx context.Context, path, body string, hdr ...string) *http.Response {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.srv.URL+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := s.srv.Client().Do(req)
	if err != nil {
		t.Fatalf("POST %s: %v", path, err)
	}
	return resp
}

func readAll(t *testing.T, resp *http.Response) string {
	t.Helper()
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("reading body: %v", err)
	}
	return string(b)
}

// sse is a parsed event stream.
type sse struct {
	data     []string // data: payloads, in order
	comments int
	err      error // nil when the stream ended cleanly
	arrivals []time.Duration
}

func readSSE(resp *http.Response, start time.Time) sse {
	defer resp.Body.Close()
	var s sse
	br := bufio.NewReader(resp.Body)
	for {
		line, err := br.ReadString('\n')
		line = strings.TrimRight(line, "\r\n")
		switch {
		case strings.HasPrefix(line, "data: "):
			s.data = append(s.data, strings.TrimPrefix(line, "data: "))
			s.arrivals = append(s.arrivals, time.Since(start))
		case strings.HasPrefix(line, ":"):
			s.comments++
		}
		if err != nil {
			if err != io.EOF {
				s.err = err
			}
			return s
		}
	}
}

type chunk struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Created int64  `json:"created"`
	Model   string `json:"model"`
	Choices []struct {
		Index int `json:"index"`
		Delta struct {
			Role    *string `json:"role"`
			Content *string `json:"content"`
		} `json:"delta"`
		FinishReason *string `json:"finish_reason"`
	} `json:"choices"`
	Usage *usage `json:"usage"`
}

type usage struct {
	PromptTokens     int `json:"prompt_tokens"`
	CompletionTokens int `json:"completion_tokens"`
	TotalTokens      int `json:"total_tokens"`
}

type apiError struct {
	Error struct {
		Message string  `json:"message"`
		Type    string  `json:"type"`
		Param   *string `json:"param"`
		Code    *string `json:"code"`
	} `json:"error"`
}

func decodeError(t *testing.T, body string) apiError {
	t.Helper()
	var e apiError
	if err := json.Unmarshal([]byte(body), &e); err != nil {
		t.Fatalf("error body %q: %v", body, err)
	}
	return e
}

func TestChatCompletion(t *testing.T) {
	tests := []struct {
		name      string
		cfg       Handler
		wantModel string
		wantReply string
		wantC     int
	}{
		{"defaults", Handler{}, "gpt-test", DefaultReply, DefaultChunks},
		{"configured model", Handler{Model: "mock-4"}, "mock-4", DefaultReply, DefaultChunks},
		{"reply and chunks", Handler{Reply: `say "hi"` + "\n\u00e9\u2028", Chunks: 3}, "gpt-test", `say "hi"` + "\n\u00e9\u2028", 3},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := serve(t, tt.cfg, nil)
			resp := s.post(t, "/v1/chat/completions", chatBody)
			body := readAll(t, resp)
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("expected 200, got %d: %s", resp.StatusCode, body)
			}
			if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
				t.Errorf("expected application/json, got %q", ct)
			}
			var got struct {
				ID      string `json:"id"`
				Object  string `json:"object"`
				Created int64  `json:"created"`
				Model   string `json:"model"`
				Choices []struct {
					Index   int `json:"index"`
					Message struct {
						Role    string `json:"role"`
						Content string `json:"content"`
					} `json:"message"`
					FinishReason string `json:"finish_reason"`
				} `json:"choices"`
				Usage usage `json:"usage"`
			}
			if err := json.Unmarshal([]byte(body), &got); err != nil {
				t.Fatalf("body %q: %v", body, err)
			}
			if !strings.HasPrefix(got.ID, "chatcmpl-mock-") {
				t.Errorf("expected id chatcmpl-mock-N, got %q", got.ID)
			}
			if got.Object != "chat.completion" {
				t.Errorf("expected object chat.completion, got %q", got.Object)
			}
			if d := time.Since(time.Unix(got.Created, 0)); d < 0 || d > time.Minute {
				t.Errorf("expected created about now, got %d", got.Created)
			}
			if got.Model != tt.wantModel {
				t.Errorf("expected model %q, got %q", tt.wantModel, got.Model)
			}
			if len(got.Choices) != 1 {
				t.Fatalf("expected 1 choice, got %d", len(got.Choices))
			}
			c := got.Choices[0]
			if c.Index != 0 || c.Message.Role != "assistant" || c.Message.Content != tt.wantReply || c.FinishReason != "stop" {
				t.Errorf("expected assistant %q stop, got %+v", tt.wantReply, c)
			}
			want := usage{tokensOf(chatBody), tt.wantC, tokensOf(chatBody) + tt.wantC}
			if got.Usage != want {
				t.Errorf("expected usage %+v, got %+v", want, got.Usage)
			}
		})
	}
}

func TestChatCompletionStream(t *testing.T) {
	tests := []struct {
		name      string
		cfg       Handler
		wantModel string
		wantReply string
		wantC     int
	}{
		{"defaults", Handler{}, "gpt-test", DefaultReply, DefaultChunks},
		{"one chunk", Handler{Chunks: 1, Model: "m"}, "m", DefaultReply, 1},
		{"more chunks than runes", Handler{Chunks: 6, Reply: "héé"}, "gpt-test", "héé", 6},
		{"escaping", Handler{Chunks: 4, Reply: "a\"b\\c\nd\te\x01"}, "gpt-test", "a\"b\\c\nd\te\x01", 4},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := serve(t, tt.cfg, nil)
			resp := s.post(t, "/v1/chat/completions", streamBody)
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("expected 200, got %d", resp.StatusCode)
			}
			if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" {
				t.Errorf("expected text/event-stream, got %q", ct)
			}
			ev := readSSE(resp, time.Now())
			if ev.err != nil {
				t.Fatalf("expected a clean end, got %v", ev.err)
			}
			if n := len(ev.data); n != tt.wantC+2 {
				t.Fatalf("expected %d events, got %d: %q", tt.wantC+2, n, ev.data)
			}
			if last := ev.data[len(ev.data)-1]; last != "[DONE]" {
				t.Fatalf("expected [DONE] last, got %q", last)
			}
			var joined strings.Builder
			var id string
			for i, d := range ev.data[:len(ev.data)-1] {
				var c chunk
				if err := json.Unmarshal([]byte(d), &c); err != nil {
					t.Fatalf("event %d %q: %v", i, d, err)
				}
				if id == "" {
					id = c.ID
				}
				if c.ID != id || !strings.HasPrefix(c.ID, "chatcmpl-mock-") {
					t.Errorf("event %d: expected id %q, got %q", i, id, c.ID)
				}
				if c.Object != "chat.completion.chunk" || c.Model != tt.wantModel || len(c.Choices) != 1 {
					t.Fatalf("event %d: unexpected shape %q", i, d)
				}
				ch := c.Choices[0]
				if i == tt.wantC { // final
					if ch.FinishReason == nil || *ch.FinishReason != "stop" || ch.Delta.Content != nil {
						t.Errorf("expected final empty delta with stop, got %q", d)
					}
					want := usage{tokensOf(streamBody), tt.wantC, tokensOf(streamBody) + tt.wantC}
					if c.Usage == nil || *c.Usage != want {
						t.Errorf("expected usage %+v, got %q", want, d)
					}
					continue
				}
				if ch.FinishReason != nil {
					t.Errorf("event %d: expected finish_reason null, got %q", i, *ch.FinishReason)
				}
				if (i == 0) != (ch.Delta.Role != nil) {
					t.Errorf("event %d: expected role only in the first delta, got %q", i, d)
				}
				if i == 0 && *ch.Delta.Role != "assistant" {
					t.Errorf("expected role assistant, got %q", *ch.Delta.Role)
				}
				if ch.Delta.Content == nil {
					t.Fatalf("event %d: expected content, got %q", i, d)
				}
				joined.WriteString(*ch.Delta.Content)
			}
			if joined.String() != tt.wantReply {
				t.Errorf("expected pieces to join to %q, got %q", tt.wantReply, joined.String())
			}
		})
	}
}

func TestStreamPacing(t *testing.T) {
	const (
		latency  = 20 * time.Millisecond
		ftd      = 40 * time.Millisecond
		interval = 25 * time.Millisecond
		chunks   = 4
	)
	s := serve(t, Handler{
		Latency:         caddy.Duration(latency),
		FirstTokenDelay: caddy.Duration(ftd),
		ChunkInterval:   caddy.Duration(interval),
		Chunks:          chunks,
	}, nil)
	start := time.Now()
	resp := s.post(t, "/chat/completions", streamBody)
	if got := time.Since(start); got < latency {
		t.Errorf("expected headers after at least %s, got %s", latency, got)
	}
	ev := readSSE(resp, start)
	if ev.err != nil || len(ev.arrivals) != chunks+2 {
		t.Fatalf("expected %d events and a clean end, got %d, %v", chunks+2, len(ev.arrivals), ev.err)
	}
	for i := range chunks {
		min := latency + ftd + time.Duration(i)*interval
		if ev.arrivals[i] < min {
			t.Errorf("chunk %d: expected after at least %s, got %s", i, min, ev.arrivals[i])
		}
	}
	if total := ev.arrivals[len(ev.arrivals)-1]; total > 2*time.Second {
		t.Errorf("expected the stream to end promptly, took %s", total)
	}
}

func TestEmbeddingsAndModels(t *testing.T) {
	t.Run("embeddings", func(t *testing.T) {
		s := serve(t, Handler{}, nil)
		reqBody := `{"model":"text-embedding-3-small","input":"hello"}`
		body := readAll(t, s.post(t, "/v1/embeddings", reqBody))
		var got struct {
			Object string `json:"object"`
			Data   []struct {
				Object    string    `json:"object"`
				Index     int       `json:"index"`
				Embedding []float64 `json:"embedding"`
			} `json:"data"`
			Model string         `json:"model"`
			Usage map[string]int `json:"usage"`
		}
		if err := json.Unmarshal([]byte(body), &got); err != nil {
			t.Fatalf("body %q: %v", body, err)
		}
		p := tokensOf(reqBody)
		if got.Object != "list" || len(got.Data) != 1 || got.Data[0].Object != "embedding" ||
			fmt.Sprint(got.Data[0].Embedding) != "[0.1 0.2 0.3]" || got.Model != "text-embedding-3-small" ||
			got.Usage["prompt_tokens"] != p || got.Usage["total_tokens"] != p || len(got.Usage) != 2 {
			t.Errorf("unexpected embeddings answer %s", body)
		}
	})
	// The OpenAI SDKs ask for encoding_format base64 by default and decode
	// little-endian float32s (openai-node's toFloat32Array): an answer of
	// numbers decodes to an empty vector there.
	t.Run("embeddings base64", func(t *testing.T) {
		s := serve(t, Handler{}, nil)
		body := readAll(t, s.post(t, "/v1/embeddings", `{"model":"e","input":"hello","encoding_format":"base64"}`))
		var got struct {
			Data []struct {
				Embedding string `json:"embedding"`
			} `json:"data"`
		}
		if err := json.Unmarshal([]byte(body), &got); err != nil || len(got.Data) != 1 {
			t.Fatalf("expected a base64 embedding, got %s (%v)", body, err)
		}
		raw, err := base64.StdEncoding.DecodeString(got.Data[0].Embedding)
		if err != nil || len(raw) != 12 {
			t.Fatalf("expected 3 float32s in base64, got %q (%v)", got.Data[0].Embedding, err)
		}
		var v []float32
		for i := 0; i < len(raw); i += 4 {
			v = append(v, math.Float32frombits(binary.LittleEndian.Uint32(raw[i:])))
		}
		if fmt.Sprint(v) != "[0.1 0.2 0.3]" {
			t.Errorf("expected [0.1 0.2 0.3], got %v", v)
		}
	})
	// One embedding per input item, indexed in order, as OpenAI answers:
	// input is a string, an array of strings, one array of tokens or an
	// array of token arrays; base64 encodes each.
	for _, tt := range []struct {
		input string
		n     int
	}{{`"hello"`, 1}, {`["a","b"]`, 2}, {`["a","b","c"]`, 3}, {`[1,2,3]`, 1}, {`[[1,2],[3]]`, 2}} {
		for _, format := range []string{"float", "base64"} {
			t.Run("embeddings of "+tt.input+" as "+format, func(t *testing.T) {
				s := serve(t, Handler{}, nil)
				body := readAll(t, s.post(t, "/v1/embeddings", `{"model":"e","input":`+tt.input+`,"encoding_format":"`+format+`"}`))
				var got struct {
					Data []struct {
						Object    string          `json:"object"`
						Index     int             `json:"index"`
						Embedding json.RawMessage `json:"embedding"`
					} `json:"data"`
				}
				if err := json.Unmarshal([]byte(body), &got); err != nil || len(got.Data) != tt.n {
					t.Fatalf("expected %d embeddings, got %s (%v)", tt.n, body, err)
				}
				want := `[0.1,0.2,0.3]`
				if format == "base64" {
					want = `"zczMPc3MTD6amZk+"`
				}
				for i, d := range got.Data {
					if d.Index != i || d.Object != "embedding" || string(d.Embedding) != want {
						t.Errorf("item %d: expected index %d and %s, got %d %s", i, i, want, d.Index, d.Embedding)
					}
				}
			})
		}
	}
	for _, tt := range []struct{ model, want string }{{"", "mock"}, {"mock-4", "mock-4"}} {
		t.Run("models "+tt.want, func(t *testing.T) {
			s := serve(t, Handler{Model: tt.model}, nil)
			resp, err := s.srv.Client().Get(s.srv.URL + "/v1/models")
			if err != nil {
				t.Fatal(err)
			}
			want := `{"object":"list","data":[{"id":"` + tt.want + `","object":"model","owned_by":"llm_mock"}]}`
			if got := readAll(t, resp); got != want {
				t.Errorf("expected %s, got %s", want, got)
			}
		})
	}
}

func TestUnservedPaths(t *testing.T) {
	s := serve(t, Handler{}, nil)
	for _, tt := range []struct{ method, path string }{
		{http.MethodGet, "/v1/chat/completions"},
		{http.MethodPost, "/v1/images/generations"},
		{http.MethodPost, "/v1/models"},
		{http.MethodPost, "/v1/messages"},
		{http.MethodPost, "/v1beta/models/gemini-x:generateContent"},
		{http.MethodPost, "/v1beta/models/gemini-x:streamGenerateContent"},
		{http.MethodGet, "/llm_mock/reset"},
		{http.MethodGet, "/"},
	} {
		req, _ := http.NewRequest(tt.method, s.srv.URL+tt.path, strings.NewReader("{}"))
		resp, err := s.srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		readAll(t, resp)
		if resp.StatusCode != http.StatusNotFound {
			t.Errorf("%s %s: expected 404, got %d", tt.method, tt.path, resp.StatusCode)
		}
	}
	if n := s.h.Stats().Requests; n != 0 {
		t.Errorf("expected 0 requests counted, got %d", n)
	}
}

func TestCaddyHandlerPassesToNext(t *testing.T) {
	h := new(Handler)
	if err := h.Setup(); err != nil {
		t.Fatal(err)
	}
	var nextCalled bool
	next := caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
		nextCalled = true
		w.WriteHeader(http.StatusTeapot)
		return nil
	})
	rec := httptest.NewRecorder()
	if err := h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/other", nil), next); err != nil {
		t.Fatal(err)
	}
	if !nextCalled || rec.Code != http.StatusTeapot {
		t.Errorf("expected next handler to answer 418, got called=%v code=%d", nextCalled, rec.Code)
	}
	nextCalled = false
	rec = httptest.NewRecorder()
	req := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", strings.NewReader(chatBody))
	if err := h.ServeHTTP(rec, req, next); err != nil {
		t.Fatal(err)
	}
	if nextCalled || rec.Code != http.StatusOK {
		t.Errorf("expected the mock to answer 200, got called=%v code=%d", nextCalled, rec.Code)
	}
}

func TestProvisionWithCaddyContext(t *testing.T) {
	t.Setenv("LLM_MOCK_TEST_KEY", "sk-env")
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	defer cancel()
	h := &Handler{APIKey: "{env.LLM_MOCK_TEST_KEY}"}
	if err := h.Provision(ctx); err != nil {
		t.Fatal(err)
	}
	if err := h.Validate(); err != nil {
		t.Fatal(err)
	}
	if h.apiKey != "sk-env" {
		t.Errorf("expected api key from the environment, got %q", h.apiKey)
	}
	if err := h.Cleanup(); err != nil {
		t.Fatal(err)
	}
	if err := h.Cleanup(); err != nil { // Caddy may clean up twice after a failed load
		t.Fatal(err)
	}
}

func TestAPIKey(t *testing.T) {
	t.Setenv("LLM_MOCK_TEST_KEY", "sk-secret")
	s := serve(t, Handler{APIKey: "{env.LLM_MOCK_TEST_KEY}", RateLimit: &RateLimit{Requests: 5}}, nil)
	tests := []struct {
		name   string
		auth   string
		status int
		shown  string // the wrong key as the 401 shows it
	}{
		{"missing", "", http.StatusUnauthorized, ""},
		{"wrong", "Bearer sk-other", http.StatusUnauthorized, "sk-other"},
		{"wrong and long", "Bearer sk-proj-0123456789SJh4", http.StatusUnauthorized, "sk-proj-**********SJh4"},
		{"not bearer", "sk-secret", http.StatusUnauthorized, ""},
		{"right", "Bearer sk-secret", http.StatusOK, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var hdr []string
			if tt.auth != "" {
				hdr = []string{"Authorization", tt.auth}
			}
			resp := s.post(t, "/v1/chat/completions", chatBody, hdr...)
			body := readAll(t, resp)
			if resp.StatusCode != tt.status {
				t.Fatalf("expected %d, got %d: %s", tt.status, resp.StatusCode, body)
			}
			if got := s.h.Stats().LastAuthorization; got != tt.auth {
				t.Errorf("expected last_authorization %q, got %q", tt.auth, got)
			}
			if resp.Header.Get("x-ratelimit-limit-requests") != "5" {
				t.Errorf("expected rate-limit headers on every answer, got %v", resp.Header)
			}
			if tt.status != http.StatusUnauthorized {
				return
			}
			want := `{"error":{"message":"Incorrect API key provided.","type":"invalid_request_error","param":null,"code":"invalid_api_key"}}`
			if tt.shown != "" {
				want = `{"error":{"message":"Incorrect API key provided: ` + tt.shown + `. You can find your API key at https://platform.openai.com/account/api-keys.","type":"invalid_request_error","param":null,"code":"invalid_api_key"}}`
			}
			if body != want {
				t.Errorf("expected %s, got %s", want, body)
			}
			if got := resp.Header.Get("x-ratelimit-remaining-requests"); got != "5" {
				t.Errorf("expected a 401 not to use the rate limit, remaining %q", got)
			}
		})
	}
}

// A wrong key is refused before routing, as providers do: a path the
// mock does not serve gets the 401, and with the right key it is the
// next handler's (HTTPHandler: 404).
func TestAPIKeyBeforeRouting(t *testing.T) {
	s := serve(t, Handler{APIKey: "sk-secret"}, nil)
	for auth, want := range map[string]int{"Bearer sk-wrong": http.StatusUnauthorized, "Bearer sk-secret": http.StatusNotFound} {
		resp := s.post(t, "/v1/audio/speech", `{"input":"hi"}`, "Authorization", auth)
		if body := readAll(t, resp); resp.StatusCode != want || want == http.StatusUnauthorized && !strings.Contains(body, "provided: sk-wrong.") {
			t.Errorf("%s: expected %d, got %d %s", auth, want, resp.StatusCode, body)
		}
	}
}

func TestBadJSON(t *testing.T) {
	s := serve(t, Handler{}, nil)
	resp := s.post(t, "/v1/chat/completions", `{"model":`)
	body := readAll(t, resp)
	if resp.StatusCode != http.StatusBadRequest || decodeError(t, body).Error.Type != "invalid_request_error" {
		t.Errorf("expected 400 invalid_request_error, got %d %s", resp.StatusCode, body)
	}
	if st := s.h.Stats(); st.Requests != 1 || st.LastBody != `{"model":` {
		t.Errorf("expected the bad request counted, got %+v", st)
	}
}

func TestRateLimitRequests(t *testing.T) {
	clock := newFakeClock()
	s := serve(t, Handler{RateLimit: &RateLimit{Requests: 3, Window: caddy.Duration(10 * time.Second)}}, clock)
	steps := []struct {
		advance   time.Duration
		status    int
		remaining string
		reset     string
		retry     string
	}{
		{0, 200, "2", "10s", ""},
		{500 * time.Millisecond, 200, "1", "9.5s", ""},
		{2 * time.Second, 200, "0", "7.5s", ""},
		{12 * time.Millisecond, 429, "0", "7.488s", "8"},
		{7 * time.Second, 429, "0", "488ms", "1"},
		{488 * time.Millisecond, 200, "2", "10s", ""}, // window rolls
		{time.Second, 200, "1", "9s", ""},
	}
	for i, st := range steps {
		clock.advance(st.advance)
		resp := s.post(t, "/v1/chat/completions", chatBody)
		body := readAll(t, resp)
		if resp.StatusCode != st.status {
			t.Fatalf("step %d: expected %d, got %d: %s", i, st.status, resp.StatusCode, body)
		}
		for name, want := range map[string]string{
			"x-ratelimit-limit-requests":     "3",
			"x-ratelimit-remaining-requests": st.remaining,
			"x-ratelimit-reset-requests":     st.reset,
			"Retry-After":                    st.retry,
			"x-ratelimit-limit-tokens":       "",
		} {
			if got := resp.Header.Get(name); got != want {
				t.Errorf("step %d: expected %s %q, got %q", i, name, want, got)
			}
		}
		if st.status == 429 {
			want := `{"error":{"message":"Rate limit reached for requests","type":"requests","param":null,"code":"rate_limit_exceeded"}}`
			if body != want {
				t.Errorf("step %d: expected %s, got %s", i, want, body)
			}
		}
	}
	if got := s.h.Stats(); got.Requests != int64(len(steps)) || got.RateLimited != 2 {
		t.Errorf("expected %d requests and 2 rate limited, got %+v", len(steps), got)
	}
}

// A real provider decides admission, and computes its rate-limit
// headers, when the request arrives; the answer brings them after the
// generation (Latency), and a refusal comes at once (PROVIDERS.md). The
// router's anchoring of resets is only tested by a mock that does this.
func TestRateLimitIsStatedAtAdmission(t *testing.T) {
	const latency = 300 * time.Millisecond
	clock := newFakeClock()
	s := serve(t, Handler{Latency: caddy.Duration(latency), RateLimit: &RateLimit{Requests: 2, Window: caddy.Duration(10 * time.Second)}}, clock)
	readAll(t, s.post(t, "/v1/chat/completions", chatBody)) // starts the window, at 0 on the mock's clock
	clock.advance(time.Second)
	// The mock's clock moves 5 s on while the second request generates:
	// its headers still state the window as it was when it arrived (1 s
	// in: 9 s left), not when it answered (4 s left).
	moved := make(chan struct{})
	go func() {
		time.Sleep(latency / 3)
		clock.advance(5 * time.Second)
		close(moved)
	}()
	sent := time.Now()
	resp := s.post(t, "/v1/chat/completions", chatBody)
	readAll(t, resp)
	<-moved
	if took := time.Since(sent); resp.StatusCode != 200 || took < latency {
		t.Fatalf("expected 200 after the latency, got %d after %v", resp.StatusCode, took)
	}
	if got := resp.Header.Get("x-ratelimit-reset-requests"); got != "9s" {
		t.Errorf("expected the reset stated at admission (9s), got %q", got)
	}
	sent = time.Now()
	resp = s.post(t, "/v1/chat/completions", chatBody)
	readAll(t, resp)
	if took := time.Since(sent); resp.StatusCode != 429 || took >= latency {
		t.Errorf("expected a 429 at once, got %d after %v", resp.StatusCode, took)
	}
}

func TestRateLimitTokens(t *testing.T) {
	clock := newFakeClock()
	per := tokensOf(chatBody) + DefaultChunks
	s := serve(t, Handler{RateLimit: &RateLimit{Tokens: 2*per + 1}}, clock) // default 1m window
	for i, want := range []struct {
		status    int
		remaining int
	}{{200, per + 1}, {200, 1}, {429, 1}} {
		resp := s.post(t, "/v1/chat/completions", chatBody)
		body := readAll(t, resp)
		if resp.StatusCode != want.status {
			t.Fatalf("request %d: expected %d, got %d", i, want.status, resp.StatusCode)
		}
		if got := resp.Header.Get("x-ratelimit-remaining-tokens"); got != strconv.Itoa(want.remaining) {
			t.Errorf("request %d: expected remaining tokens %d, got %q", i, want.remaining, got)
		}
		if got := resp.Header.Get("x-ratelimit-reset-tokens"); got != "1m0s" {
			t.Errorf("request %d: expected reset 1m0s, got %q", i, got)
		}
		if resp.Header.Get("x-ratelimit-limit-requests") != "" {
			t.Errorf("request %d: expected no request headers without a request limit", i)
		}
		if want.status == 429 {
			if e := decodeError(t, body); e.Error.Type != "tokens" || e.Error.Message != "Rate limit reached for tokens" {
				t.Errorf("expected a tokens rate limit error, got %s", body)
			}
			if resp.Header.Get("Retry-After") != "60" {
				t.Errorf("expected Retry-After 60, got %q", resp.Header.Get("Retry-After"))
			}
		}
	}
	// Embeddings use prompt tokens only, so a 1-token one still fits.
	resp := s.post(t, "/v1/embeddings", `{}`)
	readAll(t, resp)
	if resp.StatusCode != 200 || resp.Header.Get("x-ratelimit-remaining-tokens") != "0" {
		t.Errorf("expected embeddings to use 1 token, got %d remaining %q", resp.StatusCode, resp.Header.Get("x-ratelimit-remaining-tokens"))
	}
}

func TestNoRateLimitHeaders(t *testing.T) {
	s := serve(t, Handler{}, nil)
	resp := s.post(t, "/v1/chat/completions", chatBody)
	readAll(t, resp)
	for name := range resp.Header {
		if strings.HasPrefix(strings.ToLower(name), "x-ratelimit") {
			t.Errorf("expected no rate-limit headers, got %s", name)
		}
	}
}

func TestFaultEvery(t *testing.T) {
	tests := []struct {
		every   int
		faulted []int // 1-based request numbers
	}{
		{0, []int{1, 2, 3, 4, 5, 6, 7}},
		{1, []int{1, 2, 3, 4, 5, 6, 7}},
		{3, []int{3, 6}},
		{8, nil},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprint("every ", tt.every), func(t *testing.T) {
			s := serve(t, Handler{Faults: []Fault{{Kind: FaultStatus, Status: 503, Every: tt.every}}}, nil)
			var faulted []int
			for n := 1; n <= 7; n++ {
				resp := s.post(t, "/v1/chat/completions", chatBody)
				body := readAll(t, resp)
				switch resp.StatusCode {
				case 503:
					faulted = append(faulted, n)
					want := `{"error":{"message":"mock status 503","type":"server_error","param":null,"code":null}}`
					if body != want {
						t.Errorf("expected %s, got %s", want, body)
					}
				case 200:
				default:
					t.Fatalf("request %d: unexpected status %d", n, resp.StatusCode)
				}
			}
			if fmt.Sprint(faulted) != fmt.Sprint(tt.faulted) {
				t.Errorf("expected requests %v faulted, got %v", tt.faulted, faulted)
			}
			if got := s.h.Stats(); got.Requests != 7 || got.Faults != int64(len(tt.faulted)) {
				t.Errorf("expected 7 requests and %d faults, got %+v", len(tt.faulted), got)
			}
		})
	}
}

func TestFaultWindowAndOrder(t *testing.T) {
	clock := newFakeClock()
	s := serve(t, Handler{Faults: []Fault{
		{Kind: FaultStatus, Status: 502, From: caddy.Duration(time.Second), For: caddy.Duration(2 * time.Second)},
		{Kind: FaultStatus, Status: 504, From: caddy.Duration(5 * time.Second)},
		{Kind: FaultStatus, Status: 500}, // shadowed from 5s on
	}}, clock)
	steps := []struct {
		at     time.Duration
		status int
	}{
		{0, 500},
		{999 * time.Millisecond, 500},
		{time.Second, 502},
		{2999 * time.Millisecond, 502},
		{3 * time.Second, 500},
		{5 * time.Second, 504},
		{time.Hour, 504},
	}
	var at time.Duration
	for _, st := range steps {
		clock.advance(st.at - at)
		at = st.at
		resp := s.post(t, "/v1/embeddings", `{"input":"x"}`)
		readAll(t, resp)
		if resp.StatusCode != st.status {
			t.Errorf("at %s: expected %d, got %d", st.at, st.status, resp.StatusCode)
		}
	}
}

func TestFaultRateLimit(t *testing.T) {
	s := serve(t, Handler{
		RateLimit: &RateLimit{Requests: 10, Tokens: 100000},
		Faults: []Fault{
			{Kind: FaultRateLimit, Every: 2, Headers: http.Header{"Retry-After": {"30"}, "X-Custom": {"a", "b"}}},
			{Kind: FaultRateLimit, Every: 3, Status: 503, Body: "busy"},
		},
	}, nil)
	tests := []struct {
		status int
		body   string
		retry  string
	}{
		{200, "", ""},
		{429, `{"error":{"message":"Rate limit reached for requests","type":"requests","param":null,"code":"rate_limit_exceeded"}}`, "30"},
		{503, "busy", ""},
	}
	for i, tt := range tests {
		resp := s.post(t, "/v1/chat/completions", streamBody)
		body := readAll(t, resp)
		if resp.StatusCode != tt.status {
			t.Fatalf("request %d: expected %d, got %d", i+1, tt.status, resp.StatusCode)
		}
		if tt.body != "" && body != tt.body {
			t.Errorf("request %d: expected %s, got %s", i+1, tt.body, body)
		}
		if got := resp.Header.Get("Retry-After"); got != tt.retry {
			t.Errorf("request %d: expected Retry-After %q, got %q", i+1, tt.retry, got)
		}
		if got := resp.Header.Get("x-ratelimit-remaining-requests"); got != strconv.Itoa(9-i) {
			t.Errorf("request %d: expected remaining requests %d on every answer, got %q", i+1, 9-i, got)
		}
		if resp.Header.Get("x-ratelimit-remaining-tokens") == "" {
			t.Errorf("request %d: expected token headers on every answer", i+1)
		}
		if tt.status == 429 && fmt.Sprint(resp.Header.Values("X-Custom")) != "[a b]" {
			t.Errorf("expected fault headers, got %v", resp.Header)
		}
	}
}

func TestFaultRateLimitRetryDelay(t *testing.T) {
	for _, dialect := range []string{"", DialectOpenAI} {
		s := serve(t, Handler{Dialect: dialect, Faults: []Fault{
			{Kind: FaultRateLimit, Every: 2, RetryDelay: caddy.Duration(2500 * time.Millisecond)},
			{Kind: FaultRateLimit, RetryDelay: caddy.Duration(time.Second), Headers: http.Header{"Retry-After": {"7"}}},
		}}, nil)
		for _, want := range []string{"7", "3"} { // the header wins; 2.5s rounds up
			resp := s.post(t, "/v1/chat/completions", chatBody)
			body := readAll(t, resp)
			if resp.StatusCode != 429 || resp.Header.Get("Retry-After") != want || decodeError(t, body).Error.Code == nil {
				t.Errorf("dialect %q: expected 429 with Retry-After %s, got %d %q %s", dialect, want, resp.StatusCode, resp.Header.Get("Retry-After"), body)
			}
		}
	}
}

func TestFaultHang(t *testing.T) {
	for _, stream := range []bool{false, true} {
		t.Run(fmt.Sprint("stream ", stream), func(t *testing.T) {
			s := serve(t, Handler{Faults: []Fault{{Kind: FaultHang}}}, nil)
			body := chatBody
			if stream {
				body = streamBody
			}
			start := time.Now() // before the client's deadline starts counting
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Millisecond)
			defer cancel()
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, s.srv.URL+"/v1/chat/completions", strings.NewReader(body))
			resp, err := s.srv.Client().Do(req)
			if err == nil {
				resp.Body.Close()
				t.Fatalf("expected no answer, got %d", resp.StatusCode)
			}
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("expected the client's deadline, got %v", err)
			}
			if d := time.Since(start); d < 60*time.Millisecond {
				t.Errorf("expected to hang until the client gave up, returned after %s", d)
			}
			select {
			case <-s.returned:
			case <-time.After(2 * time.Second):
				t.Fatal("expected the handler to return once the client went away")
			}
		})
	}
}

func TestFaultHangReleasedOnClose(t *testing.T) {
	s := serve(t, Handler{Faults: []Fault{{Kind: FaultHang}}}, nil)
	errc := make(chan error, 1)
	go func() {
		resp, err := s.srv.Client().Post(s.srv.URL+"/v1/chat/completions", "application/json", strings.NewReader(chatBody))
		if err == nil {
			resp.Body.Close()
			err = fmt.Errorf("got status %d", resp.StatusCode)
		}
		errc <- err
	}()
	waitRequests(t, s.h, 1)
	_ = s.h.Close()
	select {
	case err := <-errc:
		if err == nil || errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("expected an aborted connection, got %v", err)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("expected Close to release the hung request")
	}
}

func TestFaultHangReleasedOnShutdown(t *testing.T) {
	s := serve(t, Handler{Faults: []Fault{{Kind: FaultHang}}}, nil)
	errc := make(chan error, 1)
	go func() {
		resp, err := s.srv.Client().Post(s.srv.URL+"/v1/chat/completions", "application/json", strings.NewReader(chatBody))
		if err == nil {
			resp.Body.Close()
		}
		errc <- err
	}()
	waitRequests(t, s.h, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := s.srv.Config.Shutdown(ctx); err != nil {
		t.Fatalf("expected graceful shutdown to finish, got %v", err)
	}
	if err := <-errc; err == nil {
		t.Error("expected an aborted connection")
	}
}

func waitRequests(t *testing.T, h *Handler, n int64) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Second)
	for h.Stats().Requests < n {
		if time.Now().After(deadline) {
			t.Fatalf("expected %d requests to arrive", n)
		}
		time.Sleep(time.Millisecond) // polling in a test, not pacing the mock
	}
}

func intp(n int) *int { return &n }

func TestFaultCut(t *testing.T) {
	tests := []struct {
		name       string
		after      *int
		wantChunks int
	}{
		{"default after", nil, 1},
		{"after 0", intp(0), 0},
		{"after 3", intp(3), 3},
		{"after beyond chunks", intp(99), DefaultChunks},
	}
	for _, tt := range tests {
		t.Run("stream "+tt.name, func(t *testing.T) {
			s := serve(t, Handler{Faults: []Fault{{Kind: FaultCut, After: tt.after}}}, nil)
			resp := s.post(t, "/v1/chat/completions", streamBody)
			ev := readSSE(resp, time.Now())
			if !errors.Is(ev.err, io.ErrUnexpectedEOF) {
				t.Errorf("expected unexpected EOF, got %v", ev.err)
			}
			if len(ev.data) != tt.wantChunks {
				t.Errorf("expected %d chunks before the cut, got %q", tt.wantChunks, ev.data)
			}
			for _, d := range ev.data {
				if d == "[DONE]" || strings.Contains(d, `"finish_reason":"stop"`) {
					t.Errorf("expected no end of stream, got %q", d)
				}
			}
		})
	}
	for _, path := range []string{"/v1/chat/completions", "/v1/embeddings"} {
		t.Run("plain "+path, func(t *testing.T) {
			s := serve(t, Handler{Faults: []Fault{{Kind: FaultCut}}}, nil)
			resp := s.post(t, path, chatBody)
			defer resp.Body.Close()
			if resp.StatusCode != http.StatusOK || resp.ContentLength <= 0 {
				t.Fatalf("expected 200 with a Content-Length, got %d %d", resp.StatusCode, resp.ContentLength)
			}
			b, err := io.ReadAll(resp.Body)
			if !errors.Is(err, io.ErrUnexpectedEOF) {
				t.Errorf("expected unexpected EOF, got %v", err)
			}
			if int64(len(b)) != resp.ContentLength/2 {
				t.Errorf("expected half of %d bytes, got %d", resp.ContentLength, len(b))
			}
		})
	}
}

func TestFaultErrorEvent(t *testing.T) {
	defaultEvent := `{"error":{"message":"The server had an error while processing your request.","type":"server_error","param":null,"code":null}}`
	tests := []struct {
		name       string
		fault      Fault
		wantChunks int
		wantEvent  string
	}{
		{"default", Fault{Kind: FaultErrorEvent}, 1, defaultEvent},
		{"after 2 custom body", Fault{Kind: FaultErrorEvent, After: intp(2), Body: `{"error":{"message":"overloaded"}}`}, 2, `{"error":{"message":"overloaded"}}`},
		{"after all chunks", Fault{Kind: FaultErrorEvent, After: intp(DefaultChunks)}, DefaultChunks, defaultEvent},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := serve(t, Handler{Faults: []Fault{tt.fault}}, nil)
			resp := s.post(t, "/v1/chat/completions", streamBody)
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("expected 200, got %d", resp.StatusCode)
			}
			ev := readSSE(resp, time.Now())
			if ev.err != nil {
				t.Errorf("expected a clean end, got %v", ev.err)
			}
			if len(ev.data) != tt.wantChunks+1 {
				t.Fatalf("expected %d chunks and the error, got %q", tt.wantChunks, ev.data)
			}
			if got := ev.data[len(ev.data)-1]; got != tt.wantEvent {
				t.Errorf("expected error event %s, got %s", tt.wantEvent, got)
			}
		})
	}
	t.Run("plain", func(t *testing.T) {
		s := serve(t, Handler{Faults: []Fault{{Kind: FaultErrorEvent}}}, nil)
		resp := s.post(t, "/v1/chat/completions", chatBody)
		body := readAll(t, resp)
		if resp.StatusCode != http.StatusInternalServerError || body != defaultEvent {
			t.Errorf("expected 500 %s, got %d %s", defaultEvent, resp.StatusCode, body)
		}
	})
}

func TestFaultKeepAlive(t *testing.T) {
	s := serve(t, Handler{
		FirstTokenDelay: caddy.Duration(250 * time.Millisecond),
		Faults: []Fault{
			{Kind: FaultKeepAlive},
			{Kind: FaultStatus, Status: 418},
		},
	}, nil)
	start := time.Now()
	ev := readSSE(s.post(t, "/v1/chat/completions", streamBody), start)
	if ev.err != nil || len(ev.data) != DefaultChunks+2 || ev.data[len(ev.data)-1] != "[DONE]" {
		t.Fatalf("expected a complete stream, got %q, %v", ev.data, ev.err)
	}
	if ev.comments < 2 || ev.comments > 3 { // at 0, 100 and 200ms, barring scheduler delays
		t.Errorf("expected 3 keep-alive comments in 250ms, got %d", ev.comments)
	}
	if ev.arrivals[0] < 250*time.Millisecond {
		t.Errorf("expected the first chunk after 250ms, got %s", ev.arrivals[0])
	}
	// keepalive never selects plain requests: the next fault applies.
	resp := s.post(t, "/v1/chat/completions", chatBody)
	readAll(t, resp)
	if resp.StatusCode != 418 {
		t.Errorf("expected the status fault for a plain request, got %d", resp.StatusCode)
	}
}

func TestStreamStopsWhenClientLeaves(t *testing.T) {
	s := serve(t, Handler{ChunkInterval: caddy.Duration(time.Hour)}, nil)
	ctx, cancel := context.WithCancel(context.Background())
	resp := s.postCtx(t, ctx, "/v1/chat/completions", streamBody)
	br := bufio.NewReader(resp.Body)
	if line, err := br.ReadString('\n'); err != nil || !strings.HasPrefix(line, "data: ") {
		t.Fatalf("expected a first chunk, got %q %v", line, err)
	}
	cancel()
	resp.Body.Close()
	select {
	case <-s.returned:
	case <-time.After(2 * time.Second):
		t.Fatal("expected the handler to stop when the client went away")
	}
}

func TestStatsAndReset(t *testing.T) {
	s := serve(t, Handler{Faults: []Fault{{Kind: FaultStatus, Every: 2}}}, nil)
	getStats := func() Stats {
		t.Helper()
		resp, err := s.srv.Client().Get(s.srv.URL + "/llm_mock/stats")
		if err != nil {
			t.Fatal(err)
		}
		var st Stats
		if err := json.Unmarshal([]byte(readAll(t, resp)), &st); err != nil {
			t.Fatal(err)
		}
		return st
	}
	if st := getStats(); st.Requests != 0 || st.LastHeaders == nil {
		t.Errorf("expected empty stats with an empty header map, got %+v", st)
	}
	readAll(t, s.post(t, "/v1/chat/completions", chatBody, "Authorization", "Bearer a"))
	readAll(t, s.post(t, "/openai/v1/embeddings", `{"model":"emb"}`, "Authorization", "Bearer b", "X-Test", "yes"))
	st := getStats()
	want := Stats{Requests: 2, Faults: 1, LastModel: "emb", LastAuthorization: "Bearer b", LastBody: `{"model":"emb"}`}
	if st.Requests != want.Requests || st.Faults != want.Faults || st.LastModel != want.LastModel ||
		st.LastAuthorization != want.LastAuthorization || st.LastBody != want.LastBody {
		t.Errorf("expected %+v, got %+v", want, st)
	}
	if st.LastAPIKey != "b" {
		t.Errorf("expected last_api_key b, got %q", st.LastAPIKey)
	}
	if st.LastHeaders["X-Test"] != "yes" || st.LastHeaders["Authorization"] != "Bearer b" {
		t.Errorf("expected last headers, got %v", st.LastHeaders)
	}

	resp := s.post(t, "/llm_mock/reset", "")
	readAll(t, resp)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("expected reset 200, got %d", resp.StatusCode)
	}
	if st := getStats(); st.Requests != 0 || st.Faults != 0 || st.LastModel != "" || st.LastBody != "" {
		t.Errorf("expected zeroed stats, got %+v", st)
	}
	// The every count restarts too: request 1 after reset is not faulted.
	resp = s.post(t, "/v1/chat/completions", chatBody)
	readAll(t, resp)
	if resp.StatusCode != http.StatusOK {
		t.Errorf("expected request 1 after reset to pass, got %d", resp.StatusCode)
	}
}

func TestResetRestartsRateLimitWindow(t *testing.T) {
	clock := newFakeClock()
	s := serve(t, Handler{RateLimit: &RateLimit{Requests: 1}}, clock)
	readAll(t, s.post(t, "/v1/chat/completions", chatBody))
	clock.advance(10 * time.Second)
	resp := s.post(t, "/v1/chat/completions", chatBody)
	readAll(t, resp)
	if resp.StatusCode != 429 || resp.Header.Get("Retry-After") != "50" {
		t.Fatalf("expected 429 with Retry-After 50, got %d %q", resp.StatusCode, resp.Header.Get("Retry-After"))
	}
	readAll(t, s.post(t, "/llm_mock/reset", ""))
	resp = s.post(t, "/v1/chat/completions", chatBody)
	readAll(t, resp)
	if resp.StatusCode != 200 || resp.Header.Get("x-ratelimit-reset-requests") != "1m0s" {
		t.Errorf("expected a fresh window after reset, got %d %q", resp.StatusCode, resp.Header.Get("x-ratelimit-reset-requests"))
	}
}

func TestConcurrentRequests(t *testing.T) {
	s := serve(t, Handler{
		RateLimit: &RateLimit{Requests: 1000},
		Faults:    []Fault{{Kind: FaultErrorEvent, Every: 3}},
	}, nil)
	const n = 30
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			body := chatBody
			if i%2 == 0 {
				body = streamBody
			}
			resp, err := s.srv.Client().Post(s.srv.URL+"/v1/chat/completions", "application/json", strings.NewReader(body))
			if err != nil {
				t.Error(err)
				return
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		})
	}
	wg.Wait()
	if st := s.h.Stats(); st.Requests != n || st.Faults != n/3 {
		t.Errorf("expected %d requests and %d faults, got %+v", n, n/3, st)
	}
}

func TestPlainHandler(t *testing.T) {
	h := &Handler{Model: "plain", Chunks: 2}
	if err := h.Setup(); err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	srv := httptest.NewServer(h.HTTPHandler())
	defer srv.Close()
	resp, err := srv.Client().Post(srv.URL+"/v1/chat/completions", "application/json", strings.NewReader(chatBody))
	if err != nil {
		t.Fatal(err)
	}
	body := readAll(t, resp)
	if !strings.Contains(body, `"model":"plain"`) || !strings.Contains(body, `"completion_tokens":2`) {
		t.Errorf("expected the configured answer, got %s", body)
	}
	if err := (&Handler{Chunks: -1}).Setup(); err == nil {
		t.Error("expected Setup to validate")
	}
}

// A copy of a set-up Handler set up again with another Reply must not
// change the stream of the original (setup once reused the pieces'
// backing array).
func TestSetupOfCopyKeepsOriginal(t *testing.T) {
	orig := &Handler{Reply: "one two three", Chunks: 3}
	if err := orig.Setup(); err != nil {
		t.Fatal(err)
	}
	defer orig.Close()
	cp := *orig
	cp.Reply = "four five six"
	if err := cp.Setup(); err != nil {
		t.Fatal(err)
	}
	defer cp.Close()
	for _, tt := range []struct {
		h    *Handler
		want string
	}{{orig, "one two three"}, {&cp, "four five six"}} {
		rec := httptest.NewRecorder()
		tt.h.HTTPHandler().ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/v1/chat/completions", strings.NewReader(streamBody)))
		var got strings.Builder
		for line := range strings.SplitSeq(rec.Body.String(), "\n") {
			d, ok := strings.CutPrefix(line, "data: ")
			if !ok || d == "[DONE]" {
				continue
			}
			var c struct {
				Choices []struct {
					Delta struct{ Content string } `json:"delta"`
				} `json:"choices"`
			}
			if err := json.Unmarshal([]byte(d), &c); err != nil {
				t.Fatalf("bad chunk %s: %v", d, err)
			}
			got.WriteString(c.Choices[0].Delta.Content)
		}
		if got.String() != tt.want {
			t.Errorf("expected the stream to carry %q, got %q", tt.want, got.String())
		}
	}
}

func TestValidate(t *testing.T) {
	tests := []struct {
		name string
		cfg  Handler
		want string // substring of the error; empty for valid
	}{
		{"zero", Handler{}, ""},
		{"full", Handler{Latency: 1, Chunks: 2, RateLimit: &RateLimit{Requests: 1, Tokens: 1, Window: 1},
			Faults: []Fault{{Kind: FaultCut, After: intp(0), Status: 599, Every: 2}}}, ""},
		{"latency", Handler{Latency: -1}, "latency"},
		{"first token delay", Handler{FirstTokenDelay: -1}, "first_token_delay"},
		{"chunks", Handler{Chunks: -1}, "chunks"},
		{"chunk interval", Handler{ChunkInterval: -1}, "chunk_interval"},
		{"rate requests", Handler{RateLimit: &RateLimit{Requests: -1}}, "requests"},
		{"rate tokens", Handler{RateLimit: &RateLimit{Tokens: -1}}, "tokens"},
		{"rate window", Handler{RateLimit: &RateLimit{Window: -1}}, "window"},
		{"no kind", Handler{Faults: []Fault{{}}}, "kind is required"},
		{"bad kind", Handler{Faults: []Fault{{Kind: "explode"}}}, "unknown kind"},
		{"every", Handler{Faults: []Fault{{Kind: FaultHang, Every: -2}}}, "every"},
		{"from", Handler{Faults: []Fault{{Kind: FaultHang, From: -1}}}, "from"},
		{"for", Handler{Faults: []Fault{{Kind: FaultHang, For: -1}}}, "for"},
		{"status", Handler{Faults: []Fault{{Kind: FaultStatus, Status: 600}}}, "status"},
		{"after", Handler{Faults: []Fault{{Kind: FaultCut, After: intp(-1)}}}, "after"},
		{"stall", Handler{Faults: []Fault{{Kind: FaultStall, After: intp(3)}}}, ""},
		{"malformed", Handler{Faults: []Fault{{Kind: FaultMalformed, After: intp(0)}}}, ""},
		{"stall after", Handler{Faults: []Fault{{Kind: FaultStall, After: intp(-1)}}}, "fault 0 (stall): after must not be negative, got -1"},
		{"bad kind listed", Handler{Faults: []Fault{{Kind: "Stall"}}}, `unknown kind "Stall" (want rate_limit, status, hang, cut, error_event, keepalive, stall, malformed or slow)`},
		{"slow", Handler{Faults: []Fault{{Kind: FaultSlow, Every: 10, Delay: caddy.Duration(time.Second)}}}, ""},
		{"slow without delay", Handler{Faults: []Fault{{Kind: FaultSlow}}}, "fault 0 (slow): delay must be positive, got 0s"},
		{"slow negative delay", Handler{Faults: []Fault{{Kind: FaultSlow, Delay: -1}}}, "delay must be positive, got -1ns"},
		{"delay elsewhere", Handler{Faults: []Fault{{Kind: FaultStall, Delay: 1}}}, "fault 0 (stall): delay is only used by slow faults"},
		{"continuation accept", Handler{Continuation: ContinuationAccept}, ""},
		{"continuation reject", Handler{Dialect: DialectBedrock, Continuation: ContinuationReject}, ""},
		{"unknown continuation", Handler{Continuation: "refuse"}, `unknown continuation "refuse" (want accept or reject)`},
		{"dialects", Handler{Dialect: DialectGemini, Faults: []Fault{{Kind: FaultRateLimit, RetryDelay: 1, QuotaID: "q"}}}, ""},
		{"openai dialect", Handler{Dialect: DialectOpenAI}, ""},
		{"anthropic dialect", Handler{Dialect: DialectAnthropic}, ""},
		{"unknown dialect", Handler{Dialect: "cohere"}, `unknown dialect "cohere"`},
		{"dialect case", Handler{Dialect: "Gemini"}, "unknown dialect"},
		{"retry delay", Handler{Faults: []Fault{{Kind: FaultRateLimit, RetryDelay: -1}}}, "retry_delay"},
		{"bedrock", Handler{Dialect: DialectBedrock, APIKey: "k", AWSCredentials: &AWSCredentials{AccessKeyID: "a", SecretAccessKey: "s"},
			Faults: []Fault{{Kind: FaultRateLimit, Quota: QuotaTokensDay}}}, ""},
		{"vertex", Handler{Dialect: DialectVertex, TokenLifetime: 1, Faults: []Fault{{Kind: FaultRateLimit, Quota: QuotaPerDay}}}, ""},
		{"aws credentials half", Handler{Dialect: DialectBedrock, AWSCredentials: &AWSCredentials{AccessKeyID: "a"}}, "aws_credentials needs"},
		{"aws credentials elsewhere", Handler{AWSCredentials: &AWSCredentials{AccessKeyID: "a", SecretAccessKey: "s"}}, "only used by the bedrock dialect"},
		{"token lifetime negative", Handler{Dialect: DialectVertex, TokenLifetime: -1}, "token_lifetime must not be negative"},
		{"token lifetime elsewhere", Handler{Dialect: DialectGemini, TokenLifetime: 1}, "only used by the vertex dialect"},
		{"api key in vertex", Handler{Dialect: DialectVertex, APIKey: "k"}, "api_key is not used by the vertex dialect"},
		{"unknown quota", Handler{Dialect: DialectBedrock, Faults: []Fault{{Kind: FaultRateLimit, Quota: "hourly"}}}, "unknown quota"},
		{"quota of another dialect", Handler{Dialect: DialectVertex, Faults: []Fault{{Kind: FaultRateLimit, Quota: QuotaTokens}}}, "not a vertex quota"},
		{"quota elsewhere", Handler{Dialect: DialectGemini, Faults: []Fault{{Kind: FaultRateLimit, Quota: QuotaPerDay}}}, "only used by the bedrock and vertex"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.cfg.Validate()
			switch {
			case tt.want == "" && err != nil:
				t.Errorf("expected valid, got %v", err)
			case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
				t.Errorf("expected an error about %q, got %v", tt.want, err)
			}
		})
	}
}

func TestJSONConfig(t *testing.T) {
	var h Handler
	raw := `{"model":"m","latency":"10ms","first_token_delay":5000000,"chunks":3,"chunk_interval":"1ms",
		"reply":"r","api_key":"{env.K}","rate_limit":{"requests":2,"tokens":100,"window":"30s"},
		"faults":[{"kind":"status","every":2,"from":"1s","for":"2s","status":503,
		"headers":{"Retry-After":["5"]},"body":"b","after":0,"retry_delay":"42s","quota_id":"q"},{"kind":"stall","after":2},{"kind":"malformed"},{"kind":"slow","delay":"800ms"}],
		"dialect":"gemini","continuation":"reject"}`
	if err := json.Unmarshal([]byte(raw), &h); err != nil {
		t.Fatal(err)
	}
	if h.Latency != caddy.Duration(10*time.Millisecond) || h.FirstTokenDelay != caddy.Duration(5*time.Millisecond) ||
		h.RateLimit.Window != caddy.Duration(30*time.Second) || len(h.Faults) != 4 ||
		h.Faults[3].Kind != FaultSlow || h.Faults[3].Delay != caddy.Duration(800*time.Millisecond) || h.Continuation != ContinuationReject ||
		h.Faults[1].Kind != FaultStall || *h.Faults[1].After != 2 || h.Faults[2].Kind != FaultMalformed || h.Faults[2].After != nil ||
		h.Faults[0].After == nil || *h.Faults[0].After != 0 || h.Faults[0].Headers.Get("Retry-After") != "5" ||
		h.Dialect != DialectGemini || h.Faults[0].RetryDelay != caddy.Duration(42*time.Second) || h.Faults[0].QuotaID != "q" {
		t.Errorf("unexpected decoded config %+v", h)
	}
}

func TestSplitReply(t *testing.T) {
	for _, tt := range []struct {
		s string
		n int
	}{{"Hello from llm_mock.", 5}, {"Hello from llm_mock.", 1}, {"ab", 5}, {"日本語テキスト", 3}, {"x", 1}} {
		pieces := splitReply(tt.s, tt.n)
		if len(pieces) != tt.n || strings.Join(pieces, "") != tt.s {
			t.Errorf("split %q in %d: got %q", tt.s, tt.n, pieces)
		}
	}
}

func TestAppendJSON(t *testing.T) {
	for _, s := range []string{"", "plain", `q"b\s`, "\n\r\t\x00\x1f", "é日本\u2028\u2029", "bad\xffutf8", "<&>"} {
		var got string
		b := appendJSON([]byte("x"), s)
		if b[0] != 'x' {
			t.Errorf("expected %q appended to x, got %s", s, b)
		}
		b = b[1:]
		if strings.HasSuffix(string(b), "\n") {
			t.Errorf("%q encoded with a trailing newline: %q", s, b)
		}
		if s == "<&>" && string(b) != `"<&>"` {
			t.Errorf("expected <, > and & unescaped, as providers send them, got %s", b)
		}
		if err := json.Unmarshal(b, &got); err != nil {
			t.Errorf("%q encoded as %s: %v", s, b, err)
			continue
		}
		want, _ := json.Marshal(s)
		var wantS string
		_ = json.Unmarshal(want, &wantS)
		if got != wantS {
			t.Errorf("expected %q, got %q", wantS, got)
		}
	}
}

// tail reads a response body in the background, so a test can look at
// what arrived so far while the stream stays open.
type tail struct {
	mu   sync.Mutex
	buf  []byte
	err  error // io.EOF for a clean end
	done chan struct{}
}

func tailBody(resp *http.Response) *tail {
	tl := &tail{done: make(chan struct{})}
	go func() {
		defer close(tl.done)
		defer resp.Body.Close()
		p := make([]byte, 4096)
		for {
			n, err := resp.Body.Read(p)
			tl.mu.Lock()
			tl.buf = append(tl.buf, p[:n]...)
			if err != nil {
				tl.err = err
			}
			tl.mu.Unlock()
			if err != nil {
				return
			}
		}
	}()
	return tl
}

func (tl *tail) bytes() []byte {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	return append([]byte(nil), tl.buf...)
}

// waitFor waits until count of what arrived reaches n.
func (tl *tail) waitFor(t *testing.T, count func([]byte) int, n int) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Second)
	for count(tl.bytes()) < n {
		select {
		case <-tl.done:
			t.Fatalf("expected %d content chunks, the stream ended after %q (%v)", n, tl.bytes(), tl.err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("expected %d content chunks, got %q", n, tl.bytes())
		}
		time.Sleep(time.Millisecond) // polling in a test, not pacing the mock
	}
}

// stallCase is a stream of some dialect and a count of the content
// chunks in what it sent.
type stallCase struct {
	name, dialect, path, body string
	count                     func([]byte) int
}

func stallCases() []stallCase {
	lines := func(prefix string) func([]byte) int {
		return func(b []byte) int { return strings.Count("\n"+string(b), "\n"+prefix) }
	}
	frames := func(prelude int) func([]byte) int {
		return func(b []byte) int {
			dec := eventstream.NewDecoder()
			r := bytes.NewReader(b)
			n := 0
			for {
				if _, err := dec.Decode(r, nil); err != nil {
					return n - prelude
				}
				n++
			}
		}
	}
	return []stallCase{
		{"openai", DialectOpenAI, "/v1/chat/completions", streamBody, lines("data: ")},
		{"responses", DialectOpenAI, "/v1/responses", `{"model":"gpt-test","stream":true,"input":"hi"}`, lines("event: response.output_text.delta")},
		{"anthropic", DialectAnthropic, "/v1/messages", anthropicStreamBody, lines("event: content_block_delta")},
		{"gemini sse", DialectGemini, geminiStreamSSE, geminiBody, lines("data: ")},
		{"gemini array", DialectGemini, geminiStreamArr, geminiBody, func(b []byte) int { return strings.Count(string(b), `"candidates"`) }},
		{"bedrock invoke", DialectBedrock, sdkPath(bedrockModel, "invoke-with-response-stream"), invokeBody, frames(3)},
		{"bedrock converse", DialectBedrock, sdkPath(bedrockModel, "converse-stream"), converseBody, frames(1)},
	}
}

func TestFaultStall(t *testing.T) {
	for _, c := range stallCases() {
		for _, after := range []int{0, 2, DefaultChunks} {
			t.Run(c.name+" after "+strconv.Itoa(after), func(t *testing.T) {
				s := serve(t, Handler{Dialect: c.dialect, Faults: []Fault{{Kind: FaultStall, After: intp(after)}}}, nil)
				ctx, cancel := context.WithCancel(context.Background())
				defer cancel()
				resp := s.postCtx(t, ctx, c.path, c.body)
				if resp.StatusCode != http.StatusOK {
					t.Fatalf("expected 200, got %d", resp.StatusCode)
				}
				tl := tailBody(resp)
				tl.waitFor(t, c.count, after)
				time.Sleep(100 * time.Millisecond) // what is sent before the stall arrives
				sent := tl.bytes()
				time.Sleep(150 * time.Millisecond) // and nothing more
				select {
				case <-tl.done:
					t.Fatalf("expected the stream to stay open, it ended after %q (%v)", tl.bytes(), tl.err)
				default:
				}
				if got := tl.bytes(); !bytes.Equal(got, sent) || c.count(got) != after || (c.dialect != DialectOpenAI && c.dialect != DialectGemini && len(got) == 0) {
					t.Fatalf("expected %d chunks and nothing more, got %q then %q", after, sent, got)
				}
				for _, end := range []string{"[DONE]", "message_stop", "STOP", "response.completed", "messageStop", "keep-alive"} {
					if strings.Contains(string(sent), end) {
						t.Errorf("expected no end nor keep-alive, got %q", sent)
					}
				}
				if n := strings.Count(string(sent), "event: ping"); c.dialect == DialectAnthropic && n != 1 {
					t.Errorf("expected the prelude's ping only, got %d in %q", n, sent)
				}
				cancel()
				select {
				case <-s.returned:
				case <-time.After(2 * time.Second):
					t.Fatal("expected the handler to return once the client went away")
				}
				if st := s.h.Stats(); st.Faults != 1 {
					t.Errorf("expected 1 fault, got %+v", st)
				}
			})
		}
	}

	t.Run("released on close", func(t *testing.T) {
		s := serve(t, Handler{Faults: []Fault{{Kind: FaultStall, After: intp(2)}}}, nil)
		tl := tailBody(s.post(t, "/v1/chat/completions", streamBody))
		tl.waitFor(t, func(b []byte) int { return strings.Count(string(b), "data: ") }, 2)
		_ = s.h.Close()
		select {
		case <-tl.done:
			if !errors.Is(tl.err, io.ErrUnexpectedEOF) {
				t.Errorf("expected an aborted stream, got %v", tl.err)
			}
		case <-time.After(2 * time.Second):
			t.Fatal("expected Close to release the stalled stream")
		}
	})

	// Plain requests hang.
	for _, path := range []string{"/v1/chat/completions", "/v1/embeddings"} {
		t.Run("plain "+path, func(t *testing.T) {
			s := serve(t, Handler{Faults: []Fault{{Kind: FaultStall}}}, nil)
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Millisecond)
			defer cancel()
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, s.srv.URL+path, strings.NewReader(chatBody))
			resp, err := s.srv.Client().Do(req)
			if err == nil {
				resp.Body.Close()
				t.Fatalf("expected no answer, got %d", resp.StatusCode)
			}
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("expected the client's deadline, got %v", err)
			}
			select {
			case <-s.returned:
			case <-time.After(2 * time.Second):
				t.Fatal("expected the handler to return once the client went away")
			}
		})
	}
}

func TestFaultMalformed(t *testing.T) {
	const broken = `{"choices":[{"delta":{"content":"x`
	for _, after := range []int{0, 2, DefaultChunks} {
		t.Run("stream after "+strconv.Itoa(after), func(t *testing.T) {
			s := serve(t, Handler{Faults: []Fault{{Kind: FaultMalformed, After: intp(after)}}}, nil)
			resp := s.post(t, "/v1/chat/completions", streamBody)
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("expected 200, got %d", resp.StatusCode)
			}
			ev := readSSE(resp, time.Now())
			if ev.err != nil {
				t.Errorf("expected the stream to end cleanly, got %v", ev.err)
			}
			if len(ev.data) != after+1 {
				t.Fatalf("expected %d chunks then the broken one, got %q", after, ev.data)
			}
			var joined strings.Builder
			for i, d := range ev.data[:after] {
				var c chunk
				if err := json.Unmarshal([]byte(d), &c); err != nil || c.Choices[0].Delta.Content == nil || c.Choices[0].FinishReason != nil {
					t.Fatalf("chunk %d: expected content, got %s (%v)", i, d, err)
				}
				joined.WriteString(*c.Choices[0].Delta.Content)
			}
			if want := strings.Join(splitReply(DefaultReply, DefaultChunks)[:after], ""); joined.String() != want {
				t.Errorf("expected %q before the broken event, got %q", want, joined.String())
			}
			if last := ev.data[after]; last != broken || json.Valid([]byte(last)) {
				t.Errorf("expected the broken event %s, got %s", broken, last)
			}
		})
	}

	for _, c := range []struct{ name, path, body, wantEvent string }{
		{"responses", "/v1/responses", `{"model":"gpt-test","stream":true,"input":"hi"}`,
			"event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"delta\":\"x\n\n"},
		{"completions", "/v1/completions", `{"model":"gpt-test","stream":true,"prompt":"hi"}`, "data: {\"choices\":[{\"text\":\"x\n\n"},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := serve(t, Handler{Faults: []Fault{{Kind: FaultMalformed, After: intp(1)}}}, nil)
			body := readAll(t, s.post(t, c.path, c.body))
			if !strings.HasSuffix(body, c.wantEvent) || strings.Count(body, "\n\n") < 2 || strings.Contains(body, "[DONE]") || strings.Contains(body, "response.completed") {
				t.Errorf("expected a chunk then %q and the end, got %q", c.wantEvent, body)
			}
		})
	}

	// Plain answers: 200 with the first half of the answer, as a whole body.
	for _, path := range []string{"/v1/chat/completions", "/v1/embeddings"} {
		t.Run("plain "+path, func(t *testing.T) {
			clock := newFakeClock()
			want := readAll(t, serve(t, Handler{}, clock).post(t, path, chatBody))
			s := serve(t, Handler{Faults: []Fault{{Kind: FaultMalformed}}}, clock)
			resp := s.post(t, path, chatBody)
			body := readAll(t, resp)
			if resp.StatusCode != http.StatusOK || resp.ContentLength != int64(len(body)) || resp.Header.Get("Content-Type") != "application/json" {
				t.Errorf("expected 200 application/json with its whole Content-Length, got %d %d/%d", resp.StatusCode, len(body), resp.ContentLength)
			}
			if body != want[:len(want)/2] || json.Valid([]byte(body)) {
				t.Errorf("expected the first half of %s, got %s", want, body)
			}
		})
	}
}

func TestFaultSlow(t *testing.T) {
	const delay = 150 * time.Millisecond
	t.Run("stream", func(t *testing.T) {
		s := serve(t, Handler{
			Latency:         caddy.Duration(20 * time.Millisecond),
			FirstTokenDelay: caddy.Duration(50 * time.Millisecond),
			Faults:          []Fault{{Kind: FaultSlow, Every: 2, Delay: caddy.Duration(delay)}},
		}, nil)
		for i, slow := range []bool{false, true, false} {
			start := time.Now()
			resp := s.post(t, "/v1/chat/completions", streamBody)
			headers := time.Since(start)
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("request %d: expected 200, got %d", i+1, resp.StatusCode)
			}
			ev := readSSE(resp, start)
			if ev.err != nil || len(ev.data) != DefaultChunks+2 || ev.data[len(ev.data)-1] != "[DONE]" {
				t.Fatalf("request %d: expected a complete stream, got %q, %v", i+1, ev.data, ev.err)
			}
			var joined strings.Builder
			for _, d := range ev.data[:DefaultChunks] {
				var c chunk
				if err := json.Unmarshal([]byte(d), &c); err != nil || c.Choices[0].Delta.Content == nil {
					t.Fatalf("request %d: expected a content chunk, got %s (%v)", i+1, d, err)
				}
				joined.WriteString(*c.Choices[0].Delta.Content)
			}
			if joined.String() != DefaultReply {
				t.Errorf("request %d: expected the whole reply, got %q", i+1, joined.String())
			}
			if headers >= delay {
				t.Errorf("request %d: expected the headers before the delay, got them after %s", i+1, headers)
			}
			first := ev.arrivals[0]
			switch {
			case slow && first < 70*time.Millisecond+delay:
				t.Errorf("request %d: expected the first chunk after latency, first_token_delay and delay (220ms), got %s", i+1, first)
			case !slow && first >= 70*time.Millisecond+delay:
				t.Errorf("request %d: expected no delay, got the first chunk after %s", i+1, first)
			}
		}
		if st := s.h.Stats(); st.Requests != 3 || st.Faults != 1 {
			t.Errorf("expected 3 requests and 1 fault, got %+v", st)
		}
	})

	t.Run("anthropic prelude on time", func(t *testing.T) {
		s := serve(t, Handler{Dialect: DialectAnthropic, Faults: []Fault{{Kind: FaultSlow, Delay: caddy.Duration(delay)}}}, nil)
		start := time.Now()
		tl := tailBody(s.post(t, "/v1/messages", anthropicStreamBody))
		deadline := time.Now().Add(2 * time.Second)
		for !strings.Contains(string(tl.bytes()), "event: ping") {
			if time.Now().After(deadline) {
				t.Fatalf("expected the prelude, got %q", tl.bytes())
			}
			time.Sleep(time.Millisecond) // polling in a test, not pacing the mock
		}
		if got := tl.bytes(); time.Since(start) >= delay || strings.Contains(string(got), "content_block_delta") {
			t.Fatalf("expected the prelude alone before the delay, got %q after %s", got, time.Since(start))
		}
		<-tl.done
		if !errors.Is(tl.err, io.EOF) || !strings.Contains(string(tl.bytes()), "message_stop") || time.Since(start) < delay {
			t.Errorf("expected a whole stream after the delay, got %q (%v) after %s", tl.bytes(), tl.err, time.Since(start))
		}
	})

	for _, c := range []struct {
		name, path, body string
		tool             bool
	}{
		{"plain", "/v1/chat/completions", chatBody, false},
		{"embeddings", "/v1/embeddings", chatBody, false},
		{"tool call stream", "/v1/chat/completions", streamBody, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := Handler{}
			if c.tool {
				cfg.ToolCall = &ToolCall{Name: "f", Arguments: json.RawMessage(`{"a":1}`)}
			}
			clock := newFakeClock()
			want := readAll(t, serve(t, cfg, clock).post(t, c.path, c.body))
			cfg.Latency = caddy.Duration(20 * time.Millisecond)
			cfg.Faults = []Fault{{Kind: FaultSlow, Delay: caddy.Duration(delay)}}
			s := serve(t, cfg, clock)
			start := time.Now()
			resp := s.post(t, c.path, c.body)
			if took := time.Since(start); took < 20*time.Millisecond+delay {
				t.Errorf("expected the answer after latency and delay (170ms), got it after %s", took)
			}
			// The same answer (a fresh mock's ids, the same clock).
			body := readAll(t, resp)
			if resp.StatusCode != http.StatusOK || body != want {
				t.Errorf("expected 200 %s, got %d %s", want, resp.StatusCode, body)
			}
		})
	}

	t.Run("client leaves", func(t *testing.T) {
		for _, body := range []string{chatBody, streamBody} {
			s := serve(t, Handler{Faults: []Fault{{Kind: FaultSlow, Delay: caddy.Duration(time.Hour)}}}, nil)
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Millisecond)
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, s.srv.URL+"/v1/chat/completions", strings.NewReader(body))
			if resp, err := s.srv.Client().Do(req); err == nil {
				_, err = io.ReadAll(resp.Body)
				resp.Body.Close()
				if err == nil {
					t.Fatalf("expected no answer within the hour, got %d", resp.StatusCode)
				}
			}
			cancel()
			select {
			case <-s.returned:
			case <-time.After(2 * time.Second):
				t.Fatal("expected the handler to return once the client went away")
			}
		}
	})
}
