// Package integration runs a real Caddy (in this test binary) with the
// llm_router and llm_mock modules, configured by Caddyfiles, and talks to it
// over HTTP as clients do, including the official OpenAI Go SDK.
//
// One Caddy serves the whole package: tests load their own config in turn
// and must not run in parallel. Capacity state survives config loads (it is
// meant to survive reloads), so each test uses upstream model names of its
// own.
package integration

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/caddytest"

	_ "github.com/llmrouter/caddy-llm-router"
	_ "github.com/llmrouter/caddy-llm-router/mockllm"
)

const routerURL = "http://localhost:9080"

func TestMain(m *testing.M) {
	// The router's tests use plain HTTP only: no test certificates needed.
	caddytest.Default.Certificates = nil
	caddytest.Default.TestRequestTimeout = 30 * time.Second
	os.Exit(m.Run())
}

// global is the options block every test config starts with.
const global = `{
	admin localhost:2999
	skip_install_trust
	http_port 9080
	https_port 9443
	grace_period 1ns
	persist_config off
}
`

// load starts (or reconfigures) the in-process Caddy; it fails the test at
// once when the config does not load.
func load(t *testing.T, config string) *caddytest.Tester {
	t.Helper()
	return loadGlobal(t, "", config)
}

// loadGlobal is load with extra global options.
func loadGlobal(t *testing.T, options, config string) *caddytest.Tester {
	t.Helper()
	// caddytest skips when Caddy cannot start (a port taken): here that is a failure.
	t.Cleanup(func() {
		if t.Skipped() {
			t.Error("the in-process Caddy could not start; are ports 2999 and 9080-9082 free?")
		}
	})
	tester := caddytest.NewTester(t).WithDefaultOverrides(caddytest.Config{TestRequestTimeout: 30 * time.Second})
	tester.InitServer(strings.Replace(global, "persist_config off\n", "persist_config off\n\t"+options+"\n", 1)+config, "caddyfile")
	if t.Failed() {
		t.FailNow()
	}
	// The reload closed the old servers' connections: do not reuse them.
	http.DefaultClient.CloseIdleConnections()
	drainOldAccepts(t, config)
	return tester
}

// sitePorts are the ports of a config's site addresses.
var sitePorts = regexp.MustCompile(`(?m)^\s*(?:https?://)?(?:localhost|127\.0\.0\.1):(\d+)\b`)

// drainOldAccepts takes, on each site port of config, the connection that
// the previous config's server for that port may still accept. Caddy
// shares a listener between a server and its successor; Close wakes the
// old server's pending Accept with a deadline in the past, but when the
// new server's Accept clears that deadline first, the old one stays
// blocked, and takes the next connection to the port, whenever it comes,
// to serve it with the old config (then it sees its listener closed and
// stops). That was the reload flake: a request, or the router's attempt
// on a mock, met the previous config (a 404 for a new model group, a reset
// connection). The two servers take turns at the socket (Go serializes
// Accept on it), so two connections in a row reach both: the old one's
// last, and the new one.
func drainOldAccepts(t *testing.T, config string) {
	t.Helper()
	seen := map[string]bool{}
	for _, m := range sitePorts.FindAllStringSubmatch(config, -1) {
		port := m[1]
		if seen[port] {
			continue
		}
		seen[port] = true
		for range 2 {
			conn, err := net.DialTimeout("tcp", "localhost:"+port, 2*time.Second)
			if err != nil {
				break // not a Caddy site (a test's own server), or not up
			}
			_ = conn.SetDeadline(time.Now().Add(2 * time.Second))
			_, _ = conn.Write([]byte("HEAD / HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"))
			_, _ = io.Copy(io.Discard, conn)
			conn.Close()
		}
	}
}

// mockStats reads what an llm_mock site saw.
type mockStats struct {
	Requests          int64             `json:"requests"`
	CountTokens       int64             `json:"count_tokens"`
	LastModel         string            `json:"last_model"`
	LastAuthorization string            `json:"last_authorization"`
	LastAPIKey        string            `json:"last_api_key"`
	LastHeaders       map[string]string `json:"last_headers"`
	LastBody          string            `json:"last_body"`
}

func stats(t *testing.T, port int) mockStats {
	t.Helper()
	resp, err := http.Get(fmt.Sprintf("http://localhost:%d/llm_mock/stats", port))
	for try := 0; retryable(err) && try < 3; try++ {
		time.Sleep(50 * time.Millisecond)
		resp, err = http.Get(fmt.Sprintf("http://localhost:%d/llm_mock/stats", port))
	}
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var s mockStats
	if err := json.NewDecoder(resp.Body).Decode(&s); err != nil {
		t.Fatalf("stats of :%d: %v", port, err)
	}
	return s
}

func chat(t *testing.T, model string, stream bool, headers ...string) *http.Response {
	t.Helper()
	return chatBody(t, fmt.Sprintf(`{"model":%q,"stream":%v,"messages":[{"role":"user","content":"Say hello."}]}`, model, stream), headers...)
}

// chatBody posts a Chat Completions request's body (see chat).
func chatBody(t *testing.T, body string, headers ...string) *http.Response {
	t.Helper()
	for try := 0; ; try++ {
		req, err := http.NewRequest(http.MethodPost, routerURL+"/v1/chat/completions", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		for i := 0; i+1 < len(headers); i += 2 {
			req.Header.Set(headers[i], headers[i+1])
		}
		resp, err := http.DefaultClient.Do(req)
		if retryable(err) && try < 3 {
			time.Sleep(50 * time.Millisecond)
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
}

// retryable: right after a config load, a connection may still reach the
// old server as it shuts down and be closed before any answer, so nothing
// reached the router or a mock: worth another try.
func retryable(err error) bool {
	return err != nil && (errors.Is(err, io.EOF) || strings.Contains(err.Error(), "connection reset"))
}

func readBody(t *testing.T, resp *http.Response) string {
	t.Helper()
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// twoProviders is a router on :9080 with deployments on two llm_mock sites,
// a (preferred by quality) on :9081 and b on :9082, plus the mocks' bodies.
func twoProviders(routerOpts, group, modelA, modelB, mockA, mockB string) string {
	return fmt.Sprintf(`
http://localhost:9080 {
	llm_router /v1/* {
		%s
		provider a {
			type openai
			base_url http://localhost:9081/v1
			api_key sk-provider-a
		}
		provider b {
			type openai
			base_url http://localhost:9082/v1
			api_key sk-provider-b
		}
		model %s {
			deployment a %s {
				quality 0.9
			}
			deployment b %s {
				quality 0.5
			}
		}
	}
}
http://localhost:9081 {
	llm_mock {
		%s
	}
}
http://localhost:9082 {
	llm_mock {
		%s
	}
}
`, routerOpts, group, modelA, modelB, mockA, mockB)
}

func TestFailoverOn429AndCooldown(t *testing.T) {
	load(t, twoProviders("", "fast", "fo-a", "fo-b",
		"fault rate_limit {\n header Retry-After 30\n }", ""))

	resp := chat(t, "fast", false)
	body := readBody(t, resp)
	if resp.StatusCode != 200 {
		t.Fatalf("expected 200, got %d: %s", resp.StatusCode, body)
	}
	if got := resp.Header.Get("X-LLM-Router-Deployment"); got != "b/fo-b" {
		t.Errorf("expected b/fo-b to answer, got %q", got)
	}
	if got := resp.Header.Get("X-LLM-Router-Attempts"); got != "2" {
		t.Errorf("expected 2 attempts, got %q", got)
	}
	var completion struct {
		Model   string `json:"model"`
		Choices []struct {
			Message struct{ Content string } `json:"message"`
		} `json:"choices"`
	}
	if err := json.Unmarshal([]byte(body), &completion); err != nil || completion.Model != "fo-b" || len(completion.Choices) != 1 {
		t.Errorf("expected a completion naming the upstream model fo-b, got %s (%v)", body, err)
	}

	// Within the 30 s, a is not touched: every answer comes from b at once.
	for i := 0; i < 5; i++ {
		resp := chat(t, "fast", false)
		readBody(t, resp)
		if resp.Header.Get("X-LLM-Router-Deployment") != "b/fo-b" || resp.Header.Get("X-LLM-Router-Attempts") != "1" {
			t.Errorf("request %d: expected b after 1 attempt, got %q after %q", i,
				resp.Header.Get("X-LLM-Router-Deployment"), resp.Header.Get("X-LLM-Router-Attempts"))
		}
	}
	if n := stats(t, 9081).Requests; n != 1 {
		t.Errorf("expected a attempted exactly once, got %d", n)
	}
	if n := stats(t, 9082).Requests; n != 6 {
		t.Errorf("expected b to serve 6 requests, got %d", n)
	}
}

func TestAllCoolingAnswers429Quickly(t *testing.T) {
	load(t, twoProviders("deadline 10s", "busy", "ac-a", "ac-b",
		"fault rate_limit {\n header Retry-After 30\n }",
		"fault rate_limit {\n header Retry-After 20\n }"))
	start := time.Now()
	resp := chat(t, "busy", false)
	body := readBody(t, resp)
	elapsed := time.Since(start)
	if resp.StatusCode != 429 {
		t.Fatalf("expected 429, got %d: %s", resp.StatusCode, body)
	}
	if ra := resp.Header.Get("Retry-After"); ra != "20" && ra != "19" {
		t.Errorf("expected Retry-After of about 20 s (the earliest reset), got %q", ra)
	}
	if !strings.Contains(body, `"code":"rate_limit_exceeded"`) || !strings.Contains(body, `"type":"rate_limit_error"`) {
		t.Errorf("expected an OpenAI-format rate-limit error, got %s", body)
	}
	if elapsed > 2*time.Second {
		t.Errorf("expected an answer at once, not a wait, took %v", elapsed)
	}
	// The next request answers without touching either provider.
	resp = chat(t, "busy", false)
	readBody(t, resp)
	if resp.StatusCode != 429 || resp.Header.Get("X-LLM-Router-Attempts") != "0" {
		t.Errorf("expected 429 after 0 attempts, got %d after %q", resp.StatusCode, resp.Header.Get("X-LLM-Router-Attempts"))
	}
	if a, b := stats(t, 9081).Requests, stats(t, 9082).Requests; a != 1 || b != 1 {
		t.Errorf("expected one attempt at each, got %d and %d", a, b)
	}
}

func TestHangEndsAt504ByDeadline(t *testing.T) {
	load(t, twoProviders("deadline 1s", "slow", "hg-a", "hg-b", "fault hang", "fault hang"))
	start := time.Now()
	resp := chat(t, "slow", false)
	body := readBody(t, resp)
	elapsed := time.Since(start)
	if resp.StatusCode != 504 {
		t.Fatalf("expected 504, got %d: %s", resp.StatusCode, body)
	}
	if !strings.Contains(body, `"code":"deadline_exceeded"`) {
		t.Errorf("expected an OpenAI-format timeout error, got %s", body)
	}
	if elapsed < 900*time.Millisecond || elapsed > 3*time.Second {
		t.Errorf("expected the answer at the 1 s deadline, took %v", elapsed)
	}
}

// sseEvent is one data line read by the test client, with its arrival time.
type sseEvent struct {
	data string
	at   time.Time
}

func readSSE(t *testing.T, resp *http.Response) []sseEvent {
	t.Helper()
	defer resp.Body.Close()
	var events []sseEvent
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if line, ok := strings.CutPrefix(sc.Text(), "data: "); ok {
			events = append(events, sseEvent{data: line, at: time.Now()})
		}
	}
	return events
}

func TestStreamRelayedChunkByChunk(t *testing.T) {
	load(t, twoProviders("", "stream", "st-a", "st-b",
		"chunks 5\n chunk_interval 150ms\n reply \"one two three four five\"", ""))
	start := time.Now()
	resp := chat(t, "stream", true)
	if resp.StatusCode != 200 || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		t.Fatalf("expected a 200 event stream, got %d %q", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	if resp.Header.Get("X-LLM-Router-Deployment") != "a/st-a" {
		t.Errorf("expected a/st-a, got %q", resp.Header.Get("X-LLM-Router-Deployment"))
	}
	events := readSSE(t, resp)
	if len(events) < 7 || events[len(events)-1].data != "[DONE]" {
		t.Fatalf("expected 5 chunks, a final chunk and [DONE], got %d events: %v", len(events), events)
	}
	var text strings.Builder
	for _, ev := range events[:len(events)-1] {
		var c struct {
			Model   string `json:"model"`
			Choices []struct {
				Delta struct{ Content string } `json:"delta"`
			} `json:"choices"`
		}
		if err := json.Unmarshal([]byte(ev.data), &c); err != nil {
			t.Fatalf("bad chunk %q: %v", ev.data, err)
		}
		if c.Model != "st-a" {
			t.Errorf("expected chunks to name the upstream model, got %q", c.Model)
		}
		for _, ch := range c.Choices {
			text.WriteString(ch.Delta.Content)
		}
	}
	if text.String() != "one two three four five" {
		t.Errorf("expected the reply reassembled, got %q", text.String())
	}
	// Relayed as they come: the first chunk arrives long before the last.
	first, last := events[0].at.Sub(start), events[len(events)-2].at.Sub(start)
	if last-first < 400*time.Millisecond {
		t.Errorf("expected chunks spread over ~600 ms as the provider paced them, got first %v last %v", first, last)
	}
}

func TestStreamFailsOverBeforeFirstByte(t *testing.T) {
	for _, tc := range []struct{ name, fault string }{
		{"429", "fault rate_limit {\n header Retry-After 30\n }"},
		{"error event before content", "fault error_event {\n after 0\n }"},
		{"503", "fault status {\n status 503\n }"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			model := "sf-" + strings.ReplaceAll(tc.name, " ", "-")
			load(t, twoProviders("", "sfo", model+"-a", model+"-b", tc.fault, "chunks 3"))
			resp := chat(t, "sfo", true)
			if resp.StatusCode != 200 {
				t.Fatalf("expected 200, got %d: %s", resp.StatusCode, readBody(t, resp))
			}
			if got := resp.Header.Get("X-LLM-Router-Deployment"); got != "b/"+model+"-b" {
				t.Errorf("expected b to answer, got %q", got)
			}
			if resp.Header.Get("X-LLM-Router-Attempts") != "2" {
				t.Errorf("expected 2 attempts, got %q", resp.Header.Get("X-LLM-Router-Attempts"))
			}
			events := readSSE(t, resp)
			if len(events) == 0 || events[len(events)-1].data != "[DONE]" {
				t.Errorf("expected a complete stream from b, got %v", events)
			}
			for _, ev := range events {
				if strings.Contains(ev.data, `"error"`) {
					t.Errorf("the client must not see a's failure, got %q", ev.data)
				}
			}
		})
	}
}

func TestStreamFailureAfterFirstByteIsInBand(t *testing.T) {
	for _, tc := range []struct{ name, fault string }{
		{"cut", "fault cut {\n after 2\n }"},
		{"error event", "fault error_event {\n after 2\n }"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			model := "mid-" + strings.ReplaceAll(tc.name, " ", "-")
			load(t, twoProviders("resume off", "mid", model+"-a", model+"-b", "chunks 5\n "+tc.fault, ""))
			resp := chat(t, "mid", true)
			events := readSSE(t, resp)
			if len(events) != 3 {
				t.Fatalf("expected 2 chunks and an error event, got %d: %v", len(events), events)
			}
			last := events[len(events)-1].data
			if !strings.Contains(last, `"error"`) || !strings.Contains(last, `"code":"stream_interrupted"`) {
				t.Errorf("expected an in-band OpenAI error event last, got %q", last)
			}
			for _, ev := range events {
				if ev.data == "[DONE]" {
					t.Error("a failed stream must not end with [DONE]")
				}
			}
			if n := stats(t, 9082).Requests; n != 0 {
				t.Errorf("after the first byte there is no failover, yet b got %d requests", n)
			}
		})
	}
}

func TestClientAuthorizationNeverReachesUpstream(t *testing.T) {
	load(t, twoProviders("", "auth", "au-a", "au-b", "api_key sk-provider-a", ""))
	resp := chat(t, "auth", false, "Authorization", "Bearer client-secret-token", "X-Api-Key", "client-x-api-key")
	body := readBody(t, resp)
	if resp.StatusCode != 200 || resp.Header.Get("X-LLM-Router-Deployment") != "a/au-a" {
		t.Fatalf("expected a to answer (it requires its own key), got %d %s", resp.StatusCode, body)
	}
	s := stats(t, 9081)
	if s.LastAuthorization != "Bearer sk-provider-a" {
		t.Errorf("expected the provider's key upstream, got %q", s.LastAuthorization)
	}
	if len(s.LastHeaders) == 0 {
		t.Error("expected the mock to report the headers it received")
	}
	for k, v := range s.LastHeaders {
		if strings.Contains(v, "client-secret-token") || strings.Contains(v, "client-x-api-key") {
			t.Errorf("client credential reached the provider in %s", k)
		}
	}
	if s.LastModel != "au-a" {
		t.Errorf("expected the upstream model au-a in the body, got %q", s.LastModel)
	}
}

func TestBadRequestsGetOpenAIErrors(t *testing.T) {
	load(t, `
http://localhost:9080 {
	# respond sorts before llm_router; a route keeps the written order.
	route {
		llm_router /v1/* {
			max_body 1KB
			provider a {
				type openai
				api_key none
				base_url http://localhost:9081/v1
			}
			model m {
				deployment a br-a
			}
		}
		respond "next handler" 200
	}
}
http://localhost:9081 {
	llm_mock
}
`)
	for _, tc := range []struct {
		name, body string
		status     int
		code       string
	}{
		{"invalid JSON", `{"model":`, 400, "invalid_json"},
		{"wrong type", `{"model":42,"messages":[]}`, 400, "invalid_json"},
		{"missing model", `{"messages":[{"role":"user","content":"hi"}]}`, 400, "missing_required_parameter"},
		{"missing messages", `{"model":"m"}`, 400, "missing_required_parameter"},
		{"empty messages", `{"model":"m","messages":[]}`, 400, "missing_required_parameter"},
		{"unknown model group", `{"model":"nope","messages":[{"role":"user","content":"hi"}]}`, 404, "model_not_found"},
		{"body is an array", `[{"model":"m"}]`, 400, "invalid_json"},
		{"duplicate model key", `{"model":"m","model":"gpt-4.5-preview","messages":[{"role":"user","content":"hi"}]}`, 400, "invalid_json"},
		{"model key in another case", `{"model":"x","MODEL":"m","messages":[{"role":"user","content":"hi"}]}`, 400, "invalid_json"},
		{"stream key in another case", `{"model":"m","stream":false,"Stream":true,"messages":[{"role":"user","content":"hi"}]}`, 400, "invalid_json"},
		{"messages not objects", `{"model":"m","messages":[1,"x",null]}`, 400, "invalid_json"},
		{"message without role", `{"model":"m","messages":[{"content":"hi"}]}`, 400, "invalid_value"},
		{"model name with path characters", `{"model":"../../etc/passwd","messages":[{"role":"user","content":"hi"}]}`, 404, "model_not_found"},
		{"too large", `{"model":"m","messages":[{"role":"user","content":"` + strings.Repeat("x", 2000) + `"}]}`, 413, "request_too_large"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp, err := http.Post(routerURL+"/v1/chat/completions", "application/json", strings.NewReader(tc.body))
			if err != nil {
				t.Fatal(err)
			}
			body := readBody(t, resp)
			if resp.StatusCode != tc.status {
				t.Errorf("expected %d, got %d: %s", tc.status, resp.StatusCode, body)
			}
			var e struct {
				Error struct {
					Message string `json:"message"`
					Type    string `json:"type"`
					Code    string `json:"code"`
				} `json:"error"`
			}
			if err := json.Unmarshal([]byte(body), &e); err != nil || e.Error.Code != tc.code || e.Error.Message == "" {
				t.Errorf("expected an OpenAI error with code %s, got %s", tc.code, body)
			}
		})
	}
	if n := stats(t, 9081).Requests; n != 0 {
		t.Errorf("bad requests must not reach a provider, got %d", n)
	}

	// Huge headers: refused by Caddy before the router, never sent upstream.
	req, _ := http.NewRequest(http.MethodPost, routerURL+"/v1/chat/completions", strings.NewReader(`{"model":"m","messages":[{"role":"user","content":"hi"}]}`))
	req.Header.Set("X-Huge", strings.Repeat("x", 2<<20))
	if resp, err := http.DefaultClient.Do(req); err == nil {
		readBody(t, resp)
		if resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge {
			t.Errorf("expected 431 for a 2 MB header, got %d", resp.StatusCode)
		}
	}
	// Over max_body without a Content-Length (chunked): 413 all the same.
	req, _ = http.NewRequest(http.MethodPost, routerURL+"/v1/chat/completions",
		io.MultiReader(strings.NewReader(`{"model":"m","messages":[{"role":"user","content":"`), strings.NewReader(strings.Repeat("x", 4000)+`"}]}`)))
	req.Header.Set("Content-Type", "application/json")
	if resp, err := http.DefaultClient.Do(req); err == nil {
		if body := readBody(t, resp); resp.StatusCode != 413 || !strings.Contains(body, "request_too_large") {
			t.Errorf("expected 413 for a chunked body over max_body, got %d %s", resp.StatusCode, body)
		}
	} else {
		t.Fatal(err)
	}
	// A gzip body the router cannot read.
	req, _ = http.NewRequest(http.MethodPost, routerURL+"/v1/chat/completions", strings.NewReader("\x1f\x8b..."))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Content-Encoding", "gzip")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if body := readBody(t, resp); resp.StatusCode != 415 || !strings.Contains(body, "unsupported_encoding") {
		t.Errorf("expected 415 for a gzip body, got %d %s", resp.StatusCode, body)
	}
	if n := stats(t, 9081).Requests; n != 0 {
		t.Errorf("bad requests must not reach a provider, got %d", n)
	}

	// The model list; other paths under the router's matcher are a 404.
	resp, err = http.Get(routerURL + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	if body := readBody(t, resp); resp.StatusCode != 200 || !strings.Contains(body, `"id":"m"`) || !strings.Contains(body, `"object":"list"`) {
		t.Errorf("expected the model groups listed, got %d %s", resp.StatusCode, body)
	}
	resp, err = http.Get(routerURL + "/v1/files")
	if err != nil {
		t.Fatal(err)
	}
	if body := readBody(t, resp); resp.StatusCode != 404 || !strings.Contains(body, `"code":"unknown_url"`) {
		t.Errorf("expected other paths answered 404 unknown_url, got %d %q", resp.StatusCode, body)
	}
}

func TestPlaceholders(t *testing.T) {
	load(t, `
http://localhost:9080 {
	header >X-Served-By "{http.llm_router.deployment} after {http.llm_router.attempts} ({http.llm_router.failover_reason})"
	llm_router /v1/* {
		provider a {
			type openai
			api_key none
			base_url http://localhost:9081/v1
		}
		provider b {
			type openai
			api_key none
			base_url http://localhost:9082/v1
		}
		model ph {
			deployment a ph-a {
				quality 1
			}
			deployment b ph-b
		}
	}
}
http://localhost:9081 {
	llm_mock {
		fault status {
			status 502
		}
	}
}
http://localhost:9082 {
	llm_mock
}
`)
	resp := chat(t, "ph", false)
	readBody(t, resp)
	if got := resp.Header.Get("X-Served-By"); got != "b/ph-b after 2 (server)" {
		t.Errorf("expected the placeholders filled, got %q", got)
	}
}
