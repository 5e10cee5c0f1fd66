package integration

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// Bounds on what a client or a provider can hold open (docs/security.md, "Bounds:
// slow bodies, endless answers, full queues, keys in URLs").

// TestAFullQueueAnswers429AtOnce: the "limited" group (10 requests per 2 s
// window, deadline 5 s) with max_queued 5. After a warm-up, 30 clients
// post at once: this window serves 10, the queue holds 5 for the next, and
// the others are answered 429 at once in OpenAI's format, saying that the
// queue is full (not that a provider is rate-limited), with
// x-should-retry: false and Retry-After until the window is back. The
// provider sends no 429.
func TestAFullQueueAnswers429AtOnce(t *testing.T) {
	const window = 2 * time.Second
	cfg := strings.Replace(limitedConfig("deadline 5s\n\t\tmax_attempts 8", window),
		"model limited {\n", "model limited {\n\t\t\tmax_queued 5\n", 1)
	load(t, cfg)
	if resp := chat(t, "limited", false); resp.StatusCode != 200 {
		t.Fatalf("warm-up: expected 200, got %d: %s", resp.StatusCode, readBody(t, resp))
	} else {
		resp.Body.Close()
	}
	before := mockStatsRateLimited(t)
	time.Sleep(window + 100*time.Millisecond) // the warm-up's window ends

	type result struct {
		status            int
		body, retry, more string
		took              time.Duration
	}
	results := make([]result, 30)
	var wg sync.WaitGroup
	start := time.Now()
	for i := range results {
		wg.Go(func() {
			resp := chat(t, "limited", false)
			body := readBody(t, resp)
			results[i] = result{resp.StatusCode, body, resp.Header.Get("Retry-After"), resp.Header.Get("X-Should-Retry"), time.Since(start)}
		})
	}
	wg.Wait()
	served, full := 0, 0
	for i, r := range results {
		switch r.status {
		case http.StatusOK:
			served++
		case http.StatusTooManyRequests:
			full++
			if !strings.Contains(r.body, "the queue of model group limited is full") || !strings.Contains(r.body, `"type":"rate_limit_error"`) || !strings.Contains(r.body, `"code":"rate_limit_exceeded"`) {
				t.Errorf("client %d: expected OpenAI's 429 saying the queue is full, got %s", i, r.body)
			}
			if n, err := strconv.Atoi(r.retry); err != nil || n < 1 || n > 2 || r.more != "false" {
				t.Errorf("client %d: expected Retry-After 1-2 s (the next window) and x-should-retry false, got %q and %q", i, r.retry, r.more)
			}
			if r.took > time.Second {
				t.Errorf("client %d: its 429 took %v, not at once", i, r.took)
			}
		default:
			t.Errorf("client %d: unexpected %d %s", i, r.status, r.body)
		}
	}
	if served < 10 || served > 15 || served+full != len(results) {
		t.Errorf("expected 10 to 15 served and the others told the queue is full, got %d served, %d full", served, full)
	}
	if n := mockStatsRateLimited(t) - before; n != 0 {
		t.Errorf("the provider answered %d 429s", n)
	}
}

// TestAStreamIsCutAtMaxStreamBytes: a provider that streams 200,000
// chunks (tens of MB, a millisecond apart: minutes) to a router with
// max_stream_bytes 64KiB. The client reads at most 64 KiB of events, then
// OpenAI's in-band error that names the bound, no [DONE], within seconds;
// the answer's tokens are counted (estimated: the provider had not stated
// them), and the deployment is not failed for it: the next request is
// served by it.
func TestAStreamIsCutAtMaxStreamBytes(t *testing.T) {
	const group = "endless"
	load(t, routerFor("deadline 10s\n\t\tmax_stream_bytes 64KiB", group, []provider{{name: "a", baseURL: mockA}},
		map[int]string{9081: "chunks 200000\n\t\tchunk_interval 1ms\n\t\treply " + strings.Repeat("x", 2000)}))
	start := time.Now()
	resp := chat(t, group, true)
	if resp.StatusCode != 200 {
		t.Fatalf("expected a stream, got %d %s", resp.StatusCode, readBody(t, resp))
	}
	raw, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	took := time.Since(start)
	if err != nil {
		t.Fatal(err)
	}
	var data []string
	relayed := 0
	for _, line := range strings.Split(string(raw), "\n") {
		if d, ok := strings.CutPrefix(line, "data: "); ok {
			data = append(data, d)
			relayed += len(d)
		}
	}
	last := data[len(data)-1]
	if !strings.Contains(last, `"code":"stream_interrupted"`) || !strings.Contains(last, "max_stream_bytes (65536 bytes)") || strings.Contains(string(raw), "[DONE]") {
		t.Errorf("expected the stream to end with the bound's in-band error and no [DONE], it ended %q", last)
	}
	if relayed-len(last) > 64<<10 || len(data) < 100 {
		t.Errorf("expected at most 64 KiB of events (and some hundreds of them) before the error, got %d bytes in %d events", relayed-len(last), len(data)-1)
	}
	if took > 5*time.Second {
		t.Errorf("the cut stream took %v: the router went on reading the provider", took)
	}
	metrics := readBody(t, must(http.Get("http://localhost:2999/metrics")))
	out := regexp.MustCompile(`llm_router_tokens_total\{deployment="a/` + group + `-a",kind="output",model_group="` + group + `"\} (\d+)`).FindStringSubmatch(metrics)
	if out == nil || out[1] == "0" {
		t.Errorf("expected the cut answer's output tokens counted, got %v", out)
	}
	if o := ask(t, group, false); o.status != 200 || o.deployment != "a/"+group+"-a" {
		t.Errorf("expected the deployment to answer the next request, got %d from %q", o.status, o.deployment)
	}
}

// TestATrickledBodyIsCutByReadBodyIdle: the router's deadline starts once
// the body is read, so a body trickled a byte at a time holds the
// connection as long as Caddy reads it. With Caddy's defaults it is still
// open after 3 s of a byte every 500 ms; with the documented timeouts
// (scaled: read_body_idle 2s 1024, read_body 3s) it is cut within about
// 2 s. The same timeouts let a stream that lasts longer than read_body
// through whole: the body was read.
func TestATrickledBodyIsCutByReadBodyIdle(t *testing.T) {
	cfg := routerFor("deadline 10s", "trickle", []provider{{name: "a", baseURL: mockA}},
		map[int]string{9081: "chunks 10\n\t\tchunk_interval 500ms"})
	snippet := readmeBlock(t, "read_body_idle")
	for _, want := range []string{"read_body_idle 10s 1024", "read_body 2m", "read_header 10s"} {
		if !strings.Contains(snippet, want) {
			t.Fatalf("docs/security.md's timeouts snippet lacks %q:\n%s", want, snippet)
		}
	}
	options := strings.NewReplacer("read_body_idle 10s 1024", "read_body_idle 2s 1024", "read_body 2m", "read_body 3s").Replace(
		strings.TrimSuffix(strings.TrimPrefix(strings.TrimSpace(snippet), "{"), "}"))

	load(t, cfg)
	if open := trickle(t, 3*time.Second); !open {
		t.Errorf("with Caddy's defaults, expected the trickled body still read after 3 s")
	}

	loadGlobal(t, options, cfg)
	start := time.Now()
	if open := trickle(t, 6*time.Second); open {
		t.Errorf("with the documented timeouts, expected the trickled body cut, still open after 6 s")
	} else if took := time.Since(start); took > 4*time.Second {
		t.Errorf("with the documented timeouts, expected the trickled body cut after about 2 s, took %v", took)
	}
	o := ask(t, "trickle", true)
	if o.status != 200 || !o.done() || o.took < 4*time.Second {
		t.Errorf("expected a 4.5 s stream relayed whole past read_body 3s, got %d after %v: %v", o.status, o.took, o.events)
	}
}

// trickle posts a body one byte every 500 ms for up to d, and reports
// whether the server was still reading it then (false: it closed the
// connection or answered).
func trickle(t *testing.T, d time.Duration) bool {
	t.Helper()
	conn, err := net.Dial("tcp", "localhost:9080")
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	body := `{"model":"trickle","messages":[{"role":"user","content":"hi"}]}`
	fmt.Fprintf(conn, "POST /v1/chat/completions HTTP/1.1\r\nHost: localhost:9080\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", len(body))
	closed := make(chan struct{})
	go func() {
		_, _ = io.Copy(io.Discard, conn) // ends when the server closes or answers and closes
		close(closed)
	}()
	end := time.Now().Add(d)
	for i := 0; time.Now().Before(end); i++ {
		select {
		case <-closed:
			return false
		case <-time.After(500 * time.Millisecond):
		}
		if _, err := conn.Write([]byte{body[i%len(body)]}); err != nil {
			return false
		}
	}
	return true
}

// TestAccessLogDropsTheQuery: a client that sends its key in the URL
// (?key=, as Gemini's API takes it) has it written to Caddy's access log
// with the request's uri; the documented filter drops the query, its key
// header lines drop the headers.
func TestAccessLogDropsTheQuery(t *testing.T) {
	snippet := readmeBlock(t, "request>uri")
	for _, tc := range []struct {
		name, filter string
		leaks        bool
	}{{"plain", "log {\n\t\toutput file %s\n\t}\n", true}, {"README", strings.Replace(snippet, "log {\n", "log {\n\toutput file %s\n", 1), false}} {
		t.Run(tc.name, func(t *testing.T) {
			logFile := filepath.Join(t.TempDir(), "access.log")
			cfg := routerFor("deadline 5s", "logged", []provider{{name: "a", baseURL: mockA}}, map[int]string{9081: ""})
			cfg = strings.Replace(cfg, "http://localhost:9080 {\n", "http://localhost:9080 {\n\t"+fmt.Sprintf(tc.filter, logFile), 1)
			load(t, cfg)
			req, _ := http.NewRequest(http.MethodPost, routerURL+"/v1/chat/completions?key=sk-in-the-query&api-key=azure-in-the-query",
				strings.NewReader(`{"model":"logged","messages":[{"role":"user","content":"hi"}]}`))
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("X-Api-Key", "sk-in-x-api-key")
			resp := must(http.DefaultClient.Do(req))
			if readBody(t, resp); resp.StatusCode != 200 {
				t.Fatalf("expected 200, got %d", resp.StatusCode)
			}
			var raw []byte
			for range 50 { // the access log is written after the answer
				raw, _ = os.ReadFile(logFile)
				if strings.Contains(string(raw), "/v1/chat/completions") {
					break
				}
				time.Sleep(20 * time.Millisecond)
			}
			if !strings.Contains(string(raw), `"uri":"/v1/chat/completions`) {
				t.Fatalf("expected the request in the access log, got %s", raw)
			}
			for _, secret := range []string{"sk-in-the-query", "azure-in-the-query", "sk-in-x-api-key"} {
				if leaked := strings.Contains(string(raw), secret); leaked != tc.leaks {
					t.Errorf("expected %s in the access log: %v, got %v:\n%s", secret, tc.leaks, leaked, raw)
				}
			}
		})
	}
}

// readmeBlock returns the caddyfile code block of docs/security.md (the
// README's security page) that holds marker.
func readmeBlock(t *testing.T, marker string) string {
	t.Helper()
	raw, err := os.ReadFile("../docs/security.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, block := range strings.Split(string(raw), "```caddyfile\n")[1:] {
		block, _, _ = strings.Cut(block, "```")
		if strings.Contains(block, marker) {
			return block
		}
	}
	t.Fatalf("docs/security.md has no caddyfile block with %q", marker)
	return ""
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}
