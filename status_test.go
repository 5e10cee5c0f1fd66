package llmrouter

import (
	"bytes"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/llmrouter/caddy-llm-router/internal/capacity"
	"github.com/llmrouter/caddy-llm-router/provider"
)

const (
	statusSecretKey      = "sk-status-page-secret-0123456789abcdef"
	statusSecretPassword = "status-pass-word"
)

// newStatusPage provisions a status page with refresh, nil for the default.
func newStatusPage(t *testing.T, refresh *caddy.Duration) *StatusPage {
	t.Helper()
	s := &StatusPage{Refresh: refresh}
	if err := s.Provision(newCaddyContext(t)); err != nil {
		t.Fatal(err)
	}
	return s
}

// serveStatus runs one request through s, as Caddy would: a returned
// HandlerError becomes its status.
func serveStatus(t *testing.T, s *StatusPage, method, target string) *httptest.ResponseRecorder {
	t.Helper()
	rec := httptest.NewRecorder()
	err := s.ServeHTTP(rec, httptest.NewRequest(method, target, nil), caddyhttp.HandlerFunc(func(http.ResponseWriter, *http.Request) error {
		t.Error("expected the status page never to call the next handler")
		return nil
	}))
	var he caddyhttp.HandlerError
	if errors.As(err, &he) {
		rec.Code = he.StatusCode
	} else if err != nil {
		t.Fatalf("%s %s: %v", method, target, err)
	}
	return rec
}

// liveRouter provisions a router whose provider has a recognizable key and
// a password in its base URL, with some traffic recorded on its deployment.
func liveRouter(t *testing.T) *Handler {
	t.Helper()
	h := handlerFromJSON(t, `{"providers":{
		"acme":{"type":"openai","base_url":"http://ops:`+statusSecretPassword+`@127.0.0.1:1/v1","api_key":"`+statusSecretKey+`"}},
		"models":{"fast":{"deployments":[{"provider":"acme","model":"m-status","rpm":60,"tpm":90000}]}}}`)
	if err := h.Provision(newCaddyContext(t)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = h.Cleanup() })
	st := h.groups["fast"].Deployments[0].State
	now := time.Now()
	st.RecordUsage(now, provider.Usage{InputTokens: 1200, CachedInputTokens: 200, OutputTokens: 34}, 0.0042)
	st.RecordFailover(provider.RateLimited)
	o := provider.NewObservation(provider.RateLimited)
	o.Requests = provider.Window{Limit: 20, Remaining: 0, Reset: 30 * time.Second}
	o.RetryAfter = 30 * time.Second
	o.Message = "Rate limit reached for requests"
	st.Observe(now, o, capacity.DefaultPolicy)
	return h
}

// withoutLiveHandlers hides the live handlers for the test's duration, as
// in a Caddy that loads no llm_router.
func withoutLiveHandlers(t *testing.T) {
	live.Lock()
	saved := live.handlers
	live.handlers = map[*Handler]struct{}{}
	live.Unlock()
	t.Cleanup(func() {
		live.Lock()
		live.handlers = saved
		live.Unlock()
	})
}

func TestStatusJSON(t *testing.T) {
	s := newStatusPage(t, nil)

	t.Run("no router loaded", func(t *testing.T) {
		withoutLiveHandlers(t)
		rec := serveStatus(t, s, http.MethodGet, "/status/?format=json")
		if rec.Code != http.StatusOK {
			t.Fatalf("expected 200, got %d", rec.Code)
		}
		var got map[string]json.RawMessage
		if err := json.Unmarshal(rec.Body.Bytes(), &got); err != nil {
			t.Fatal(err)
		}
		for _, k := range []string{"deployments", "model_groups"} {
			if string(got[k]) != "[]" {
				t.Errorf("expected %s to be [], got %s", k, got[k])
			}
		}
	})

	liveRouter(t)
	before := time.Now()
	rec := serveStatus(t, s, http.MethodGet, "/status/?format=json")
	if rec.Code != http.StatusOK {
		t.Fatalf("expected 200, got %d: %s", rec.Code, rec.Body)
	}
	for k, want := range map[string]string{
		"Content-Type":           "application/json",
		"Cache-Control":          "no-store",
		"X-Content-Type-Options": "nosniff",
	} {
		if got := rec.Header().Get(k); got != want {
			t.Errorf("expected %s %q, got %q", k, want, got)
		}
	}
	if csp := rec.Header().Get("Content-Security-Policy"); !strings.HasPrefix(csp, "default-src 'none'") {
		t.Errorf("expected a CSP that allows nothing, got %q", csp)
	}
	body := rec.Body.String()
	for _, secret := range []string{statusSecretKey, statusSecretPassword, "api_key"} {
		if strings.Contains(body, secret) {
			t.Errorf("expected no %q in the JSON, got %s", secret, body)
		}
	}

	var out struct {
		GeneratedAt time.Time                    `json:"generated_at"`
		Deployments []map[string]json.RawMessage `json:"deployments"`
		ModelGroups []GroupStatus                `json:"model_groups"`
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &out); err != nil {
		t.Fatal(err)
	}
	if out.GeneratedAt.Before(before.Add(-time.Second)) || out.GeneratedAt.After(time.Now().Add(time.Second)) {
		t.Errorf("expected generated_at about now, got %v", out.GeneratedAt)
	}
	var dep map[string]json.RawMessage
	for _, d := range out.Deployments {
		if string(d["name"]) == `"acme/m-status"` {
			dep = d
		}
	}
	if dep == nil {
		t.Fatalf("expected the deployment acme/m-status, got %s", body)
	}
	for _, k := range []string{"type", "base_url", "model_groups", "circuit", "open_until", "open_reason",
		"limit_requests", "remaining_requests", "reset_requests", "limit_tokens", "remaining_tokens",
		"declared_rpm", "declared_tpm", "requests_last_minute", "tokens_last_minute",
		"latency_ewma_ms", "ttft_ewma_ms", "success_rate", "in_flight", "last_class", "last_message", "usage"} {
		if _, ok := dep[k]; !ok {
			t.Errorf("expected the field %s in the deployment, got %s", k, body)
		}
	}
	for k, want := range map[string]string{
		"circuit": `"open"`, "open_reason": `"rate_limited"`, "limit_requests": "20", "limit_tokens": "-1",
		"declared_rpm": "60", "declared_tpm": "90000", "model_groups": `["fast"]`,
	} {
		var compact bytes.Buffer
		if err := json.Compact(&compact, dep[k]); err != nil || compact.String() != want {
			t.Errorf("expected %s %s, got %s", k, want, dep[k])
		}
	}
	var usage capacity.UsageReport
	if err := json.Unmarshal(dep["usage"], &usage); err != nil {
		t.Fatal(err)
	}
	for _, sp := range []capacity.Spend{usage.Total, usage.LastHour} {
		if sp.Answers != 1 || sp.InputTokens != 1200 || sp.CachedInputTokens != 200 || sp.OutputTokens != 34 || sp.CostUSD != 0.0042 {
			t.Errorf("expected 1 answer of 1200 (200 cached) in, 34 out, $0.0042, got %+v", sp)
		}
	}
	if usage.Failovers["rate_limited"] != 1 {
		t.Errorf("expected one failover for rate_limited, got %v", usage.Failovers)
	}
	found := false
	for _, g := range out.ModelGroups {
		found = found || g.Name == "fast"
	}
	if !found {
		t.Errorf("expected the model group fast, got %+v", out.ModelGroups)
	}

	// The same report as the admin API's, plus generated_at.
	admin := httptest.NewRecorder()
	if err := handleDeployments(admin, httptest.NewRequest(http.MethodGet, "/llm_router/deployments", nil)); err != nil {
		t.Fatal(err)
	}
	var fromAdmin, fromPage map[string]any
	if err := json.Unmarshal(admin.Body.Bytes(), &fromAdmin); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &fromPage); err != nil {
		t.Fatal(err)
	}
	delete(fromPage, "generated_at")
	// The success rate decays with time: the two reports are a moment apart.
	for _, r := range []map[string]any{fromAdmin, fromPage} {
		for _, d := range r["deployments"].([]any) {
			delete(d.(map[string]any), "success_rate")
		}
	}
	if !reflect.DeepEqual(fromAdmin, fromPage) {
		t.Errorf("expected the admin API's report, got\n%s\nadmin:\n%s", rec.Body, admin.Body)
	}
}

// A configured URL is shown, on the status page and in the admin API,
// with its userinfo and every query value masked (Azure takes its key as
// ?api-key= too), and its credentials are secrets the router redacts.
func TestConfiguredURLsAreMasked(t *testing.T) {
	const key, password = "azqk0123456789abcdef0123456789ab", "ops-pass-word"
	h := handlerFromJSON(t, `{"providers":{"az":{"type":"azure","api_key":"none",
		"base_url":"https://ops:`+password+`@res.openai.azure.com/openai?api-key=`+key+`&api-version=2024-10-21"}},
		"models":{"fast":{"deployments":[{"provider":"az","model":"m-masked"}]}}}`)
	if err := h.Provision(newCaddyContext(t)); err != nil {
		t.Fatal(err)
	}
	defer h.Cleanup()
	const want = "https://xxxxx@res.openai.azure.com/openai?api-key=xxxxx&api-version=xxxxx"
	admin := httptest.NewRecorder()
	if err := handleDeployments(admin, httptest.NewRequest(http.MethodGet, "/llm_router/deployments", nil)); err != nil {
		t.Fatal(err)
	}
	page := serveStatus(t, newStatusPage(t, nil), http.MethodGet, "/status/?format=json")
	shown := `"` + want + `"` // as written: & not escaped
	for where, body := range map[string]string{"admin API": admin.Body.String(), "status page": page.Body.String()} {
		if strings.Contains(body, key) || strings.Contains(body, password) || strings.Contains(body, "ops") || !strings.Contains(body, string(shown)) {
			t.Errorf("%s: expected the base_url shown as %s, got %s", where, want, body)
		}
	}
	for _, secret := range []string{key, password} {
		if !slices.Contains(h.groups["fast"].Deployments[0].Secrets, secret) {
			t.Errorf("expected %q among the deployment's secrets", secret)
		}
	}
}

func TestStatusHTML(t *testing.T) {
	liveRouter(t)
	for _, tc := range []struct {
		name    string
		refresh *caddy.Duration
		path    string
		wantMS  string
	}{
		{"default refresh", nil, "/status/", "2000"},
		{"refresh 5s, under a prefix", durationPtr(5 * time.Second), "/ops/llm/status/", "5000"},
		{"refresh off, any path under the matcher", durationPtr(0), "/status/anything/else?format=html", "0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newStatusPage(t, tc.refresh)
			rec := serveStatus(t, s, http.MethodGet, tc.path)
			if rec.Code != http.StatusOK {
				t.Fatalf("expected 200, got %d", rec.Code)
			}
			page := rec.Body.String()
			if ct := rec.Header().Get("Content-Type"); ct != "text/html; charset=utf-8" {
				t.Errorf("expected an HTML page, got %q", ct)
			}
			if cc, nosniff := rec.Header().Get("Cache-Control"), rec.Header().Get("X-Content-Type-Options"); cc != "no-store" || nosniff != "nosniff" {
				t.Errorf("expected no-store and nosniff, got %q %q", cc, nosniff)
			}
			if want := `data-refresh-ms="` + tc.wantMS + `"`; !strings.Contains(page, want) {
				t.Errorf("expected %s in the page", want)
			}
			// The script fetches the JSON relative to the page's own URL.
			if !strings.Contains(page, `fetch("?format=json"`) || !strings.Contains(page, "setTimeout(load, period)") {
				t.Error("expected the script to fetch ?format=json and to refresh every period")
			}
			for _, bad := range []string{"http://", "https://", "//cdn", "@import", "url(", "<script src", `rel="stylesheet"`,
				statusSecretKey, statusSecretPassword} {
				if strings.Contains(page, bad) {
					t.Errorf("expected no %q in the page", bad)
				}
			}

			// The CSP allows exactly the inline style and script served.
			csp := rec.Header().Get("Content-Security-Policy")
			for _, want := range []string{"default-src 'none'", "connect-src 'self'", "img-src 'self' data:", "frame-ancestors 'none'"} {
				if !strings.Contains(csp, want) {
					t.Errorf("expected %q in the CSP, got %q", want, csp)
				}
			}
			if strings.Contains(csp, "unsafe-") {
				t.Errorf("expected no unsafe- source in the CSP, got %q", csp)
			}
			for _, tag := range []string{"script", "style"} {
				m := regexp.MustCompile(`(?s)<`+tag+`>(.*?)</`+tag+`>`).FindAllStringSubmatch(page, -1)
				if len(m) != 1 {
					t.Fatalf("expected one inline %s, got %d", tag, len(m))
				}
				if want := tag + "-src '" + cspHash(m[0][1]) + "'"; !strings.Contains(csp, want) {
					t.Errorf("expected the CSP to allow the %s served (%s), got %q", tag, want, csp)
				}
			}
		})
	}
}

func TestStatusMethodsAndFormats(t *testing.T) {
	s := newStatusPage(t, nil)
	for _, method := range []string{http.MethodPost, http.MethodPut, http.MethodDelete} {
		rec := serveStatus(t, s, method, "/status/")
		if rec.Code != http.StatusMethodNotAllowed || rec.Header().Get("Allow") != "GET, HEAD" {
			t.Errorf("%s: expected 405 with Allow: GET, HEAD, got %d %q", method, rec.Code, rec.Header().Get("Allow"))
		}
	}
	for _, target := range []string{"/status/", "/status/?format=json"} {
		rec := serveStatus(t, s, http.MethodHead, target)
		if rec.Code != http.StatusOK || rec.Body.Len() != 0 || rec.Header().Get("Content-Length") == "0" {
			t.Errorf("HEAD %s: expected 200, a length and no body, got %d %q %d bytes", target, rec.Code, rec.Header().Get("Content-Length"), rec.Body.Len())
		}
	}
	if rec := serveStatus(t, s, http.MethodGet, "/status/?format=xml"); rec.Code != http.StatusBadRequest {
		t.Errorf("expected 400 for an unknown format, got %d", rec.Code)
	}
}

func durationPtr(d time.Duration) *caddy.Duration {
	cd := caddy.Duration(d)
	return &cd
}

func TestStatusCaddyfile(t *testing.T) {
	for _, tc := range []struct {
		input string
		want  *caddy.Duration
	}{
		{"llm_router_status", nil},
		{"llm_router_status {\n}", nil},
		{"llm_router_status {\n\trefresh 5s\n}", durationPtr(5 * time.Second)},
		{"llm_router_status {\n\trefresh 0\n}", durationPtr(0)},
		{"llm_router_status {\n\trefresh 250ms\n}", durationPtr(250 * time.Millisecond)},
	} {
		s := new(StatusPage)
		if err := s.UnmarshalCaddyfile(caddyfile.NewTestDispenser(tc.input)); err != nil {
			t.Errorf("%q: %v", tc.input, err)
			continue
		}
		if !reflect.DeepEqual(s.Refresh, tc.want) {
			t.Errorf("%q: expected refresh %v, got %v", tc.input, tc.want, s.Refresh)
		}
	}
	for _, tc := range []struct{ input, want string }{
		{"llm_router_status extra", "wrong argument count"},
		{"llm_router_status {\n\trefresh\n}", "wrong argument count"},
		{"llm_router_status {\n\trefresh 1s 2s\n}", "wrong argument count"},
		{"llm_router_status {\n\trefresh soon\n}", "refresh: "},
		{"llm_router_status {\n\trefresh -1s\n}", "refresh must be 0 (off) or at least 250ms"},
		{"llm_router_status {\n\trefresh 10ms\n}", "refresh must be 0 (off) or at least 250ms"},
		{"llm_router_status {\n\trefresh 1s\n\trefresh 2s\n}", "duplicate subdirective refresh"},
		{"llm_router_status {\n\tinterval 1s\n}", "unknown subdirective interval"},
	} {
		err := new(StatusPage).UnmarshalCaddyfile(caddyfile.NewTestDispenser(tc.input))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: expected an error containing %q, got %v", tc.input, tc.want, err)
		}
	}
	if err := (&StatusPage{Refresh: durationPtr(time.Millisecond)}).Provision(newCaddyContext(t)); err == nil {
		t.Error("expected a JSON config with refresh 1ms refused at load")
	}
}

// The directive needs no order line and no route: it sits before
// llm_router (right after metrics), and where a handle block puts it.
func TestStatusCaddyfileAdapt(t *testing.T) {
	adapted, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(`:8080 {
	llm_router /v1/* {
		provider p {
			type openai
			base_url http://127.0.0.1:9/v1
			api_key none
		}
		model m {
			deployment p x
		}
	}
	llm_router_status /status/*
	handle /ops/llm/* {
		llm_router_status {
			refresh 5s
		}
	}
}`), nil)
	if err != nil {
		t.Fatal(err)
	}
	var cfg struct {
		Apps struct {
			HTTP struct {
				Servers map[string]struct {
					Routes []json.RawMessage `json:"routes"`
				} `json:"servers"`
			} `json:"http"`
		} `json:"apps"`
	}
	if err := json.Unmarshal(adapted, &cfg); err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, r := range cfg.Apps.HTTP.Servers["srv0"].Routes {
		var route struct {
			Match  []struct{ Path []string } `json:"match"`
			Handle []json.RawMessage         `json:"handle"`
		}
		if err := json.Unmarshal(r, &route); err != nil {
			t.Fatal(err)
		}
		path := ""
		if len(route.Match) > 0 {
			path = strings.Join(route.Match[0].Path, ",")
		}
		handler := ""
		for _, h := range route.Handle {
			switch {
			case strings.Contains(string(h), `"handler":"llm_router_status","refresh":5000000000`):
				handler = "llm_router_status refresh 5s"
			case strings.Contains(string(h), `"handler":"llm_router_status"`):
				handler = "llm_router_status"
			case strings.Contains(string(h), `"handler":"llm_router"`):
				handler = "llm_router"
			}
		}
		got = append(got, path+" "+handler)
	}
	want := []string{"/ops/llm/* llm_router_status refresh 5s", "/status/* llm_router_status", "/v1/* llm_router"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("expected the routes %q, got %q in\n%s", want, got, adapted)
	}
}

// cspHash is a Content-Security-Policy hash source for an inline
// element's text (sha256, base64), computed here as a browser does.
func cspHash(text string) string {
	sum := sha256.Sum256([]byte(text))
	return "sha256-" + base64.StdEncoding.EncodeToString(sum[:])
}
