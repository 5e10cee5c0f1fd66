package adapters

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/llmrouter/caddy-llm-router/internal/capacity"
	"github.com/llmrouter/caddy-llm-router/provider"
)

func TestChatRequestCarriesOnlyProviderCredentials(t *testing.T) {
	ep := &provider.Endpoint{BaseURL: "https://api.example.com/v1", APIKey: "sk-provider", Header: http.Header{"Openai-Organization": {"org-1"}}}
	req, err := chatRequest(byName("openai", *ep), "gpt-4o-mini", []byte(`{"model":"fast","stream":true}`), true)
	if err != nil {
		t.Fatal(err)
	}
	if req.URL.String() != "https://api.example.com/v1/chat/completions" || req.Method != http.MethodPost {
		t.Errorf("expected POST to chat/completions, got %s %s", req.Method, req.URL)
	}
	if req.Header.Get("Authorization") != "Bearer sk-provider" || req.Header.Get("Openai-Organization") != "org-1" ||
		req.Header.Get("Accept") != "text/event-stream" {
		t.Errorf("unexpected headers %v", req.Header)
	}
	body, _ := io.ReadAll(req.Body)
	if string(body) != `{"stream_options":{"include_usage":true},"model":"gpt-4o-mini","stream":true}` {
		t.Errorf("expected the upstream model in the body and the usage asked for, got %s", body)
	}
	// A client's other stream options stay.
	r0 := chatReq([]byte(`{"model":"m","stream":true,"stream_options":{"include_obfuscation":false,"include_usage":false}}`), true)
	pl0, err := (&OpenAI{Endpoint: provider.Endpoint{BaseURL: "https://api.example.com/v1"}}).Plan(context.Background(), "gpt-4o-mini", r0)
	if err != nil {
		t.Fatal(err)
	}
	if body, _ := io.ReadAll(pl0.Request().Body); string(body) != `{"model":"gpt-4o-mini","stream":true,"stream_options":{"include_obfuscation":false,"include_usage":true}}` {
		t.Errorf("the client's stream options: %s", body)
	}
	// A client that asked for usage itself: its body as it came.
	r := chatReq([]byte(`{"model":"m","stream":true,"stream_options":{"include_usage":true}}`), true)
	r.IncludeUsage = true
	pl, err := (&OpenAI{Endpoint: provider.Endpoint{BaseURL: "https://api.example.com/v1"}}).Plan(context.Background(), "gpt-4o-mini", r)
	if err != nil {
		t.Fatal(err)
	}
	if body, _ := io.ReadAll(pl.Request().Body); string(body) != `{"model":"gpt-4o-mini","stream":true,"stream_options":{"include_usage":true}}` {
		t.Errorf("a client's own include_usage: %s", body)
	}
}

func TestGarbageHeadersAreUnknown(t *testing.T) {
	h := http.Header{}
	h.Set("x-ratelimit-limit-requests", "lots")
	h.Set("x-ratelimit-remaining-requests", "-1")
	h.Set("x-ratelimit-reset-requests", "whenever")
	h.Set("x-ratelimit-remaining-tokens", "1e400")
	h.Set("Retry-After", "-30")
	o := (&OpenAI{}).Observe(429, h, []byte(`not json at all`), time.Now())
	if o.Class != provider.RateLimited {
		t.Errorf("a 429 with a garbage body is still rate_limited, got %s", o.Class)
	}
	if o.Requests != provider.UnknownWindow || o.Tokens.Remaining != provider.Unknown || o.RetryAfter != provider.Unknown {
		t.Errorf("garbage must decode to unknown, got %+v", o)
	}
	// Unknown waits still give a bounded, non-zero cooldown.
	if c := capacity.DefaultPolicy.Cooldown(o, 1); c < capacity.DefaultPolicy.BackoffBase || c > time.Minute {
		t.Errorf("expected the backoff floor, got %v", c)
	}
}

// streamKinds reads an SSE fixture through the adapter and returns the kind
// of each event, with the error class of an provider.EventError.
func streamKinds(t *testing.T, name string) ([]provider.EventKind, provider.Class, error) {
	t.Helper()
	f, err := os.Open(filepath.Join("testdata", "streams", name))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	r := provider.NewSSEReader(f)
	var kinds []provider.EventKind
	var class provider.Class
	for {
		ev, err := r.Next()
		if err != nil {
			if err == io.EOF {
				err = nil
			}
			return kinds, class, err
		}
		_, kind, obs := chatDecoder(byName("openai", provider.Endpoint{})).Event(ev)
		kinds = append(kinds, kind)
		if kind == provider.EventError {
			class = obs.Class
		}
	}
}

func TestOpenAIStreamFixtures(t *testing.T) {
	// Keep-alive comments before the first event are not content.
	kinds, _, err := streamKinds(t, "deepseek-keepalive-comments.sse")
	want := []provider.EventKind{provider.EventSkip, provider.EventSkip, provider.EventSkip, provider.EventData, provider.EventFinal, provider.EventDone}
	if err != nil || !equalKinds(kinds, want) {
		t.Errorf("deepseek keep-alive: expected %v, got %v (%v)", want, kinds, err)
	}
	// An error object after content began: an in-band error, no terminator.
	// The role-only chunk that opens the stream is no first token.
	kinds, class, err := streamKinds(t, "openai-midstream-error.sse")
	want = []provider.EventKind{provider.EventSkip, provider.EventData, provider.EventError}
	if err != nil || !equalKinds(kinds, want) || class != provider.Server {
		t.Errorf("openai mid-stream error: expected %v with class server, got %v %s (%v)", want, kinds, class, err)
	}
	// OpenRouter: comments, content, then a chunk with an error and finish_reason "error".
	kinds, class, err = streamKinds(t, "openrouter-midstream-error.sse")
	want = []provider.EventKind{provider.EventSkip, provider.EventSkip, provider.EventData, provider.EventError}
	if err != nil || !equalKinds(kinds, want) || class != provider.Server {
		t.Errorf("openrouter mid-stream error: expected %v with class server, got %v %s (%v)", want, kinds, class, err)
	}
}

func equalKinds(a, b []provider.EventKind) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func TestStreamEventEdgeCases(t *testing.T) {
	for _, tc := range []struct {
		data  string
		kind  provider.EventKind
		class provider.Class
	}{
		{`{"choices":[{"delta":{"content":"the word \"error\" in text"},"finish_reason":null}]}`, provider.EventData, provider.OK},
		{`{"choices":[{"delta":{},"finish_reason": "length"}]}`, provider.EventFinal, provider.OK},
		{`{"error":{"message":"Rate limit","type":"rate_limit_exceeded","code":"rate_limit_exceeded"}}`, provider.EventError, provider.RateLimited},
		{`{"error":{"message":"x","code":529}}`, provider.EventError, provider.Overloaded},
		{`{"error":{"message":"Incorrect API key provided: sk-ab*****wxyz.","type":"invalid_request_error","code":"invalid_api_key"}}`, provider.EventError, provider.Auth},
		{`{"error":{"message":"denied","type":"authentication_error"}}`, provider.EventError, provider.Auth},
		{`{"error":{"message":"Billing hard limit has been reached","type":"invalid_request_error","code":"billing_hard_limit_reached"}}`, provider.EventError, provider.QuotaExhausted},
		{`{"choices":[{"delta":{"content":"unterminated`, provider.EventError, provider.Server},
		{`not json`, provider.EventError, provider.Server},
		{`[DONE]`, provider.EventDone, provider.OK},
	} {
		_, kind, obs := chatDecoder(byName("openai", provider.Endpoint{})).Event(&provider.Event{Data: []byte(tc.data)})
		if kind != tc.kind || (kind == provider.EventError && obs.Class != tc.class) {
			t.Errorf("%s: expected kind %d class %s, got %d %s", tc.data, tc.kind, tc.class, kind, obs.Class)
		}
	}
}

func TestNamedErrorEvent(t *testing.T) {
	_, kind, obs := chatDecoder(byName("openai", provider.Endpoint{})).Event(&provider.Event{Name: "error", Data: []byte(`{"type":"error","message":"overloaded"}`)})
	if kind != provider.EventError || obs.Class != provider.Server {
		t.Errorf("expected an error event, got %d %s", kind, obs.Class)
	}
}

// What opens a stream without content is no first token; any content is.
func TestOpeningChunkShapes(t *testing.T) {
	chunk := func(delta string) string {
		return `{"id":"c","object":"chat.completion.chunk","model":"m","choices":[{"index":0,"delta":` + delta + `,"logprobs":null,"finish_reason":null}]}`
	}
	for data, content := range map[string]bool{
		chunk(`{}`):   false,
		chunk(`null`): false,
		chunk(`{"role":"assistant","content":""}`): false,
		chunk(`{"content":null,"refusal":null}`):   false,
		chunk(`{"reasoning_content":""}`):          false,
		chunk(`{"tool_calls":[{"index":0}]}`):      false,
		chunk(`{"tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"arguments":""}}]}`): false,
		chunk(`{"tool_calls":[{}]}`):                          false,
		chunk(`{"audio":{"transcript":""}}`):                  false,
		chunk(`{"content":false}`):                            false,
		`{"id":"c","choices":[],"usage":{"prompt_tokens":3}}`: false,
		`{"id":"c","choices":null}`:                           false,
		chunk(`{"content":" "}`):                              true,
		chunk(`{"content":"Hi"}`):                             true,
		chunk(`{"refusal":"I can't"}`):                        true,
		chunk(`{"reasoning_content":"Let me think"}`):         true,
		chunk(`{"reasoning":"Let me think"}`):                 true,
		chunk(`{"tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"name":"get_weather","arguments":""}}]}`): true,
		chunk(`{"tool_calls":[{"index":0,"function":{"arguments":"{\"city\""}}]}`):                                             true,
	} {
		for _, name := range []string{"openai", "azure"} {
			_, kind, _ := chatDecoder(byName(name, provider.Endpoint{})).Event(&provider.Event{Data: []byte(data)})
			if got := kind == provider.EventData; got != content {
				t.Errorf("%s: %s: expected content %v, got kind %d", name, data, content, kind)
			}
		}
	}
}

// A quota is read from a message only when no wait is stated anywhere and
// the message names no short period: rate limits that mention billing or
// credits, a load balancer, or a 400 echoing the client's own words are not
// quotas (found by adversarial testing).
func TestQuotaMessagesAreNotRateLimits(t *testing.T) {
	geminiObj := `{"error": {"code": 429, "status": "RESOURCE_EXHAUSTED", "message": "You exceeded your current quota, please check your plan and billing details.\n* Quota exceeded for metric: generativelanguage.googleapis.com/generate_content_free_tier_requests, limit: 15, model: gemini-x\nPlease retry in 26.211922938s."}}`
	for _, tc := range []struct {
		name   string
		status int
		body   string
		hdr    []string
		want   provider.Class
	}{
		{"gemini openai-compat per-minute free tier (object)", 429, geminiObj, nil, provider.RateLimited},
		{"gemini openai-compat per-minute free tier (array)", 429, "[" + geminiObj + "]", nil, provider.RateLimited},
		{"cohere trial per-minute", 429, `{"id":"x","message":"You are using a Trial key, which is limited to 10 API calls / minute. You can continue to use the Trial key for free or upgrade to a Production key with higher rate limits"}`, nil, provider.RateLimited},
		{"per-minute with header Retry-After and billing link", 429, `{"error":{"message":"Too many requests. Add a payment method at https://example.com/billing to raise your limits.","type":"requests"}}`, []string{"Retry-After", "20"}, provider.RateLimited},
		{"per-minute with remaining 0 reset 20s and credit words", 429, `{"error":{"message":"Request limit exceeded for free-tier keys; buy credits for higher limits."}}`, []string{"x-ratelimit-remaining-requests", "0", "x-ratelimit-reset-requests", "20s"}, provider.RateLimited},
		{"40 rpm trial", 429, `{"error":{"message":"Rate limit exceeded: trial accounts are limited to 40 rpm"}}`, nil, provider.RateLimited},
		{"load balancer", 429, `{"error":{"message":"Too many requests to the load balancer, slow down"}}`, nil, provider.RateLimited},
		{"400 unrecognized argument echoed (credit)", 400, `{"error":{"message":"Unrecognized request argument supplied: credit_score","type":"invalid_request_error","param":null,"code":null}}`, nil, provider.ClientError},
		{"400 unrecognized argument echoed (billing)", 400, `{"error":{"message":"Unrecognized request argument supplied: billing_id","type":"invalid_request_error","param":null,"code":null}}`, nil, provider.ClientError},
		{"400 groq tool name echoed", 400, `{"error":{"message":"tool call validation failed: attempted to call tool 'get_daily_balance' which was not in request.tools","type":"invalid_request_error","code":"tool_use_failed"}}`, nil, provider.ClientError},
		{"daily limit with stated wait", 429, `{"error":{"message":"Daily request limit reached. Please try again in 2h13m."}}`, nil, provider.RateLimited},
	} {
		o := (&OpenAI{}).Observe(tc.status, headerOf(tc.hdr...), []byte(tc.body), time.Now())
		if o.Class != tc.want {
			t.Errorf("%s: class %s, want %s (retry_after %v, msg %q)", tc.name, o.Class, tc.want, o.RetryAfter, o.Message)
		}
	}
}

// A request larger than a token window's whole limit is too_large, its
// limit read from the message when no header states it; a request larger
// than what is left of the window (Used + Requested over the limit, or a
// message naming no limit) is a rate limit as before.
func TestRequestTooLargeIsNotARateLimit(t *testing.T) {
	tooLarge := `{"error": {"message": "Request too large for gpt-4o-mini in organization org-FAKE on tokens per day (TPD): Limit 200000, Requested 250123. The input or output tokens must be reduced in order to run successfully.", "type": "tokens", "param": null, "code": "rate_limit_exceeded"}}`
	for _, tc := range []struct {
		name   string
		status int
		body   string
		want   provider.Class
		limit  int64
	}{
		{"too large, message only", 429, tooLarge, provider.TooLarge, 200000},
		{"the window's remainder", 429, `{"error": {"message": "Rate limit reached for gpt-4o in organization org-FAKE on tokens per min (TPM): Limit 30000, Used 29000, Requested 2000. Please try again in 2s.", "type": "tokens", "code": "rate_limit_exceeded"}}`, provider.RateLimited, provider.Unknown},
		{"no numbers", 429, `{"error": {"message": "Request too large; try again later", "type": "tokens"}}`, provider.RateLimited, provider.Unknown},
		{"a 400 that echoes the words", 400, tooLarge, provider.ClientError, provider.Unknown},
		{"a 413 of another kind", 413, `{"error":{"message":"Request Entity Too Large"}}`, provider.ClientError, provider.Unknown},
	} {
		o := (&OpenAI{}).Observe(tc.status, http.Header{}, []byte(tc.body), time.Now())
		if o.Class != tc.want || o.Tokens.Limit != tc.limit {
			t.Errorf("%s: expected %s with token limit %d, got %s with %d", tc.name, tc.want, tc.limit, o.Class, o.Tokens.Limit)
		}
	}
}

// OpenAI's x-ratelimit-limit-tokens bounds one request (admission counts
// the request's own estimate); a token window under other headers is not
// known to, nor is Anthropic's most restrictive one.
func TestTokenWindowsThatBoundARequest(t *testing.T) {
	ok := func(p provider.Provider, kv ...string) provider.Window {
		return p.Observe(200, headerOf(kv...), nil, time.Now()).Tokens
	}
	if w := ok(&OpenAI{}, "x-ratelimit-limit-tokens", "30000", "x-ratelimit-remaining-tokens", "29000", "x-ratelimit-reset-tokens", "2s"); !w.BoundsRequest || w.Limit != 30000 {
		t.Errorf("openai: expected a bounding window of 30000, got %+v", w)
	}
	if w := ok(&OpenAI{}, "x-ratelimit-limit-tokens-minute", "30000", "x-ratelimit-remaining-tokens-minute", "29000"); w.BoundsRequest {
		t.Errorf("a per-minute window under another name: expected it not known to bound a request, got %+v", w)
	}
	if w := ok(&Anthropic{}, "anthropic-ratelimit-tokens-limit", "8000", "anthropic-ratelimit-tokens-remaining", "7000"); w.BoundsRequest || w.Limit != 8000 {
		t.Errorf("anthropic: expected a window of 8000 not known to bound a request, got %+v", w)
	}
}

func headerOf(kv ...string) http.Header {
	h := http.Header{}
	for i := 0; i+1 < len(kv); i += 2 {
		h.Set(kv[i], kv[i+1])
	}
	return h
}

// An answer that names no model (some OpenAI-compatible servers) is given
// the deployment's upstream model: clients attribute tokens by it. One
// that names its own keeps it.
func TestAnswerWithoutModelIsNamed(t *testing.T) {
	p := &OpenAI{Endpoint: provider.Endpoint{BaseURL: "https://api.example.com/v1"}}
	pl, err := p.Plan(context.Background(), "llama-3-8b", chatReq([]byte(`{"model":"m","messages":[{"role":"user","content":"hi"}]}`), false))
	if err != nil {
		t.Fatal(err)
	}
	for body, want := range map[string]string{
		`{"id":"x","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}]}`:            "llama-3-8b",
		`{"id":"x","object":"chat.completion","model":"","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}]}`: "llama-3-8b",
		`{"id":"x","object":"chat.completion","model":"llama-3-8b-instruct-q4","choices":[{"index":0,"message":{"role":"assistant","content":"hi"}}]}`:  "llama-3-8b-instruct-q4",
	} {
		out, err := pl.Answer([]byte(body))
		if err != nil {
			t.Fatal(err)
		}
		var m struct{ Model string }
		if json.Unmarshal(out, &m) != nil || m.Model != want {
			t.Errorf("%s: model %q, want %q", body, m.Model, want)
		}
	}
}
