package integration

import (
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// The fault matrix: each way a provider misbehaves, streaming and not, with
// the outcome, the attempts counted at the fake provider and the time taken
// checked against the deadline.

// provider is one upstream in a fault test's config.
type provider struct {
	name, baseURL, extra string // extra: provider subdirectives
	quality              string // ranks the deployment; "" = 0
}

// routerFor is a router on :9080 with one model group over providers, and
// mocks: llm_mock sites (port -> body).
func routerFor(opts, group string, providers []provider, mocks map[int]string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "http://localhost:9080 {\n\tllm_router /v1/* {\n\t\t%s\n", opts)
	for _, p := range providers {
		key := "\t\t\tapi_key none\n"
		if strings.Contains(p.extra, "api_key") {
			key = ""
		}
		fmt.Fprintf(&b, "\t\tprovider %s {\n\t\t\ttype openai\n%s\t\t\tbase_url %s\n\t\t\t%s\n\t\t}\n", p.name, key, p.baseURL, p.extra)
	}
	fmt.Fprintf(&b, "\t\tmodel %s {\n", group)
	for _, p := range providers {
		fmt.Fprintf(&b, "\t\t\tdeployment %s %s-%s {\n\t\t\t\tquality %s\n\t\t\t}\n", p.name, group, p.name, orZero(p.quality))
	}
	b.WriteString("\t\t}\n\t}\n}\n")
	for port, body := range mocks {
		fmt.Fprintf(&b, "http://localhost:%d {\n\tllm_mock {\n\t\t%s\n\t}\n}\n", port, body)
	}
	return b.String()
}

func orZero(s string) string {
	if s == "" {
		return "0"
	}
	return s
}

// outcome is what a client saw of one request.
type outcome struct {
	status     int
	attempts   string
	deployment string
	body       string
	events     []string // data lines of a stream
	took       time.Duration
}

func (o outcome) done() bool {
	return len(o.events) > 0 && o.events[len(o.events)-1] == "[DONE]"
}

func (o outcome) inBandError() bool {
	return len(o.events) > 0 && strings.Contains(o.events[len(o.events)-1], `"stream_interrupted"`)
}

func ask(t *testing.T, group string, stream bool) outcome {
	t.Helper()
	start := time.Now()
	resp := chat(t, group, stream)
	o := outcome{status: resp.StatusCode, attempts: resp.Header.Get("X-LLM-Router-Attempts"),
		deployment: resp.Header.Get("X-LLM-Router-Deployment")}
	if stream && resp.StatusCode == 200 {
		for _, ev := range readSSE(t, resp) {
			o.events = append(o.events, ev.data)
		}
	} else {
		o.body = readBody(t, resp)
	}
	o.took = time.Since(start)
	return o
}

// both runs f streaming and not.
func both(t *testing.T, f func(t *testing.T, stream bool)) {
	for _, stream := range []bool{false, true} {
		t.Run(fmt.Sprintf("stream=%v", stream), func(t *testing.T) { f(t, stream) })
	}
}

// success checks a complete answer from deployment.
func success(t *testing.T, o outcome, stream bool, deployment, attempts string) {
	t.Helper()
	if o.status != 200 || o.deployment != deployment || o.attempts != attempts {
		t.Errorf("expected 200 from %s after %s attempts, got %d from %q after %q: %s", deployment, attempts, o.status, o.deployment, o.attempts, o.body)
	}
	if stream && !o.done() {
		t.Errorf("expected a complete stream, got %v", o.events)
	}
}

func within(t *testing.T, o outcome, lo, hi time.Duration) {
	t.Helper()
	if o.took < lo || o.took > hi {
		t.Errorf("expected the answer within [%v, %v], took %v", lo, hi, o.took)
	}
}

const mockA, mockB = "http://localhost:9081/v1", "http://localhost:9082/v1"

func TestFault429Once(t *testing.T) {
	for _, tc := range []struct {
		name, header string
		wait         time.Duration
	}{
		{"with Retry-After", "header Retry-After 1", time.Second},
		{"without Retry-After", "", 300 * time.Millisecond}, // the backoff floor
	} {
		t.Run(tc.name, func(t *testing.T) {
			both(t, func(t *testing.T, stream bool) {
				group := fmt.Sprintf("r1-%d-%v", len(tc.header), stream)
				// Every 2nd request is a 429: the priming request passes, the
				// next attempt meets the 429, its retry passes.
				load(t, routerFor("backoff_base 300ms\n deadline 5s", group,
					[]provider{{name: "a", baseURL: mockA}},
					map[int]string{9081: "fault rate_limit {\n every 2\n " + tc.header + "\n }"}))
				ask(t, group, stream)
				o := ask(t, group, stream)
				success(t, o, stream, "a/"+group+"-a", "2")
				within(t, o, tc.wait, tc.wait+time.Second)
				if n := stats(t, 9081).Requests; n != 3 {
					t.Errorf("expected 3 requests at the mock (priming, 429, retry), got %d", n)
				}
			})
		})
	}
}

func TestFault429Persistent(t *testing.T) {
	both(t, func(t *testing.T, stream bool) {
		group := fmt.Sprintf("rp-%v", stream)
		// Alone and without Retry-After: backoff 200, 400, 800 ms, then 429.
		load(t, routerFor("backoff_base 200ms\n deadline 5s", group, []provider{{name: "a", baseURL: mockA}},
			map[int]string{9081: "fault rate_limit"}))
		o := ask(t, group, stream)
		if o.status != 429 || o.attempts != "4" || !strings.Contains(o.body, "rate_limit_exceeded") {
			t.Errorf("expected 429 after max_attempts 4, got %d after %q: %s", o.status, o.attempts, o.body)
		}
		within(t, o, 1400*time.Millisecond, 3*time.Second)
		if n := stats(t, 9081).Requests; n != 4 {
			t.Errorf("expected 4 attempts at the mock, no blind loop, got %d", n)
		}
	})
}

func TestFault5xx(t *testing.T) {
	both(t, func(t *testing.T, stream bool) {
		group := fmt.Sprintf("s5-%v", stream)
		// 500 once on a lone deployment: retried after the backoff.
		load(t, routerFor("backoff_base 200ms\n deadline 5s", group, []provider{{name: "a", baseURL: mockA}},
			map[int]string{9081: "fault status {\n every 2\n status 500\n }"}))
		ask(t, group, stream)
		o := ask(t, group, stream)
		success(t, o, stream, "a/"+group+"-a", "2")
		within(t, o, 200*time.Millisecond, 1200*time.Millisecond)

		// 503 persistent: another deployment answers at once; alone, 502.
		load(t, routerFor("backoff_base 200ms\n deadline 5s", group+"p", []provider{{name: "a", baseURL: mockA, quality: "1"}, {name: "b", baseURL: mockB}},
			map[int]string{9081: "fault status {\n status 503\n }", 9082: ""}))
		o = ask(t, group+"p", stream)
		success(t, o, stream, "b/"+group+"p-b", "2")
		within(t, o, 0, 500*time.Millisecond)
		load(t, routerFor("backoff_base 100ms\n deadline 5s", group+"q", []provider{{name: "a", baseURL: mockA}},
			map[int]string{9081: "fault status {\n status 503\n }"}))
		o = ask(t, group+"q", stream)
		if o.status != 502 || o.attempts != "4" || !strings.Contains(o.body, "upstream_unavailable") {
			t.Errorf("expected 502 after 4 attempts, got %d after %q: %s", o.status, o.attempts, o.body)
		}
		within(t, o, 700*time.Millisecond, 3*time.Second)
	})
}

// rawServer listens on port and runs handle on each connection, for faults
// llm_mock cannot script (resets, TLS, malformed streams).
func rawServer(t *testing.T, port int, handle func(net.Conn)) {
	t.Helper()
	ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go handle(c)
		}
	}()
}

func TestFaultTransport(t *testing.T) {
	// Reset before headers: accept, read the request, close with RST.
	rawServer(t, 9086, func(c net.Conn) {
		buf := make([]byte, 4096)
		_, _ = c.Read(buf)
		if tc, ok := c.(*net.TCPConn); ok {
			_ = tc.SetLinger(0)
		}
		c.Close()
	})
	// TLS with a certificate nobody trusts.
	tlsSrv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	ln, err := net.Listen("tcp", "127.0.0.1:9087")
	if err != nil {
		t.Fatal(err)
	}
	tlsSrv.Listener = ln
	tlsSrv.StartTLS()
	t.Cleanup(tlsSrv.Close)

	for _, tc := range []struct{ name, baseURL string }{
		{"refused", "http://127.0.0.1:9085/v1"},
		{"reset before headers", "http://127.0.0.1:9086/v1"},
		{"TLS failure", "https://127.0.0.1:9087/v1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			both(t, func(t *testing.T, stream bool) {
				group := fmt.Sprintf("tr-%d-%v", len(tc.name), stream)
				load(t, routerFor("deadline 5s", group, []provider{{name: "a", baseURL: tc.baseURL, quality: "1"}, {name: "b", baseURL: mockB}},
					map[int]string{9082: ""}))
				o := ask(t, group, stream)
				success(t, o, stream, "b/"+group+"-b", "2")
				within(t, o, 0, time.Second)
			})
		})
	}
}

func TestFaultHang(t *testing.T) {
	both(t, func(t *testing.T, stream bool) {
		group := fmt.Sprintf("hg-%v", stream)
		timeouts := "timeout 300ms\n ttft_timeout 300ms"
		// A silent a ends at its own timeout, and b (failing) is retried,
		// never the silent a again while b exists.
		load(t, routerFor("deadline 5s\n backoff_base 100ms", group,
			[]provider{{name: "a", baseURL: mockA, extra: timeouts, quality: "1"}, {name: "b", baseURL: mockB}},
			map[int]string{9081: "fault hang", 9082: "fault status {\n status 503\n }"}))
		o := ask(t, group, stream)
		if o.status != 502 || o.attempts != "4" {
			t.Errorf("expected 502 after 4 attempts, got %d after %q: %s", o.status, o.attempts, o.body)
		}
		if a, b := stats(t, 9081).Requests, stats(t, 9082).Requests; a != 1 || b != 3 {
			t.Errorf("expected the silent a tried once and b 3 times, got %d and %d", a, b)
		}
		within(t, o, 300*time.Millisecond, 2*time.Second)

		// The deadline comes before the provider's timeout: 504 at the deadline.
		load(t, routerFor("deadline 700ms", group+"d", []provider{{name: "a", baseURL: mockA, extra: "timeout 30s\n ttft_timeout 30s"}},
			map[int]string{9081: "fault hang"}))
		o = ask(t, group+"d", stream)
		if o.status != 504 || o.attempts != "1" {
			t.Errorf("expected 504 after 1 attempt, got %d after %q", o.status, o.attempts)
		}
		within(t, o, 650*time.Millisecond, 1500*time.Millisecond)
	})
}

func TestFaultLateFirstToken(t *testing.T) {
	for _, tc := range []struct{ name, mock string }{
		{"silent", "first_token_delay 3s"},
		// Keep-alive comments are not a first token and do not commit.
		{"keep-alive comments", "first_token_delay 3s\n fault keepalive"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			group := fmt.Sprintf("lt-%d", len(tc.name))
			load(t, routerFor("deadline 5s", group,
				[]provider{{name: "a", baseURL: mockA, extra: "ttft_timeout 400ms", quality: "1"}, {name: "b", baseURL: mockB}},
				map[int]string{9081: tc.mock, 9082: ""}))
			o := ask(t, group, true)
			success(t, o, true, "b/"+group+"-b", "2")
			within(t, o, 400*time.Millisecond, 1500*time.Millisecond)
		})
	}
}

func TestFaultStreamGoesSilent(t *testing.T) {
	load(t, routerFor("deadline 5s\n\t\tresume off", "idle",
		[]provider{{name: "a", baseURL: mockA, extra: "idle_timeout 300ms", quality: "1"}, {name: "b", baseURL: mockB}},
		map[int]string{9081: "chunks 3\n chunk_interval 3s", 9082: ""}))
	o := ask(t, "idle", true)
	if len(o.events) != 2 || !o.inBandError() || o.done() {
		t.Errorf("expected one chunk then an in-band error, got %v", o.events)
	}
	within(t, o, 300*time.Millisecond, 1500*time.Millisecond)
	// The router stays healthy: the next request is answered (by b, a failed).
	if o := ask(t, "idle", false); o.status != 200 {
		t.Errorf("expected the next request answered, got %d", o.status)
	}
}

func TestFaultMidStreamErrorEachDialect(t *testing.T) {
	for _, dialect := range []string{"openai", "anthropic", "gemini"} {
		t.Run(dialect, func(t *testing.T) {
			typ, base := dialect, mockA
			if dialect == "gemini" {
				base = "http://localhost:9081/v1beta"
			}
			group := "ms-" + dialect
			cfg := routerFor("deadline 5s\n\t\tresume off", group, []provider{{name: "a", baseURL: base, quality: "1"}, {name: "b", baseURL: mockB}},
				map[int]string{9081: "dialect " + dialect + "\n chunks 5\n fault error_event {\n after 2\n }", 9082: ""})
			cfg = strings.Replace(cfg, "type openai\n\t\t\tapi_key none\n\t\t\tbase_url "+base, "type "+typ+"\n\t\t\tapi_key none\n\t\t\tbase_url "+base, 1)
			load(t, cfg)
			o := ask(t, group, true)
			if o.status != 200 || o.deployment != "a/"+group+"-a" {
				t.Fatalf("expected a's stream, got %d from %q", o.status, o.deployment)
			}
			if !o.inBandError() || o.done() || len(o.events) < 2 {
				t.Errorf("expected content then an in-band error and no [DONE], got %v", o.events)
			}
			if n := stats(t, 9082).Requests; n != 0 {
				t.Errorf("no failover after the first byte, yet b got %d", n)
			}
		})
	}
}

// sseServer answers every request with a fixed event stream.
func sseServer(t *testing.T, port int, body string) {
	t.Helper()
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = w.Write([]byte(body))
	})}
	ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { srv.Close() })
}

func TestFaultMalformedStreams(t *testing.T) {
	const chunk = `data: {"id":"x","object":"chat.completion.chunk","model":"m","choices":[{"index":0,"delta":{"content":"Hi"},"finish_reason":null}]}` + "\n\n"
	const final = `data: {"id":"x","object":"chat.completion.chunk","model":"m","choices":[{"index":0,"delta":{},"finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4}}` + "\n\n"
	// An invalid JSON event after content began: in-band error.
	sseServer(t, 9086, chunk+"data: {\"choices\":[{\"delta\":{\"content\":\"oops\n\n"+final)
	// Complete, but no [DONE]: finished for the client; the usage counted,
	// and kept from a client that did not ask for it.
	sseServer(t, 9087, chunk+final)
	load(t, routerFor("deadline 5s", "mal", []provider{{name: "bad", baseURL: "http://127.0.0.1:9086/v1"}}, nil))
	o := ask(t, "mal", true)
	if !o.inBandError() || o.done() {
		t.Errorf("invalid JSON event: expected an in-band error, got %v", o.events)
	}
	load(t, routerFor("deadline 5s", "nodone", []provider{{name: "ok", baseURL: "http://127.0.0.1:9087/v1"}}, nil))
	o = ask(t, "nodone", true)
	if !o.done() || len(o.events) != 3 || !strings.Contains(o.events[1], `"finish_reason":"stop"`) || strings.Contains(o.events[1], `"usage"`) {
		t.Errorf("complete stream without [DONE]: expected chunk, final without the usage nobody asked for, [DONE]; got %v", o.events)
	}
}

func TestFaultClientErrors(t *testing.T) {
	tooLong := `{"error":{"message":"This model's maximum context length is 8192 tokens.","type":"invalid_request_error","param":"messages","code":"context_length_exceeded"}}`
	policy := `{"error":{"message":"Your request was rejected as a result of our safety system.","type":"invalid_request_error","param":null,"code":"content_policy_violation"}}`
	both(t, func(t *testing.T, stream bool) {
		group := fmt.Sprintf("ce-%v", stream)
		cfg := routerFor("deadline 5s", group, []provider{{name: "small", baseURL: mockA, quality: "1"}, {name: "large", baseURL: mockB}},
			map[int]string{9081: "fault status {\n status 400\n body " + fmt.Sprintf("%q", tooLong) + "\n }", 9082: ""})
		cfg = strings.Replace(cfg, "quality 1\n", "quality 1\n\t\t\t\tcontext_window 8192\n", 1)
		cfg = strings.Replace(cfg, "-large {\n\t\t\t\tquality 0\n", "-large {\n\t\t\t\tquality 0\n\t\t\t\tcontext_window 128000\n", 1)
		load(t, cfg)
		o := ask(t, group, stream)
		success(t, o, stream, "large/"+group+"-large", "2")
		o = ask(t, group, stream)
		if n := stats(t, 9081).Requests; n != 2 {
			t.Errorf("context_length: expected small tried once per request, got %d", n)
		}

		// No larger window: the 400 goes to the client as it is.
		load(t, routerFor("deadline 5s", group+"x", []provider{{name: "small", baseURL: mockA}},
			map[int]string{9081: "fault status {\n status 400\n body " + fmt.Sprintf("%q", tooLong) + "\n }"}))
		o = ask(t, group+"x", stream)
		if o.status != 400 || !strings.Contains(o.body, "context_length_exceeded") || o.attempts != "1" {
			t.Errorf("expected the provider's 400 after 1 attempt, got %d after %q: %s", o.status, o.attempts, o.body)
		}

		// Content policy: returned as it is, never retried elsewhere.
		load(t, routerFor("deadline 5s", group+"p", []provider{{name: "a", baseURL: mockA, quality: "1"}, {name: "b", baseURL: mockB}},
			map[int]string{9081: "fault status {\n status 400\n body " + fmt.Sprintf("%q", policy) + "\n }", 9082: ""}))
		o = ask(t, group+"p", stream)
		if o.status != 400 || !strings.Contains(o.body, "content_policy_violation") || stats(t, 9082).Requests != 0 {
			t.Errorf("expected the content policy 400 passed on without retry, got %d: %s", o.status, o.body)
		}
	})
}

func TestFaultGarbageRateLimitValues(t *testing.T) {
	for _, tc := range []struct{ name, headers string }{
		{"negative", "header Retry-After -30\n header x-ratelimit-remaining-requests -5\n header x-ratelimit-reset-requests -10s"},
		{"huge", "header Retry-After 1e12\n header retry-after-ms 1e300\n header x-ratelimit-reset-tokens 99999999h"},
		{"garbage", "header Retry-After soon\n header x-ratelimit-remaining-requests lots\n header x-ratelimit-reset-requests whenever"},
		{"contradictory", "header x-ratelimit-limit-requests 10\n header x-ratelimit-remaining-requests 5000\n header Retry-After 0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			group := "gb-" + tc.name
			load(t, routerFor("deadline 3s\n backoff_base 100ms", group, []provider{{name: "a", baseURL: mockA}},
				map[int]string{9081: "fault rate_limit {\n " + tc.headers + "\n }"}))
			o := ask(t, group, false)
			if o.status != 429 || o.attempts != "4" {
				t.Errorf("expected a bounded 429 after 4 attempts, got %d after %q", o.status, o.attempts)
			}
			// Waits of 100, 200, 400 ms: neither an instant loop nor a wait past the deadline.
			within(t, o, 600*time.Millisecond, 3*time.Second)
		})
	}
}

// The router's own log never holds a provider key or a client's credential.
func TestNoKeysInLogs(t *testing.T) {
	logFile := filepath.Join(t.TempDir(), "caddy.log")
	t.Setenv("LLM_ROUTER_TEST_KEY", "sk-secret-provider-key")
	cfg := routerFor("deadline 2s", "keys", []provider{{name: "a", baseURL: mockA, extra: "api_key {env.LLM_ROUTER_TEST_KEY}", quality: "1"}, {name: "b", baseURL: mockB}},
		map[int]string{9081: "api_key other-key", 9082: ""})
	// Caddy's own log (the router logs there) and the access log, at
	// debug, the latter with the client key headers filtered as docs/security.md says.
	cfg = strings.Replace(cfg, "http://localhost:9080 {\n", "http://localhost:9080 {\n\tlog {\n\t\toutput file "+logFile+
		"\n\t\tformat filter {\n\t\t\trequest>headers>X-Api-Key delete\n\t\t}\n\t}\n", 1)
	loadGlobal(t, "log {\n\t\toutput file "+logFile+"\n\t\tlevel DEBUG\n\t}", cfg)
	resp := chat(t, "keys", false, "Authorization", "Bearer sk-client-secret", "X-Api-Key", "sk-client-x-api-key")
	readBody(t, resp)
	if resp.StatusCode != 200 {
		t.Fatalf("expected b to answer after a's 401, got %d", resp.StatusCode)
	}
	time.Sleep(100 * time.Millisecond)
	raw, err := os.ReadFile(logFile)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(raw), "deployment disabled") {
		t.Errorf("expected the 401 logged, log was:\n%s", raw)
	}
	for _, secret := range []string{"sk-secret-provider-key", "sk-client-secret", "sk-client-x-api-key"} {
		if strings.Contains(string(raw), secret) {
			t.Errorf("the log holds %s", secret)
		}
	}
}
