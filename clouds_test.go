package llmrouter

import (
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"

	"github.com/llmrouter/caddy-llm-router/internal/clouds"
	"github.com/llmrouter/caddy-llm-router/mockllm"
)

// isolateAWS keeps the test away from the machine's AWS configuration:
// no shared files, no instance metadata, only what the test sets.
func isolateAWS(t *testing.T) {
	t.Helper()
	dir := t.TempDir()
	for _, k := range []string{"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_REGION", "AWS_DEFAULT_REGION",
		"AWS_PROFILE", "AWS_BEARER_TOKEN_BEDROCK", "AWS_ROLE_ARN", "AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_CONTAINER_CREDENTIALS_FULL_URI",
		"AWS_CONTAINER_CREDENTIALS_RELATIVE_URI"} {
		t.Setenv(k, "")
		os.Unsetenv(k)
	}
	t.Setenv("AWS_CONFIG_FILE", filepath.Join(dir, "config"))
	t.Setenv("AWS_SHARED_CREDENTIALS_FILE", filepath.Join(dir, "credentials"))
	t.Setenv("AWS_EC2_METADATA_DISABLED", "true")
}

// bedrockMock is llm_mock's bedrock dialect on a test server: it checks
// each request's SigV4 signature with the AWS SDK's signer (or takes
// apiKey as a Bedrock API key).
func bedrockMock(t *testing.T, akid, secret, apiKey string) (*httptest.Server, *mockllm.Handler) {
	t.Helper()
	m := &mockllm.Handler{Dialect: "bedrock", Reply: "Signed.", APIKey: apiKey,
		AWSCredentials: &mockllm.AWSCredentials{AccessKeyID: akid, SecretAccessKey: secret}}
	if err := m.Setup(); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(m.HTTPHandler())
	t.Cleanup(srv.Close)
	return srv, m
}

// A bedrock provider signs each request with SigV4 (service bedrock, its
// region) with the credentials of the environment, re-signing a request
// the router sends again; a signature made with another secret does not
// verify. A Bedrock API key goes as a bearer token instead.
func TestBedrockSignsWithTheCredentialChain(t *testing.T) {
	isolateAWS(t)
	t.Setenv("AWS_ACCESS_KEY_ID", "AKIDEXAMPLE")
	t.Setenv("AWS_SECRET_ACCESS_KEY", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY")
	upstream, mock := bedrockMock(t, "AKIDEXAMPLE", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY", "ABSK-test-key")

	var h Handler
	err := h.UnmarshalCaddyfile(caddyfile.NewTestDispenser(`llm_router {
		provider aws {
			type bedrock
			region us-west-2
			base_url ` + upstream.URL + `
		}
		provider awskey {
			type bedrock
			region us-west-2
			base_url ` + upstream.URL + `
			api_key ABSK-test-key
		}
		model claude {
			deployment aws us.anthropic.claude-sonnet-4-5-20250929-v1:0
		}
		model keyed {
			deployment awskey anthropic.claude-3-haiku-20240307-v1:0
		}
	}`))
	if err != nil {
		t.Fatal(err)
	}
	var cfg map[string]any
	if err := json.Unmarshal(h.ProvidersRaw["aws"], &cfg); err != nil || cfg["type"] != "bedrock" || cfg["region"] != "us-west-2" {
		t.Fatalf("JSON %s", h.ProvidersRaw["aws"])
	}
	if err := h.Provision(newCaddyContext(t)); err != nil {
		t.Fatal(err)
	}
	defer h.Cleanup()
	for _, model := range []string{"claude", "keyed"} {
		w := httptest.NewRecorder()
		r := postJSON("/v1/messages", `{"model":"`+model+`","max_tokens":20,"messages":[{"role":"user","content":"hi"}]}`)
		if err := h.ServeHTTP(w, r, nil); err != nil {
			t.Fatal(err)
		}
		if w.Code != 200 || !strings.Contains(w.Body.String(), "Signed.") {
			t.Errorf("%s: %d %s", model, w.Code, w.Body)
		}
		st := mock.Stats()
		switch model {
		case "claude": // signed in the configured region, for bedrock
			if st.LastModel != "us.anthropic.claude-sonnet-4-5-20250929-v1:0" || st.LastPrincipal != "AKIDEXAMPLE" ||
				!strings.Contains(st.LastAuthorization, "/us-west-2/bedrock/aws4_request") {
				t.Errorf("%s: the mock saw %+v", model, st)
			}
		case "keyed":
			if st.LastAuthorization != "Bearer ABSK-test-key" {
				t.Errorf("%s: the mock saw %q", model, st.LastAuthorization)
			}
		}
	}
	if st := mock.Stats(); st.AuthAccepted != 2 || st.AuthRefused != 0 {
		t.Errorf("accepted %d refused %d", st.AuthAccepted, st.AuthRefused)
	}
	// The identity of a bedrock deployment names its account, never a secret.
	for _, ref := range h.states {
		if strings.Contains(ref.key, "wJalr") || strings.Contains(ref.key, "ABSK") || !strings.Contains(ref.key, "region=us-west-2") {
			t.Errorf("identity %q", ref.key)
		}
	}

	// Another secret: the signature does not verify (the check can fail).
	t.Setenv("AWS_SECRET_ACCESS_KEY", "not-the-secret")
	h2 := handlerFromCaddyfile(t, `llm_router {
		provider aws {
			type bedrock
			region us-west-2
			base_url `+upstream.URL+`
		}
		model claude {
			deployment aws us.anthropic.claude-sonnet-4-5-20250929-v1:0
		}
	}`)
	defer h2.Cleanup()
	w := httptest.NewRecorder()
	_ = h2.ServeHTTP(w, postJSON("/v1/messages", `{"model":"claude","max_tokens":20,"messages":[{"role":"user","content":"hi"}]}`), nil)
	if w.Code == 200 || mock.Stats().AuthRefused != 1 {
		t.Errorf("a wrong secret: %d, refused %d", w.Code, mock.Stats().AuthRefused)
	}
	if strings.Contains(w.Body.String(), "not-the-secret") || strings.Contains(w.Body.String(), "AKIDEXAMPLE") {
		t.Errorf("the answer shows a credential: %s", w.Body)
	}
}

// Without credentials anywhere, the attempt fails at the transport (the
// router fails over), quickly, and says why without a secret.
func TestBedrockWithoutCredentials(t *testing.T) {
	isolateAWS(t)
	h := handlerFromCaddyfile(t, `llm_router {
		provider aws {
			type bedrock
			region eu-west-1
		}
		model claude {
			deployment aws anthropic.claude-3-haiku-20240307-v1:0
		}
	}`)
	defer h.Cleanup()
	p := h.providers["aws"].(*Bedrock)
	if p.Bedrock.Endpoint.BaseURL != "https://bedrock-runtime.eu-west-1.amazonaws.com" {
		t.Errorf("base URL %s", p.Bedrock.Endpoint.BaseURL)
	}
	req, _ := http.NewRequest(http.MethodPost, "https://bedrock-runtime.eu-west-1.amazonaws.com/model/x/invoke", strings.NewReader("{}"))
	start := time.Now()
	_, err := p.transport.RoundTrip(req)
	if err == nil || !strings.Contains(err.Error(), "AWS credentials") || time.Since(start) > 5*time.Second {
		t.Errorf("no credentials: %v after %v", err, time.Since(start))
	}
}

// Configuration errors of the bedrock type, at load.
func TestBedrockConfigErrors(t *testing.T) {
	isolateAWS(t)
	t.Setenv("LLM_ROUTER_TEST_REGION", "us-east-1.evil.example")
	for input, want := range map[string]string{
		"type bedrock\nregion":                     "wrong argument count",
		"type bedrock\nregion a b":                 "wrong argument count",
		"type bedrock\nregion us-east-1\nzone x":   "unknown subdirective zone",
		"type bedrock\nprofile p\nprofile q":       "duplicate subdirective profile",
		"type bedrock\nrole_arn":                   "wrong argument count",
		"type bedrock\nbase_url ftp://x\nregion r": "must be an absolute http or https URL",
	} {
		var h Handler
		err := h.UnmarshalCaddyfile(caddyfile.NewTestDispenser("llm_router {\nprovider aws {\n" + input + "\n}\nmodel m {\ndeployment aws x\n}\n}"))
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v, want %q", input, err, want)
		}
	}
	for raw, want := range map[string]string{
		`{"type":"bedrock"}`: "bedrock: no region",
		`{"type":"bedrock","region":"us-east-1","profile":"nope"}`: "failed to get shared config profile, nope",
		// The region names the host the credentials go to.
		`{"type":"bedrock","region":"evil.example/x"}`:                       `bedrock: region "evil.example/x" is not an AWS region`,
		`{"type":"bedrock","region":"{env.LLM_ROUTER_TEST_REGION}"}`:         `bedrock: region "us-east-1.evil.example" is not an AWS region`,
		`{"type":"vertex","project":"my-project","region":"evil.example/x"}`: `vertex: region "evil.example/x" is not a Vertex AI location`,
		`{"type":"vertex","project":"../../x","region":"us-east5"}`:          `vertex: project "../../x" is not a Google Cloud project id`,
	} {
		h := handlerFromJSON(t, `{"providers":{"a":`+raw+`},"models":{"m":{"deployments":[{"provider":"a","model":"x"}]}}}`)
		err := h.Provision(newCaddyContext(t))
		h.Cleanup()
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want %q", raw, err, want)
		}
	}
}

// tokenServer is a fake OAuth token endpoint for service-account
// credentials (the JWT bearer grant): it issues numbered tokens that last
// lifetime.
type tokenServer struct {
	*httptest.Server
	issued atomic.Int64
}

func newTokenServer(t *testing.T, lifetime time.Duration) *tokenServer {
	ts := &tokenServer{}
	ts.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := r.ParseForm(); err != nil || r.Form.Get("grant_type") != "urn:ietf:params:oauth:grant-type:jwt-bearer" ||
			strings.Count(r.Form.Get("assertion"), ".") != 2 {
			w.WriteHeader(400)
			_, _ = w.Write([]byte(`{"error":"invalid_grant"}`))
			return
		}
		n := ts.issued.Add(1)
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"access_token":"ya29.test-%d","expires_in":%d,"token_type":"Bearer"}`, n, int(lifetime.Seconds()))
	}))
	t.Cleanup(ts.Close)
	return ts
}

// serviceAccountFile writes a service account's JSON key whose token_uri
// is tokenURL.
func serviceAccountFile(t *testing.T, tokenURL string) string {
	t.Helper()
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	der, _ := x509.MarshalPKCS8PrivateKey(key)
	sa, _ := json.Marshal(map[string]string{
		"type": "service_account", "project_id": "test-project", "private_key_id": "k1",
		"private_key":  string(pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der})),
		"client_email": "router@test-project.iam.gserviceaccount.com", "client_id": "1",
		"token_uri": tokenURL,
	})
	path := filepath.Join(t.TempDir(), "sa.json")
	if err := os.WriteFile(path, sa, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// A vertex provider sends each request with an access token from the
// token endpoint its service account names, reuses it while it lasts and
// fetches a new one once it has expired.
func TestVertexTokensFromServiceAccount(t *testing.T) {
	tokens := newTokenServer(t, time.Second)
	var mu sync.Mutex
	var seen []string
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen = append(seen, r.URL.Path+" "+r.Header.Get("Authorization"))
		mu.Unlock()
		_, _ = w.Write([]byte(`{"candidates":[{"content":{"role":"model","parts":[{"text":"From Vertex."}]},"finishReason":"STOP"}],"usageMetadata":{"promptTokenCount":2,"candidatesTokenCount":3,"totalTokenCount":5}}`))
	}))
	defer upstream.Close()
	t.Setenv("GOOGLE_APPLICATION_CREDENTIALS", serviceAccountFile(t, tokens.URL+"/token"))

	h := handlerFromCaddyfile(t, `llm_router {
		provider gcp {
			type vertex
			project my-project
			region us-central1
			base_url `+upstream.URL+`/v1
		}
		model gemini {
			deployment gcp gemini-2.5-flash
		}
	}`)
	defer h.Cleanup()
	ask := func() {
		w := httptest.NewRecorder()
		_ = h.ServeHTTP(w, postJSON("/v1/chat/completions", `{"model":"gemini","messages":[{"role":"user","content":"hi"}]}`), nil)
		if w.Code != 200 || !strings.Contains(w.Body.String(), "From Vertex.") {
			t.Fatalf("%d %s", w.Code, w.Body)
		}
	}
	ask()
	time.Sleep(1100 * time.Millisecond) // the first token has expired
	ask()
	mu.Lock()
	defer mu.Unlock()
	const path = "/v1/projects/my-project/locations/us-central1/publishers/google/models/gemini-2.5-flash:generateContent"
	// The first request's token is the first one issued, or a later one
	// when the load's own check took longer than its second of life.
	if len(seen) != 2 || !strings.HasPrefix(seen[0], path+" Bearer ya29.test-") || !strings.HasPrefix(seen[1], path+" Bearer ya29.test-") || seen[1] == seen[0] {
		t.Errorf("requests %q", seen)
	}
	if tokens.issued.Load() < 2 {
		t.Errorf("tokens issued %d, want a new one after expiry", tokens.issued.Load())
	}
}

// Configuration errors of the vertex type.
func TestVertexConfigErrors(t *testing.T) {
	t.Setenv("GOOGLE_APPLICATION_CREDENTIALS", filepath.Join(t.TempDir(), "missing.json"))
	for input, want := range map[string]string{
		"type vertex\nregion us-east5":                       "vertex: needs a project",
		"type vertex\nproject p":                             "vertex: needs a region",
		"type vertex\nproject p\nregion r\napi_key k":        "not an api_key",
		"type vertex\nproject p\nregion r\ncredentials_file": "wrong argument count",
		"type vertex\nproject p\nregion r\nproject q":        "duplicate subdirective project",
	} {
		var h Handler
		err := h.UnmarshalCaddyfile(caddyfile.NewTestDispenser("llm_router {\nprovider g {\n" + input + "\n}\nmodel m {\ndeployment g x\n}\n}"))
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v, want %q", input, err, want)
		}
	}
	h := handlerFromJSON(t, `{"providers":{"g":{"type":"vertex","project":"my-project","region":"global"}},"models":{"m":{"deployments":[{"provider":"g","model":"x"}]}}}`)
	err := h.Provision(newCaddyContext(t))
	h.Cleanup()
	if err == nil || !strings.Contains(err.Error(), "vertex: finding Google credentials") || !strings.Contains(err.Error(), "missing.json") {
		t.Errorf("no credentials: %v", err)
	}
}

// role_arn: the credentials found assume the role through STS
// (AWS_ENDPOINT_URL points the SDK's STS client at a fake one), the
// requests are signed with the role's temporary credentials and session
// token, and credentials that expire within the expiry window are fetched
// anew before the next request rather than used until they fail.
func TestBedrockAssumesARole(t *testing.T) {
	isolateAWS(t)
	t.Setenv("AWS_ACCESS_KEY_ID", "AKIDBASE")
	t.Setenv("AWS_SECRET_ACCESS_KEY", "base-secret")
	var assumed atomic.Int64
	var stsProblem atomic.Value
	sts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		form, _ := url.ParseQuery(string(body))
		if form.Get("Action") != "AssumeRole" || form.Get("RoleArn") != "arn:aws:iam::123456789012:role/router" ||
			!strings.Contains(r.Header.Get("Authorization"), "Credential=AKIDBASE/") {
			stsProblem.Store(fmt.Sprintf("STS got %v %s", form, r.Header.Get("Authorization")))
		}
		n := assumed.Add(1)
		// Expires within the expiry window: fetched anew each time.
		exp := time.Now().Add(clouds.ExpiryWindow / 2).UTC().Format(time.RFC3339)
		w.Header().Set("Content-Type", "text/xml")
		fmt.Fprintf(w, `<AssumeRoleResponse xmlns="https://sts.amazonaws.com/doc/2011-06-15/"><AssumeRoleResult><Credentials>`+
			`<AccessKeyId>ASIAROLE</AccessKeyId><SecretAccessKey>role-secret</SecretAccessKey><SessionToken>session-%d</SessionToken>`+
			`<Expiration>%s</Expiration></Credentials><AssumedRoleUser><Arn>arn:aws:sts::123456789012:assumed-role/router/caddy-llm-router</Arn>`+
			`<AssumedRoleId>AROA1:caddy-llm-router</AssumedRoleId></AssumedRoleUser></AssumeRoleResult><ResponseMetadata><RequestId>1</RequestId></ResponseMetadata></AssumeRoleResponse>`,
			n, exp)
	}))
	defer sts.Close()
	t.Setenv("AWS_ENDPOINT_URL", sts.URL)
	upstream, mock := bedrockMock(t, "ASIAROLE", "role-secret", "")

	h := handlerFromCaddyfile(t, `llm_router {
		provider aws {
			type bedrock
			region us-east-2
			role_arn arn:aws:iam::123456789012:role/router
			base_url `+upstream.URL+`
		}
		model nova {
			deployment aws amazon.nova-lite-v1:0
		}
	}`)
	defer h.Cleanup()
	for i := 1; i <= 2; i++ {
		w := httptest.NewRecorder()
		_ = h.ServeHTTP(w, postJSON("/v1/chat/completions", `{"model":"nova","messages":[{"role":"user","content":"hi"}]}`), nil)
		if w.Code != 200 || !strings.Contains(w.Body.String(), "Signed.") {
			t.Fatalf("%d %s", w.Code, w.Body)
		}
		// Signed with the role's keys and its latest session token.
		if st := mock.Stats(); st.LastPrincipal != "ASIAROLE" || st.LastHeaders["X-Amz-Security-Token"] != fmt.Sprintf("session-%d", i) || st.AuthRefused != 0 {
			t.Errorf("request %d: the mock saw %+v", i, st)
		}
	}
	if p := stsProblem.Load(); p != nil || assumed.Load() != 2 {
		t.Errorf("assumed %d times (want 2: each time the credentials were about to expire); %v", assumed.Load(), p)
	}
}

// `api_key none` signs with SigV4 even when AWS_BEARER_TOKEN_BEDROCK is
// set (which otherwise makes a Bedrock API key the credentials).
func TestBedrockAPIKeyNoneSigns(t *testing.T) {
	isolateAWS(t)
	t.Setenv("AWS_ACCESS_KEY_ID", "AKIDEXAMPLE")
	t.Setenv("AWS_SECRET_ACCESS_KEY", "secret-of-the-example")
	t.Setenv("AWS_BEARER_TOKEN_BEDROCK", "ABSK-from-the-environment")
	upstream, mock := bedrockMock(t, "AKIDEXAMPLE", "secret-of-the-example", "ABSK-from-the-environment")
	for _, c := range []struct{ key, want string }{{"", "Bearer ABSK-from-the-environment"}, {"api_key none", "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/"}} {
		var h Handler
		if err := h.UnmarshalCaddyfile(caddyfile.NewTestDispenser(`llm_router {
			provider aws {
				type bedrock
				region us-east-1
				base_url ` + upstream.URL + `
				` + c.key + `
			}
			model nova {
				deployment aws amazon.nova-lite-v1:0
			}
		}`)); err != nil {
			t.Fatal(err)
		}
		if err := h.Provision(newCaddyContext(t)); err != nil {
			t.Fatal(err)
		}
		w := httptest.NewRecorder()
		_ = h.ServeHTTP(w, postJSON("/v1/chat/completions", `{"model":"nova","messages":[{"role":"user","content":"hi"}]}`), nil)
		h.Cleanup()
		if st := mock.Stats(); w.Code != 200 || !strings.HasPrefix(st.LastAuthorization, c.want) {
			t.Errorf("%q: %d, sent %q", c.key, w.Code, st.LastAuthorization)
		}
	}
}

// A typo of a type's own subdirective is answered with its name; one of
// another type says which types take it.
func TestProviderSubdirectiveHints(t *testing.T) {
	for input, want := range map[string]string{
		"type bedrock\nregoin us-east-1":            `unknown subdirective regoin in provider (did you mean "region"?)`,
		"type vertex\ncredentials_fil x":            `(did you mean "credentials_file"?)`,
		"type openai\napi_key none\nregion x":       "unknown subdirective region in provider (an option of type bedrock, vertex)",
		"type anthropic\napi_key k\nresponses chat": "unknown subdirective responses in provider (an option of type openai)",
	} {
		var h Handler
		err := h.UnmarshalCaddyfile(caddyfile.NewTestDispenser("llm_router {\nprovider p {\nbase_url http://h\n" + input + "\n}\nmodel m {\ndeployment p x\n}\n}"))
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v, want %q", input, err, want)
		}
	}
}
