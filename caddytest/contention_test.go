package integration

import (
	"encoding/json"
	"fmt"
	"net/http"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestBurstOnALimitedDeploymentSpendsItsWindows: the scenario,
// shortened. One deployment whose provider allows 10 requests per 2 s
// fixed window and states it (x-ratelimit-*, 429 once spent); deadline 5 s.
// A warm-up request teaches the router the limit; once the next window
// opens, 60 clients post at once. An ideal scheduler serves 30 (this
// window and the two that open within the deadline) and draws no 429
// from the provider; the others get their 429 at once.
func TestBurstOnALimitedDeploymentSpendsItsWindows(t *testing.T) {
	const window = 2 * time.Second
	load(t, limitedConfig("deadline 5s\n\t\tmax_attempts 8", window))
	if resp := chat(t, "limited", false); resp.StatusCode != 200 {
		t.Fatalf("warm-up: expected 200, got %d: %s", resp.StatusCode, readBody(t, resp))
	} else {
		resp.Body.Close()
	}
	before := mockStatsRateLimited(t)
	time.Sleep(window + 100*time.Millisecond) // the warm-up's window ends

	type result struct {
		status int
		took   time.Duration
	}
	results := make([]result, 60)
	var wg sync.WaitGroup
	start := time.Now()
	for i := range results {
		wg.Go(func() {
			resp := chat(t, "limited", false)
			readBody(t, resp)
			results[i] = result{resp.StatusCode, time.Since(start)}
		})
	}
	wg.Wait()

	served, limited := 0, 0
	var limitedTook []time.Duration
	for _, r := range results {
		switch r.status {
		case http.StatusOK:
			served++
		case http.StatusTooManyRequests:
			limited++
			limitedTook = append(limitedTook, r.took)
		default:
			t.Errorf("unexpected status %d", r.status)
		}
		if r.took > 5*time.Second+500*time.Millisecond {
			t.Errorf("a client waited %v, past the 5 s deadline", r.took)
		}
	}
	upstream429 := mockStatsRateLimited(t) - before
	t.Logf("served %d (ideal 30), client 429s %d, upstream 429s %d", served, limited, upstream429)
	if served < 29 {
		t.Errorf("served %d, expected at least 95%% of the ideal 30", served)
	}
	if float64(upstream429) > 0.05*float64(served) {
		t.Errorf("the provider answered %d 429s for %d served (at most 0.05 per served)", upstream429, served)
	}
	queueSeen(t, "limited", 20)
	// The requests that could never be served within the deadline are told
	// at once, not after waiting (generous bound for a loaded CI machine;
	// the contention benchmark measures it).
	sort.Slice(limitedTook, func(i, j int) bool { return limitedTook[i] < limitedTook[j] })
	if n := len(limitedTook); n > 0 && limitedTook[n*9/10] > time.Second {
		t.Errorf("90%% of the 429s should come at once; the 90th percentile took %v", limitedTook[n*9/10])
	}
}

// queueSeen checks the admin endpoint's and the metrics' view of the
// group's queue after a burst: empty now, waited requests counted.
func queueSeen(t *testing.T, group string, minWaited int64) {
	t.Helper()
	resp, err := http.Get("http://localhost:2999/llm_router/deployments")
	if err != nil {
		t.Fatal(err)
	}
	var st struct {
		ModelGroups []struct {
			Name       string  `json:"name"`
			Queued     int     `json:"queued"`
			Waited     int64   `json:"waited"`
			MeanWaitMS float64 `json:"mean_wait_ms"`
		} `json:"model_groups"`
	}
	if err := jsonDecode(resp, &st); err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	found := false
	for _, g := range st.ModelGroups {
		if g.Name == group {
			found = true
			if g.Queued != 0 || g.Waited < minWaited || g.MeanWaitMS <= 0 {
				t.Errorf("admin: expected the queue empty and at least %d waits, got %+v", minWaited, g)
			}
		}
	}
	if !found {
		t.Errorf("admin: no model group %s in %+v", group, st.ModelGroups)
	}
	resp, err = http.Get("http://localhost:2999/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body := readBody(t, resp)
	for _, want := range []string{
		`llm_router_queue_length{model_group="` + group + `"} 0`,
		`llm_router_queue_wait_seconds_count{model_group="` + group + `"}`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("metrics: expected %s", want)
		}
	}
}

// limitedConfig is a router on :9080 (with the options given) whose model
// group "limited" is one deployment on an llm_mock at :9081 that allows 10
// requests per window, states it in x-ratelimit-* headers and answers 429
// once it is spent.
func limitedConfig(options string, window time.Duration) string {
	return fmt.Sprintf(`
http://localhost:9080 {
	llm_router /v1/* {
		%s
		provider a {
			type openai
			base_url http://localhost:9081/v1
			api_key sk-provider-a
		}
		model limited {
			deployment a gpt-4o-mini
		}
	}
}
http://localhost:9081 {
	llm_mock {
		rate_limit {
			requests 10
			window %s
		}
	}
}
`, options, window)
}

func mockStatsRateLimited(t *testing.T) int64 {
	t.Helper()
	resp, err := http.Get("http://localhost:9081/llm_mock/stats")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var s struct {
		RateLimited int64 `json:"rate_limited"`
	}
	if err := jsonDecode(resp, &s); err != nil {
		t.Fatal(err)
	}
	return s.RateLimited
}

func jsonDecode(resp *http.Response, v any) error { return json.NewDecoder(resp.Body).Decode(v) }

// TestPriorityAndReserve: 30% of each window is kept for priority 7 and
// above. A burst of 20 low-priority requests takes 7 of this window and 7
// of the next (the deadline allows two); 5 high-priority requests that
// come after them are all served, before the low ones still waiting. A
// priority that is not a number from 0 to 9 is a 400 in the client's
// format.
func TestPriorityAndReserve(t *testing.T) {
	const window = 2 * time.Second
	load(t, limitedConfig("deadline 3s\n\t\tpriority {http.request.header.X-Priority}\n\t\treserve 30% for priority >= 7", window))
	resp := chat(t, "limited", false, "X-Priority", "urgent")
	body := readBody(t, resp)
	if resp.StatusCode != 400 || !strings.Contains(body, `"param":"priority"`) || !strings.Contains(body, "from 0 to 9") {
		t.Errorf("expected a 400 about the priority in OpenAI's format, got %d %s", resp.StatusCode, body)
	}
	if resp := chat(t, "limited", false); resp.StatusCode != 200 { // warm-up, default priority
		t.Fatalf("warm-up: expected 200, got %d", resp.StatusCode)
	} else {
		resp.Body.Close()
	}
	before := mockStatsRateLimited(t)
	time.Sleep(window + 100*time.Millisecond)

	var mu sync.Mutex
	got := map[string]map[int]int{"low": {}, "high": {}}
	var wg sync.WaitGroup
	send := func(kind, priority string) {
		wg.Go(func() {
			resp := chat(t, "limited", false, "X-Priority", priority)
			readBody(t, resp)
			mu.Lock()
			got[kind][resp.StatusCode]++
			mu.Unlock()
		})
	}
	for range 20 {
		send("low", "1")
	}
	time.Sleep(200 * time.Millisecond)
	for range 5 {
		send("high", "9")
	}
	wg.Wait()
	t.Logf("low: %v, high: %v", got["low"], got["high"])
	if got["high"][200] != 5 {
		t.Errorf("expected all 5 high-priority requests served, got %v", got["high"])
	}
	if got["low"][200] < 12 || got["low"][200] > 14 {
		t.Errorf("expected 7 low-priority requests per window (two windows), got %v", got["low"])
	}
	if n := mockStatsRateLimited(t) - before; n != 0 {
		t.Errorf("expected no upstream 429, got %d", n)
	}
}
