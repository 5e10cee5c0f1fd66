package fleet

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
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
// reads but never answers, on old connections and new ones alike. It
// delays each of Redis' replies by late (ns; 0: none): a Redis under load.
type stallProxy struct {
	ln      net.Listener
	to      string
	stalled atomic.Bool
	late    atomic.Int64
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
	go p.answer(c, up)
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

// answer copies Redis' replies from up to c, each p.late late.
func (p *stallProxy) answer(c, up net.Conn) {
	buf := make([]byte, 4096)
	for {
		n, err := up.Read(buf)
		if err != nil {
			return
		}
		time.Sleep(time.Duration(p.late.Load()))
		if _, err := c.Write(buf[:n]); err != nil {
			return
		}
	}
}

// stalls are the ways Redis stalls: paused by DEBUG SLEEP, behind a proxy
// that never answers, or killed. (A Redis that answers each call late:
// TestALateRedisHoldsNoRequestPastTimeout.)
var stalls = map[string]func(r *redisProc, p *stallProxy){
	"debug sleep": func(r *redisProc, _ *stallProxy) {
		c := redis.NewClient(&redis.Options{Addr: fmt.Sprintf("127.0.0.1:%d", r.port), Protocol: 2, DisableIdentity: true})
		go func() { defer c.Close(); c.Do(context.Background(), "DEBUG", "SLEEP", "2") }()
		time.Sleep(20 * time.Millisecond)
	},
	"no answer": func(_ *redisProc, p *stallProxy) { p.stalled.Store(true) },
	"killed":    func(r *redisProc, _ *stallProxy) { r.kill() },
}

// stallTimeout is the store's Timeout in the stall tests.
const stallTimeout = 50 * time.Millisecond

// stalledInstance is a fleet-mode router's group "paid" (holdInstance's,
// with a budget of $100 per hour) on a store with Timeout stallTimeout
// whose Redis (a real redis-server behind a stallProxy) stall stalls; it
// serves one request before the stall.
func stalledInstance(t *testing.T, transport http.RoundTripper, fleetQueue bool, stall func(r *redisProc, p *stallProxy)) (*router.Router, *router.Group) {
	t.Helper()
	r := &redisProc{path: needRedisServer(t), port: freePort(t, 0, 0), dir: t.TempDir(),
		args: []string{"--enable-debug-command", "yes"}}
	r.start(t)
	t.Cleanup(r.kill)
	p := newStallProxy(t, fmt.Sprintf("127.0.0.1:%d", r.port))
	s, err := New(Options{URL: "redis://" + p.ln.Addr().String() + "/0", KeyPrefix: keyPrefix(t),
		PollInterval: time.Hour, Timeout: stallTimeout})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	in := &instance{state: capacity.NewState(), obs: newCounter(), store: s}
	s.Bind(testIdentity, in.state)
	hp := &heldProvider{open: make(chan struct{})}
	close(hp.open)
	g := holdInstance(in, hp)
	g.Deployments[0].Transport = transport
	if fleetQueue {
		g.Fleet = routerQueue{s.Queue(g.Name, []string{testIdentity})}
	}
	g.Spending = capacity.NewSpending(capacity.SpendLimit{USD: 100, Period: time.Hour}, s, "budget:group|paid")
	rt := router.New()
	if res := rt.ServeGroup(context.Background(), g, stallReq); res.Err != nil {
		t.Fatalf("before the stall: %v", res.Err)
	}
	stall(r, p)
	return rt, g
}

var stallReq = &router.Request{Request: &provider.Request{Format: provider.Chat, Choices: 1,
	Body: []byte(`{"model":"paid","max_tokens":80,"messages":[{"role":"user","content":"hi"}]}`)},
	Tokens: 180, PromptTokens: 100, OutputTokens: 80}

// serveStalled serves n requests at once through g and returns how long
// each took; each must be served.
func serveStalled(t *testing.T, rt *router.Router, g *router.Group, n int) []time.Duration {
	t.Helper()
	var wg sync.WaitGroup
	took := make([]time.Duration, n)
	for i := range took {
		wg.Go(func() {
			start := time.Now()
			res := rt.ServeGroup(context.Background(), g, stallReq)
			took[i] = time.Since(start)
			if res.Err != nil {
				t.Errorf("request %d: %v", i, res.Err)
			}
		})
	}
	wg.Wait()
	t.Logf("slowest request with Redis stalled: %v", slices.Max(took))
	return took
}

// With Redis stalled (paused by DEBUG SLEEP, behind a proxy that never
// answers, or killed), each request through a fleet-mode router with a
// budget and declared rpm finishes within the store's timeout (50ms) plus
// slack: Redis never holds a request longer than Timeout.
func TestRedisStallHoldsNoRequestPastTimeout(t *testing.T) {
	for name, stall := range stalls {
		t.Run(name, func(t *testing.T) {
			hp := &heldProvider{open: make(chan struct{})}
			close(hp.open)
			rt, g := stalledInstance(t, hp, false, stall)
			for i, d := range serveStalled(t, rt, g, 8) {
				if d > 250*time.Millisecond {
					t.Errorf("request %d took %v with Redis stalled (timeout %v)", i, d, stallTimeout)
				}
			}
		})
	}
}

// windowProvider answers as heldProvider, stating a window of 100
// requests whose first answer leaves none until reset (after which the
// window is full again).
type windowProvider struct {
	calls atomic.Int32
	reset time.Duration
}

func (p *windowProvider) RoundTrip(req *http.Request) (*http.Response, error) {
	remaining := "99"
	if p.calls.Add(1) == 1 {
		remaining = "0"
	}
	h := http.Header{"Content-Type": {"application/json"}}
	h.Set("x-ratelimit-limit-requests", "100")
	h.Set("x-ratelimit-remaining-requests", remaining)
	h.Set("x-ratelimit-reset-requests", p.reset.String())
	return &http.Response{StatusCode: 200, Header: h, Body: io.NopCloser(strings.NewReader(heldBody)), Request: req}, nil
}

// The same with the requests waiting in the group's queue, and so in the
// fleet's (its Join, looks and Leave are Redis calls on the request path):
// the deployment's window, spent by the first request, is full again
// after 300 ms; 16 requests that wait for it while Redis stalls are served
// within the reset plus the store's timeout and slack, not a call's time
// per request that joined the fleet's queue before them.
func TestRedisStallHoldsNoQueuedRequestPastTimeout(t *testing.T) {
	const reset = 300 * time.Millisecond
	for name, stall := range stalls {
		t.Run(name, func(t *testing.T) {
			rt, g := stalledInstance(t, &windowProvider{reset: reset}, true, stall)
			for i, d := range serveStalled(t, rt, g, 16) {
				if d > reset+stallTimeout+150*time.Millisecond {
					t.Errorf("request %d took %v with Redis stalled (the window full again after %v, timeout %v)", i, d, reset, stallTimeout)
				}
			}
		})
	}
}

// A request that leaves the fleet's queue (its turn came: it is about to
// be sent) waits on no Redis call: with Redis not answering, Leave returns
// at once (it waited the whole timeout, 50 ms, on the way to the
// provider), and with Redis answering the member is out before the next
// call of the instance is answered.
func TestLeavingTheFleetQueueWaitsOnNoRedis(t *testing.T) {
	r := &redisProc{path: needRedisServer(t), port: freePort(t, 0, 0), dir: t.TempDir()}
	r.start(t)
	t.Cleanup(r.kill)
	p := newStallProxy(t, fmt.Sprintf("127.0.0.1:%d", r.port))
	s, err := New(Options{URL: "redis://" + p.ln.Addr().String() + "/0", KeyPrefix: keyPrefix(t),
		PollInterval: time.Hour, Timeout: stallTimeout})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	q := s.Queue("paid", []string{testIdentity})
	join := func(order uint64) string {
		t.Helper()
		m, _, _, err := q.Join(5, 9, time.Now(), order, time.Minute, 10, false)
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	first, second := join(1), join(2)
	q.Leave(first)
	if _, _, err := q.Ahead(first, false); !errors.Is(err, ErrNotQueued) {
		t.Errorf("expected the member that left out of the queue at the next call, got %v", err)
	}
	p.stalled.Store(true)
	start := time.Now()
	q.Leave(second)
	if took := time.Since(start); took > stallTimeout/2 {
		t.Errorf("expected Leave to return at once with Redis stalled, took %v (timeout %v)", took, stallTimeout)
	}
}

// routerQueue is q as the router asks it (router.FleetQueue), as the root
// module's store.go adapts it.
type routerQueue struct{ *Queue }

func (q routerQueue) JoinAll(joins []router.FleetJoin) {
	js := make([]Joining, len(joins))
	for i, j := range joins {
		js[i] = Joining(j)
	}
	q.Queue.JoinAll(js)
	for i, j := range js {
		joins[i] = router.FleetJoin(j)
	}
}
