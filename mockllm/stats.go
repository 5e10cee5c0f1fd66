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
// completions, embeddings, messages, generateContent, invoke, converse,
// rawPredict), faulted and rejected ones included.
type Stats struct {
	// Requests is the number of requests received.
	Requests int64 `json:"requests"`
	// Faults is the number of answers a fault was injected into.
	Faults int64 `json:"faults"`
	// RateLimited is the number of 429s sent because of RateLimit.
	RateLimited int64 `json:"rate_limited"`
	// Continuations is the number of requests asking to continue the
	// conversation's final assistant message (Handler.Continuation),
	// whether answered, rejected (400) or faulted.
	Continuations int64 `json:"continuations"`
	// CountTokens is the number of count_tokens requests (anthropic
	// dialect), which are not counted in Requests.
	CountTokens int64 `json:"count_tokens"`
	// AuthAccepted is the number of requests whose credentials were
	// checked and accepted: an API key (Handler.APIKey), a SigV4
	// signature (Handler.AWSCredentials) or a vertex access token.
	// Requests to a mock that requires no credentials are not counted.
	AuthAccepted int64 `json:"auth_accepted"`
	// AuthRefused is the number of requests refused for their
	// credentials (401, or 403 in the gemini and bedrock dialects).
	AuthRefused int64 `json:"auth_refused"`
	// TokensIssued is the number of access tokens the vertex dialect's
	// token endpoint issued (this handler's; the tokens themselves are
	// shared by every vertex mock of the process).
	TokensIssued int64 `json:"tokens_issued"`
	// TokensRefused is the number of token requests it refused (400
	// invalid_grant).
	TokensRefused int64 `json:"tokens_refused"`
	// LastModel is the model named by the last request's body, or in
	// the gemini, bedrock and vertex dialects by its path (bedrock: the
	// model id unescaped).
	LastModel string `json:"last_model"`
	// LastAuthorization is the last request's Authorization header.
	LastAuthorization string `json:"last_authorization"`
	// LastAPIKey is the API key the last request sent where the
	// dialect expects it (see Handler.APIKey): the Bearer token of
	// Authorization (openai; bedrock: a Bedrock API key; vertex: the
	// access token), x-api-key, or x-goog-api-key else ?key=; empty
	// when it sent none.
	LastAPIKey string `json:"last_api_key"`
	// LastPrincipal is who the last request claimed to be, valid or
	// not: the access key id of its SigV4 signature (bedrock), the
	// service account (the JWT's iss) its access token was issued to
	// (vertex, known tokens only); else empty.
	LastPrincipal string `json:"last_principal"`
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
// provision, and the vertex access tokens issued stay valid.
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
func (h *Handler) record(r *http.Request, model, key, principal string, body []byte) int64 {
	return h.recordAs(r, model, key, principal, body, &h.st.stats.Requests)
}

// recordAs is record counting the request in counter (a field of
// h.st.stats).
func (h *Handler) recordAs(r *http.Request, model, key, principal string, body []byte, counter *int64) int64 {
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
	s.LastPrincipal = principal
	s.LastHeaders = hdrs
	s.LastBody = string(body)
	return *counter
}
