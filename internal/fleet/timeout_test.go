package fleet

import (
	"context"
	"fmt"
	"io"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/llmrouter/caddy-llm-router/internal/capacity"
	"github.com/llmrouter/caddy-llm-router/internal/router"
	"github.com/llmrouter/caddy-llm-router/provider"
)

// stallProxy forwards TCP to a Redis until stalled: then it accepts and
// reads but never answers, on old connections and new ones alike.
type stallProxy struct {
	ln      net.Listener
	to      string
	stalled atomic.Bool
}

func newStallProxy(t *testing.T, to string) *stallProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &stallProxy{ln: ln, to: to}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go p.serve(c)
		}
	}()
	return p
}

func (p *stallProxy) serve(c net.Conn) {
	defer c.Close()
	if p.stalled.Load() {
		_, _ = io.Copy(io.Discard, c)
		return
	}
	up, err := net.Dial("tcp", p.to)
	if err != nil {
		return
	}
	defer up.Close()
	go func() { _, _ = io.Copy(c, up) }()
	buf := make([]byte, 4096)
	for {
		n, err := c.Read(buf)
		if err != nil {
			return
		}
		if !p.stalled.Load() {
			if _, err := up.Write(buf[:n]); err != nil {
				return
			}
		}
	}
}

// With Redis stalled (paused by DEBUG SLEEP, behind a proxy that never
// answers, or killed), each request through a fleet-mode router with a
// budget and declared rpm finishes within the store's timeout (50ms) plus
// slack: Redis never holds a request longer than Timeout.
func TestRedisStallHoldsNoRequestPastTimeout(t *testing.T) {
	const timeout = 50 * time.Millisecond
	stalls := map[string]func(r *redisProc, p *stallProxy){
		"debug sleep": func(r *redisProc, _ *stallProxy) {
			c := redis.NewClient(&redis.Options{Addr: fmt.Sprintf("127.0.0.1:%d", r.port), Protocol: 2, DisableIdentity: true})
			go func() { defer c.Close(); c.Do(context.Background(), "DEBUG", "SLEEP", "2") }()
			time.Sleep(20 * time.Millisecond)
		},
		"no answer": func(_ *redisProc, p *stallProxy) { p.stalled.Store(true) },
		"killed":    func(r *redisProc, _ *stallProxy) { r.kill() },
	}
	for name, stall := range stalls {
		t.Run(name, func(t *testing.T) {
			r := &redisProc{path: needRedisServer(t), port: freePort(t, 0, 0), dir: t.TempDir(),
				args: []string{"--enable-debug-command", "yes"}}
			r.start(t)
			t.Cleanup(r.kill)
			p := newStallProxy(t, fmt.Sprintf("127.0.0.1:%d", r.port))
			s, err := New(Options{URL: "redis://" + p.ln.Addr().String() + "/0", KeyPrefix: keyPrefix(t),
				PollInterval: time.Hour, Timeout: timeout})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { s.Close() })
			in := &instance{state: capacity.NewState(), obs: newCounter(), store: s}
			s.Bind(testIdentity, in.state)
			hp := &heldProvider{open: make(chan struct{})}
			close(hp.open)
			g := holdInstance(in, hp)
			g.Spending = capacity.NewSpending(capacity.SpendLimit{USD: 100, Period: time.Hour}, s, "budget:group|paid")
			rt := router.New()
			req := &router.Request{Request: &provider.Request{Format: provider.Chat, Choices: 1,
				Body: []byte(`{"model":"paid","max_tokens":80,"messages":[{"role":"user","content":"hi"}]}`)},
				Tokens: 180, PromptTokens: 100, OutputTokens: 80}
			if res := rt.ServeGroup(context.Background(), g, req); res.Err != nil {
				t.Fatalf("before the stall: %v", res.Err)
			}
			stall(r, p)
			var wg sync.WaitGroup
			took := make([]time.Duration, 8)
			for i := range took {
				wg.Go(func() {
					start := time.Now()
					res := rt.ServeGroup(context.Background(), g, req)
					took[i] = time.Since(start)
					if res.Err != nil {
						t.Errorf("request %d: %v", i, res.Err)
					}
				})
			}
			wg.Wait()
			t.Logf("slowest request with Redis stalled: %v", slices.Max(took))
			for i, d := range took {
				if d > 250*time.Millisecond {
					t.Errorf("request %d took %v with Redis stalled (timeout %v)", i, d, timeout)
				}
			}
		})
	}
}
