package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"
)

// The bare upstream: a plain net/http server that answers a fixed
// chat.completion (or a stream of chunks), so that the baseline measures
// the proxy and not a mock's own bookkeeping. One process listens on
// several ports, one role per port (see upstreamPorts).

// Port offsets from the upstream's base port.
const (
	portPlain     = 0  // answers; no rate-limit headers
	portLimited   = 1  // 1..8: answers with x-ratelimit-* headers
	portFailA     = 9  // always 429 (the failover test's first deployment)
	portFailB     = 10 // answers (the failover test's second deployment)
	upstreamPorts = 11
)

const completion = `{"id":"chatcmpl-bench","object":"chat.completion","created":1732900000,"model":"bench-up","choices":[{"index":0,"message":{"role":"assistant","content":"Hello! This is the fixed answer of the benchmark upstream."},"finish_reason":"stop"}],"usage":{"prompt_tokens":256,"completion_tokens":12,"total_tokens":268}}`

const rateLimitedBody = `{"error":{"message":"Rate limit reached for requests","type":"requests","param":null,"code":"rate_limit_exceeded"}}`

// upstreamRequest is what the upstream reads of a request body. Streams
// send max_tokens chunks, metadata.bench_interval apart; user tags a
// request for the failover test.
type upstreamRequest struct {
	Stream    bool   `json:"stream"`
	MaxTokens int    `json:"max_tokens"`
	User      string `json:"user"`
	Metadata  struct {
		Interval string `json:"bench_interval"`
	} `json:"metadata"`
}

// event is one request seen on a failover port, on this process's
// monotonic clock (ns since start).
type event struct {
	ID   string `json:"id"`
	Port int    `json:"port"` // offset: portFailA or portFailB
	Recv int64  `json:"recv_ns"`
	Sent int64  `json:"sent_ns"` // when the 429 (or the answer) was written and flushed
}

type upstream struct {
	latency time.Duration
	start   time.Time
	mu      sync.Mutex
	events  []event
}

func (u *upstream) since() int64 { return int64(time.Since(u.start)) }

func runUpstream(args []string) {
	fs := flag.NewFlagSet("upstream", flag.ExitOnError)
	base := fs.Int("base", 18100, "first port; the upstream listens on base..base+10 on 127.0.0.1")
	latency := fs.Duration("latency", 0, "delay before the response headers")
	_ = fs.Parse(args)
	u := &upstream{latency: *latency, start: time.Now()}
	errs := make(chan error)
	for off := 0; off < upstreamPorts; off++ {
		ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", *base+off))
		if err != nil {
			log.Fatal(err)
		}
		srv := &http.Server{Handler: u.handler(off), ReadHeaderTimeout: 10 * time.Second}
		go func() { errs <- srv.Serve(ln) }()
	}
	log.Fatal(<-errs)
}

func (u *upstream) handler(off int) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		recv := u.since()
		switch {
		case r.URL.Path == "/bench/events" && r.Method == http.MethodGet:
			u.mu.Lock()
			b, _ := json.Marshal(u.events)
			u.mu.Unlock()
			w.Header().Set("Content-Type", "application/json")
			_, _ = w.Write(b)
			return
		case r.URL.Path == "/bench/events" && r.Method == http.MethodDelete:
			u.mu.Lock()
			u.events = nil
			u.mu.Unlock()
			return
		case r.Method != http.MethodPost:
			http.NotFound(w, r)
			return
		}
		body, err := io.ReadAll(r.Body)
		if err != nil {
			return
		}
		var req upstreamRequest
		if err := json.Unmarshal(body, &req); err != nil {
			http.Error(w, "bad json", http.StatusBadRequest)
			return
		}
		if u.latency > 0 {
			t := time.NewTimer(u.latency)
			select {
			case <-t.C:
			case <-r.Context().Done():
				t.Stop()
				return
			}
		}
		h := w.Header()
		if off >= portLimited && off < portLimited+8 {
			h["X-Ratelimit-Limit-Requests"] = []string{"10000"}
			h["X-Ratelimit-Limit-Tokens"] = []string{"2000000"}
			h["X-Ratelimit-Remaining-Requests"] = []string{"9999"}
			h["X-Ratelimit-Remaining-Tokens"] = []string{"1999000"}
			h["X-Ratelimit-Reset-Requests"] = []string{"6ms"}
			h["X-Ratelimit-Reset-Tokens"] = []string{"30ms"}
		}
		if off == portFailA {
			h["Content-Type"] = []string{"application/json"}
			h["Content-Length"] = []string{strconv.Itoa(len(rateLimitedBody))}
			w.WriteHeader(http.StatusTooManyRequests)
			_, _ = io.WriteString(w, rateLimitedBody)
			_ = http.NewResponseController(w).Flush()
			u.record(event{ID: req.User, Port: off, Recv: recv, Sent: u.since()})
			return
		}
		if off == portFailB {
			u.record(event{ID: req.User, Port: off, Recv: recv})
		}
		if !req.Stream {
			h["Content-Type"] = []string{"application/json"}
			h["Content-Length"] = []string{strconv.Itoa(len(completion))}
			_, _ = io.WriteString(w, completion)
			return
		}
		u.stream(w, r, req)
	})
}

func (u *upstream) record(e event) {
	u.mu.Lock()
	u.events = append(u.events, e)
	u.mu.Unlock()
}

// stream sends max_tokens content chunks, each carrying the wall-clock
// instant it was written ("t<unix ns>") so that the client can tell how
// long each event took to reach it; then a final chunk and [DONE].
func (u *upstream) stream(w http.ResponseWriter, r *http.Request, req upstreamRequest) {
	n := max(req.MaxTokens, 1)
	interval, _ := time.ParseDuration(req.Metadata.Interval)
	h := w.Header()
	h["Content-Type"] = []string{"text/event-stream"}
	h["Cache-Control"] = []string{"no-cache"}
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	buf := make([]byte, 0, 512)
	var timer *time.Timer
	for i := 0; i < n; i++ {
		if i > 0 && interval > 0 {
			if timer == nil {
				timer = time.NewTimer(interval)
			} else {
				timer.Reset(interval)
			}
			select {
			case <-timer.C:
			case <-r.Context().Done():
				return
			}
		}
		buf = append(buf[:0], `data: {"id":"chatcmpl-bench","object":"chat.completion.chunk","created":1732900000,"model":"bench-up","choices":[{"index":0,"delta":{`...)
		if i == 0 {
			buf = append(buf, `"role":"assistant",`...)
		}
		buf = append(buf, `"content":"t`...)
		buf = strconv.AppendInt(buf, time.Now().UnixNano(), 10)
		buf = append(buf, ` "},"finish_reason":null}]}`+"\n\n"...)
		if _, err := w.Write(buf); err != nil {
			return
		}
		if err := rc.Flush(); err != nil {
			return
		}
	}
	_, _ = io.WriteString(w, `data: {"id":"chatcmpl-bench","object":"chat.completion.chunk","created":1732900000,"model":"bench-up","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}`+"\n\ndata: [DONE]\n\n")
	_ = rc.Flush()
}

// sentAt reads the send instant a bench upstream put in a chunk; 0 when
// there is none (llm_mock's chunks).
func sentAt(data []byte) int64 {
	i := bytes.Index(data, []byte(`"content":"t`))
	if i < 0 {
		return 0
	}
	var ns int64
	for _, c := range data[i+len(`"content":"t`):] {
		if c < '0' || c > '9' {
			break
		}
		ns = ns*10 + int64(c-'0')
	}
	return ns
}
