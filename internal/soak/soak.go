// Package soak drives many requests through an in-process Caddy running
// llm_router in front of four llm_mock deployments that misbehave on a
// schedule (429s in the OpenAI and Gemini dialects, Anthropic's 529, 5xx,
// hangs, cut, stalled and malformed streams, mid-stream errors), and
// counts what clients must never see: a 429 while a deployment had
// capacity, an answer after the deadline, a truncated answer presented as
// complete. The router resumes broken streams (resume
// any): a continuation on the deployments that continue text (anthropic's
// prefill, steady's prefix), else a replay: every deployment serves one
// model, asked at temperature 0, and writes the same reply (a deterministic
// backend, where a replay can match), so both must give the client exactly
// the whole of it.
package soak

import (
	"bufio"
	"bytes"
	"context"
	_ "embed"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	_ "github.com/caddyserver/caddy/v2/caddyconfig/caddyfile" // the Caddyfile adapter
	_ "github.com/caddyserver/caddy/v2/modules/standard"

	_ "github.com/llmrouter/caddy-llm-router"
	"github.com/llmrouter/caddy-llm-router/mockllm"
)

// Options of a run.
type Options struct {
	// Requests to send in all; half stream.
	Requests int
	// Concurrency is the number of clients sending at once.
	Concurrency int
	// Deadline is the router's deadline; an answer (a stream's headers)
	// later than Deadline + Slack is an overrun.
	Deadline, Slack time.Duration
	// Port is the router's port; the mocks take the next four.
	Port int
	// Resume is the router's resume mode: same_model, any or off; empty
	// leaves the router's default (same_model).
	Resume string
}

// DefaultOptions: 20,000 requests at 200 concurrency, a 3 s deadline,
// broken streams resumed on any deployment.
var DefaultOptions = Options{Requests: 20000, Concurrency: 200, Deadline: 3 * time.Second, Slack: 500 * time.Millisecond, Port: 9400, Resume: "any"}

// Result counts the outcomes of a run.
type Result struct {
	Requests       int64
	Successes      int64 // complete answers: valid completions, streams ending in [DONE]
	InBandErrors   int64 // streams that failed after they began, ended with an error event
	ServerErrors   int64 // 502/504 answers
	Surfaced429    int64 // must be 0: one deployment never rate-limits
	Overruns       int64 // must be 0: answers later than the deadline (+ slack)
	Truncated      int64 // must be 0: a 200 that is cut or invalid, without an error
	Other          int64 // anything else (transport errors, other statuses)
	Continuations  int64 // continuation requests the mocks received (resumes asking for the rest of a broken stream)
	GoroutinesPre  int
	GoroutinesPost int
	PeakRSSKiB     int64
	Duration       time.Duration
	Slowest        time.Duration
}

// OK reports whether the three counts that must be zero are.
func (r *Result) OK() bool { return r.Surfaced429 == 0 && r.Overruns == 0 && r.Truncated == 0 }

func (r *Result) String() string {
	return fmt.Sprintf(`requests              %d in %v (%.0f/s)
successes             %d
in-band stream errors %d
continuations         %d (requests to continue a broken stream, as the mocks counted them)
502/504 answers       %d
other                 %d
429s surfaced         %d (must be 0)
deadline overruns     %d (must be 0; slowest answer %v)
truncated successes   %d (must be 0)
goroutines            %d before Caddy started, %d after it stopped
peak RSS              %d KiB`,
		r.Requests, r.Duration.Round(time.Millisecond), float64(r.Requests)/r.Duration.Seconds(),
		r.Successes, r.InBandErrors, r.Continuations, r.ServerErrors, r.Other, r.Surfaced429, r.Overruns, r.Slowest.Round(time.Millisecond),
		r.Truncated, r.GoroutinesPre, r.GoroutinesPost, r.PeakRSSKiB)
}

// configFormat is the soak's Caddyfile (soak.caddyfile) as a format: the
// router's port, the four mocks' (%[2]d..%[5]d), the deadline and the
// resume line.
//
//go:embed soak.caddyfile
var configFormat string

// config is the soak's Caddyfile: a router over four misbehaving mocks. The
// anthropic and "steady" deployments never answer 429, so a 429 reaching a
// client is always a defect. Streams break after they began (cut, error
// event, stall past the 1s idle_timeout, malformed JSON) in every dialect;
// the mocks all send the default reply, so a resumed stream's text must be
// it.
func config(o Options) string {
	p := o.Port
	resume := ""
	if o.Resume != "" {
		resume = "\n\t\tresume " + o.Resume
	}
	return fmt.Sprintf(configFormat, p, p+1, p+2, p+3, p+4, o.Deadline, resume)
}

// Run starts Caddy with the soak config, drives the load, stops Caddy and
// returns the counts.
func Run(o Options) (*Result, error) {
	adapter := caddyconfig.GetAdapter("caddyfile")
	cfgJSON, warns, err := adapter.Adapt([]byte(config(o)), nil)
	if err != nil {
		return nil, fmt.Errorf("adapting the soak config: %v (%v)", err, warns)
	}
	res := &Result{GoroutinesPre: runtime.NumGoroutine()}
	if err := caddy.Load(cfgJSON, true); err != nil {
		return nil, fmt.Errorf("starting caddy: %v", err)
	}
	stopped := false
	defer func() {
		if !stopped {
			_ = caddy.Stop()
		}
	}()

	url := fmt.Sprintf("http://127.0.0.1:%d/v1/chat/completions", o.Port)
	transport := &http.Transport{MaxIdleConnsPerHost: o.Concurrency, MaxConnsPerHost: o.Concurrency}
	client := &http.Client{Transport: transport, Timeout: o.Deadline + 30*time.Second}
	var slowest atomic.Int64
	var next atomic.Int64
	start := time.Now()
	var wg sync.WaitGroup
	for w := 0; w < o.Concurrency; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := next.Add(1)
				if i > int64(o.Requests) {
					return
				}
				took := one(client, url, i%2 == 0, o, res)
				for {
					s := slowest.Load()
					if int64(took) <= s || slowest.CompareAndSwap(s, int64(took)) {
						break
					}
				}
			}
		}()
	}
	wg.Wait()
	res.Duration = time.Since(start)
	res.Slowest = time.Duration(slowest.Load())
	res.Requests = int64(o.Requests)
	// What the mocks saw, read before Caddy stops.
	for port := o.Port + 1; port <= o.Port+4; port++ {
		st, err := mockStats(client, port)
		if err != nil {
			return nil, err
		}
		res.Continuations += st.Continuations
	}
	transport.CloseIdleConnections()
	// Goroutines are counted before Caddy starts and after it stops: what is
	// left then (beyond a few of the runtime's own) leaked.
	if err := caddy.Stop(); err != nil {
		return nil, fmt.Errorf("stopping caddy: %v", err)
	}
	stopped = true
	// Goroutines of connections closing may take a moment to end: up to 2s.
	for i := 0; i < 40 && runtime.NumGoroutine() > res.GoroutinesPre; i++ {
		time.Sleep(50 * time.Millisecond)
	}
	res.GoroutinesPost = runtime.NumGoroutine()
	res.PeakRSSKiB = peakRSS()
	return res, nil
}

// mockStats reads the stats of the mock on port.
func mockStats(client *http.Client, port int) (*mockllm.Stats, error) {
	resp, err := client.Get(fmt.Sprintf("http://127.0.0.1:%d/llm_mock/stats", port))
	if err != nil {
		return nil, fmt.Errorf("reading the stats of the mock on port %d: %v", port, err)
	}
	defer resp.Body.Close()
	var st mockllm.Stats
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil || resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("reading the stats of the mock on port %d: %d %v", port, resp.StatusCode, err)
	}
	return &st, nil
}

// one sends one request and classifies what the client saw; it returns
// how long until the answer (a stream: its headers) came.
func one(client *http.Client, url string, stream bool, o Options, res *Result) time.Duration {
	body := fmt.Sprintf(`{"model":"soak","stream":%v,"temperature":0,"messages":[{"role":"user","content":"soak"}]}`, stream)
	ctx, cancel := context.WithTimeout(context.Background(), o.Deadline+30*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	began := time.Now()
	resp, err := client.Do(req)
	took := time.Since(began)
	if took > o.Deadline+o.Slack {
		atomic.AddInt64(&res.Overruns, 1)
	}
	if err != nil {
		atomic.AddInt64(&res.Other, 1)
		return took
	}
	defer resp.Body.Close()
	switch {
	case resp.StatusCode == http.StatusTooManyRequests:
		atomic.AddInt64(&res.Surfaced429, 1)
	case resp.StatusCode == http.StatusBadGateway || resp.StatusCode == http.StatusGatewayTimeout:
		atomic.AddInt64(&res.ServerErrors, 1)
	case resp.StatusCode != http.StatusOK:
		atomic.AddInt64(&res.Other, 1)
	case stream:
		end, text := streamEnd(resp.Body)
		switch {
		case end == "done" && text == mockllm.DefaultReply:
			atomic.AddInt64(&res.Successes, 1)
		case end == "done":
			// Ended as whole, but not the answer the providers wrote: a
			// truncated or garbled answer presented as complete.
			atomic.AddInt64(&res.Truncated, 1)
		case end == "error":
			atomic.AddInt64(&res.InBandErrors, 1)
		default:
			atomic.AddInt64(&res.Truncated, 1)
		}
	default:
		raw, err := io.ReadAll(resp.Body)
		var c struct {
			Choices []struct {
				Message struct{ Content string } `json:"message"`
			} `json:"choices"`
		}
		if err != nil || json.Unmarshal(raw, &c) != nil || len(c.Choices) == 0 || c.Choices[0].Message.Content != mockllm.DefaultReply {
			atomic.AddInt64(&res.Truncated, 1)
		} else {
			atomic.AddInt64(&res.Successes, 1)
		}
	}
	return took
}

// streamEnd reads a stream to its end: "done" after [DONE], "error" after
// an in-band error event, "" for anything else (a cut that looks complete
// or not); and the text its chunks carried.
func streamEnd(r io.Reader) (end, text string) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	last := ""
	var b strings.Builder
	for sc.Scan() {
		if data, ok := bytes.CutPrefix(sc.Bytes(), []byte("data: ")); ok {
			last = string(data)
			var c struct {
				Choices []struct {
					Delta struct{ Content string } `json:"delta"`
				} `json:"choices"`
			}
			if json.Unmarshal(data, &c) == nil && len(c.Choices) > 0 {
				b.WriteString(c.Choices[0].Delta.Content)
			}
		}
	}
	switch {
	case sc.Err() != nil:
		return "", b.String()
	case last == "[DONE]":
		return "done", b.String()
	case strings.HasPrefix(last, `{"error"`):
		return "error", b.String()
	}
	return "", b.String()
}

// peakRSS reads the process's peak resident set (VmHWM), in KiB.
func peakRSS() int64 {
	raw, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(raw), "\n") {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			n, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return n
		}
	}
	return 0
}
