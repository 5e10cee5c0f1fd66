package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"
)

type bench struct {
	o       options
	started time.Time
	res     results
	// budget is what is left of -busy-budget: time to spend waiting for
	// other processes to calm down, or measuring noisy runs again.
	budget time.Duration
}

// waitQuiet waits, up to 15 s and within the budget, until the processes
// this benchmark did not start use less than -noise % of a CPU.
func (b *bench) waitQuiet() {
	start := time.Now()
	for b.budget > time.Since(start) {
		s0 := snapshot()
		time.Sleep(300 * time.Millisecond)
		load := otherLoad(s0, snapshot())
		if load <= b.o.noise {
			break
		}
		if time.Since(start) > 15*time.Second {
			b.logf("  (other processes still use %.0f%% of a CPU: going on)", load)
			break
		}
	}
	b.budget -= time.Since(start)
}

// again reports whether a run that saw others% of other load is measured
// again, and charges the run's time to the budget if so.
func (b *bench) again(others float64, attempt int, took time.Duration) bool {
	if others <= b.o.noise || attempt >= b.o.retries || b.budget <= 0 {
		return false
	}
	b.budget -= took
	return true
}

// upstreamSet is one upstream process and its ports (see upstream.go and
// configs/mock.Caddyfile).
type upstreamSet struct {
	name    string // "bare" or "llm_mock"
	latency time.Duration
	base    int
}

func (u upstreamSet) label() string {
	return fmt.Sprintf("%s %dms", u.name, u.latency.Milliseconds())
}

// env points the Caddyfiles under test at this upstream.
func (u upstreamSet) env() []string {
	env := []string{fmt.Sprintf("BENCH_UP=127.0.0.1:%d", u.base)}
	for i := 1; i <= 8; i++ {
		env = append(env, fmt.Sprintf("BENCH_UP%d=127.0.0.1:%d", i, u.base+i))
	}
	return append(env,
		fmt.Sprintf("BENCH_FAIL_A=127.0.0.1:%d", u.base+portFailA),
		fmt.Sprintf("BENCH_FAIL_B=127.0.0.1:%d", u.base+portFailB))
}

var (
	bare0  = upstreamSet{"bare", 0, bare0Base}
	bare50 = upstreamSet{"bare", 50 * time.Millisecond, bare50Base}
	mock0  = upstreamSet{"llm_mock", 0, mock0Base}
	mock50 = upstreamSet{"llm_mock", 50 * time.Millisecond, mock50Base}
)

// scenario is one way of reaching the upstream.
type scenario struct {
	name   string
	config string // Caddyfile in configs/; "" = direct to the upstream
}

var (
	direct       = scenario{"direct", ""}
	proxy        = scenario{"reverse_proxy", "reverse_proxy.Caddyfile"}
	router1      = scenario{"router-1", "router1.Caddyfile"}
	router8      = scenario{"router-8", "router8.Caddyfile"}
	failoverSc   = scenario{"router-failover", "failover.Caddyfile"}
	allScenarios = []scenario{direct, proxy, router1, router8}
)

func (b *bench) upstreamSets() []upstreamSet {
	if b.o.mock {
		return []upstreamSet{bare0, bare50, mock0, mock50}
	}
	return []upstreamSet{bare0, bare50}
}

func (b *bench) startUpstreams() error {
	self, err := os.Executable()
	if err != nil {
		return err
	}
	for _, u := range []upstreamSet{bare0, bare50} {
		argv := []string{self, "upstream", "-base", strconv.Itoa(u.base), "-latency", u.latency.String()}
		log := filepath.Join(b.o.out, "logs", fmt.Sprintf("upstream-%s-%dms.log", u.name, u.latency.Milliseconds()))
		if _, err := start(u.label(), argv, nil, "", log, fmt.Sprintf("127.0.0.1:%d", u.base+upstreamPorts-1)); err != nil {
			return err
		}
	}
	if !b.o.mock {
		return nil
	}
	for _, u := range []upstreamSet{mock0, mock50} {
		env := []string{
			fmt.Sprintf("BENCH_ADMIN_PORT=%d", u.base+mockAdminOff),
			"BENCH_LATENCY=" + u.latency.String(),
			"BENCH_CHUNK_INTERVAL=2ms",
		}
		for i := 0; i <= 8; i++ {
			env = append(env, fmt.Sprintf("BENCH_MOCK%d=%d", i, u.base+i))
		}
		argv := []string{b.o.caddy, "run", "--config", filepath.Join(b.o.configs, "mock.Caddyfile"), "--adapter", "caddyfile"}
		log := filepath.Join(b.o.out, "logs", fmt.Sprintf("upstream-%s-%dms.log", u.name, u.latency.Milliseconds()))
		if _, err := start(u.label(), argv, env, "", log, fmt.Sprintf("127.0.0.1:%d", u.base+8)); err != nil {
			return err
		}
	}
	b.logf("upstreams ready: bare (0 ms, 50 ms) on 127.0.0.1:%d+, :%d+; llm_mock: %v", bare0Base, bare50Base, b.o.mock)
	return nil
}

// startCaddy starts the Caddy under test for sc, pointed at u, on its own
// CPUs; nil for the direct scenario.
func (b *bench) startCaddy(sc scenario, u upstreamSet, tag string) (*child, error) {
	if sc.config == "" {
		return nil, nil
	}
	env := append([]string{
		fmt.Sprintf("BENCH_ADMIN_PORT=%d", caddyAdmin),
		fmt.Sprintf("BENCH_PORT=%d", caddyPort),
	}, u.env()...)
	argv := []string{b.o.caddy, "run", "--config", filepath.Join(b.o.configs, sc.config), "--adapter", "caddyfile"}
	log := filepath.Join(b.o.out, "logs", tag+".log")
	return start(sc.name, argv, env, b.o.caddyCPUs, log, fmt.Sprintf("127.0.0.1:%d", caddyPort))
}

func chatURL(sc scenario, u upstreamSet) string {
	if sc.config == "" {
		return fmt.Sprintf("http://127.0.0.1:%d/v1/chat/completions", u.base)
	}
	return fmt.Sprintf("http://127.0.0.1:%d/v1/chat/completions", caddyPort)
}

// chatBody is the non-streaming request: a system prompt and a question,
// about 1 KB, as a chat application sends.
var chatBody = func() []byte {
	system := strings.Repeat("You are a helpful assistant for the support team. Answer in the customer's language, in at most three sentences. ", 7)
	b, _ := json.Marshal(map[string]any{
		"model": "bench",
		"messages": []map[string]string{
			{"role": "system", "content": system},
			{"role": "user", "content": "My order 4711 has not arrived yet, it was due on Monday. Can you tell me where it is and when it will be delivered?"},
		},
		"max_tokens":  128,
		"temperature": 0.2,
	})
	return b
}()

// streamBody asks for a stream of chunks, interval apart (the bare
// upstream reads both from the body; llm_mock sends its configured 200).
func streamBody(chunks int, interval time.Duration, user string) []byte {
	b, _ := json.Marshal(map[string]any{
		"model":      "bench",
		"stream":     true,
		"messages":   []map[string]string{{"role": "user", "content": "Tell me a story."}},
		"max_tokens": chunks,
		"metadata":   map[string]string{"bench_interval": interval.String()},
		"user":       user,
	})
	return b
}

// loadRow is one non-streaming run.
type loadRow struct {
	Upstream  string `json:"upstream"`
	LatencyMs int64  `json:"upstream_latency_ms"`
	Rate      int    `json:"rate"` // 0: closed loop
	Workers   int    `json:"workers,omitempty"`
	Scenario  string `json:"scenario"`
	Round     int    `json:"round"`
	loadStats
	CaddyCPUPerReqUs float64 `json:"caddy_cpu_per_request_us"`
	CaddyCPUPct      float64 `json:"caddy_cpu_percent"`
	PeakRSSMiB       float64 `json:"caddy_peak_rss_mib"`
	AddedP50         float64 `json:"added_p50_ms"`
	AddedP99         float64 `json:"added_p99_ms"`
	Sustained        bool    `json:"sustained"`
	// OtherCPUPct is what the rest of the machine used meanwhile, in % of one CPU.
	OtherCPUPct float64 `json:"other_cpu_percent"`
}

// sustained: at least 99.9% successes, the rate issued, and no queue
// building up (p99 within 100 ms of the upstream's own latency).
func (r *loadRow) judge() {
	if r.Rate == 0 {
		r.Sustained = r.OK == r.Requests
		return
	}
	r.Sustained = r.Requests > 0 && float64(r.OK) >= 0.999*float64(r.Requests) &&
		r.Issued >= 0.97*float64(r.Rate) && r.P99 <= float64(r.LatencyMs)+100
}

// measure runs one attack against sc, again (up to -retries times) when
// other processes on the machine used more than -noise % of a CPU meanwhile.
func (b *bench) measure(sc scenario, u upstreamSet, rate, workers int, tag string) (loadRow, error) {
	for attempt := 0; ; attempt++ {
		b.waitQuiet()
		t := time.Now()
		row, err := b.measureOnce(sc, u, rate, workers, tag)
		if err != nil || !b.again(row.OtherCPUPct, attempt, time.Since(t)) {
			return row, err
		}
		b.logf("  (%s %s: other processes used %.0f%% of a CPU meanwhile; measuring again)", sc.name, u.label(), row.OtherCPUPct)
	}
}

// measureOnce runs one attack against sc and reads the Caddy process's CPU
// and peak RSS around it.
func (b *bench) measureOnce(sc scenario, u upstreamSet, rate, workers int, tag string) (loadRow, error) {
	row := loadRow{Upstream: u.name, LatencyMs: u.latency.Milliseconds(), Rate: rate, Scenario: sc.name}
	if rate == 0 {
		row.Workers = workers
	}
	c, err := b.startCaddy(sc, u, tag)
	if err != nil {
		return row, err
	}
	if c != nil {
		defer c.stop()
	}
	client := newClient()
	defer client.CloseIdleConnections()
	url := chatURL(sc, u)
	if b.o.warm > 0 {
		attack(client, url, chatBody, rate, workers, b.o.warm)
	}
	var cpu0 time.Duration
	if c != nil {
		cpu0, _ = cpuTime(c.pid())
	}
	t0, s0 := time.Now(), snapshot()
	row.loadStats = attack(client, url, chatBody, rate, workers, b.o.dur)
	wall := time.Since(t0)
	row.OtherCPUPct = otherLoad(s0, snapshot())
	if c != nil {
		cpu1, _ := cpuTime(c.pid())
		if row.Requests > 0 {
			row.CaddyCPUPerReqUs = float64(cpu1-cpu0) / float64(time.Microsecond) / float64(row.Requests)
		}
		row.CaddyCPUPct = 100 * float64(cpu1-cpu0) / float64(wall)
		if _, hwm, err := memKiB(c.pid()); err == nil {
			row.PeakRSSMiB = float64(hwm) / 1024
		}
	}
	row.judge()
	return row, nil
}

func fixedWorkers(rate int, latency time.Duration) int {
	return int(float64(rate)*latency.Seconds()*1.2) + 32
}

// loadMatrix: every upstream, rate and scenario, at fixed rates. Scenarios
// alternate within a rate so that drift touches them alike.
func (b *bench) loadMatrix() error {
	for _, u := range b.upstreamSets() {
		for _, rate := range b.o.rates {
			var base *loadRow
			for _, sc := range allScenarios {
				tag := fmt.Sprintf("load-%s-%dms-%d-%s", u.name, u.latency.Milliseconds(), rate, sc.name)
				row, err := b.measure(sc, u, rate, fixedWorkers(rate, u.latency), tag)
				if err != nil {
					return err
				}
				row.Round = 1
				if sc == direct {
					base = &row
				} else if base != nil {
					row.AddedP50, row.AddedP99 = row.P50-base.P50, row.P99-base.P99
				}
				b.res.Load = append(b.res.Load, row)
				b.logf("%-14s %5d/s %-13s ok %d/%d  %7.0f/s  p50 %6.2f ms  p99 %7.2f ms  cpu %5.1f us/req  rss %5.1f MiB  others %3.0f%%%s",
					u.label(), rate, sc.name, row.OK, row.Requests, row.Throughput, row.P50, row.P99,
					row.CaddyCPUPerReqUs, row.PeakRSSMiB, row.OtherCPUPct, map[bool]string{true: "", false: "  NOT SUSTAINED"}[row.Sustained])
			}
		}
	}
	return nil
}

// closedLoop measures the highest throughput of each scenario: workers
// concurrent requests, each sent as soon as the previous answer came;
// -rounds interleaved rounds against the bare 0 ms upstream, one against
// llm_mock.
func (b *bench) closedLoop() error {
	sets := []upstreamSet{bare0}
	if b.o.mock {
		sets = append(sets, mock0)
	}
	for _, u := range sets {
		rounds := 1
		if u == bare0 {
			rounds = max(b.o.rounds, 1)
		}
		var rows []loadRow
		for round := 1; round <= rounds; round++ {
			for _, sc := range allScenarios {
				tag := fmt.Sprintf("closed-%s-%d-%s", u.name, round, sc.name)
				row, err := b.measure(sc, u, 0, b.o.closedWorkers, tag)
				if err != nil {
					return err
				}
				row.Round = round
				rows = append(rows, row)
				b.res.Closed = append(b.res.Closed, row)
				b.logf("closed loop %-9s round %d %-13s %d workers: %7.0f/s  p50 %6.2f ms  p99 %7.2f ms  caddy cpu %5.1f%%  %5.1f us/req  others %3.0f%%",
					u.label(), round, sc.name, row.Workers, row.Throughput, row.P50, row.P99, row.CaddyCPUPct, row.CaddyCPUPerReqUs, row.OtherCPUPct)
			}
		}
		b.res.ClosedSummary = append(b.res.ClosedSummary, summarize(rows)...)
	}
	return nil
}

// streamRow is one streaming run: 200-chunk answers, chunks 2 ms apart.
type streamRow struct {
	Upstream string  `json:"upstream"`
	Scenario string  `json:"scenario"`
	Rate     float64 `json:"streams_per_second"`
	streamStats
	CaddyCPUPerStreamUs float64 `json:"caddy_cpu_per_stream_us"`
	PeakRSSMiB          float64 `json:"caddy_peak_rss_mib"`
	AddedFirstEvent     float64 `json:"added_first_event_p50_ms"`
	AddedTotal          float64 `json:"added_total_p50_ms"`
	AddedDelayP50       float64 `json:"added_event_delay_p50_ms"`
	AddedDelayP99       float64 `json:"added_event_delay_p99_ms"`
	OtherCPUPct         float64 `json:"other_cpu_percent"`
}

const (
	streamChunks   = 200
	streamInterval = 2 * time.Millisecond
	streamRate     = 20.0 // streams per second
)

func (b *bench) streaming() error {
	sets := []upstreamSet{bare0}
	if b.o.mock {
		sets = append(sets, mock0)
	}
	for _, u := range sets {
		var base *streamRow
		for _, sc := range allScenarios {
			var row streamRow
			for attempt := 0; ; attempt++ {
				b.waitQuiet()
				t := time.Now()
				var err error
				if row, err = b.streamOnce(sc, u); err != nil {
					return err
				}
				if !b.again(row.OtherCPUPct, attempt, time.Since(t)) {
					break
				}
				b.logf("  (stream %s %s: other processes used %.0f%% of a CPU meanwhile; measuring again)", sc.name, u.label(), row.OtherCPUPct)
			}
			if sc == direct {
				base = &row
			} else if base != nil {
				row.AddedFirstEvent = row.FirstEventP50 - base.FirstEventP50
				row.AddedTotal = row.TotalP50 - base.TotalP50
				if row.Delays > 0 {
					row.AddedDelayP50, row.AddedDelayP99 = row.DelayP50-base.DelayP50, row.DelayP99-base.DelayP99
				}
			}
			b.res.Streaming = append(b.res.Streaming, row)
			b.logf("stream %-9s %-13s ok %d/%d  first event p50 %6.2f ms  total p50 %7.1f ms  event delay p50 %5.3f p99 %5.3f ms  events>=%d  cpu %6.0f us/stream  others %3.0f%%",
				u.label(), sc.name, row.OK, row.Streams, row.FirstEventP50, row.TotalP50, row.DelayP50, row.DelayP99, row.MinEvents, row.CaddyCPUPerStreamUs, row.OtherCPUPct)
		}
	}
	return nil
}

func (b *bench) streamOnce(sc scenario, u upstreamSet) (streamRow, error) {
	row := streamRow{Upstream: u.name, Scenario: sc.name, Rate: streamRate}
	c, err := b.startCaddy(sc, u, fmt.Sprintf("stream-%s-%s", u.name, sc.name))
	if err != nil {
		return row, err
	}
	client := newClient()
	defer client.CloseIdleConnections()
	url := chatURL(sc, u)
	body := streamBody(streamChunks, streamInterval, "")
	streams(client, url, body, 5, streamRate, nil) // warm-up
	var cpu0 time.Duration
	if c != nil {
		cpu0, _ = cpuTime(c.pid())
	}
	s0 := snapshot()
	row.streamStats = streams(client, url, body, b.o.streamN, streamRate, nil)
	row.OtherCPUPct = otherLoad(s0, snapshot())
	if c != nil {
		cpu1, _ := cpuTime(c.pid())
		row.CaddyCPUPerStreamUs = float64(cpu1-cpu0) / float64(time.Microsecond) / float64(b.o.streamN)
		if _, hwm, err := memKiB(c.pid()); err == nil {
			row.PeakRSSMiB = float64(hwm) / 1024
		}
		c.stop()
	}
	return row, nil
}

// memoryRow is the open-streams run: n slow streams open at once.
type memoryRow struct {
	Scenario     string         `json:"scenario"`
	Streams      int            `json:"streams"`
	OK           int            `json:"ok"`
	Errors       map[string]int `json:"errors,omitempty"`
	BaselineMiB  float64        `json:"baseline_rss_mib"`
	PeakMiB      float64        `json:"peak_rss_mib"` // VmHWM
	PerStreamKiB float64        `json:"kib_per_open_stream"`
	// From Caddy's /debug/vars once every stream was open, over the same
	// before the streams: Go heap in use and goroutine stacks, per stream.
	HeapPerStreamKiB  float64 `json:"heap_inuse_kib_per_stream"`
	StackPerStreamKiB float64 `json:"stack_inuse_kib_per_stream"`
	// GoroutinesPerStream is Caddy's goroutine count once all were open / streams.
	GoroutinesPerStream float64 `json:"goroutines_per_stream"`
	OtherCPUPct         float64 `json:"other_cpu_percent"`
}

// openStreamsRun opens o.openStreams streams of 20 chunks 250 ms apart (about
// 5 s each) at 1000 per second, so that all are open at once, and reads
// the Caddy process's peak RSS.
func (b *bench) openStreamsRun() error {
	n := b.o.openStreams
	body := streamBody(20, 250*time.Millisecond, "")
	for _, sc := range []scenario{proxy, router1} {
		c, err := b.startCaddy(sc, bare0, "open-streams-"+sc.name)
		if err != nil {
			return err
		}
		client := newClient()
		url := chatURL(sc, bare0)
		streams(client, url, streamBody(5, time.Millisecond, ""), 50, 100, nil) // warm-up
		client.CloseIdleConnections()
		time.Sleep(200 * time.Millisecond)
		b.waitQuiet()
		baseline, _, _ := memKiB(c.pid())
		s0 := snapshot()
		// Once every stream is open: what holds the memory (in-use heap) and
		// how many goroutines there are.
		profiled := make(chan struct{})
		var heapInuse, stackInuse uint64
		var goroutines int
		heap0, stack0 := goMem()
		go func() {
			defer close(profiled)
			time.Sleep(time.Duration(n)*time.Millisecond + 1500*time.Millisecond)
			dir := filepath.Join(b.o.out, "profiles")
			heap := filepath.Join(dir, "open-streams-"+sc.name+"-heap.pprof")
			if err := fetch(fmt.Sprintf("http://127.0.0.1:%d/debug/pprof/heap", caddyAdmin), heap); err == nil {
				_ = os.WriteFile(filepath.Join(dir, "open-streams-"+sc.name+"-heap-top.txt"),
					[]byte(pprofTop(b.o.caddy, heap, "inuse_space", filepath.Join(dir, "open-streams-"+sc.name+"-heap-top.txt"))), 0o644)
			}
			gfile := filepath.Join(dir, "open-streams-"+sc.name+"-goroutines.txt")
			if fetch(fmt.Sprintf("http://127.0.0.1:%d/debug/pprof/goroutine?debug=1", caddyAdmin), gfile) == nil {
				if text, err := os.ReadFile(gfile); err == nil {
					line, _, _ := strings.Cut(string(text), "\n")
					goroutines = atoi(strings.TrimPrefix(line, "goroutine profile: total "))
				}
			}
			var vars struct {
				MemStats struct {
					HeapInuse, StackInuse, Sys uint64
					NumGC                      uint32
				} `json:"memstats"`
			}
			if err := httpJSON(fmt.Sprintf("http://127.0.0.1:%d/debug/vars", caddyAdmin), &vars); err == nil {
				heapInuse, stackInuse = vars.MemStats.HeapInuse, vars.MemStats.StackInuse
			}
		}()
		st := streams(client, url, body, n, 1000, nil)
		other := otherLoad(s0, snapshot())
		<-profiled
		_, hwm, _ := memKiB(c.pid())
		c.stop()
		client.CloseIdleConnections()
		row := memoryRow{Scenario: sc.name, Streams: n, OK: st.OK, Errors: st.Errors,
			BaselineMiB: float64(baseline) / 1024, PeakMiB: float64(hwm) / 1024,
			PerStreamKiB: float64(hwm-baseline) / float64(n), OtherCPUPct: other,
			HeapPerStreamKiB:    (float64(heapInuse) - float64(heap0)) / 1024 / float64(n),
			StackPerStreamKiB:   (float64(stackInuse) - float64(stack0)) / 1024 / float64(n),
			GoroutinesPerStream: float64(goroutines) / float64(n)}
		b.res.Memory = append(b.res.Memory, row)
		b.logf("%d open streams %-13s ok %d  RSS %.1f MiB -> peak %.1f MiB: %.1f KiB per stream",
			n, sc.name, row.OK, row.BaselineMiB, row.PeakMiB, row.PerStreamKiB)
	}
	return nil
}

// failoverRow: the time from deployment a's 429 leaving the upstream to
// deployment b's request reaching it, per request, both on the upstream's
// own clock.
type failoverRow struct {
	Mode      string  `json:"mode"` // "non-streaming", "streaming"
	Requests  int     `json:"requests"`
	Failovers int     `json:"failovers"` // answered by b after a's 429 (2 attempts)
	P50       float64 `json:"p50_ms"`
	P99       float64 `json:"p99_ms"`
	Max       float64 `json:"max_ms"`
	// OtherCPUPct is what the rest of the machine used meanwhile, in % of one CPU.
	OtherCPUPct float64 `json:"other_cpu_percent"`
}

func (b *bench) failover() error {
	const n = 200
	c, err := b.startCaddy(failoverSc, bare0, "failover")
	if err != nil {
		return err
	}
	defer c.stop()
	client := newClient()
	defer client.CloseIdleConnections()
	events := fmt.Sprintf("http://127.0.0.1:%d/bench/events", bare0.base+portFailB)
	url := chatURL(failoverSc, bare0)
	for _, mode := range []string{"non-streaming", "streaming"} {
		row := failoverRow{Mode: mode, Requests: n}
		post := func(id string) (int, error) {
			var body []byte
			if mode == "streaming" {
				body = streamBody(5, 0, id)
			} else {
				body = []byte(strings.Replace(string(chatBody), `{`, `{"user":"`+id+`",`, 1))
			}
			resp, err := client.Post(url, "application/json", strings.NewReader(string(body)))
			if err != nil {
				return 0, err
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				return 0, fmt.Errorf("failover run: status %d", resp.StatusCode)
			}
			return strconv.Atoi(resp.Header.Get("X-Llm-Router-Attempts"))
		}
		for i := 0; i < 10; i++ { // warm-up: connections to a and b
			if _, err := post(fmt.Sprintf("warm-%d", i)); err != nil {
				return err
			}
			time.Sleep(20 * time.Millisecond)
		}
		if err := httpDo(http.MethodDelete, events); err != nil {
			return err
		}
		b.waitQuiet()
		s0 := snapshot()
		for i := 0; i < n; i++ {
			t := time.Now()
			attempts, err := post(fmt.Sprintf("fo-%d", i))
			if err != nil {
				return err
			}
			if attempts == 2 {
				row.Failovers++
			}
			time.Sleep(time.Until(t.Add(20 * time.Millisecond)))
		}
		row.OtherCPUPct = otherLoad(s0, snapshot())
		var evs []event
		if err := httpJSON(events, &evs); err != nil {
			return err
		}
		recvB, sentA := map[string]int64{}, map[string]int64{}
		for _, e := range evs {
			if e.Port == portFailA {
				sentA[e.ID] = e.Sent
			} else {
				recvB[e.ID] = e.Recv
			}
		}
		var d []time.Duration
		for id, a := range sentA {
			if rb, ok := recvB[id]; ok {
				d = append(d, time.Duration(rb-a))
			}
		}
		row.P50, row.P99, row.Max = pct(d, 0.5), pct(d, 0.99), pct(d, 1)
		b.res.Failover = append(b.res.Failover, row)
		b.logf("failover %-13s %d/%d requests failed over: 429 sent -> next request received p50 %.3f ms, p99 %.3f ms, max %.3f ms",
			mode, row.Failovers, row.Requests, row.P50, row.P99, row.Max)
	}
	return nil
}

// goMem reads the Caddy under test's Go heap and stack in use.
func goMem() (heap, stack uint64) {
	var vars struct {
		MemStats struct{ HeapInuse, StackInuse uint64 } `json:"memstats"`
	}
	if httpJSON(fmt.Sprintf("http://127.0.0.1:%d/debug/vars", caddyAdmin), &vars) != nil {
		return 0, 0
	}
	return vars.MemStats.HeapInuse, vars.MemStats.StackInuse
}

func httpDo(method, url string) error {
	req, err := http.NewRequest(method, url, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	resp.Body.Close()
	return nil
}

func httpJSON(url string, v any) error {
	resp, err := http.Get(url)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	return json.NewDecoder(resp.Body).Decode(v)
}

// profileInfo is one profile taken.
type profileInfo struct {
	Scenario string `json:"scenario"`
	Rate     int    `json:"rate"`
	CPU      string `json:"cpu_profile"`
	Allocs   string `json:"allocs_profile"`
	Top      string `json:"cpu_top"`
	AllocTop string `json:"alloc_top"`
}

// profileRate is the highest fixed rate that reverse_proxy and router-1
// both sustained against the bare 0 ms upstream.
func (b *bench) profileRate() int {
	if b.o.profileRate > 0 {
		return b.o.profileRate
	}
	if b.res.HeadToHeadRate > 0 {
		return b.res.HeadToHeadRate
	}
	best := 0
	for _, rate := range b.o.rates {
		ok := 0
		for _, r := range b.res.Load {
			if r.Upstream == bare0.name && r.LatencyMs == 0 && r.Rate == rate && r.Sustained &&
				(r.Scenario == proxy.name || r.Scenario == router1.name) {
				ok++
			}
		}
		if ok == 2 && rate > best {
			best = rate
		}
	}
	if best == 0 {
		best = b.o.rates[0]
	}
	return best
}

// profiles takes a CPU and an allocation profile of the Caddy under test
// (admin /debug/pprof) during a run at the profile rate; separate runs, so
// that profiling does not touch the measured figures.
func (b *bench) profiles() error {
	rate := b.profileRate()
	dir := filepath.Join(b.o.out, "profiles")
	secs := max(int(b.o.profileDur/time.Second), 1)
	for _, sc := range []scenario{proxy, router1, router8} {
		b.waitQuiet()
		c, err := b.startCaddy(sc, bare0, "profile-"+sc.name)
		if err != nil {
			return err
		}
		client := newClient()
		url := chatURL(sc, bare0)
		attack(client, url, chatBody, rate, fixedWorkers(rate, 0), b.o.warm)
		p := profileInfo{Scenario: sc.name, Rate: rate,
			CPU:    filepath.Join(dir, sc.name+"-cpu.pprof"),
			Allocs: filepath.Join(dir, sc.name+"-allocs.pprof")}
		var wg sync.WaitGroup
		errs := make([]error, 2)
		for i, f := range []struct{ path, file string }{
			{fmt.Sprintf("/debug/pprof/profile?seconds=%d", secs), p.CPU},
			{fmt.Sprintf("/debug/pprof/allocs?seconds=%d", secs), p.Allocs},
		} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				errs[i] = fetch(fmt.Sprintf("http://127.0.0.1:%d%s", caddyAdmin, f.path), f.file)
			}()
		}
		attack(client, url, chatBody, rate, fixedWorkers(rate, 0), time.Duration(secs)*time.Second+500*time.Millisecond)
		wg.Wait()
		c.stop()
		client.CloseIdleConnections()
		for _, err := range errs {
			if err != nil {
				return fmt.Errorf("profile of %s: %w", sc.name, err)
			}
		}
		p.Top = pprofTop(b.o.caddy, p.CPU, "", filepath.Join(dir, sc.name+"-cpu-top.txt"))
		p.AllocTop = pprofTop(b.o.caddy, p.Allocs, "alloc_space", filepath.Join(dir, sc.name+"-allocs-top.txt"))
		b.res.Profiles = append(b.res.Profiles, p)
		b.logf("profiled %s at %d/s: %s", sc.name, rate, p.CPU)
	}
	return nil
}

func fetch(url, file string) error {
	resp, err := http.Get(url)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	f, err := os.Create(file)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, resp.Body); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// pprofTop writes `go tool pprof -top` of a profile to out and returns its
// first lines.
func pprofTop(bin, profile, index, out string) string {
	args := []string{"tool", "pprof", "-top", "-nodecount=40"}
	if index != "" {
		args = append(args, "-sample_index="+index)
	}
	cmd := exec.Command("go", append(args, bin, profile)...)
	text, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Sprintf("go tool pprof: %v", err)
	}
	_ = os.WriteFile(out, text, 0o644)
	lines := strings.Split(string(text), "\n")
	return strings.Join(lines[:min(len(lines), 30)], "\n")
}
