package mockllm

import (
	"maps"
	"net/http"
	"strings"
	"time"
)

// Stats: what reached the provider, how requests are counted in it,
// and reading and resetting it from Go.

// Stats describe what reached the provider: API requests (chat
// completions, embeddings, messages, generateContent), faulted and
// rejected ones included.
type Stats struct {
	// Requests is the number of requests received.
	Requests int64 `json:"requests"`
	// Faults is the number of answers a fault was injected into.
	Faults int64 `json:"faults"`
	// RateLimited is the number of 429s sent because of RateLimit.
	RateLimited int64 `json:"rate_limited"`
	// CountTokens is the number of count_tokens requests (anthropic
	// dialect), which are not counted in Requests.
	CountTokens int64 `json:"count_tokens"`
	// LastModel is the model named by the last request's body, or in
	// the gemini dialect by its path.
	LastModel string `json:"last_model"`
	// LastAuthorization is the last request's Authorization header.
	LastAuthorization string `json:"last_authorization"`
	// LastAPIKey is the API key the last request sent where the
	// dialect expects it (see Handler.APIKey): the Bearer token of
	// Authorization, x-api-key, or x-goog-api-key else ?key=; empty
	// when it sent none.
	LastAPIKey string `json:"last_api_key"`
	// LastHeaders are the last request's headers, values joined by ", ".
	LastHeaders map[string]string `json:"last_headers"`
	// LastBody is the last request's body.
	LastBody string `json:"last_body"`
}

// Stats returns what has reached the provider so far.
func (h *Handler) Stats() Stats {
	if h.st == nil {
		return Stats{LastHeaders: map[string]string{}}
	}
	h.st.mu.Lock()
	s := h.st.stats
	h.st.mu.Unlock()
	s.LastHeaders = maps.Clone(s.LastHeaders)
	if s.LastHeaders == nil {
		s.LastHeaders = map[string]string{}
	}
	return s
}

// Reset zeroes the counters, forgets the last request and restarts
// the rate-limit window. Fault From/For windows keep counting from
// provision.
func (h *Handler) Reset() {
	if h.st == nil {
		return
	}
	h.st.mu.Lock()
	h.st.stats = Stats{}
	h.st.rlStart = time.Time{}
	h.st.rlRequests, h.st.rlTokens = 0, 0
	h.st.prefixes = nil
	h.st.mu.Unlock()
}

// record counts a request in Stats and returns its 1-based number.
func (h *Handler) record(r *http.Request, model, key string, body []byte) int64 {
	return h.recordAs(r, model, key, body, &h.st.stats.Requests)
}

// recordAs is record counting the request in counter (a field of
// h.st.stats).
func (h *Handler) recordAs(r *http.Request, model, key string, body []byte, counter *int64) int64 {
	hdrs := make(map[string]string, len(r.Header))
	for k, v := range r.Header {
		hdrs[k] = strings.Join(v, ", ")
	}
	h.st.mu.Lock()
	defer h.st.mu.Unlock()
	s := &h.st.stats
	*counter++
	s.LastModel = model
	s.LastAuthorization = r.Header.Get("Authorization")
	s.LastAPIKey = key
	s.LastHeaders = hdrs
	s.LastBody = string(body)
	return *counter
}
