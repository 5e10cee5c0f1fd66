package adapters

import (
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/llmrouter/caddy-llm-router/internal/jsontest"
	"github.com/llmrouter/caddy-llm-router/provider"
)

func TestAzureURL(t *testing.T) {
	for _, tc := range []struct{ base, want string }{
		{"https://contoso.openai.azure.com/openai",
			"https://contoso.openai.azure.com/openai/deployments/gpt4o-prod/chat/completions?api-version=2024-10-21"},
		{"https://contoso.openai.azure.com/openai/",
			"https://contoso.openai.azure.com/openai/deployments/gpt4o-prod/chat/completions?api-version=2024-10-21"},
		{"https://contoso.openai.azure.com/openai?api-version=2024-06-01",
			"https://contoso.openai.azure.com/openai/deployments/gpt4o-prod/chat/completions?api-version=2024-06-01"},
		{"https://contoso.openai.azure.com/openai/?api-version=2025-04-01-preview&x-ms-trace=1",
			"https://contoso.openai.azure.com/openai/deployments/gpt4o-prod/chat/completions?api-version=2025-04-01-preview&x-ms-trace=1"},
		// The v1 API: model in the body, no api-version.
		{"https://contoso.openai.azure.com/openai/v1",
			"https://contoso.openai.azure.com/openai/v1/chat/completions"},
	} {
		got, err := azureURL(tc.base, "gpt4o-prod", "chat/completions")
		if err != nil || got != tc.want {
			t.Errorf("%s: expected %s, got %s (%v)", tc.base, tc.want, got, err)
		}
	}
	if got, _ := azureURL("https://x.openai.azure.com/openai", "my deployment", "chat/completions"); got != "https://x.openai.azure.com/openai/deployments/my%20deployment/chat/completions?api-version=2024-10-21" {
		t.Errorf("expected the deployment name escaped, got %s", got)
	}
	for _, bad := range []string{"contoso.openai.azure.com/openai", "://", ""} {
		if _, err := azureURL(bad, "d", "chat/completions"); err == nil {
			t.Errorf("%q: expected an error", bad)
		}
	}
}

func TestAzureChatRequest(t *testing.T) {
	ep := &provider.Endpoint{BaseURL: "https://contoso.openai.azure.com/openai?api-version=2024-06-01", APIKey: "azure-key",
		Header: http.Header{"X-Ms-Client-Request-Id": {"r1"}}}
	req, err := chatRequest(byName("azure", *ep), "gpt4o-prod", []byte(`{"model":"fast","messages":[{"role":"user","content":"hi"}],"stream":true}`), true)
	if err != nil {
		t.Fatal(err)
	}
	if want := "https://contoso.openai.azure.com/openai/deployments/gpt4o-prod/chat/completions?api-version=2024-06-01"; req.URL.String() != want || req.Method != http.MethodPost {
		t.Errorf("expected POST %s, got %s %s", want, req.Method, req.URL)
	}
	if req.Header.Get("Api-Key") != "azure-key" || req.Header.Get("X-Ms-Client-Request-Id") != "r1" ||
		req.Header.Get("Accept") != "text/event-stream" || req.Header.Get("Content-Type") != "application/json" {
		t.Errorf("unexpected headers %v", req.Header)
	}
	if _, ok := req.Header["Authorization"]; ok {
		t.Errorf("Azure takes api-key, expected no Authorization header, got %v", req.Header)
	}
	body, _ := io.ReadAll(req.Body)
	// The usage chunk asked for: the router counts every stream's tokens.
	if string(body) != `{"stream_options":{"include_usage":true},"model":"gpt4o-prod","messages":[{"role":"user","content":"hi"}],"stream":true}` {
		t.Errorf("expected the client's body with the deployment as model and the usage asked for, got %s", body)
	}
	// Without a key, no api-key header at all.
	req, _ = chatRequest(byName("azure", provider.Endpoint{BaseURL: "https://x.openai.azure.com/openai"}), "d", []byte(`{}`), false)
	if _, ok := req.Header["Api-Key"]; ok {
		t.Errorf("expected no api-key without a key, got %v", req.Header)
	}
	if _, err := chatRequest(byName("azure", *ep), "d", []byte(`[1]`), false); err == nil {
		t.Error("expected an error for a body that is not an object")
	}
}

func TestAzureObserve(t *testing.T) {
	resp, body := readFixture(t, "azure-429-retry-after-ms.http")
	o := (&Azure{}).Observe(resp.StatusCode, resp.Header, body, time.Now())
	if o.Class != provider.RateLimited || o.RetryAfter != 4500*time.Millisecond {
		t.Errorf("expected rate_limited for retry-after-ms 4500, got %s %v", o.Class, o.RetryAfter)
	}
	h := http.Header{}
	h.Set("x-ratelimit-remaining-requests", "-1")
	h.Set("x-ratelimit-remaining-tokens", "-1")
	o = (&Azure{}).Observe(200, h, nil, time.Now())
	if o.Requests.Remaining != provider.Unknown || o.Tokens.Remaining != provider.Unknown {
		t.Errorf("Azure's -1 means unknown, got %+v %+v", o.Requests, o.Tokens)
	}
	o = (&Azure{}).Observe(400, http.Header{}, []byte(`{"error":{"code":"content_filter","message":"The response was filtered due to the prompt triggering Azure OpenAI's content management policy.","status":400}}`), time.Now())
	if o.Class != provider.ClientError {
		t.Errorf("a content filter refusal is the client's: expected client_error, got %s", o.Class)
	}
}

// Azure's stream begins with a chunk holding only the prompt's content
// filter results.
const azureSSE = `data: {"choices":[],"created":0,"id":"","model":"","object":"","prompt_filter_results":[{"prompt_index":0,"content_filter_results":{"hate":{"filtered":false,"severity":"safe"}}}]}

data: {"choices":[{"content_filter_results":{},"delta":{"content":"","role":"assistant"},"finish_reason":null,"index":0}],"created":1724000000,"id":"chatcmpl-A1","model":"gpt-4o-2024-08-06","object":"chat.completion.chunk","system_fingerprint":"fp_1"}

data: {"choices":[{"content_filter_results":{"hate":{"filtered":false,"severity":"safe"}},"delta":{"content":"Hi"},"finish_reason":null,"index":0}],"created":1724000000,"id":"chatcmpl-A1","model":"gpt-4o-2024-08-06","object":"chat.completion.chunk"}

data: {"choices":[{"content_filter_results":{},"delta":{},"finish_reason":"stop","index":0}],"created":1724000000,"id":"chatcmpl-A1","model":"gpt-4o-2024-08-06","object":"chat.completion.chunk"}

data: {"choices":[],"created":1724000000,"id":"chatcmpl-A1","model":"gpt-4o-2024-08-06","object":"chat.completion.chunk","usage":{"completion_tokens":1,"prompt_tokens":8,"total_tokens":9}}

data: [DONE]

`

func TestAzureStream(t *testing.T) {
	dec := chatDecoder(byName("azure", provider.Endpoint{}))
	var kinds []provider.EventKind
	var usage string
	for i, data := range splitSSEData(azureSSE) {
		out, kind, _ := dec.Event(&provider.Event{Data: []byte(data)})
		kinds = append(kinds, kind)
		if i == 0 && len(out) != 0 {
			t.Errorf("expected the filter-results chunk dropped, got %s", out)
		}
		if kind == provider.EventData && len(out) > 0 && jsontest.Field(t, out, "usage") != nil {
			usage = string(out)
		}
	}
	// The filter results and the role-only chunk are no first token.
	want := []provider.EventKind{provider.EventSkip, provider.EventSkip, provider.EventData, provider.EventFinal, provider.EventData, provider.EventDone}
	if !equalKinds(kinds, want) {
		t.Errorf("expected the filter-results and role-only chunks skipped, %v, got %v", want, kinds)
	}
	if usage == "" {
		t.Error("expected the usage chunk (no choices, but usage) relayed")
	}
}

// splitSSEData returns the data of each event of a simple SSE text.
func splitSSEData(sse string) []string {
	var out []string
	r := provider.NewSSEReader(strings.NewReader(sse))
	for {
		ev, err := r.Next()
		if err != nil {
			return out
		}
		out = append(out, string(ev.Data))
	}
}
