package mockllm

import (
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"cloud.google.com/go/auth/credentials"
	"github.com/caddyserver/caddy/v2"
)

const (
	vertexGemini     = "/v1/projects/p1/locations/us-central1/publishers/google/models/gemini-2.5-pro"
	vertexClaude     = "/v1/projects/p1/locations/us-east5/publishers/anthropic/models/claude-sonnet-4-5@20250929"
	vertexClaudeBody = `{"anthropic_version":"vertex-2023-10-16","max_tokens":64,"messages":[{"role":"user","content":"hi"}]}`
	testSA           = "router@p1.iam.gserviceaccount.com"
	unauthenticated  = `{"error":{"code":401,"message":"Request had invalid authentication credentials. Expected OAuth 2 access token, login cookie or other valid authentication credential. See https://developers.google.com/identity/sign-in/web/devconsole-project.","status":"UNAUTHENTICATED"}}`
)

// makeJWT is a JWS with claims and a made-up signature.
func makeJWT(claims map[string]any) string {
	enc := func(v any) string {
		b, _ := json.Marshal(v)
		return base64.RawURLEncoding.EncodeToString(b)
	}
	return enc(map[string]string{"alg": "RS256", "typ": "JWT", "kid": "k1"}) + "." + enc(claims) + "." +
		base64.RawURLEncoding.EncodeToString([]byte("not really signed"))
}

// saClaims are the claims a service account's assertion to s has.
func saClaims(s *served) map[string]any {
	now := time.Now()
	return map[string]any{"iss": testSA, "scope": "https://www.googleapis.com/auth/cloud-platform",
		"aud": s.srv.URL + "/token", "iat": now.Unix(), "exp": now.Add(time.Hour).Unix()}
}

func postForm(t *testing.T, s *served, path string, form url.Values) (int, string) {
	t.Helper()
	resp, err := s.srv.Client().PostForm(s.srv.URL+path, form)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, readAll(t, resp)
}

// token gets an access token from s's token endpoint.
func token(t *testing.T, s *served) string {
	t.Helper()
	code, body := postForm(t, s, "/token", url.Values{"grant_type": {jwtBearerGrant}, "assertion": {makeJWT(saClaims(s))}})
	var tok struct {
		AccessToken string `json:"access_token"`
	}
	if code != 200 || json.Unmarshal([]byte(body), &tok) != nil || tok.AccessToken == "" {
		t.Fatalf("expected a token, got %d %s", code, body)
	}
	return tok.AccessToken
}

func bearer(tok string) []string { return []string{"Authorization", "Bearer " + tok} }

func TestVertexTokenEndpoint(t *testing.T) {
	s := serve(t, Handler{Dialect: DialectVertex}, nil)
	code, body := postForm(t, s, "/token", url.Values{"grant_type": {jwtBearerGrant}, "assertion": {makeJWT(saClaims(s))}})
	var tok struct {
		AccessToken string `json:"access_token"`
		ExpiresIn   int    `json:"expires_in"`
		TokenType   string `json:"token_type"`
	}
	if code != 200 || json.Unmarshal([]byte(body), &tok) != nil || !strings.HasPrefix(tok.AccessToken, "ya29.mock-") ||
		tok.ExpiresIn != 3600 || tok.TokenType != "Bearer" || body != `{"access_token":"`+tok.AccessToken+`","expires_in":3600,"token_type":"Bearer"}` {
		t.Fatalf("unexpected token answer %d %s", code, body)
	}
	if st := s.h.Stats(); st.TokensIssued != 1 || st.TokensRefused != 0 || st.Requests != 0 {
		t.Errorf("expected one token issued and no API request, got %+v", st)
	}
	if t2 := token(t, s); t2 == tok.AccessToken {
		t.Errorf("expected a new token each time, got %s twice", t2)
	}

	with := func(k string, v any) map[string]any {
		c := saClaims(s)
		if v == nil {
			delete(c, k)
		} else {
			c[k] = v
		}
		return c
	}
	for _, tt := range []struct {
		name string
		form url.Values
		want string
	}{
		{"grant type", url.Values{"grant_type": {"client_credentials"}, "assertion": {makeJWT(saClaims(s))}}, "grant_type"},
		{"no assertion", url.Values{"grant_type": {jwtBearerGrant}}, "not a JWT"},
		{"two parts", url.Values{"grant_type": {jwtBearerGrant}, "assertion": {"e30.e30"}}, "not a JWT"},
		{"not base64", url.Values{"grant_type": {jwtBearerGrant}, "assertion": {"e30.!!!.c2ln"}}, "not a JWT"},
		{"no scope", url.Values{"grant_type": {jwtBearerGrant}, "assertion": {makeJWT(with("scope", nil))}}, "scope"},
		{"other scope", url.Values{"grant_type": {jwtBearerGrant}, "assertion": {makeJWT(with("scope", "https://www.googleapis.com/auth/devstorage.read_only"))}}, "scope"},
		{"wrong audience", url.Values{"grant_type": {jwtBearerGrant}, "assertion": {makeJWT(with("aud", "https://oauth2.googleapis.com/token"))}}, "audience"},
		{"wrong audience path", url.Values{"grant_type": {jwtBearerGrant}, "assertion": {makeJWT(with("aud", s.srv.URL+"/other/token"))}}, "audience"},
		{"no issuer", url.Values{"grant_type": {jwtBearerGrant}, "assertion": {makeJWT(with("iss", nil))}}, "iss"},
		{"expired", url.Values{"grant_type": {jwtBearerGrant}, "assertion": {makeJWT(with("exp", time.Now().Add(-time.Minute).Unix()))}}, "exp"},
		{"no expiry", url.Values{"grant_type": {jwtBearerGrant}, "assertion": {makeJWT(with("exp", nil))}}, "exp"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			before := s.h.Stats().TokensRefused
			code, body := postForm(t, s, "/token", tt.form)
			var e struct {
				Error       string `json:"error"`
				Description string `json:"error_description"`
			}
			if code != 400 || json.Unmarshal([]byte(body), &e) != nil || e.Error != "invalid_grant" || !strings.Contains(e.Description, tt.want) {
				t.Errorf("expected 400 invalid_grant about %q, got %d %s", tt.want, code, body)
			}
			if got := s.h.Stats().TokensRefused; got != before+1 {
				t.Errorf("expected the refusal counted, got %d", got)
			}
		})
	}

	// token_lifetime sets expires_in, rounded up to whole seconds.
	for _, c := range []struct {
		life time.Duration
		want int
	}{{90 * time.Second, 90}, {1500 * time.Millisecond, 2}} {
		l := serve(t, Handler{Dialect: DialectVertex, TokenLifetime: caddy.Duration(c.life)}, nil)
		_, body := postForm(t, l, "/token", url.Values{"grant_type": {jwtBearerGrant}, "assertion": {makeJWT(saClaims(l))}})
		if !strings.Contains(body, `"expires_in":`+strconv.Itoa(c.want)+",") {
			t.Errorf("lifetime %s: expected expires_in %d, got %s", c.life, c.want, body)
		}
	}
}

func TestVertexAuth(t *testing.T) {
	clock := newFakeClock()
	a := serve(t, Handler{Dialect: DialectVertex, TokenLifetime: caddy.Duration(time.Minute)}, clock)
	b := serve(t, Handler{Dialect: DialectVertex}, clock)
	for _, p := range []struct{ path, body string }{{vertexGemini + ":generateContent", geminiBody}, {vertexClaude + ":rawPredict", vertexClaudeBody}} {
		for _, hdr := range [][]string{nil, bearer(""), bearer("ya29.unknown"), {"Authorization", "ya29.mock-1"}, {"x-goog-api-key", "k"}} {
			resp := a.post(t, p.path, p.body, hdr...)
			if body := readAll(t, resp); resp.StatusCode != 401 || body != unauthenticated {
				t.Errorf("%s with %q: expected 401 UNAUTHENTICATED, got %d %s", p.path, hdr, resp.StatusCode, body)
			}
		}
	}
	if st := a.h.Stats(); st.AuthRefused != 10 || st.AuthAccepted != 0 || st.Requests != 10 {
		t.Errorf("expected 10 refusals counted, got %+v", st)
	}

	tok := token(t, a)
	for _, s := range []*served{a, b} { // b accepts a's token
		for _, p := range []struct{ path, body string }{{vertexGemini + ":generateContent", geminiBody}, {vertexClaude + ":rawPredict", vertexClaudeBody}} {
			if resp := s.post(t, p.path, p.body, bearer(tok)...); resp.StatusCode != 200 {
				t.Errorf("%s: expected the token accepted, got %d %s", p.path, resp.StatusCode, readAll(t, resp))
			}
		}
		if st := s.h.Stats(); st.AuthAccepted != 2 || st.LastPrincipal != testSA || st.LastAPIKey != tok {
			t.Errorf("unexpected stats %+v", st)
		}
	}

	// The token lives its lifetime plus a second, then is refused.
	clock.advance(time.Minute + time.Second)
	if resp := a.post(t, vertexGemini+":generateContent", geminiBody, bearer(tok)...); resp.StatusCode != 200 {
		t.Errorf("expected the token accepted at its end, got %d", resp.StatusCode)
	}
	clock.advance(time.Millisecond)
	for _, s := range []*served{a, b} {
		resp := s.post(t, vertexGemini+":streamGenerateContent?alt=sse", geminiBody, bearer(tok)...)
		if body := readAll(t, resp); resp.StatusCode != 401 || body != unauthenticated {
			t.Errorf("expected an expired token refused, got %d %s", resp.StatusCode, body)
		}
	}
	if st := a.h.Stats(); st.LastPrincipal != testSA {
		t.Errorf("expected the expired token's principal, got %q", st.LastPrincipal)
	}
}

// TestVertexServiceAccount runs cloud.google.com/go/auth's service
// account flow (a JWT bearer grant to the key file's token_uri) against
// the mock, and uses its token.
func TestVertexServiceAccount(t *testing.T) {
	s := serve(t, Handler{Dialect: DialectVertex}, nil)
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	pk := pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: must(x509.MarshalPKCS8PrivateKey(key))})
	sa, _ := json.Marshal(map[string]string{
		"type": "service_account", "project_id": "p1", "private_key_id": "k1", "private_key": string(pk),
		"client_email": testSA, "client_id": "1", "token_uri": s.srv.URL + "/token",
	})
	creds, err := credentials.NewCredentialsFromJSON(credentials.ServiceAccount, sa, &credentials.DetectOptions{
		Scopes: []string{"https://www.googleapis.com/auth/cloud-platform"},
		Client: s.srv.Client(),
	})
	if err != nil {
		t.Fatal(err)
	}
	tok, err := creds.Token(context.Background())
	if err != nil {
		t.Fatalf("expected a token from the mock, got %v", err)
	}
	if !strings.HasPrefix(tok.Value, "ya29.mock-") || time.Until(tok.Expiry) < 59*time.Minute {
		t.Errorf("unexpected token %q expiring %v", tok.Value, tok.Expiry)
	}
	if resp := s.post(t, vertexClaude+":rawPredict", vertexClaudeBody, bearer(tok.Value)...); resp.StatusCode != 200 {
		t.Errorf("expected the token accepted, got %d %s", resp.StatusCode, readAll(t, resp))
	}
	if st := s.h.Stats(); st.TokensIssued != 1 || st.LastPrincipal != testSA {
		t.Errorf("unexpected stats %+v", st)
	}
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

// TestVertexGemini: the google publisher answers exactly as the gemini
// dialect does.
func TestVertexGemini(t *testing.T) {
	cfg := Handler{Chunks: 3, Reply: "Hi <there> é"}
	vc, gc := cfg, cfg
	vc.Dialect, gc.Dialect = DialectVertex, DialectGemini
	v, g := serve(t, vc, nil), serve(t, gc, nil)
	tok := token(t, v)
	for _, m := range []string{":generateContent", ":streamGenerateContent?alt=sse", ":streamGenerateContent"} {
		vr := v.post(t, vertexGemini+m, geminiBody, bearer(tok)...)
		gr := g.post(t, "/v1beta/models/gemini-2.5-pro"+m, geminiBody)
		vb, gb := readAll(t, vr), readAll(t, gr)
		if vr.StatusCode != 200 || vb != gb || vr.Header.Get("Content-Type") != gr.Header.Get("Content-Type") {
			t.Errorf("%s: expected the gemini dialect's %q, got %d %q", m, gb, vr.StatusCode, vb)
		}
	}
	if st := v.h.Stats(); st.LastModel != "gemini-2.5-pro" {
		t.Errorf("expected the path's model, got %q", st.LastModel)
	}
	// Bad JSON is Gemini's 400.
	resp := v.post(t, vertexGemini+":generateContent", `{`, bearer(tok)...)
	if body := readAll(t, resp); resp.StatusCode != 400 || decodeRPCError(t, body).Status != "INVALID_ARGUMENT" {
		t.Errorf("expected 400 INVALID_ARGUMENT, got %d %s", resp.StatusCode, body)
	}
}

// TestVertexAnthropic: the anthropic publisher answers as the anthropic
// dialect does, for the path's model.
func TestVertexAnthropic(t *testing.T) {
	cfg := Handler{Chunks: 3, Reply: "abc<d>"}
	vc, ac := cfg, cfg
	vc.Dialect, ac.Dialect = DialectVertex, DialectAnthropic
	v, a := serve(t, vc, nil), serve(t, ac, nil)
	tok := token(t, v)
	const model = "claude-sonnet-4-5@20250929"
	messagesBody := strings.Replace(vertexClaudeBody, `"anthropic_version":"vertex-2023-10-16"`, `"model":"`+model+`"`, 1)

	vb := readAll(t, v.post(t, vertexClaude+":rawPredict", vertexClaudeBody, bearer(tok)...))
	ab := readAll(t, a.post(t, "/v1/messages", messagesBody))
	var vm, am anthropicMsg
	_ = json.Unmarshal([]byte(vb), &vm)
	_ = json.Unmarshal([]byte(ab), &am)
	vm.ID, am.ID = "", ""
	vm.Usage = am.Usage // bodies differ in size
	if vm.Model != model || len(vm.Content) != 1 || vm.Content[0].Text != "abc<d>" {
		t.Errorf("unexpected rawPredict answer %s", vb)
	}
	vj, _ := json.Marshal(vm)
	aj, _ := json.Marshal(am)
	if string(vj) != string(aj) {
		t.Errorf("expected the anthropic dialect's %s, got %s", aj, vj)
	}

	streamBody := strings.Replace(vertexClaudeBody, "{", `{"stream":true,`, 1)
	for _, c := range []struct{ method, body string }{
		{":streamRawPredict", streamBody},
		{":streamRawPredict", vertexClaudeBody}, // the method streams
		{":rawPredict", streamBody},             // as does "stream": true
	} {
		resp := v.post(t, vertexClaude+c.method, c.body, bearer(tok)...)
		if resp.Header.Get("Content-Type") != "text/event-stream" {
			t.Fatalf("%s: expected SSE, got %q", c.method, resp.Header.Get("Content-Type"))
		}
		es := readEvents(resp, time.Now())
		want := readEvents(a.post(t, "/v1/messages", strings.Replace(messagesBody, "{", `{"stream":true,`, 1)), time.Now())
		if es.err != nil || strings.Join(es.names(), ",") != strings.Join(want.names(), ",") {
			t.Fatalf("%s: expected events %v, got %v (%v)", c.method, want.names(), es.names(), es.err)
		}
		for i := 1; i < len(es.events); i++ {
			if es.events[i].data != want.events[i].data {
				t.Errorf("%s: event %d: expected %s, got %s", c.method, i, want.events[i].data, es.events[i].data)
			}
		}
		if !strings.Contains(es.events[0].data, `"model":"`+model+`"`) {
			t.Errorf("expected message_start of %s, got %s", model, es.events[0].data)
		}
	}

	for _, tt := range []struct{ name, body, want string }{
		{"no version", `{"max_tokens":1,"messages":[]}`, `{"error":{"code":400,"message":"anthropic_version: Field required","status":"INVALID_ARGUMENT"}}`},
		{"bedrock's version", `{"anthropic_version":"bedrock-2023-05-31","max_tokens":1,"messages":[]}`,
			`{"error":{"code":400,"message":"anthropic_version: Input should be 'vertex-2023-10-16'","status":"INVALID_ARGUMENT"}}`},
		{"model", `{"anthropic_version":"vertex-2023-10-16","model":"claude","max_tokens":1,"messages":[]}`, `"message":"model: Extra inputs are not permitted`},
		{"bad JSON", `{"anthropic_version":`, `{"error":{"code":400,"message":"Invalid JSON payload received.","status":"INVALID_ARGUMENT"}}`},
	} {
		resp := v.post(t, vertexClaude+":rawPredict", tt.body, bearer(tok)...)
		if body := readAll(t, resp); resp.StatusCode != 400 || !strings.Contains(body, tt.want) {
			t.Errorf("%s: expected 400 %s, got %d %s", tt.name, tt.want, resp.StatusCode, body)
		}
	}

	// The scripted tool call, as the anthropic dialect's.
	tc := serve(t, Handler{Dialect: DialectVertex, ToolCall: &ToolCall{Name: "f", Arguments: json.RawMessage(`{"a":1}`)}}, nil)
	if body := readAll(t, tc.post(t, vertexClaude+":rawPredict", vertexClaudeBody, bearer(tok)...)); !strings.Contains(body, `"stop_reason":"tool_use"`) {
		t.Errorf("expected a tool_use, got %s", body)
	}
	if body := readAll(t, tc.post(t, vertexGemini+":generateContent", geminiBody, bearer(tok)...)); strings.Contains(body, "tool") {
		t.Errorf("expected no tool call for Gemini, got %s", body)
	}
}

func TestVertexFaults(t *testing.T) {
	const (
		shared    = `{"error":{"code":429,"message":"Resource exhausted. Please try again later. Please refer to https://cloud.google.com/vertex-ai/generative-ai/docs/error-code-429 for more details.","status":"RESOURCE_EXHAUSTED"}}`
		perMinute = `{"error":{"code":429,"message":"Quota exceeded for aiplatform.googleapis.com/generate_content_requests_per_minute_per_project_per_base_model with base model: MODEL. Please submit a quota increase request. https://cloud.google.com/vertex-ai/docs/generative-ai/quotas-genai.","status":"RESOURCE_EXHAUSTED"}}`
		perDay    = `{"error":{"code":429,"message":"Quota exceeded for aiplatform.googleapis.com/generate_content_requests_per_day_per_project_per_base_model with base model: MODEL. Please submit a quota increase request. https://cloud.google.com/vertex-ai/docs/generative-ai/quotas-genai.","status":"RESOURCE_EXHAUSTED"}}`
		custom    = `{"error":{"code":429,"message":"Quota exceeded for aiplatform.googleapis.com/online_prediction_requests_per_base_model with base model: MODEL. Please submit a quota increase request. https://cloud.google.com/vertex-ai/docs/generative-ai/quotas-genai.","status":"RESOURCE_EXHAUSTED","details":[{"@type":"type.googleapis.com/google.rpc.RetryInfo","retryDelay":"23s"}]}}`
		overA     = `{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}`
		overG     = `{"error":{"code":503,"status":"UNAVAILABLE","message":"The model is overloaded."}}`
	)
	routes := []struct{ path, model, body, wire string }{
		{vertexGemini + ":generateContent", "gemini-2.5-pro", geminiBody, "google"},
		{vertexClaude + ":rawPredict", "claude-sonnet-4-5@20250929", vertexClaudeBody, "anthropic"},
	}
	for _, tt := range []struct {
		name   string
		fault  Fault
		status int
		want   map[string]string // by publisher; "" both
	}{
		{"shared", Fault{Kind: FaultRateLimit}, 429, map[string]string{"": shared}},
		{"shared explicit", Fault{Kind: FaultRateLimit, Quota: QuotaShared}, 429, map[string]string{"": shared}},
		{"per minute", Fault{Kind: FaultRateLimit, Quota: QuotaPerMinute}, 429, map[string]string{"": perMinute}},
		{"per day", Fault{Kind: FaultRateLimit, Quota: QuotaPerDay}, 429, map[string]string{"": perDay}},
		{"quota id and retry", Fault{Kind: FaultRateLimit, Quota: QuotaPerMinute, QuotaID: "online_prediction_requests_per_base_model",
			RetryDelay: caddy.Duration(22500 * time.Millisecond)}, 429, map[string]string{"": custom}},
		{"overloaded", Fault{Kind: FaultErrorEvent}, 0, map[string]string{"anthropic": overA, "google": overG}},
		{"status", Fault{Kind: FaultStatus, Status: 500}, 500, map[string]string{
			"anthropic": `{"type":"error","error":{"type":"api_error","message":"mock status 500"}}`,
			"google":    `{"error":{"code":500,"status":"INTERNAL","message":"mock status 500"}}`}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			s := serve(t, Handler{Dialect: DialectVertex, Faults: []Fault{tt.fault}}, nil)
			tok := token(t, s)
			for _, r := range routes {
				want, ok := tt.want[r.wire]
				if !ok {
					want = tt.want[""]
				}
				want = strings.ReplaceAll(want, "MODEL", r.model)
				status := tt.status
				if status == 0 {
					status = map[string]int{"anthropic": 529, "google": 503}[r.wire]
				}
				resp := s.post(t, r.path, r.body, bearer(tok)...)
				if body := readAll(t, resp); resp.StatusCode != status || body != want {
					t.Errorf("%s: expected %d %s, got %d %s", r.wire, status, want, resp.StatusCode, body)
				}
			}
		})
	}

	// Mid-stream errors as the anthropic and gemini dialects send them.
	s := serve(t, Handler{Dialect: DialectVertex, Faults: []Fault{{Kind: FaultErrorEvent, After: intp(2)}}}, nil)
	tok := token(t, s)
	es := readEvents(s.post(t, vertexClaude+":streamRawPredict", strings.Replace(vertexClaudeBody, "{", `{"stream":true,`, 1), bearer(tok)...), time.Now())
	if n := es.names(); len(n) != 6 || n[5] != "error" || es.events[5].data != overA {
		t.Errorf("expected an error event after 2 deltas, got %v %+v", n, es.events)
	}
	es = readEvents(s.post(t, vertexGemini+":streamGenerateContent?alt=sse", geminiBody, bearer(tok)...), time.Now())
	if len(es.events) != 3 || es.events[2].data != overG {
		t.Errorf("expected Gemini's error event after 2 chunks, got %+v", es.events)
	}

	// The RateLimit window: a per-minute quota with RetryInfo.
	w := serve(t, Handler{Dialect: DialectVertex, RateLimit: &RateLimit{Requests: 1, Window: caddy.Duration(30 * time.Second)}}, newFakeClock())
	tok = token(t, w)
	readAll(t, w.post(t, vertexGemini+":generateContent", geminiBody, bearer(tok)...))
	resp := w.post(t, vertexGemini+":generateContent", geminiBody, bearer(tok)...)
	body := readAll(t, resp)
	if e := decodeRPCError(t, body); resp.StatusCode != 429 || e.Status != "RESOURCE_EXHAUSTED" ||
		!strings.Contains(e.Message, "generate_content_requests_per_minute_per_project_per_base_model with base model: gemini-2.5-pro") ||
		len(e.Details) != 1 || e.Details[0].RetryDelay != "30s" {
		t.Errorf("expected a per-minute quota error, got %d %s", resp.StatusCode, body)
	}
}

func TestVertexRoutes(t *testing.T) {
	s := serve(t, Handler{Dialect: DialectVertex}, nil)
	tok := token(t, s)
	for _, p := range []string{
		"/v1/projects/p1/locations/us/publishers/meta/models/llama:rawPredict",
		"/v1/projects/p1/locations/us/publishers/google/models/gemini:rawPredict",
		"/v1/projects/p1/locations/us/publishers/anthropic/models/claude:generateContent",
		"/v1/projects/p1/publishers/google/models/gemini:generateContent",
		"/v1beta/models/gemini:generateContent",
		"/v1/messages",
	} {
		if resp := s.post(t, p, geminiBody, bearer(tok)...); resp.StatusCode != 404 {
			t.Errorf("%s: expected 404, got %d", p, resp.StatusCode)
		}
	}
	if resp := s.post(t, "/v1beta1/projects/p1/locations/global/publishers/google/models/gemini-2.5-flash:generateContent", geminiBody, bearer(tok)...); resp.StatusCode != 200 {
		t.Errorf("expected v1beta1 and the global location served, got %d", resp.StatusCode)
	}
	// The token endpoint is the vertex dialect's only.
	g := serve(t, Handler{Dialect: DialectGemini}, nil)
	if code, _ := postForm(t, g, "/token", url.Values{"grant_type": {jwtBearerGrant}}); code != 404 {
		t.Errorf("expected no token endpoint in the gemini dialect, got %d", code)
	}
}

// TestAuthStatsOtherDialects: API keys are counted in every dialect.
func TestAuthStatsOtherDialects(t *testing.T) {
	s := serve(t, Handler{APIKey: "sk-1"}, nil)
	readAll(t, s.post(t, "/v1/chat/completions", chatBody, "Authorization", "Bearer sk-1"))
	readAll(t, s.post(t, "/v1/chat/completions", chatBody, "Authorization", "Bearer sk-2"))
	if st := s.h.Stats(); st.AuthAccepted != 1 || st.AuthRefused != 1 || st.LastPrincipal != "" {
		t.Errorf("unexpected stats %+v", st)
	}
	o := serve(t, Handler{}, nil)
	readAll(t, o.post(t, "/v1/chat/completions", chatBody))
	if st := o.h.Stats(); st.AuthAccepted != 0 || st.AuthRefused != 0 {
		t.Errorf("expected nothing counted without an api_key, got %+v", st)
	}
	var got map[string]any
	b, _ := json.Marshal(s.h.Stats())
	_ = json.Unmarshal(b, &got)
	for _, k := range []string{"auth_accepted", "auth_refused", "tokens_issued", "tokens_refused", "last_principal"} {
		if _, ok := got[k]; !ok {
			t.Errorf("expected %s in the stats JSON %s", k, b)
		}
	}
}
