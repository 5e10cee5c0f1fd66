package mockllm

import (
	"encoding/base64"
	"encoding/json"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

// The vertex dialect: Google Vertex AI's publisher models, Gemini
// (google: generateContent, streamGenerateContent, as the gemini
// dialect) and Claude (anthropic: rawPredict, streamRawPredict, as the
// anthropic dialect), its errors and quota failures, and a fake OAuth 2
// token endpoint for service accounts (the JWT bearer grant
// cloud.google.com/go/auth makes when a service account key's token_uri
// points at the mock) whose access tokens every vertex request must
// carry. Tokens live in a registry of the process, so vertex mocks
// accept each other's tokens.

// vertexAnthropicVersion is the anthropic_version Vertex requires in
// a Claude request.
const vertexAnthropicVersion = "vertex-2023-10-16"

const (
	// jwtBearerGrant is the grant_type of a service account's token
	// request.
	jwtBearerGrant = "urn:ietf:params:oauth:grant-type:jwt-bearer"
	// cloudPlatformScope is the scope Vertex AI needs.
	cloudPlatformScope = "https://www.googleapis.com/auth/cloud-platform"

	vertexUnauthenticated = "Request had invalid authentication credentials. Expected OAuth 2 access token, login cookie or other valid authentication credential. See https://developers.google.com/identity/sign-in/web/devconsole-project."
	vertexSharedQuota     = "Resource exhausted. Please try again later. Please refer to https://cloud.google.com/vertex-ai/generative-ai/docs/error-code-429 for more details."

	// Vertex quotas of a base model (after aiplatform.googleapis.com/).
	vertexRequestsPerMinute = "generate_content_requests_per_minute_per_project_per_base_model"
	vertexRequestsPerDay    = "generate_content_requests_per_day_per_project_per_base_model"
	vertexTokensPerMinute   = "generate_content_input_tokens_per_minute_per_base_model"
)

// vertexRoute matches .../projects/{p}/locations/{l}/publishers/
// {publisher}/models/{model}:{method}.
func vertexRoute(r *http.Request) (call, bool) {
	p := r.URL.Path
	i := strings.LastIndex(p, "/projects/")
	if i < 0 {
		return call{}, false
	}
	s := strings.Split(p[i+1:], "/")
	if len(s) != 8 || s[1] == "" || s[2] != "locations" || s[3] == "" || s[4] != "publishers" || s[6] != "models" {
		return call{}, false
	}
	model, method, ok := strings.Cut(s[7], ":")
	if !ok || model == "" {
		return call{}, false
	}
	switch s[5] + ":" + method {
	case "google:generateContent":
		return call{ep: epGenerate, wire: wireGemini, model: model}, true
	case "google:streamGenerateContent":
		return call{ep: epStreamGenerate, wire: wireGemini, model: model, array: r.URL.Query().Get("alt") != "sse"}, true
	case "anthropic:rawPredict":
		return call{ep: epRawPredict, wire: wireAnthropic, model: model}, true
	case "anthropic:streamRawPredict":
		return call{ep: epStreamRaw, wire: wireAnthropic, model: model}, true
	}
	return call{}, false
}

// checkVertexAnthropicBody checks a Claude request on Vertex (a JSON
// object) and returns why it is rejected, or "".
func checkVertexAnthropicBody(body []byte) string {
	var m map[string]json.RawMessage
	_ = json.Unmarshal(body, &m)
	v, ok := m["anthropic_version"]
	if !ok {
		return "anthropic_version: Field required"
	}
	var version string
	if json.Unmarshal(v, &version) != nil || version != vertexAnthropicVersion {
		return "anthropic_version: Input should be '" + vertexAnthropicVersion + "'"
	}
	if _, ok := m["model"]; ok {
		return "model: Extra inputs are not permitted (Vertex AI takes the model from the URL)"
	}
	return ""
}

// vertexStatus is a google.rpc.Status in Vertex's field order.
type vertexStatus struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
	Status  string `json:"status"`
	Details []any  `json:"details,omitempty"`
}

// vertexError is a Vertex AI error body.
func vertexError(code int, msg string) []byte {
	return marshalVertexError(code, googleStatusName(code), msg, nil)
}

// vertexQuotaError is a RESOURCE_EXHAUSTED body of Vertex: the dynamic
// shared quota, or a per-minute or per-day quota (quotaID, default
// Vertex's requests quota) of the base model; with a RetryInfo when
// retry > 0.
func vertexQuotaError(code int, quota, quotaID, model string, retry time.Duration) []byte {
	msg := vertexSharedQuota
	switch quota {
	case QuotaPerMinute, QuotaPerDay:
		if quotaID == "" {
			quotaID = vertexRequestsPerMinute
			if quota == QuotaPerDay {
				quotaID = vertexRequestsPerDay
			}
		}
		msg = "Quota exceeded for aiplatform.googleapis.com/" + quotaID + " with base model: " + model +
			". Please submit a quota increase request. https://cloud.google.com/vertex-ai/docs/generative-ai/quotas-genai."
	}
	var details []any
	if retry > 0 {
		details = []any{retryInfo{Type: "type.googleapis.com/google.rpc.RetryInfo", RetryDelay: strconv.FormatInt(retryAfterSeconds(retry), 10) + "s"}}
	}
	return marshalVertexError(code, "RESOURCE_EXHAUSTED", msg, details)
}

func marshalVertexError(code int, status, msg string, details []any) []byte {
	return appendJSON(nil, &struct {
		Error vertexStatus `json:"error"`
	}{vertexStatus{Code: code, Message: msg, Status: status, Details: details}})
}

// vertexModels is a model list in the form of Vertex's publisher models.
func vertexModels(id string) []byte {
	type model struct {
		Name string `json:"name"`
	}
	return appendJSON(nil, &struct {
		PublisherModels [1]model `json:"publisherModels"`
	}{[1]model{{Name: "publishers/google/models/" + id}}})
}

// issuedToken is an access token the token endpoint gave.
type issuedToken struct {
	expires   time.Time // last instant it is accepted, on the issuer's clock
	principal string    // the JWT's iss: the service account
}

// accessTokens are the tokens of every vertex mock of the process.
var accessTokens struct {
	mu sync.Mutex
	n  uint64
	m  map[string]issuedToken
}

// maxTokens bounds the registry; past it expired tokens are dropped.
const maxTokens = 1 << 12

// issueToken registers a new token valid until expires.
func issueToken(principal string, now, expires time.Time) string {
	accessTokens.mu.Lock()
	defer accessTokens.mu.Unlock()
	accessTokens.n++
	tok := "ya29.mock-" + strconv.FormatUint(accessTokens.n, 10)
	if accessTokens.m == nil {
		accessTokens.m = make(map[string]issuedToken)
	}
	if len(accessTokens.m) >= maxTokens {
		for k, t := range accessTokens.m {
			if t.expires.Before(now) {
				delete(accessTokens.m, k)
			}
		}
	}
	accessTokens.m[tok] = issuedToken{expires: expires, principal: principal}
	return tok
}

// lookupToken finds an issued token, expired or not.
func lookupToken(tok string) (issuedToken, bool) {
	accessTokens.mu.Lock()
	defer accessTokens.mu.Unlock()
	t, ok := accessTokens.m[tok]
	return t, ok
}

// tokenValid reports whether tok was issued and has not expired.
func (h *Handler) tokenValid(tok string) bool {
	if tok == "" {
		return false
	}
	t, ok := lookupToken(tok)
	return ok && !h.now().After(t.expires)
}

// jwtClaims are the claims of a service account's assertion the token
// endpoint checks.
type jwtClaims struct {
	Iss   string   `json:"iss"`
	Scope string   `json:"scope"`
	Aud   string   `json:"aud"`
	Exp   *float64 `json:"exp"`
}

// parseJWT decodes the claims of a JWS compact serialization: three
// base64url parts, a JSON header, JSON claims and a signature (not
// checked: the mock does not know the service account's key).
func parseJWT(s string) (jwtClaims, bool) {
	var c jwtClaims
	parts := strings.Split(s, ".")
	if len(parts) != 3 || parts[2] == "" {
		return c, false
	}
	dec := func(p string) ([]byte, error) { return base64.RawURLEncoding.DecodeString(strings.TrimRight(p, "=")) }
	head, err1 := dec(parts[0])
	claims, err2 := dec(parts[1])
	_, err3 := dec(parts[2])
	var hdr map[string]any
	if err1 != nil || err2 != nil || err3 != nil || json.Unmarshal(head, &hdr) != nil || hdr == nil || json.Unmarshal(claims, &c) != nil {
		return c, false
	}
	return c, true
}

// serveToken is the token endpoint: a JWT bearer grant whose assertion
// asks for the cloud-platform scope, addressed to this endpoint (aud:
// its URL; the scheme is not compared), issued by someone (iss) and not
// expired gets an access token for TokenLifetime; other requests get
// 400 invalid_grant. Token requests are not API requests: no latency,
// fault or rate limit applies, and they are counted in
// Stats.TokensIssued or TokensRefused only.
func (h *Handler) serveToken(w http.ResponseWriter, r *http.Request) {
	r.Body = http.MaxBytesReader(w, r.Body, 1<<20)
	refuse := func(desc string) {
		h.st.mu.Lock()
		h.st.stats.TokensRefused++
		h.st.mu.Unlock()
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": "invalid_grant", "error_description": desc})
	}
	if err := r.ParseForm(); err != nil {
		refuse("Invalid request body.")
		return
	}
	if g := r.PostForm.Get("grant_type"); g != jwtBearerGrant {
		refuse("Invalid grant_type: " + g)
		return
	}
	claims, ok := parseJWT(r.PostForm.Get("assertion"))
	if !ok {
		refuse("Invalid JWT: the assertion is not a JWT (three base64url parts: JSON header, JSON claims, signature).")
		return
	}
	path := r.URL.Path
	if orig, ok := r.Context().Value(caddyhttp.OriginalRequestCtxKey).(http.Request); ok && orig.URL != nil {
		path = orig.URL.Path
	}
	now := h.now()
	aud, err := url.Parse(claims.Aud)
	switch {
	case !slices.Contains(strings.Fields(claims.Scope), cloudPlatformScope):
		refuse("Invalid OAuth scope or ID token audience provided.")
	case err != nil || !strings.EqualFold(aud.Host, r.Host) || aud.Path != path:
		scheme := "http"
		if r.TLS != nil {
			scheme = "https"
		}
		refuse("Invalid JWT: Failed audience check. The right audience is " + scheme + "://" + r.Host + path)
	case claims.Iss == "":
		refuse("Invalid JWT: No issuer (iss) claim.")
	case claims.Exp == nil || !time.Unix(int64(*claims.Exp), 0).After(now):
		refuse("Invalid JWT: Token must be a short-lived token (60 minutes) and in a reasonable timeframe. Check your iat and exp values in the JWT claim.")
	default:
		life := h.tokenLifetime()
		tok := issueToken(claims.Iss, now, now.Add(life+time.Second))
		h.st.mu.Lock()
		h.st.stats.TokensIssued++
		h.st.mu.Unlock()
		w.Header().Set("Cache-Control", "no-store")
		writeBody(w, http.StatusOK, appendJSON(nil, &struct {
			AccessToken string `json:"access_token"`
			ExpiresIn   int64  `json:"expires_in"`
			TokenType   string `json:"token_type"`
		}{tok, retryAfterSeconds(life), "Bearer"}))
	}
}
