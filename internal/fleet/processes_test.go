package fleet

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// TestFleetOfTwoCaddies runs two router instances as two processes (the
// development build of Caddy, each with its own Caddyfile and admin port)
// sharing one real redis-server, and counts at the llm_mock upstreams what
// reached them:
//
//   - a 429 learned by instance A makes instance B skip that deployment on
//     its next request without touching it;
//   - a declared rpm is counted fleet-wide: rpm 10 and 30 concurrent requests
//     split over both instances within a second, exactly 10 reach the mock;
//   - Redis killed mid-run fails no request; when it comes back, sharing
//     resumes (a 429, and a declared rpm).
//
// Ports: routers 9500 and 9501, mocks 9510-9515, Redis in 9590-9599,
// admin localhost:2599 and localhost:2598.
func TestFleetOfTwoCaddies(t *testing.T) {
	needRedisServer(t)
	for _, p := range []int{9500, 9501, 9510, 9511, 9512, 9513, 9514, 9515, 2599, 2598} {
		if l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p)); err != nil {
			t.Fatalf("port %d must be free for this test: %v", p, err)
		} else {
			l.Close()
		}
	}
	bin := buildCaddy(t)
	rd := startRedis(t, freePort(t, 9590, 9599))

	a := startCaddy(t, bin, "a", 2599, routerConfig(9500, 2599, rd.URL())+mocks)
	b := startCaddy(t, bin, "b", 2598, routerConfig(9501, 2598, rd.URL()))
	for _, in := range []*caddyProc{a, b} {
		in.waitStoreUp(t)
	}

	t.Run("a 429 learned by A makes B skip the deployment", func(t *testing.T) {
		res := a.chat(t, "share")
		if res.status != 200 || res.deployment != "fallback/m-share-fb" || res.attempts != "2" {
			t.Fatalf("expected A to fail over from the 429 to fallback, got %+v", res)
		}
		b.waitCircuit(t, "a429/m-share", "open")
		res = b.chat(t, "share")
		if res.status != 200 || res.deployment != "fallback/m-share-fb" || res.attempts != "1" {
			t.Errorf("expected B to go straight to fallback, got %+v", res)
		}
		if n := mockRequests(t, 9510); n != 1 {
			t.Errorf("expected the rate-limited mock touched once (by A), got %d", n)
		}
	})

	t.Run("rpm 10 with two instances lets exactly 10 through", func(t *testing.T) {
		statuses := burst(t, a, b, "rpm", 30)
		if statuses[200] != 30 {
			t.Errorf("expected 30 answers of 200, got %v", statuses)
		}
		if n := mockRequests(t, 9512); n != 10 {
			t.Errorf("expected exactly 10 requests at the rpm-10 deployment, fleet-wide, got %d", n)
		}
	})

	t.Run("Redis killed mid-run fails no request; sharing resumes", func(t *testing.T) {
		var sent, failed atomic.Int64
		var slowest atomic.Int64
		var firstErr atomic.Value
		stop := make(chan struct{})
		var wg sync.WaitGroup
		for w := 0; w < 4; w++ {
			wg.Add(1)
			go func(w int) {
				defer wg.Done()
				in := []*caddyProc{a, b}[w%2]
				for {
					select {
					case <-stop:
						return
					default:
					}
					began := time.Now()
					res, err := in.tryChat("steady")
					sent.Add(1)
					if d := int64(time.Since(began)); d > slowest.Load() {
						slowest.Store(d)
					}
					if err != nil || res.status != 200 {
						failed.Add(1)
						firstErr.CompareAndSwap(nil, fmt.Sprintf("%+v %v", res, err))
					}
				}
			}(w)
		}
		time.Sleep(500 * time.Millisecond)
		rd.kill()
		time.Sleep(1500 * time.Millisecond)
		rd.start(t)
		for _, in := range []*caddyProc{a, b} {
			in.waitStoreUp(t)
		}
		time.Sleep(500 * time.Millisecond)
		close(stop)
		wg.Wait()
		t.Logf("%d requests across the outage, slowest %v", sent.Load(), time.Duration(slowest.Load()))
		if failed.Load() != 0 {
			t.Errorf("expected no request to fail, %d of %d did; first: %v", failed.Load(), sent.Load(), firstErr.Load())
		}
		if sent.Load() < 100 {
			t.Errorf("expected requests all along the outage, only %d", sent.Load())
		}
		// (A local fallback is counted only once an instance's grants of
		// declared places are used up: a short outage may need none.)
		for _, in := range []*caddyProc{a, b} {
			if n := in.metric(t, `llm_router_store_errors_total`); n < 1 {
				t.Errorf("%s: expected store errors counted, got %v", in.name, n)
			}
			if n := in.logLines(t, "fleet store unreachable"); n != 1 {
				t.Errorf("%s: expected the outage logged once, got %d lines", in.name, n)
			}
			if n := in.logLines(t, "fleet store reachable again"); n != 1 {
				t.Errorf("%s: expected the return logged once, got %d lines", in.name, n)
			}
		}

		// Sharing resumes: a 429 at A reaches B, and rpm counts fleet-wide.
		res := a.chat(t, "resume")
		if res.status != 200 || res.deployment != "fallback/m-resume-fb" {
			t.Fatalf("expected A to fail over from the 429, got %+v", res)
		}
		b.waitCircuit(t, "a429b/m-resume", "open")
		if res := b.chat(t, "resume"); res.status != 200 || res.attempts != "1" {
			t.Errorf("expected B to skip the rate-limited deployment, got %+v", res)
		}
		if n := mockRequests(t, 9514); n != 1 {
			t.Errorf("expected the rate-limited mock touched once after the outage, got %d", n)
		}
		statuses := burst(t, a, b, "rpm2", 12)
		if statuses[200] != 12 {
			t.Errorf("expected 12 answers of 200, got %v", statuses)
		}
		if n := mockRequests(t, 9515); n != 4 {
			t.Errorf("expected exactly 4 requests at the rpm-4 deployment after the outage, got %d", n)
		}
	})
}

// routerConfig is one instance's router on port, sharing state through
// Redis at redisURL. Ranking counts quality only, so the better deployment
// of each group is always tried first while usable.
func routerConfig(port, admin int, redisURL string) string {
	return fmt.Sprintf(`{
	admin localhost:%d
	auto_https off
	persist_config off
	grace_period 1ns
}
http://localhost:%d {
	llm_router /v1/* {
		store redis %s {
			timeout 50ms
			poll_interval 200ms
		}
		deadline 10s
		weights cost 0 latency 0 reliability 0 quality 1 capacity 0
		provider a429 {
			type openai
			base_url http://localhost:9510/v1
			api_key sk-fleet-a429
		}
		provider fallback {
			type openai
			base_url http://localhost:9511/v1
			api_key sk-fleet-fallback
		}
		provider limited {
			type openai
			base_url http://localhost:9512/v1
			api_key sk-fleet-limited
		}
		provider steady {
			type openai
			base_url http://localhost:9513/v1
			api_key sk-fleet-steady
		}
		provider a429b {
			type openai
			base_url http://localhost:9514/v1
			api_key sk-fleet-a429b
		}
		provider limited2 {
			type openai
			base_url http://localhost:9515/v1
			api_key sk-fleet-limited2
		}
		model share {
			deployment a429 m-share {
				quality 0.9
			}
			deployment fallback m-share-fb {
				quality 0.1
			}
		}
		model rpm {
			deployment limited m-rpm {
				quality 0.9
				rpm 10
			}
			deployment fallback m-rpm-fb {
				quality 0.1
			}
		}
		model steady {
			deployment steady m-steady {
				rpm 1000000
			}
		}
		model resume {
			deployment a429b m-resume {
				quality 0.9
			}
			deployment fallback m-resume-fb {
				quality 0.1
			}
		}
		model rpm2 {
			deployment limited2 m-rpm2 {
				quality 0.9
				rpm 4
			}
			deployment fallback m-rpm2-fb {
				quality 0.1
			}
		}
	}
}
`, admin, port, redisURL)
}

// mocks are the fake providers, served by instance A's process (the
// instances only share Redis and these upstreams).
const mocks = `
http://localhost:9510 {
	llm_mock {
		fault rate_limit {
			header Retry-After 30
		}
	}
}
http://localhost:9511 {
	llm_mock
}
http://localhost:9512 {
	llm_mock
}
http://localhost:9513 {
	llm_mock
}
http://localhost:9514 {
	llm_mock {
		fault rate_limit {
			header Retry-After 30
		}
	}
}
http://localhost:9515 {
	llm_mock
}
`

// buildCaddy builds the development binary (./cmd/caddy) into a temporary
// directory.
func buildCaddy(t *testing.T) string {
	t.Helper()
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		t.Fatal(err)
	}
	root := filepath.Dir(strings.TrimSpace(string(out)))
	bin := filepath.Join(t.TempDir(), "caddy")
	cmd := exec.Command("go", "build", "-o", bin, "./cmd/caddy")
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("building ./cmd/caddy: %v\n%s", err, out)
	}
	return bin
}

// caddyProc is a Caddy process the test started; only it is ever signalled.
type caddyProc struct {
	name    string
	port    int
	admin   int
	logPath string
	cmd     *exec.Cmd
	done    chan struct{}
	client  *http.Client
}

func startCaddy(t *testing.T, bin, name string, admin int, config string) *caddyProc {
	t.Helper()
	dir := t.TempDir()
	cfg := filepath.Join(dir, "Caddyfile")
	if err := os.WriteFile(cfg, []byte(config), 0o600); err != nil {
		t.Fatal(err)
	}
	port := 9500
	if name == "b" {
		port = 9501
	}
	p := &caddyProc{name: name, port: port, admin: admin, logPath: filepath.Join(dir, "caddy.log"),
		client: &http.Client{Timeout: 20 * time.Second}}
	logf, err := os.Create(p.logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "run", "--config", cfg, "--adapter", "caddyfile")
	cmd.Env = append(os.Environ(), "XDG_DATA_HOME="+filepath.Join(dir, "data"), "XDG_CONFIG_HOME="+filepath.Join(dir, "config"), "HOME="+dir)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p.cmd, p.done = cmd, make(chan struct{})
	go func() {
		_ = cmd.Wait()
		logf.Close()
		close(p.done)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(os.Interrupt)
		select {
		case <-p.done:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-p.done
		}
		if t.Failed() {
			raw, _ := os.ReadFile(p.logPath)
			t.Logf("instance %s log:\n%s", name, tail(string(raw), 60))
		}
	})
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := p.client.Get(fmt.Sprintf("http://localhost:%d/v1/models", port))
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return p
			}
		}
		select {
		case <-p.done:
			raw, _ := os.ReadFile(p.logPath)
			t.Fatalf("instance %s exited at start:\n%s", name, tail(string(raw), 40))
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("instance %s does not answer on :%d", name, port)
		}
	}
}

func tail(s string, n int) string {
	lines := strings.Split(s, "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

type chatResult struct {
	status     int
	deployment string
	attempts   string
}

func (p *caddyProc) tryChat(model string) (chatResult, error) {
	body := fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":"Say hello."}]}`, model)
	resp, err := p.client.Post(fmt.Sprintf("http://localhost:%d/v1/chat/completions", p.port), "application/json", strings.NewReader(body))
	if err != nil {
		return chatResult{}, err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return chatResult{resp.StatusCode, resp.Header.Get("X-LLM-Router-Deployment"), resp.Header.Get("X-LLM-Router-Attempts")}, nil
}

func (p *caddyProc) chat(t *testing.T, model string) chatResult {
	t.Helper()
	res, err := p.tryChat(model)
	if err != nil {
		t.Fatalf("instance %s: %v", p.name, err)
	}
	return res
}

// burst sends n concurrent requests for model, alternating between a and b,
// and counts the statuses (0: transport error).
func burst(t *testing.T, a, b *caddyProc, model string, n int) map[int]int {
	t.Helper()
	var mu sync.Mutex
	statuses := map[int]int{}
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func(in *caddyProc) {
			defer wg.Done()
			res, _ := in.tryChat(model)
			mu.Lock()
			statuses[res.status]++
			mu.Unlock()
		}([]*caddyProc{a, b}[i%2])
	}
	wg.Wait()
	return statuses
}

// waitCircuit waits until the instance's admin API shows the deployment's
// circuit in the given state.
func (p *caddyProc) waitCircuit(t *testing.T, deployment, circuit string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	last := ""
	for time.Now().Before(deadline) {
		resp, err := p.client.Get(fmt.Sprintf("http://localhost:%d/llm_router/deployments", p.admin))
		if err == nil {
			var out struct {
				Deployments []struct {
					Name    string `json:"name"`
					Circuit string `json:"circuit"`
				} `json:"deployments"`
			}
			_ = json.NewDecoder(resp.Body).Decode(&out)
			resp.Body.Close()
			for _, d := range out.Deployments {
				if d.Name == deployment {
					last = d.Circuit
				}
			}
			if last == circuit {
				return
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("instance %s: expected %s's circuit %s within 5s, last %q", p.name, deployment, circuit, last)
}

// metric sums the samples of the instance's Prometheus metric whose line
// starts with prefix.
func (p *caddyProc) metric(t *testing.T, prefix string) float64 {
	t.Helper()
	resp, err := p.client.Get(fmt.Sprintf("http://localhost:%d/metrics", p.admin))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sum := 0.0
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, prefix) {
			f := strings.Fields(line)
			v, _ := strconv.ParseFloat(f[len(f)-1], 64)
			sum += v
		}
	}
	return sum
}

// waitStoreUp waits until the instance's store answers (llm_router_store_up 1).
func (p *caddyProc) waitStoreUp(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for p.metric(t, "llm_router_store_up ") != 1 {
		if time.Now().After(deadline) {
			t.Fatalf("instance %s: the store did not come up", p.name)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (p *caddyProc) logLines(t *testing.T, snippet string) int {
	t.Helper()
	raw, err := os.ReadFile(p.logPath)
	if err != nil {
		t.Fatal(err)
	}
	return strings.Count(string(raw), snippet)
}

func mockRequests(t *testing.T, port int) int64 { return mockStats(t, port).Requests }

// mockStats reads what the llm_mock on port saw.
func mockStats(t *testing.T, port int) (s struct {
	Requests    int64 `json:"requests"`
	RateLimited int64 `json:"rate_limited"`
}) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("http://localhost:%d/llm_mock/stats", port), nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(&s); err != nil {
		t.Fatalf("stats of :%d: %v", port, err)
	}
	return s
}
