package mockllm

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
)

const (
	geminiBody      = `{"contents":[{"role":"user","parts":[{"text":"hi"}]}]}`
	geminiGenerate  = "/v1beta/models/gemini-x:generateContent"
	geminiStreamSSE = "/v1beta/models/gemini-x:streamGenerateContent?alt=sse"
	geminiStreamArr = "/v1beta/models/gemini-x:streamGenerateContent"
	geminiPerDay    = "GenerateRequestsPerDayPerProjectPerModel-FreeTier"
)

type geminiResp struct {
	Candidates []struct {
		Content struct {
			Role  string `json:"role"`
			Parts []struct {
				Text *string `json:"text"`
			} `json:"parts"`
		} `json:"content"`
		FinishReason *string `json:"finishReason"`
		Index        *int    `json:"index"`
	} `json:"candidates"`
	UsageMetadata *struct {
		PromptTokenCount     int `json:"promptTokenCount"`
		CandidatesTokenCount int `json:"candidatesTokenCount"`
		TotalTokenCount      int `json:"totalTokenCount"`
	} `json:"usageMetadata"`
	ModelVersion string    `json:"modelVersion"`
	Error        *rpcError `json:"error"`
}

type rpcError struct {
	Code    int    `json:"code"`
	Status  string `json:"status"`
	Message string `json:"message"`
	Details []struct {
		Type       string `json:"@type"`
		RetryDelay string `json:"retryDelay"`
		Reason     string `json:"reason"`
		Violations []struct {
			QuotaMetric     string            `json:"quotaMetric"`
			QuotaID         string            `json:"quotaId"`
			QuotaDimensions map[string]string `json:"quotaDimensions"`
			QuotaValue      string            `json:"quotaValue"`
		} `json:"violations"`
	} `json:"details"`
}

func decodeRPCError(t *testing.T, body string) rpcError {
	t.Helper()
	var e struct {
		Error *rpcError `json:"error"`
	}
	if err := json.Unmarshal([]byte(body), &e); err != nil || e.Error == nil {
		t.Fatalf("expected a google.rpc error, got %q (%v)", body, err)
	}
	return *e.Error
}

// quotaInfo returns the QuotaFailure quotaId and model, and the
// RetryInfo retryDelay of a RESOURCE_EXHAUSTED error.
func quotaInfo(t *testing.T, e rpcError) (quotaID, model, quotaValue, retryDelay string) {
	t.Helper()
	if e.Code != 429 || e.Status != "RESOURCE_EXHAUSTED" || !strings.HasPrefix(e.Message, "You exceeded your current quota") {
		t.Errorf("expected 429 RESOURCE_EXHAUSTED, got %+v", e)
	}
	var sawQuota, sawRetry bool
	for _, d := range e.Details {
		switch d.Type {
		case "type.googleapis.com/google.rpc.QuotaFailure":
			sawQuota = true
			if len(d.Violations) != 1 {
				t.Fatalf("expected one violation, got %+v", d)
			}
			v := d.Violations[0]
			quotaID, model, quotaValue = v.QuotaID, v.QuotaDimensions["model"], v.QuotaValue
			if !strings.HasPrefix(v.QuotaMetric, "generativelanguage.googleapis.com/") {
				t.Errorf("unexpected quota metric %q", v.QuotaMetric)
			}
		case "type.googleapis.com/google.rpc.RetryInfo":
			sawRetry = true
			retryDelay = d.RetryDelay
		}
	}
	if !sawQuota || !sawRetry {
		t.Errorf("expected QuotaFailure and RetryInfo details, got %+v", e.Details)
	}
	return quotaID, model, quotaValue, retryDelay
}

// partText checks r is one candidate with one text part and returns it.
func partText(t *testing.T, r geminiResp) string {
	t.Helper()
	if len(r.Candidates) != 1 || r.Candidates[0].Content.Role != "model" || len(r.Candidates[0].Content.Parts) != 1 ||
		r.Candidates[0].Content.Parts[0].Text == nil || r.Candidates[0].Index == nil || *r.Candidates[0].Index != 0 {
		t.Fatalf("expected one model candidate with one text part, got %+v", r)
	}
	return *r.Candidates[0].Content.Parts[0].Text
}

func TestGeminiGenerateContent(t *testing.T) {
	tests := []struct {
		name        string
		cfg         Handler
		path        string
		wantVersion string
		wantReply   string
		wantC       int
	}{
		{"defaults", Handler{Dialect: DialectGemini}, geminiGenerate, "gemini-x", DefaultReply, DefaultChunks},
		{"vertex-style prefix", Handler{Dialect: DialectGemini, Chunks: 2, Reply: "é\"\n"},
			"/v1/projects/p/locations/us/publishers/google/models/gemini-2.5-pro:generateContent", "gemini-2.5-pro", "é\"\n", 2},
		{"configured model", Handler{Dialect: DialectGemini, Model: "gemini-mock"}, geminiGenerate, "gemini-mock", DefaultReply, DefaultChunks},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := serve(t, tt.cfg, nil)
			resp := s.post(t, tt.path, geminiBody)
			body := readAll(t, resp)
			if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "application/json" {
				t.Fatalf("expected 200 application/json, got %d %q: %s", resp.StatusCode, resp.Header.Get("Content-Type"), body)
			}
			var r geminiResp
			if err := json.Unmarshal([]byte(body), &r); err != nil {
				t.Fatalf("body %q: %v", body, err)
			}
			if got := partText(t, r); got != tt.wantReply {
				t.Errorf("expected %q, got %q", tt.wantReply, got)
			}
			if fr := r.Candidates[0].FinishReason; fr == nil || *fr != "STOP" {
				t.Errorf("expected finishReason STOP, got %s", body)
			}
			p := tokensOf(geminiBody)
			if u := r.UsageMetadata; u == nil || u.PromptTokenCount != p || u.CandidatesTokenCount != tt.wantC || u.TotalTokenCount != p+tt.wantC {
				t.Errorf("expected usage %d+%d, got %s", p, tt.wantC, body)
			}
			if r.ModelVersion != tt.wantVersion {
				t.Errorf("expected modelVersion %q, got %q", tt.wantVersion, r.ModelVersion)
			}
			// Stats report the model the path named, whatever answered.
			if st := s.h.Stats(); st.LastModel != strings.TrimSuffix(tt.path[strings.LastIndex(tt.path, "/")+1:], ":generateContent") {
				t.Errorf("expected last_model from the path, got %q", st.LastModel)
			}
			for name := range resp.Header {
				if strings.Contains(strings.ToLower(name), "ratelimit") {
					t.Errorf("expected no rate-limit headers, got %s", name)
				}
			}
			if tt.name == "defaults" {
				p := tokensOf(geminiBody)
				want := `{"candidates":[{"content":{"role":"model","parts":[{"text":"Hello from llm_mock."}]},"finishReason":"STOP","index":0}],"usageMetadata":{"promptTokenCount":` +
					strconv.Itoa(p) + `,"candidatesTokenCount":5,"totalTokenCount":` + strconv.Itoa(p+5) + `},"modelVersion":"gemini-x"}`
				if body != want {
					t.Errorf("expected exactly %s, got %s", want, body)
				}
			}
		})
	}
}

func TestGeminiStreamSSE(t *testing.T) {
	tests := []struct {
		name      string
		cfg       Handler
		wantReply string
		wantC     int
	}{
		{"defaults", Handler{Dialect: DialectGemini}, DefaultReply, DefaultChunks},
		{"one chunk", Handler{Dialect: DialectGemini, Chunks: 1}, DefaultReply, 1},
		{"empty pieces", Handler{Dialect: DialectGemini, Chunks: 4, Reply: "日本"}, "日本", 4},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := serve(t, tt.cfg, nil)
			resp := s.post(t, geminiStreamSSE, geminiBody)
			if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "text/event-stream" {
				t.Fatalf("expected a 200 event stream, got %d %q", resp.StatusCode, resp.Header.Get("Content-Type"))
			}
			es := readEvents(resp, time.Now())
			if es.err != nil {
				t.Fatalf("expected a clean end, got %v", es.err)
			}
			if len(es.events) != tt.wantC {
				t.Fatalf("expected %d events (one per chunk, no [DONE]), got %d: %+v", tt.wantC, len(es.events), es.events)
			}
			var joined strings.Builder
			for i, e := range es.events {
				if e.name != "" {
					t.Errorf("event %d: expected no event name, got %q", i, e.name)
				}
				var r geminiResp
				if err := json.Unmarshal([]byte(e.data), &r); err != nil {
					t.Fatalf("event %d %q: %v", i, e.data, err)
				}
				joined.WriteString(partText(t, r))
				if r.ModelVersion != "gemini-x" {
					t.Errorf("event %d: expected modelVersion gemini-x, got %q", i, r.ModelVersion)
				}
				last := i == len(es.events)-1
				fr := r.Candidates[0].FinishReason
				if last != (fr != nil) || last != (r.UsageMetadata != nil) {
					t.Errorf("event %d: expected finishReason and usageMetadata only on the last event, got %s", i, e.data)
				}
				if last {
					p := tokensOf(geminiBody)
					if *fr != "STOP" || r.UsageMetadata.PromptTokenCount != p || r.UsageMetadata.CandidatesTokenCount != tt.wantC ||
						r.UsageMetadata.TotalTokenCount != p+tt.wantC {
						t.Errorf("unexpected last event %s", e.data)
					}
				}
			}
			if joined.String() != tt.wantReply {
				t.Errorf("expected parts to join to %q, got %q", tt.wantReply, joined.String())
			}
			if st := s.h.Stats(); st.LastModel != "gemini-x" || st.Requests != 1 {
				t.Errorf("expected 1 request for gemini-x, got %+v", st)
			}
		})
	}
}

func TestGeminiStreamArray(t *testing.T) {
	s := serve(t, Handler{Dialect: DialectGemini, Chunks: 3, ChunkInterval: caddy.Duration(5 * time.Millisecond)}, nil)
	resp := s.post(t, geminiStreamArr, geminiBody)
	body := readAll(t, resp)
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "application/json" {
		t.Fatalf("expected 200 application/json, got %d %q", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	var rs []geminiResp
	if err := json.Unmarshal([]byte(body), &rs); err != nil {
		t.Fatalf("expected a JSON array, got %q: %v", body, err)
	}
	var joined strings.Builder
	for i, r := range rs {
		joined.WriteString(partText(t, r))
		if last := i == len(rs)-1; last != (r.Candidates[0].FinishReason != nil) || last != (r.UsageMetadata != nil) {
			t.Errorf("element %d: expected finishReason and usage only last, got %+v", i, r)
		}
	}
	if len(rs) != 3 || joined.String() != DefaultReply {
		t.Errorf("expected 3 elements joining to the reply, got %d %q", len(rs), joined.String())
	}
}

func TestGeminiRateLimit(t *testing.T) {
	clock := newFakeClock()
	s := serve(t, Handler{Dialect: DialectGemini, RateLimit: &RateLimit{Requests: 2, Window: caddy.Duration(10 * time.Second)}}, clock)
	for i := range 2 {
		resp := s.post(t, geminiGenerate, geminiBody)
		readAll(t, resp)
		if resp.StatusCode != 200 {
			t.Fatalf("request %d: expected 200, got %d", i, resp.StatusCode)
		}
	}
	clock.advance(3500 * time.Millisecond)
	for _, path := range []string{geminiGenerate, geminiStreamSSE} {
		resp := s.post(t, path, geminiBody)
		body := readAll(t, resp)
		if resp.StatusCode != 429 || resp.Header.Get("Content-Type") != "application/json" {
			t.Fatalf("%s: expected a 429 JSON error, got %d %q", path, resp.StatusCode, resp.Header.Get("Content-Type"))
		}
		for name := range resp.Header {
			if n := strings.ToLower(name); strings.Contains(n, "ratelimit") || n == "retry-after" {
				t.Errorf("expected no rate-limit headers from Gemini, got %s", name)
			}
		}
		e := decodeRPCError(t, body)
		id, model, value, delay := quotaInfo(t, e)
		if id != "GenerateRequestsPerMinutePerProjectPerModel-FreeTier" || model != "gemini-x" || value != "2" {
			t.Errorf("expected the per-minute requests quota of gemini-x (2), got %q %q %q", id, model, value)
		}
		if delay != "7s" { // 6.5s to the window's end, rounded up
			t.Errorf("expected retryDelay 7s, got %q", delay)
		}
		if !strings.Contains(e.Message, "Please retry in 6.5s.") {
			t.Errorf("expected the exact wait in the message, got %q", e.Message)
		}
	}
	if st := s.h.Stats(); st.RateLimited != 2 {
		t.Errorf("expected 2 rate limited, got %+v", st)
	}
	clock.advance(6500 * time.Millisecond)
	resp := s.post(t, geminiGenerate, geminiBody)
	readAll(t, resp)
	if resp.StatusCode != 200 {
		t.Errorf("expected a new window, got %d", resp.StatusCode)
	}

	t.Run("tokens", func(t *testing.T) {
		per := tokensOf(geminiBody) + DefaultChunks
		s := serve(t, Handler{Dialect: DialectGemini, RateLimit: &RateLimit{Tokens: per}}, newFakeClock())
		readAll(t, s.post(t, geminiGenerate, geminiBody))
		resp := s.post(t, geminiGenerate, geminiBody)
		body := readAll(t, resp)
		if resp.StatusCode != 429 {
			t.Fatalf("expected 429, got %d", resp.StatusCode)
		}
		id, _, value, delay := quotaInfo(t, decodeRPCError(t, body))
		if id != "GenerateContentInputTokensPerModelPerMinute-FreeTier" || value != strconv.Itoa(per) || delay != "60s" {
			t.Errorf("expected the per-minute input tokens quota, 60s, got %q %q %q", id, value, delay)
		}
	})
}

func TestGeminiFaultRateLimit(t *testing.T) {
	clock := newFakeClock()
	tests := []struct {
		name   string
		cfg    Handler
		status int
		id     string
		value  string
		delay  string
	}{
		{"default", Handler{Faults: []Fault{{Kind: FaultRateLimit}}}, 429, "GenerateRequestsPerMinutePerProjectPerModel-FreeTier", "", "60s"},
		{"per day", Handler{Faults: []Fault{{Kind: FaultRateLimit, QuotaID: geminiPerDay, RetryDelay: caddy.Duration(42 * time.Second)}}},
			429, geminiPerDay, "", "42s"},
		{"window end", Handler{RateLimit: &RateLimit{Requests: 15, Window: caddy.Duration(20 * time.Second)}, Faults: []Fault{{Kind: FaultRateLimit}}},
			429, "GenerateRequestsPerMinutePerProjectPerModel-FreeTier", "15", "20s"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.cfg.Dialect = DialectGemini
			s := serve(t, tt.cfg, clock)
			for _, path := range []string{geminiGenerate, geminiStreamSSE, geminiStreamArr} {
				resp := s.post(t, path, geminiBody)
				body := readAll(t, resp)
				if resp.StatusCode != tt.status || resp.Header.Get("Retry-After") != "" {
					t.Fatalf("%s: expected %d without Retry-After, got %d %v", path, tt.status, resp.StatusCode, resp.Header)
				}
				id, model, value, delay := quotaInfo(t, decodeRPCError(t, body))
				if id != tt.id || model != "gemini-x" || value != tt.value || delay != tt.delay {
					t.Errorf("%s: expected quota %q of gemini-x (%q) retry %q, got %q %q %q %q", path, tt.id, tt.value, tt.delay, id, model, value, delay)
				}
			}
		})
	}
}

func TestGeminiAuth(t *testing.T) {
	s := serve(t, Handler{Dialect: DialectGemini, APIKey: "AIza-secret", RateLimit: &RateLimit{Requests: 10}}, nil)
	tests := []struct {
		name    string
		query   string
		hdr     []string
		status  int
		rpc     string
		wantKey string
	}{
		{"missing", "", nil, 403, "PERMISSION_DENIED", ""},
		{"bearer is not gemini's", "", []string{"Authorization", "Bearer AIza-secret"}, 403, "PERMISSION_DENIED", ""},
		{"wrong header", "", []string{"x-goog-api-key", "AIza-other"}, 401, "UNAUTHENTICATED", "AIza-other"},
		{"wrong query", "?key=AIza-other", nil, 401, "UNAUTHENTICATED", "AIza-other"},
		{"header wins over query", "?key=AIza-secret", []string{"x-goog-api-key", "AIza-other"}, 401, "UNAUTHENTICATED", "AIza-other"},
		{"right header", "", []string{"x-goog-api-key", "AIza-secret"}, 200, "", "AIza-secret"},
		{"right query", "?key=AIza-secret", nil, 200, "", "AIza-secret"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			resp := s.post(t, geminiGenerate+tt.query, geminiBody, tt.hdr...)
			body := readAll(t, resp)
			if resp.StatusCode != tt.status {
				t.Fatalf("expected %d, got %d: %s", tt.status, resp.StatusCode, body)
			}
			if got := s.h.Stats().LastAPIKey; got != tt.wantKey {
				t.Errorf("expected last_api_key %q, got %q", tt.wantKey, got)
			}
			if tt.rpc == "" {
				return
			}
			if e := decodeRPCError(t, body); e.Code != tt.status || e.Status != tt.rpc || e.Message == "" {
				t.Errorf("expected %d %s, got %s", tt.status, tt.rpc, body)
			}
		})
	}
	// A key query parameter on the streaming path works with alt=sse.
	resp := s.post(t, geminiStreamSSE+"&key=AIza-secret", geminiBody)
	if es := readEvents(resp, time.Now()); resp.StatusCode != 200 || es.err != nil || len(es.events) != DefaultChunks {
		t.Errorf("expected a stream with the query key, got %d %d %v", resp.StatusCode, len(es.events), es.err)
	}
	if st := s.h.Stats(); st.Requests != int64(len(tests)+1) {
		t.Errorf("expected every request counted, got %+v", st)
	}
}

func TestGeminiBadJSONAndPaths(t *testing.T) {
	s := serve(t, Handler{Dialect: DialectGemini}, nil)
	for _, body := range []string{`{"contents":`, `[]`} {
		resp := s.post(t, geminiGenerate, body)
		got := readAll(t, resp)
		if e := decodeRPCError(t, got); resp.StatusCode != 400 || e.Code != 400 || e.Status != "INVALID_ARGUMENT" {
			t.Errorf("%s: expected 400 INVALID_ARGUMENT, got %d %s", body, resp.StatusCode, got)
		}
	}
	readAll(t, s.post(t, "/llm_mock/reset", ""))
	for _, tt := range []struct{ method, path string }{
		{http.MethodPost, "/v1/chat/completions"},
		{http.MethodPost, "/v1/embeddings"},
		{http.MethodPost, "/v1/messages"},
		{http.MethodGet, geminiGenerate},
		{http.MethodPost, "/v1beta/models/:generateContent"},
		{http.MethodPost, "/v1beta/models/a/b:generateContent"},
		{http.MethodPost, "/v1beta/models/gemini-x:countTokens"},
		{http.MethodPost, "/v1beta/models/gemini-x"},
		{http.MethodPost, "/v1beta/tunedModels/t:generateContent"},
	} {
		req, _ := http.NewRequest(tt.method, s.srv.URL+tt.path, strings.NewReader(geminiBody))
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
		t.Errorf("expected misrouted requests not to be counted, got %d", n)
	}
	resp, err := s.srv.Client().Get(s.srv.URL + "/v1beta/models")
	if err != nil {
		t.Fatal(err)
	}
	var list struct {
		Models []struct {
			Name    string   `json:"name"`
			Methods []string `json:"supportedGenerationMethods"`
		} `json:"models"`
	}
	if err := json.Unmarshal([]byte(readAll(t, resp)), &list); err != nil || len(list.Models) != 1 || list.Models[0].Name != "models/mock" {
		t.Errorf("expected Gemini's model list, got %+v %v", list, err)
	}
}

func TestGeminiFaultStatus(t *testing.T) {
	tests := []struct {
		status int
		rpc    string
	}{
		{0, "INTERNAL"}, // default 500
		{400, "INVALID_ARGUMENT"},
		{401, "UNAUTHENTICATED"},
		{403, "PERMISSION_DENIED"},
		{404, "NOT_FOUND"},
		{409, "ABORTED"},
		{418, "FAILED_PRECONDITION"},
		{429, "RESOURCE_EXHAUSTED"},
		{499, "CANCELLED"},
		{501, "UNIMPLEMENTED"},
		{502, "UNKNOWN"},
		{503, "UNAVAILABLE"},
		{504, "DEADLINE_EXCEEDED"},
	}
	for _, tt := range tests {
		t.Run(strconv.Itoa(tt.status), func(t *testing.T) {
			s := serve(t, Handler{Dialect: DialectGemini, Faults: []Fault{{Kind: FaultStatus, Status: tt.status}}}, nil)
			for _, path := range []string{geminiGenerate, geminiStreamSSE} {
				resp := s.post(t, path, geminiBody)
				body := readAll(t, resp)
				want := statusOr(tt.status, 500)
				if resp.StatusCode != want {
					t.Fatalf("expected %d, got %d", want, resp.StatusCode)
				}
				msg := "mock status " + strconv.Itoa(want)
				if want == 503 {
					msg = "The model is overloaded. Please try again later."
				}
				wantBody := `{"error":{"code":` + strconv.Itoa(want) + `,"status":"` + tt.rpc + `","message":"` + msg + `"}}`
				if body != wantBody {
					t.Errorf("expected %s, got %s", wantBody, body)
				}
			}
		})
	}
}

func TestGeminiFaultErrorEvent(t *testing.T) {
	const overloaded = `{"error":{"code":503,"status":"UNAVAILABLE","message":"The model is overloaded."}}`
	tests := []struct {
		name       string
		fault      Fault
		wantChunks int
		wantData   string
	}{
		{"default", Fault{Kind: FaultErrorEvent}, 1, overloaded},
		{"after 0", Fault{Kind: FaultErrorEvent, After: intp(0)}, 0, overloaded},
		{"after all chunks", Fault{Kind: FaultErrorEvent, After: intp(DefaultChunks)}, DefaultChunks, overloaded},
		{"custom body", Fault{Kind: FaultErrorEvent, After: intp(2), Body: `{"error":{"code":500}}`}, 2, `{"error":{"code":500}}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := serve(t, Handler{Dialect: DialectGemini, Faults: []Fault{tt.fault}}, nil)
			resp := s.post(t, geminiStreamSSE, geminiBody)
			es := readEvents(resp, time.Now())
			if resp.StatusCode != 200 || es.err != nil {
				t.Fatalf("expected a 200 stream that ends cleanly, got %d %v", resp.StatusCode, es.err)
			}
			if len(es.events) != tt.wantChunks+1 {
				t.Fatalf("expected %d chunks and the error, got %+v", tt.wantChunks, es.events)
			}
			for i, e := range es.events[:tt.wantChunks] {
				var r geminiResp
				if err := json.Unmarshal([]byte(e.data), &r); err != nil {
					t.Fatal(err)
				}
				partText(t, r)
				if r.Candidates[0].FinishReason != nil || r.UsageMetadata != nil {
					t.Errorf("chunk %d: expected no finishReason before an error, got %s", i, e.data)
				}
			}
			if got := es.events[len(es.events)-1].data; got != tt.wantData {
				t.Errorf("expected error event %s, got %s", tt.wantData, got)
			}
		})
	}
	t.Run("array", func(t *testing.T) {
		s := serve(t, Handler{Dialect: DialectGemini, Faults: []Fault{{Kind: FaultErrorEvent, After: intp(2)}}}, nil)
		resp := s.post(t, geminiStreamArr, geminiBody)
		var rs []geminiResp
		if err := json.Unmarshal([]byte(readAll(t, resp)), &rs); err != nil {
			t.Fatal(err)
		}
		if len(rs) != 3 || rs[2].Error == nil || rs[2].Error.Code != 503 || rs[2].Error.Status != "UNAVAILABLE" || len(rs[2].Candidates) != 0 {
			t.Errorf("expected 2 chunks then the error element, got %+v", rs)
		}
	})
	t.Run("plain", func(t *testing.T) {
		s := serve(t, Handler{Dialect: DialectGemini, Faults: []Fault{{Kind: FaultErrorEvent}}}, nil)
		resp := s.post(t, geminiGenerate, geminiBody)
		if body := readAll(t, resp); resp.StatusCode != 503 || body != overloaded {
			t.Errorf("expected 503 %s, got %d %s", overloaded, resp.StatusCode, body)
		}
	})
}

func TestGeminiFaultCut(t *testing.T) {
	for _, after := range []int{0, 2, DefaultChunks} {
		t.Run("stream after "+strconv.Itoa(after), func(t *testing.T) {
			s := serve(t, Handler{Dialect: DialectGemini, Faults: []Fault{{Kind: FaultCut, After: intp(after)}}}, nil)
			es := readEvents(s.post(t, geminiStreamSSE, geminiBody), time.Now())
			if !errors.Is(es.err, io.ErrUnexpectedEOF) {
				t.Errorf("expected unexpected EOF, got %v", es.err)
			}
			if len(es.events) != after {
				t.Errorf("expected %d chunks before the cut, got %d", after, len(es.events))
			}
			for _, e := range es.events {
				if strings.Contains(e.data, "finishReason") {
					t.Errorf("expected no finishReason in a cut stream, got %s", e.data)
				}
			}
		})
	}
	t.Run("array", func(t *testing.T) {
		s := serve(t, Handler{Dialect: DialectGemini, Faults: []Fault{{Kind: FaultCut, After: intp(2)}}}, nil)
		resp := s.post(t, geminiStreamArr, geminiBody)
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if !errors.Is(err, io.ErrUnexpectedEOF) || strings.HasSuffix(string(b), "]") || strings.Count(string(b), `"candidates"`) != 2 {
			t.Errorf("expected 2 elements then an abort, got %q %v", b, err)
		}
	})
	t.Run("plain", func(t *testing.T) {
		s := serve(t, Handler{Dialect: DialectGemini, Faults: []Fault{{Kind: FaultCut}}}, nil)
		resp := s.post(t, geminiGenerate, geminiBody)
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if resp.StatusCode != 200 || !errors.Is(err, io.ErrUnexpectedEOF) || int64(len(b)) != resp.ContentLength/2 {
			t.Errorf("expected 200 then half the body and unexpected EOF, got %d %d/%d %v", resp.StatusCode, len(b), resp.ContentLength, err)
		}
	})
}

func TestGeminiFaultKeepAlive(t *testing.T) {
	const ftd = 400 * time.Millisecond
	s := serve(t, Handler{
		Dialect:         DialectGemini,
		FirstTokenDelay: caddy.Duration(ftd),
		Faults:          []Fault{{Kind: FaultKeepAlive}, {Kind: FaultStatus, Status: 503}},
	}, nil)
	start := time.Now()
	es := readEvents(s.post(t, geminiStreamSSE, geminiBody), start)
	if es.err != nil || len(es.events) != DefaultChunks {
		t.Fatalf("expected a complete stream, got %d events %v", len(es.events), es.err)
	}
	if es.comments < 2 || es.comments > 4 { // at 0, 100, 200 and 300ms, barring scheduler delays
		t.Errorf("expected 4 keep-alive comments, got %d", es.comments)
	}
	if es.events[0].at < ftd {
		t.Errorf("expected the first chunk after %s, got %s", ftd, es.events[0].at)
	}

	// A JSON array stream cannot carry comments: only the delay.
	start = time.Now()
	resp := s.post(t, geminiStreamArr, geminiBody)
	body := readAll(t, resp)
	var rs []geminiResp
	if err := json.Unmarshal([]byte(body), &rs); err != nil || len(rs) != DefaultChunks || !strings.HasPrefix(body, "[") {
		t.Errorf("expected a plain JSON array, got %q %v", body, err)
	}
	if d := time.Since(start); d < ftd {
		t.Errorf("expected the first token delay, took %s", d)
	}

	resp = s.post(t, geminiGenerate, geminiBody)
	readAll(t, resp)
	if resp.StatusCode != 503 {
		t.Errorf("expected keepalive to skip plain requests, got %d", resp.StatusCode)
	}
}

func TestGeminiFaultMalformed(t *testing.T) {
	const broken = `{"candidates":[{"content":{"role":"model","parts":[{"text":"x`
	s := serve(t, Handler{Dialect: DialectGemini, Faults: []Fault{{Kind: FaultMalformed, After: intp(2)}}}, nil)
	ev := readSSE(s.post(t, geminiStreamSSE, geminiBody), time.Now())
	if ev.err != nil || len(ev.data) != 3 {
		t.Fatalf("expected 2 chunks, the broken one and a clean end, got %q %v", ev.data, ev.err)
	}
	var text strings.Builder
	for _, d := range ev.data[:2] {
		var r geminiResp
		if err := json.Unmarshal([]byte(d), &r); err != nil {
			t.Fatalf("chunk %s: %v", d, err)
		}
		text.WriteString(partText(t, r))
	}
	if want := strings.Join(splitReply(DefaultReply, DefaultChunks)[:2], ""); text.String() != want {
		t.Errorf("expected %q before the broken chunk, got %q", want, text.String())
	}
	if ev.data[2] != broken {
		t.Errorf("expected %s, got %s", broken, ev.data[2])
	}

	// Without ?alt=sse: an array element cut short, the array unclosed.
	body := readAll(t, s.post(t, geminiStreamArr, geminiBody))
	elems := strings.Split(strings.TrimPrefix(body, "["), ",\r\n")
	if !strings.HasPrefix(body, "[") || len(elems) != 3 || elems[2] != broken || json.Valid([]byte(body)) {
		t.Fatalf("expected [ then 2 chunks and the broken one, got %q", body)
	}
	for _, e := range elems[:2] {
		if !json.Valid([]byte(e)) {
			t.Errorf("expected a whole chunk, got %s", e)
		}
	}
}
