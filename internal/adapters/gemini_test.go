package adapters

import (
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/llmrouter/caddy-llm-router/internal/jsontest"
	"github.com/llmrouter/caddy-llm-router/internal/wire/chat"
	"github.com/llmrouter/caddy-llm-router/provider"
)

const geminiWithTools = `{
 "contents": [
  {"role": "user", "parts": [
    {"text": "What is in these pictures, and how is the weather in Paris?"},
    {"inlineData": {"mimeType": "image/png", "data": "iVBORw0KGgoAAAANSUhEUg=="}},
    {"fileData": {"mimeType": "image/jpeg", "fileUri": "https://upload.example.org/cat.jpg"}}
  ]},
  {"role": "model", "parts": [
    {"text": "Let me check."},
    {"functionCall": {"name": "get_weather", "args": {"city": "Paris", "unit": "c"}}SIGNATURE},
    {"functionCall": {"name": "get_time", "args": {}}}
  ]},
  {"role": "user", "parts": [
    {"functionResponse": {"name": "get_weather", "response": {"temp": 21}}},
    {"functionResponse": {"name": "get_time", "response": {"result": "14:05"}}},
    {"text": "Thanks. And tomorrow?"}
  ]}
 ],
 "systemInstruction": {"parts": [{"text": "You are a weather bot."}, {"text": "Answer in one line."}]},
 "tools": [{"functionDeclarations": [
  {"name": "get_weather", "description": "Current weather",
   "parametersJsonSchema": {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["c", "f"]}}, "required": ["city"], "additionalProperties": false}},
  {"name": "get_time"}
 ]}],
 "toolConfig": {"functionCallingConfig": {"mode": "AUTO"}},
 "generationConfig": {"temperature": 0.3, "topP": 0.9, "maxOutputTokens": 512, "stopSequences": ["\n\nUser:"]}
}`

func TestGeminiChatRequest(t *testing.T) {
	for _, tc := range []struct {
		model, url, signature string
		stream                bool
	}{
		{"gemini-2.5-flash", "https://generativelanguage.googleapis.com/v1beta/models/gemini-2.5-flash:generateContent", "", false},
		{"models/gemini-2.5-flash", "https://generativelanguage.googleapis.com/v1beta/models/gemini-2.5-flash:streamGenerateContent?alt=sse", "", true},
		// Gemini 3 rejects replayed calls without a thought signature.
		{"gemini-3-pro-preview", "https://generativelanguage.googleapis.com/v1beta/models/gemini-3-pro-preview:generateContent",
			`, "thoughtSignature": "skip_thought_signature_validator"`, false},
		{"tunedModels/my-weather-1", "https://generativelanguage.googleapis.com/v1beta/tunedModels/my-weather-1:generateContent", "", false},
	} {
		ep := &provider.Endpoint{BaseURL: "https://generativelanguage.googleapis.com/v1beta", APIKey: "AIza-provider"}
		req, err := chatRequest(byName("gemini", *ep), tc.model, []byte(chatWithTools), tc.stream)
		if err != nil {
			t.Fatal(err)
		}
		if req.Method != http.MethodPost || req.URL.String() != tc.url {
			t.Errorf("%s: expected POST %s, got %s %s", tc.model, tc.url, req.Method, req.URL)
		}
		if req.Header.Get("X-Goog-Api-Key") != "AIza-provider" || req.Header.Get("Authorization") != "" ||
			req.Header.Get("Content-Type") != "application/json" {
			t.Errorf("%s: unexpected headers %v", tc.model, req.Header)
		}
		body, _ := io.ReadAll(req.Body)
		want := strings.Replace(geminiWithTools, "SIGNATURE", tc.signature, 1)
		if !jsontest.Same(t, body, want) {
			t.Errorf("%s:\nexpected %s\ngot      %s", tc.model, jsontest.Compact(want), body)
		}
	}
}

func TestGeminiRequestTranslation(t *testing.T) {
	for _, tc := range []struct {
		name, in, want string
	}{
		{
			"minimal: no generationConfig",
			`{"messages":[{"role":"user","content":"hi"}]}`,
			`{"contents":[{"role":"user","parts":[{"text":"hi"}]}]}`,
		},
		{
			"a named function, JSON output with a schema, penalties and seed",
			`{"messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{"name":"f"}}],
			  "tool_choice":{"type":"function","function":{"name":"f"}},"max_tokens":9,"seed":7,"presence_penalty":0.5,
			  "response_format":{"type":"json_schema","json_schema":{"name":"o","schema":{"type":"object"}}}}`,
			`{"contents":[{"role":"user","parts":[{"text":"x"}]}],"tools":[{"functionDeclarations":[{"name":"f"}]}],
			  "toolConfig":{"functionCallingConfig":{"mode":"ANY","allowedFunctionNames":["f"]}},
			  "generationConfig":{"maxOutputTokens":9,"seed":7,"presencePenalty":0.5,"responseMimeType":"application/json","responseJsonSchema":{"type":"object"}}}`,
		},
		{
			"required and none",
			`{"messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{"name":"f"}}],"tool_choice":"required"}`,
			`{"contents":[{"role":"user","parts":[{"text":"x"}]}],"tools":[{"functionDeclarations":[{"name":"f"}]}],
			  "toolConfig":{"functionCallingConfig":{"mode":"ANY"}}}`,
		},
		{
			"consecutive user messages merge; a tool result names its call by the tool message's name when the call is not in the history",
			`{"messages":[{"role":"user","content":"a"},{"role":"user","content":"b"},{"role":"tool","tool_call_id":"x","name":"lookup","content":"[1,2]"}]}`,
			`{"contents":[{"role":"user","parts":[{"text":"a"},{"text":"b"},{"functionResponse":{"name":"lookup","response":{"result":"[1,2]"}}}]}]}`,
		},
	} {
		got, err := chatToGemini([]byte(tc.in), "gemini-2.5-flash")
		if err != nil {
			t.Errorf("%s: %v", tc.name, err)
			continue
		}
		if !jsontest.Same(t, got, tc.want) {
			t.Errorf("%s:\nexpected %s\ngot      %s", tc.name, jsontest.Compact(tc.want), got)
		}
	}
	for _, in := range []string{
		`[1]`,
		`{"messages":[{"role":"tool","tool_call_id":"nope","content":"x"}]}`,
		`{"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"file:///etc/passwd"}}]}]}`,
		`{"messages":[{"role":"user","content":[{"type":"input_audio"}]}]}`,
		`{"messages":[{"role":"user","content":"x"}],"tools":[{"type":"code_interpreter"}]}`,
		`{"messages":[{"role":"user","content":"x"}],"n":3}`,
		`{"messages":[{"role":"system","content":"only a system prompt"}]}`,
	} {
		if _, err := chatToGemini([]byte(in), "gemini-2.5-flash"); err == nil {
			t.Errorf("%s: expected an error", in)
		}
	}
}

func TestGeminiChatResponse(t *testing.T) {
	body := `{
	  "candidates": [{"content": {"parts": [
	      {"text": "**Thinking about Paris**", "thought": true},
	      {"text": "Checking "}, {"text": "now."},
	      {"functionCall": {"name": "get_weather", "args": {"city": "Paris"}}},
	      {"functionCall": {"name": "get_time", "args": {}}}
	    ], "role": "model"},
	    "finishReason": "STOP", "index": 0}],
	  "usageMetadata": {"promptTokenCount": 40, "candidatesTokenCount": 12, "totalTokenCount": 80, "thoughtsTokenCount": 28, "cachedContentTokenCount": 32},
	  "modelVersion": "gemini-2.5-flash",
	  "responseId": "mAitaK3hJ8WtxN8P7pfA0Ak"
	}`
	got, err := chatAnswer(byName("gemini", provider.Endpoint{}), []byte(body))
	if err != nil {
		t.Fatal(err)
	}
	var c chat.Completion
	if err := decodeJSON(got, &c); err != nil || len(c.Choices) != 1 {
		t.Fatalf("expected a chat.completion, got %s (%v)", got, err)
	}
	m := c.Choices[0].Message
	if c.ID != "mAitaK3hJ8WtxN8P7pfA0Ak" || c.Object != "chat.completion" || c.Model != "gemini-2.5-flash" {
		t.Errorf("expected id, object and model from the answer, got %s", got)
	}
	if m.Content.IsNull() || m.Content.Text != "Checking now." || c.Choices[0].FinishReason != "tool_calls" {
		t.Errorf("expected text without thoughts and finish_reason tool_calls, got %s", got)
	}
	if len(m.ToolCalls) != 2 || m.ToolCalls[0].Function.Name != "get_weather" || m.ToolCalls[0].Function.Arguments != `{"city": "Paris"}` ||
		m.ToolCalls[1].Function.Arguments != "{}" || m.ToolCalls[0].Type != "function" ||
		!strings.HasPrefix(m.ToolCalls[0].ID, "call_") || m.ToolCalls[0].ID == m.ToolCalls[1].ID || m.ToolCalls[0].Index != nil {
		t.Errorf("expected two tool calls with distinct fresh ids, got %s", got)
	}
	if u := c.Usage; u == nil || u.PromptTokens != 40 || u.CompletionTokens != 40 || u.TotalTokens != 80 ||
		u.CompletionTokensDetails == nil || u.CompletionTokensDetails.ReasoningTokens != 28 ||
		u.PromptTokensDetails == nil || u.PromptTokensDetails.CachedTokens != 32 {
		t.Errorf("expected usage 40 + (12+28 thinking) = 80, 32 cached, got %+v", c.Usage)
	}

	// A blocked prompt has no candidates.
	got, err = chatAnswer(byName("gemini", provider.Endpoint{}), []byte(`{"promptFeedback":{"blockReason":"SAFETY"},"usageMetadata":{"promptTokenCount":8,"totalTokenCount":8},"modelVersion":"gemini-2.0-flash"}`))
	if err != nil || !strings.Contains(string(got), `"finish_reason":"content_filter"`) || !strings.Contains(string(got), `"content":""`) {
		t.Errorf("expected an empty content_filter answer for a blocked prompt, got %s (%v)", got, err)
	}
	for _, bad := range []string{`{}`, `{"candidates":[]}`, `{"error":{"code":500,"message":"x","status":"INTERNAL"}}`, `[]`, `not json`} {
		if out, err := chatAnswer(byName("gemini", provider.Endpoint{}), []byte(bad)); err == nil {
			t.Errorf("%s: expected an error, got %s", bad, out)
		}
	}
}

func TestGeminiFinishReasons(t *testing.T) {
	for reason, want := range map[string]string{
		"STOP": "stop", "MAX_TOKENS": "length", "SAFETY": "content_filter", "RECITATION": "content_filter",
		"BLOCKLIST": "content_filter", "PROHIBITED_CONTENT": "content_filter", "SPII": "content_filter",
		"OTHER": "stop", "MALFORMED_FUNCTION_CALL": "stop",
	} {
		if got := geminiFinish(reason, false); got != want {
			t.Errorf("%s: expected %s, got %s", reason, want, got)
		}
	}
	if got := geminiFinish("STOP", true); got != "tool_calls" {
		t.Errorf("STOP after function calls: expected tool_calls, got %s", got)
	}
}

// An ?alt=sse stream as Gemini sends it (CRLF line ends, no terminator).
const geminiSSE = "data: {\"candidates\": [{\"content\": {\"parts\": [{\"text\": \"The\"}],\"role\": \"model\"},\"index\": 0}],\"usageMetadata\": {\"promptTokenCount\": 12,\"totalTokenCount\": 12},\"modelVersion\": \"gemini-2.5-flash\",\"responseId\": \"mAitaK3hJ8WtxN8P7pfA0Ak\"}\r\n\r\n" +
	"data: {\"candidates\": [{\"content\": {\"parts\": [{\"text\": \" weather in Paris is\"}],\"role\": \"model\"},\"index\": 0}],\"usageMetadata\": {\"promptTokenCount\": 12,\"totalTokenCount\": 12},\"modelVersion\": \"gemini-2.5-flash\",\"responseId\": \"mAitaK3hJ8WtxN8P7pfA0Ak\"}\r\n\r\n" +
	"data: {\"candidates\": [{\"content\": {\"parts\": [{\"text\": \" worth a look:\"},{\"functionCall\": {\"name\": \"get_weather\",\"args\": {\"city\": \"Paris\"}}}],\"role\": \"model\"},\"index\": 0}],\"usageMetadata\": {\"promptTokenCount\": 12,\"totalTokenCount\": 12},\"modelVersion\": \"gemini-2.5-flash\",\"responseId\": \"mAitaK3hJ8WtxN8P7pfA0Ak\"}\r\n\r\n" +
	"data: {\"candidates\": [{\"content\": {\"parts\": [{\"functionCall\": {\"name\": \"get_time\",\"args\": {}}}],\"role\": \"model\"},\"finishReason\": \"STOP\",\"index\": 0}],\"usageMetadata\": {\"promptTokenCount\": 12,\"candidatesTokenCount\": 9,\"totalTokenCount\": 45,\"thoughtsTokenCount\": 24},\"modelVersion\": \"gemini-2.5-flash\",\"responseId\": \"mAitaK3hJ8WtxN8P7pfA0Ak\"}\r\n\r\n"

func TestGeminiStream(t *testing.T) {
	res := runStream(t, chatDecoder(byName("gemini", provider.Endpoint{})), geminiSSE)
	want := []provider.EventKind{provider.EventData, provider.EventData, provider.EventData, provider.EventFinal}
	if !equalKinds(res.kinds, want) {
		t.Errorf("kinds: expected %v, got %v", want, res.kinds)
	}
	if res.content != "The weather in Paris is worth a look:" {
		t.Errorf("content: got %q", res.content)
	}
	if len(res.roles) != 1 || !strings.Contains(res.chunks[0], `"role":"assistant"`) {
		t.Errorf("expected the role in the first chunk only, got %v", res.roles)
	}
	if len(res.tools) != 2 || res.tools[0].name != "get_weather" || res.tools[0].args != `{"city": "Paris"}` ||
		res.tools[1].name != "get_time" || res.tools[1].args != "{}" || res.tools[0].typ != "function" ||
		!strings.HasPrefix(res.tools[0].id, "call_") || res.tools[0].id == res.tools[1].id {
		t.Errorf("expected get_weather and get_time at indexes 0 and 1, got %+v %+v", res.tools[0], res.tools[len(res.tools)-1])
	}
	if res.lastContentKind() != provider.EventFinal || res.finish != "tool_calls" {
		t.Errorf("expected a final event with finish_reason tool_calls, got %q", res.finish)
	}
	if u := res.usage; u == nil || u.PromptTokens != 12 || u.CompletionTokens != 33 || u.TotalTokens != 45 {
		t.Errorf("expected usage 12 + 33 = 45, got %+v", u)
	}
	if len(res.ids) != 1 || !res.ids["mAitaK3hJ8WtxN8P7pfA0Ak"] || !res.models["gemini-2.5-flash"] {
		t.Errorf("expected one id and the model version on every chunk, got %v %v", res.ids, res.models)
	}
	// Only the final chunk has usage: a client asking for it knows the
	// stream is complete.
	for _, c := range res.chunks[:len(res.chunks)-1] {
		if strings.Contains(c, `"usage"`) {
			t.Errorf("usage before the final chunk: %s", c)
		}
	}
}

func TestGeminiStreamUsageFromEarlierEvent(t *testing.T) {
	// A final event without usageMetadata still carries usage: a client
	// that asked for it (include_usage) must see the stream complete.
	sse := "data: {\"candidates\":[{\"content\":{\"parts\":[{\"text\":\"Hi\"}],\"role\":\"model\"}}],\"usageMetadata\":{\"promptTokenCount\":5,\"candidatesTokenCount\":1,\"totalTokenCount\":6}}\n\n" +
		"data: {\"candidates\":[{\"content\":{\"parts\":[{\"text\":\"!\"}],\"role\":\"model\"},\"finishReason\":\"MAX_TOKENS\"}]}\n\n"
	res := runStream(t, chatDecoder(byName("gemini", provider.Endpoint{})), sse)
	if res.content != "Hi!" || res.finish != "length" || res.usage == nil || res.usage.PromptTokens != 5 {
		t.Errorf("expected Hi! ending length with the earlier usage, got %q %q %+v", res.content, res.finish, res.usage)
	}
}

func TestGeminiStreamEvents(t *testing.T) {
	for _, tc := range []struct {
		name, data string
		kind       provider.EventKind
		class      provider.Class
		retry      time.Duration
	}{
		{"overloaded mid-stream", `{"error":{"code":503,"message":"The model is overloaded. Please try again later.","status":"UNAVAILABLE"}}`, provider.EventError, provider.Overloaded, provider.Unknown},
		{"rate limited mid-stream", `{"error":{"code":429,"message":"Resource exhausted","status":"RESOURCE_EXHAUSTED","details":[{"@type":"type.googleapis.com/google.rpc.RetryInfo","retryDelay":"3s"}]}}`, provider.EventError, provider.RateLimited, 3 * time.Second},
		{"daily quota mid-stream", `{"error":{"code":429,"message":"Quota exceeded","status":"RESOURCE_EXHAUSTED","details":[{"@type":"type.googleapis.com/google.rpc.QuotaFailure","violations":[{"quotaId":"GenerateRequestsPerDayPerProjectPerModel-FreeTier"}]},{"@type":"type.googleapis.com/google.rpc.RetryInfo","retryDelay":"3s"}]}}`, provider.EventError, provider.QuotaExhausted, provider.Unknown},
		{"a blocked prompt", `{"promptFeedback":{"blockReason":"PROHIBITED_CONTENT"},"usageMetadata":{"promptTokenCount":4}}`, provider.EventFinal, provider.OK, 0},
		{"usage alone", `{"usageMetadata":{"promptTokenCount":4}}`, provider.EventSkip, provider.OK, 0},
		{"an empty text", `{"candidates":[{"content":{"parts":[{"text":""}],"role":"model"}}]}`, provider.EventSkip, provider.OK, 0},
		{"an empty thought", `{"candidates":[{"content":{"parts":[{"text":"","thought":true}],"role":"model"}}]}`, provider.EventSkip, provider.OK, 0},
		{"a thought", `{"candidates":[{"content":{"parts":[{"text":"Considering the question","thought":true}],"role":"model"}}]}`, provider.EventData, provider.OK, 0},
		{"cut JSON", `{"candidates":[{"content":`, provider.EventError, provider.Server, provider.Unknown},
	} {
		out, kind, obs := chatDecoder(byName("gemini", provider.Endpoint{})).Event(&provider.Event{Data: []byte(tc.data)})
		if kind != tc.kind {
			t.Errorf("%s: expected kind %d, got %d (%s)", tc.name, tc.kind, kind, out)
			continue
		}
		if kind == provider.EventError && (obs.Class != tc.class || obs.RetryAfter != tc.retry) {
			t.Errorf("%s: expected %s retry %v, got %s %v", tc.name, tc.class, tc.retry, obs.Class, obs.RetryAfter)
		}
		if kind == provider.EventFinal && !strings.Contains(string(out), `"finish_reason":"content_filter"`) {
			t.Errorf("%s: expected content_filter, got %s", tc.name, out)
		}
	}
	// Comments are skipped.
	if _, kind, _ := chatDecoder(byName("gemini", provider.Endpoint{})).Event(&provider.Event{Comment: true, Data: []byte("keep-alive")}); kind != provider.EventSkip {
		t.Errorf("expected a comment skipped, got %d", kind)
	}
}

func TestGeminiObserve(t *testing.T) {
	for _, tc := range []struct {
		name   string
		status int
		body   string
		want   provider.Class
		retry  time.Duration
	}{
		{"invalid key", 400, `{"error":{"code":400,"message":"API key not valid. Please pass a valid API key.","status":"INVALID_ARGUMENT","details":[{"@type":"type.googleapis.com/google.rpc.ErrorInfo","reason":"API_KEY_INVALID","domain":"googleapis.com"}]}}`, provider.Auth, provider.Unknown},
		{"no key", 403, `{"error":{"code":403,"message":"Method doesn't allow unregistered callers.","status":"PERMISSION_DENIED"}}`, provider.Auth, provider.Unknown},
		{"wrong key", 401, `{"error":{"code":401,"message":"Request had invalid authentication credentials.","status":"UNAUTHENTICATED"}}`, provider.Auth, provider.Unknown},
		{"context", 400, `{"error":{"code":400,"message":"The input token count (1200000) exceeds the maximum number of tokens allowed (1048576).","status":"INVALID_ARGUMENT"}}`, provider.ContextLength, provider.Unknown},
		{"bad field", 400, `{"error":{"code":400,"message":"Invalid JSON payload received. Unknown name \"foo\": Cannot find field.","status":"INVALID_ARGUMENT"}}`, provider.ClientError, provider.Unknown},
		{"retired model", 404, `{"error":{"code":404,"message":"models/gemini-9 is not found for API version v1beta","status":"NOT_FOUND"}}`, provider.Server, provider.Unknown},
		{"billing", 400, `{"error":{"code":400,"message":"Gemini API free tier is not available in your country. Please enable billing on your project in Google AI Studio.","status":"FAILED_PRECONDITION"}}`, provider.QuotaExhausted, provider.Unknown},
		{"internal", 500, `{"error":{"code":500,"message":"An internal error has occurred.","status":"INTERNAL"}}`, provider.Server, provider.Unknown},
		{"overloaded", 503, `{"error":{"code":503,"message":"The model is overloaded. Please try again later.","status":"UNAVAILABLE"}}`, provider.Overloaded, provider.Unknown},
		{"deadline", 504, `{"error":{"code":504,"message":"Deadline exceeded","status":"DEADLINE_EXCEEDED"}}`, provider.Server, provider.Unknown},
		{"429 without details", 429, `{"error":{"code":429,"message":"Resource has been exhausted (e.g. check quota).","status":"RESOURCE_EXHAUSTED"}}`, provider.RateLimited, provider.Unknown},
		{"fractional retryDelay", 429, `{"error":{"code":429,"message":"x","status":"RESOURCE_EXHAUSTED","details":[{"@type":"type.googleapis.com/google.rpc.RetryInfo","retryDelay":"1.5s"}]}}`, provider.RateLimited, 1500 * time.Millisecond},
		{"absurd retryDelay", 429, `{"error":{"code":429,"message":"x","status":"RESOURCE_EXHAUSTED","details":[{"@type":"type.googleapis.com/google.rpc.RetryInfo","retryDelay":"99999999s"}]}}`, provider.RateLimited, provider.Unknown},
		{"negative retryDelay", 429, `{"error":{"code":429,"message":"x","status":"RESOURCE_EXHAUSTED","details":[{"@type":"type.googleapis.com/google.rpc.RetryInfo","retryDelay":"-5s"}]}}`, provider.RateLimited, provider.Unknown},
		{"array body", 429, `[{"error":{"code":429,"message":"Please retry in 2s.","status":"RESOURCE_EXHAUSTED"}}]`, provider.RateLimited, 2 * time.Second},
		{"odd detail types", 429, `{"error":{"code":429,"message":"x","status":"RESOURCE_EXHAUSTED","details":[{"@type":"t","violations":"no"},{"@type":"type.googleapis.com/google.rpc.RetryInfo","retryDelay":"4s"}]}}`, provider.RateLimited, 4 * time.Second},
		{"garbage 429", 429, `<html>`, provider.RateLimited, provider.Unknown},
		{"garbage 500", 500, `{"error":`, provider.Server, provider.Unknown},
		{"empty 502", 502, ``, provider.Server, provider.Unknown},
	} {
		o := (byName("gemini", provider.Endpoint{})).Observe(tc.status, http.Header{}, []byte(tc.body), time.Now())
		if o.Class != tc.want || o.RetryAfter != tc.retry {
			t.Errorf("%s: expected %s retry %v, got %s %v (%q)", tc.name, tc.want, tc.retry, o.Class, o.RetryAfter, o.Message)
		}
		if o.Requests != provider.UnknownWindow || o.Tokens != provider.UnknownWindow {
			t.Errorf("%s: Gemini states no windows, got %+v %+v", tc.name, o.Requests, o.Tokens)
		}
	}
	// A success states nothing.
	if o := (byName("gemini", provider.Endpoint{})).Observe(200, http.Header{}, nil, time.Now()); o != provider.NewObservation(provider.OK) {
		t.Errorf("expected nothing known from a success, got %+v", o)
	}
}

func TestGeminiPerDayIgnoresRetryDelay(t *testing.T) {
	resp, body := readFixture(t, "gemini-429-per-day.http")
	o := (byName("gemini", provider.Endpoint{})).Observe(resp.StatusCode, resp.Header, body, time.Now())
	if o.Class != provider.QuotaExhausted || o.RetryAfter != provider.Unknown {
		t.Errorf("expected quota_exhausted without the 42 s retryDelay, got %s %v", o.Class, o.RetryAfter)
	}
	resp, body = readFixture(t, "gemini-429-per-minute.http")
	o = (byName("gemini", provider.Endpoint{})).Observe(resp.StatusCode, resp.Header, body, time.Now())
	if o.Class != provider.RateLimited || o.RetryAfter != 26*time.Second {
		t.Errorf("expected rate_limited for the retryDelay of 26s, got %s %v", o.Class, o.RetryAfter)
	}
}

// What the client is told of an error (restated by the client API, see
// internal/api): class, message and the google.rpc status as the code.
func TestGeminiErrorObservation(t *testing.T) {
	_, body := readFixture(t, "gemini-429-per-minute.http")
	o := (byName("gemini", provider.Endpoint{})).Observe(429, http.Header{}, body, time.Now())
	if o.Class != provider.RateLimited || o.Code != "RESOURCE_EXHAUSTED" || !strings.HasPrefix(o.Message, "You exceeded your current quota") {
		t.Errorf("expected rate_limited RESOURCE_EXHAUSTED, got %+v", o)
	}
	o = (byName("gemini", provider.Endpoint{})).Observe(400, http.Header{}, []byte(`{"error":{"code":400,"message":"bad field","status":"INVALID_ARGUMENT"}}`), time.Now())
	if o.Class != provider.ClientError || o.Code != "INVALID_ARGUMENT" || o.Message != "bad field" {
		t.Errorf("expected client_error INVALID_ARGUMENT, got %+v", o)
	}
}
