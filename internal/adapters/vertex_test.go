package adapters

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/llmrouter/caddy-llm-router/internal/jsontest"
	"github.com/llmrouter/caddy-llm-router/provider"
)

func newVertex() *Vertex {
	return &Vertex{Endpoint: provider.Endpoint{BaseURL: "https://us-east5-aiplatform.googleapis.com/v1", Header: http.Header{}},
		Project: "my-project", Location: "us-east5"}
}

// Each model goes to its publisher's method: Claude to rawPredict or
// streamRawPredict with Vertex's Messages body (no model, its
// anthropic_version, stream in the body, the client's betas as a header),
// Gemini to generateContent or streamGenerateContent?alt=sse.
func TestVertexPlans(t *testing.T) {
	p := newVertex()
	const root = "/v1/projects/my-project/locations/us-east5/publishers/"
	msgBody := `{"model":"claude","max_tokens":64,"stream":true,"messages":[{"role":"user","content":"hi"}],"thinking":{"type":"enabled","budget_tokens":1024}}`
	pl, err := p.Plan(context.Background(), "claude-sonnet-4-5@20250929", &provider.Request{Format: provider.Messages, Stream: true,
		Body: []byte(msgBody), Header: http.Header{"Anthropic-Beta": {"context-1m-2025-08-07"}}})
	if err != nil {
		t.Fatal(err)
	}
	if got := pl.Request().URL.String(); got != "https://us-east5-aiplatform.googleapis.com"+root+"anthropic/models/claude-sonnet-4-5@20250929:streamRawPredict" {
		t.Errorf("url %s", got)
	}
	if pl.Format() != provider.Messages || pl.Native() || pl.Request().Header.Get("Anthropic-Beta") != "context-1m-2025-08-07" {
		t.Errorf("plan %v native %v headers %v", pl.Format(), pl.Native(), pl.Request().Header)
	}
	jsontest.Same(t, planBody(t, pl), `{"max_tokens":64,"messages":[{"role":"user","content":"hi"}],"thinking":{"type":"enabled","budget_tokens":1024},"anthropic_version":"vertex-2023-10-16","stream":true}`)

	pl, err = p.Plan(context.Background(), "claude-3-5-haiku@20241022", chatReq([]byte(`{"model":"g","max_tokens":20,"messages":[{"role":"user","content":"hi"}]}`), false))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasSuffix(pl.Request().URL.Path, root+"anthropic/models/claude-3-5-haiku@20241022:rawPredict") || pl.Format() != provider.Chat {
		t.Errorf("chat to claude: %s %v", pl.Request().URL, pl.Format())
	}
	jsontest.Same(t, planBody(t, pl), `{"max_tokens":20,"messages":[{"role":"user","content":"hi"}],"anthropic_version":"vertex-2023-10-16"}`)

	for model, want := range map[string]string{
		"gemini-2.5-flash":                        root + "google/models/gemini-2.5-flash:streamGenerateContent",
		"publishers/google/models/gemini-2.5-pro": root + "google/models/gemini-2.5-pro:streamGenerateContent",
	} {
		pl, err = p.Plan(context.Background(), model, chatReq([]byte(`{"model":"g","stream":true,"messages":[{"role":"user","content":"hi"}]}`), true))
		if err != nil {
			t.Fatal(err)
		}
		if u := pl.Request().URL; u.Path != want || u.RawQuery != "alt=sse" {
			t.Errorf("%s: %s", model, u)
		}
		jsontest.Same(t, planBody(t, pl), `{"contents":[{"role":"user","parts":[{"text":"hi"}]}]}`)
	}
	if _, err := p.Plan(context.Background(), "gemini-2.5-flash", &provider.Request{Format: provider.Embeddings, Body: []byte(`{}`)}); err == nil {
		t.Error("no embeddings on vertex")
	}
}

// Vertex's 429s: a per-minute quota is spent until the next minute; a
// per-day quota is exhausted; dynamic shared quota states no reset (the
// backoff decides); a RetryInfo is the wait. An Anthropic model's own
// error format is read as Anthropic's.
func TestVertexObserve(t *testing.T) {
	p := newVertex()
	now := time.Date(2025, 8, 21, 12, 40, 15, 0, time.UTC)
	date := http.Header{"Date": {now.Format(http.TimeFormat)}}
	o := p.Observe(429, date, []byte(`{"error":{"code":429,"message":"Quota exceeded for aiplatform.googleapis.com/generate_content_requests_per_minute_per_project_per_base_model with base model: gemini-1.5-pro. Please submit a quota increase request.","status":"RESOURCE_EXHAUSTED"}}`), now)
	if o.Class != provider.RateLimited || o.RetryAfter != 45*time.Second || o.Requests.Remaining != 0 || o.Requests.Reset != 45*time.Second || o.Tokens.Remaining != provider.Unknown {
		t.Errorf("per minute: %+v", o)
	}
	o = p.Observe(429, date, []byte(`{"error":{"code":429,"message":"Quota exceeded.","status":"RESOURCE_EXHAUSTED","details":[{"@type":"type.googleapis.com/google.rpc.QuotaFailure","violations":[{"quotaMetric":"aiplatform.googleapis.com/generate_content_input_tokens_per_minute_per_base_model","quotaId":"GenerateContentInputTokensPerMinutePerBaseModel"}]}]}}`), now)
	if o.Class != provider.RateLimited || o.Tokens.Remaining != 0 || o.Tokens.Reset != 45*time.Second || o.Requests.Remaining != provider.Unknown {
		t.Errorf("tokens per minute (QuotaFailure): %+v", o)
	}
	o = p.Observe(429, date, []byte(`{"error":{"code":429,"message":"Resource exhausted. Please try again later. Please refer to https://cloud.google.com/vertex-ai/generative-ai/docs/error-code-429 for more details.","status":"RESOURCE_EXHAUSTED"}}`), now)
	if o.Class != provider.RateLimited || o.RetryAfter != provider.Unknown || o.Requests.Remaining != provider.Unknown {
		t.Errorf("dynamic shared quota: %+v", o)
	}
	o = p.Observe(429, date, []byte(`{"error":{"code":429,"message":"Quota exceeded for aiplatform.googleapis.com/generate_content_requests_per_day_per_project_per_base_model with base model: gemini-1.5-pro.","status":"RESOURCE_EXHAUSTED"}}`), now)
	if o.Class != provider.QuotaExhausted {
		t.Errorf("per day: %+v", o)
	}
	o = p.Observe(429, date, []byte(`{"error":{"code":429,"message":"Resource exhausted.","status":"RESOURCE_EXHAUSTED","details":[{"@type":"type.googleapis.com/google.rpc.RetryInfo","retryDelay":"12s"}]}}`), now)
	if o.Class != provider.RateLimited || o.RetryAfter != 12*time.Second {
		t.Errorf("RetryInfo: %+v", o)
	}
	o = p.Observe(529, date, []byte(`{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}`), now)
	if o.Class != provider.Overloaded || o.Message != "Overloaded" {
		t.Errorf("anthropic's 529: %+v", o)
	}
	o = p.Observe(401, date, []byte(`{"error":{"code":401,"message":"Request had invalid authentication credentials.","status":"UNAUTHENTICATED"}}`), now)
	if o.Class != provider.Auth || o.Code != "UNAUTHENTICATED" {
		t.Errorf("401: %+v", o)
	}
}
