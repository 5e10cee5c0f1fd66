package integration

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	_ "github.com/caddyserver/caddy/v2/caddyconfig/caddyfile" // the Caddyfile adapter
)

// BenchmarkHedge measures what hedge_after does to the time to first token
// of a deployment with a slow tail. A router on :19100 serves one model
// group of two llm_mock deployments: a (quality 1, ranked first), whose
// every 10th request gets its first token 800 ms late (a slow fault), and b,
// fast. 200 streamed requests at concurrency 4, with hedge_after off, then
// 100ms; the client times each request to its first content chunk.
//
//	cd caddytest && go test -run '^$' -bench Hedge -benchtime 1x .
//
// It starts its own Caddy (admin off) with caddy.Load, replacing any
// config a test loaded before: the package's tests run before benchmarks.
func BenchmarkHedge(b *testing.B) {
	if testing.Short() {
		b.Skip("starts a Caddy and sends 400 requests")
	}
	b.Cleanup(func() { _ = caddy.Stop() })
	for _, hedge := range []string{"off", "100ms"} {
		name := "hedge=on"
		if hedge == "off" {
			name = "hedge=off"
		}
		b.Run(name, func(b *testing.B) {
			var all []hedgeSample
			for i := 0; i < b.N; i++ {
				b.StopTimer()
				hedgeLoad(b, hedge)
				b.StartTimer()
				all = append(all, hedgeRun(b, hedgeRequests, hedgeConcurrency)...)
			}
			b.StopTimer()
			a, bb := hedgeMockRequests(b, hedgePortA), hedgeMockRequests(b, hedgePortB)
			hedgeReport(b, name, all, a, bb)
		})
	}
}

const (
	hedgePortRouter  = 19100
	hedgePortA       = 19101
	hedgePortB       = 19102
	hedgeRequests    = 200
	hedgeConcurrency = 4
	hedgeReply       = "one two three four five six seven eight nine ten"
)

// hedgeLoads makes each load's deployment names new: capacity state (the
// latency and reliability the ranking uses) survives a reload, and each
// run must start from none.
var hedgeLoads atomic.Int64

// hedgeLoad (re)starts Caddy with the benchmark's config; hedge is
// hedge_after's value, or "off".
func hedgeLoad(b *testing.B, hedge string) {
	b.Helper()
	opt := ""
	if hedge != "off" {
		opt = "hedge_after " + hedge
	}
	n := hedgeLoads.Add(1)
	mock := func(port int, fault string) string {
		return fmt.Sprintf(`http://127.0.0.1:%d {
	llm_mock {
		reply %q
		chunks 10
		first_token_delay 20ms
		chunk_interval 5ms
		%s
	}
}
`, port, hedgeReply, fault)
	}
	cfg := fmt.Sprintf(`{
	admin off
	persist_config off
	grace_period 1ns
	log {
		level ERROR
	}
}
http://127.0.0.1:%[1]d {
	llm_router /v1/* {
		deadline 10s
		%[4]s
		provider a%[5]d {
			type openai
			api_key none
			base_url http://127.0.0.1:%[2]d/v1
		}
		provider b%[5]d {
			type openai
			api_key none
			base_url http://127.0.0.1:%[3]d/v1
		}
		model hedged {
			deployment a%[5]d m {
				quality 1
			}
			deployment b%[5]d m
		}
	}
}
`, hedgePortRouter, hedgePortA, hedgePortB, opt, n) +
		mock(hedgePortA, "fault slow {\n\t\t\tevery 10\n\t\t\tdelay 800ms\n\t\t}") +
		mock(hedgePortB, "")
	js, warns, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(cfg), nil)
	if err != nil {
		b.Fatalf("adapting the config: %v (%v)", err, warns)
	}
	if err := caddy.Load(js, true); err != nil {
		b.Fatalf("starting caddy (ports %d-%d free?): %v", hedgePortRouter, hedgePortB, err)
	}
}

// hedgeSample is what the client saw of one request.
type hedgeSample struct {
	ttft     time.Duration // to the first content chunk
	attempts int           // X-LLM-Router-Attempts
	hedge    string        // X-LLM-Router-Hedge: "", won, lost
}

// hedgeRun sends n streamed requests from c clients and returns what each
// saw; a request that fails, or a stream that is not the whole reply,
// fails the benchmark.
func hedgeRun(b *testing.B, n, c int) []hedgeSample {
	b.Helper()
	tr := &http.Transport{MaxIdleConnsPerHost: c}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr, Timeout: 30 * time.Second}
	url := fmt.Sprintf("http://127.0.0.1:%d/v1/chat/completions", hedgePortRouter)
	body := `{"model":"hedged","stream":true,"messages":[{"role":"user","content":"Count to ten."}]}`
	out := make([]hedgeSample, n)
	var next atomic.Int64
	var wg sync.WaitGroup
	var mu sync.Mutex
	var errs []string
	for range c {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= n {
					return
				}
				s, err := hedgeOne(client, url, body)
				if err != nil {
					mu.Lock()
					errs = append(errs, err.Error())
					mu.Unlock()
				}
				out[i] = s
			}
		})
	}
	wg.Wait()
	if len(errs) > 0 {
		b.Fatalf("%d of %d requests failed, the first: %s", len(errs), n, errs[0])
	}
	return out
}

// hedgeOne sends one streamed request, times it to its first content chunk
// and reads it to its end.
func hedgeOne(client *http.Client, url, body string) (hedgeSample, error) {
	var s hedgeSample
	start := time.Now()
	resp, err := client.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		return s, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return s, fmt.Errorf("status %d", resp.StatusCode)
	}
	s.attempts, _ = strconv.Atoi(resp.Header.Get("X-LLM-Router-Attempts"))
	s.hedge = resp.Header.Get("X-LLM-Router-Hedge")
	sc := bufio.NewScanner(resp.Body)
	var text strings.Builder
	done := false
	for sc.Scan() {
		data, ok := bytes.CutPrefix(sc.Bytes(), []byte("data: "))
		if !ok {
			continue
		}
		if string(data) == "[DONE]" {
			done = true
			continue
		}
		var c struct {
			Choices []struct {
				Delta struct{ Content string } `json:"delta"`
			} `json:"choices"`
		}
		if err := json.Unmarshal(data, &c); err != nil {
			return s, fmt.Errorf("not a chunk: %s", data)
		}
		for _, ch := range c.Choices {
			if ch.Delta.Content != "" && s.ttft == 0 {
				s.ttft = time.Since(start)
			}
			text.WriteString(ch.Delta.Content)
		}
	}
	if err := sc.Err(); err != nil {
		return s, err
	}
	if !done || text.String() != hedgeReply {
		return s, fmt.Errorf("expected the whole reply and [DONE], got %q (done %v)", text.String(), done)
	}
	return s, nil
}

// hedgeMockRequests reads how many requests the mock on port received.
func hedgeMockRequests(b *testing.B, port int) int64 {
	b.Helper()
	resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/llm_mock/stats", port))
	if err != nil {
		b.Fatal(err)
	}
	defer resp.Body.Close()
	var st struct {
		Requests int64 `json:"requests"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		b.Fatal(err)
	}
	return st.Requests
}

// hedgeReport reports the percentiles of the samples' time to first token
// and the upstream attempts per request; reqA and reqB are what the mocks
// received in the last run.
func hedgeReport(b *testing.B, name string, samples []hedgeSample, reqA, reqB int64) {
	b.Helper()
	ttft := make([]time.Duration, len(samples))
	attempts, won, lost := 0, 0, 0
	for i, s := range samples {
		ttft[i] = s.ttft
		attempts += s.attempts
		switch s.hedge {
		case "won":
			won++
		case "lost":
			lost++
		}
	}
	slices.Sort(ttft)
	pct := func(p int) float64 {
		i := (len(ttft)*p+99)/100 - 1 // nearest rank
		return float64(ttft[max(i, 0)]) / float64(time.Millisecond)
	}
	perReq := float64(attempts) / float64(len(samples))
	b.ReportMetric(pct(50), "p50-ttft-ms")
	b.ReportMetric(pct(99), "p99-ttft-ms")
	b.ReportMetric(perReq, "upstream-attempts/req")
	b.ReportMetric(0, "ns/op") // the run's length says nothing here
	b.Logf("%s: %d streams at concurrency %d: ttft p50 %.1f ms, p90 %.1f ms, p99 %.1f ms, max %.1f ms; %.3f upstream attempts/req; hedges %d (won %d, lost %d); last run's mocks: a %d requests, b %d",
		name, len(samples), hedgeConcurrency, pct(50), pct(90), pct(99), pct(100), perReq, won+lost, won, lost, reqA, reqB)
}
