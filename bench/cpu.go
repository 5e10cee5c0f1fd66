package main

import (
	"fmt"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// The cpu mode (-only cpu): one Caddy process (configs/same_process.Caddyfile)
// serves reverse_proxy, router-1 and router-8 side by side, each on a port
// of its own, against the bare 0 ms upstream. Rounds alternate the
// scenarios (the order rotates each round), non-streaming then streaming,
// and each round's figure is the process's utime+stime over the round
// (/proc/<pid>/stat) divided by the requests (streams) it served: the same
// build, process and run for all three, so that drift of the machine
// touches them alike. A router's ratio is the median over the rounds of
// its round's figure divided by reverse_proxy's in the same round (the
// three ran within seconds of each other), with the least and greatest of
// those ratios as its spread.

// Ports of the same-process Caddy's three sites (its admin endpoint is
// caddyAdmin).
const (
	cpuPortProxy   = caddyPort + 1
	cpuPortRouter1 = caddyPort + 2
	cpuPortRouter8 = caddyPort + 3
)

// cpuScenarios are the scenarios of the cpu mode and their ports.
var cpuScenarios = []struct {
	sc   scenario
	port int
}{{proxy, cpuPortProxy}, {router1, cpuPortRouter1}, {router8, cpuPortRouter8}}

// cpuRow is one round of one scenario in the cpu mode.
type cpuRow struct {
	Scenario  string `json:"scenario"`
	Streaming bool   `json:"streaming"`
	Round     int    `json:"round"`
	// Requests is what the round sent (streams, when streaming), OK what
	// was answered in full.
	Requests int `json:"requests"`
	OK       int `json:"ok"`
	// CPUPerReqUs is the Caddy process's utime+stime over the round
	// divided by Requests, in microseconds (10 ms ticks).
	CPUPerReqUs float64 `json:"caddy_cpu_per_request_us"`
	// Reads and Writes: the Caddy's read and write system calls over the
	// round (/proc/<pid>/io) divided by Requests.
	Reads  float64 `json:"caddy_reads_per_request"`
	Writes float64 `json:"caddy_writes_per_request"`
	// P50 and P99: latency (non-streaming) or time to [DONE] (streaming), ms.
	P50         float64 `json:"p50_ms"`
	P99         float64 `json:"p99_ms"`
	OtherCPUPct float64 `json:"other_cpu_percent"`
}

// cpuSummary is a scenario's figures over the rounds of one run.
type cpuSummary struct {
	Scenario  string `json:"scenario"`
	Streaming bool   `json:"streaming"`
	// CPUPerReqUs, Min, Max: the median, least and greatest of Rounds,
	// CPU per request (stream) in microseconds.
	CPUPerReqUs float64   `json:"median_cpu_per_request_us"`
	Min         float64   `json:"min_cpu_per_request_us"`
	Max         float64   `json:"max_cpu_per_request_us"`
	Rounds      []float64 `json:"cpu_per_request_us"`
	// Reads and Writes: the medians of the rounds' system calls per
	// request (stream).
	Reads  float64 `json:"median_reads_per_request"`
	Writes float64 `json:"median_writes_per_request"`
	// VsProxy is the median of VsProxyRounds, each round's figure divided
	// by reverse_proxy's in the same round; VsProxyMin and VsProxyMax their
	// least and greatest (1 for reverse_proxy itself).
	VsProxy       float64   `json:"vs_reverse_proxy"`
	VsProxyMin    float64   `json:"vs_reverse_proxy_min"`
	VsProxyMax    float64   `json:"vs_reverse_proxy_max"`
	VsProxyRounds []float64 `json:"vs_reverse_proxy_rounds"`
	P50           float64   `json:"median_p50_ms"`
	P99           float64   `json:"median_p99_ms"`
}

// cpuRun is the cpu mode: -cpu-rounds rounds of each scenario,
// non-streaming at -cpu-rate for -duration, then streaming (-cpu-streams
// streams of 200 chunks 2 ms apart, -cpu-stream-rate per second).
func (b *bench) cpuRun() error {
	c, err := b.startSameProcess("cpu-same-process")
	if err != nil {
		return err
	}
	defer c.stop()
	for _, streaming := range []bool{false, true} {
		if err := b.cpuRounds(c, streaming); err != nil {
			return err
		}
	}
	b.res.CPUSummary = summarizeCPU(b.res.CPU)
	if b.o.cpuProfile {
		return b.cpuProfiles(c)
	}
	return nil
}

// cpuProfiles takes a CPU profile of the Caddy (admin /debug/pprof/profile)
// during one more streaming round of each scenario, after the measured
// ones: profiles/cpu-streaming-<scenario>.pprof and its -top.txt.
func (b *bench) cpuProfiles(c *child) error {
	client := newClient()
	defer client.CloseIdleConnections()
	dir := filepath.Join(b.o.out, "profiles")
	secs := max(int(float64(b.o.cpuStreams)/b.o.cpuStreamRate), 1)
	for _, s := range cpuScenarios {
		p := profileInfo{Scenario: s.sc.name + " streaming", Rate: int(b.o.cpuStreamRate), CPU: filepath.Join(dir, "cpu-streaming-"+s.sc.name+".pprof")}
		got := make(chan error, 1)
		go func() {
			got <- fetch(fmt.Sprintf("http://127.0.0.1:%d/debug/pprof/profile?seconds=%d", caddyAdmin, secs), p.CPU)
		}()
		b.cpuOnce(client, c, s.sc, s.port, true, b.o.dur)
		if err := <-got; err != nil {
			return fmt.Errorf("profile of %s streaming: %w", s.sc.name, err)
		}
		p.Top = pprofTop(b.o.caddy, p.CPU, "", strings.TrimSuffix(p.CPU, ".pprof")+"-top.txt")
		b.res.Profiles = append(b.res.Profiles, p)
		b.logf("profiled %s streaming: %s", s.sc.name, p.CPU)
	}
	return nil
}

// startSameProcess starts the Caddy of configs/same_process.Caddyfile on
// the Caddy CPUs, against the bare 0 ms upstream.
func (b *bench) startSameProcess(tag string) (*child, error) {
	env := []string{
		fmt.Sprintf("BENCH_ADMIN_PORT=%d", caddyAdmin),
		fmt.Sprintf("BENCH_PORT_PROXY=%d", cpuPortProxy),
		fmt.Sprintf("BENCH_PORT_ROUTER1=%d", cpuPortRouter1),
		fmt.Sprintf("BENCH_PORT_ROUTER8=%d", cpuPortRouter8),
	}
	argv := []string{b.o.caddy, "run", "--config", filepath.Join(b.o.configs, "same_process.Caddyfile"), "--adapter", "caddyfile"}
	return start("same-process", argv, append(env, bare0.env()...), b.o.caddyCPUs,
		filepath.Join(b.o.out, "logs", tag+".log"), fmt.Sprintf("127.0.0.1:%d", cpuPortRouter8))
}

// cpuRounds runs the rounds of one mode; a warm-up of each scenario first.
func (b *bench) cpuRounds(c *child, streaming bool) error {
	client := newClient()
	defer client.CloseIdleConnections()
	rate := b.o.cpuRate
	for _, s := range cpuScenarios {
		b.cpuOnce(client, c, s.sc, s.port, streaming, b.o.warm)
	}
	for round := 1; round <= b.o.cpuRounds; round++ {
		for k := range cpuScenarios {
			s := cpuScenarios[(k+round-1)%len(cpuScenarios)] // rotate the order
			b.waitQuiet()
			row := b.cpuOnce(client, c, s.sc, s.port, streaming, b.o.dur)
			row.Round = round
			if row.OK < row.Requests {
				b.logf("  cpu %s: only %d of %d answered", s.sc.name, row.OK, row.Requests)
			}
			b.res.CPU = append(b.res.CPU, row)
			b.logf("cpu round %d %-13s %-13s ok %d/%d  cpu %6.1f us/%s  r/w %5.1f/%5.1f  p50 %6.2f ms  p99 %6.2f ms  others %3.0f%%",
				round, s.sc.name, map[bool]string{false: fmt.Sprintf("%d/s", rate), true: "streaming"}[streaming], // 0/s: closed loop
				row.OK, row.Requests, row.CPUPerReqUs, map[bool]string{false: "req", true: "stream"}[streaming],
				row.Reads, row.Writes, row.P50, row.P99, row.OtherCPUPct)
		}
	}
	return nil
}

// cpuOnce runs one round of sc (its site on port) and reads the process's
// CPU around it.
func (b *bench) cpuOnce(client *http.Client, c *child, sc scenario, port int, streaming bool, dur time.Duration) cpuRow {
	row := cpuRow{Scenario: sc.name, Streaming: streaming}
	url := fmt.Sprintf("http://127.0.0.1:%d/v1/chat/completions", port)
	cpu0, _ := cpuTime(c.pid())
	r0, w0, _ := syscalls(c.pid())
	s0 := snapshot()
	if streaming {
		n := max(int(dur.Seconds()*b.o.cpuStreamRate), 1) // the warm-up
		if dur >= b.o.dur {
			n = b.o.cpuStreams
		}
		st := streams(client, url, streamBody(streamChunks, streamInterval, ""), n, b.o.cpuStreamRate, nil)
		row.Requests, row.OK, row.P50, row.P99 = st.Streams, st.OK, st.TotalP50, st.TotalP99
	} else {
		workers := fixedWorkers(b.o.cpuRate, 0)
		if b.o.cpuRate == 0 {
			workers = b.o.closedWorkers // closed loop: Caddy saturated
		}
		st := attack(client, url, chatBody, b.o.cpuRate, workers, dur)
		row.Requests, row.OK, row.P50, row.P99 = st.Requests, st.OK, st.P50, st.P99
	}
	cpu1, _ := cpuTime(c.pid())
	r1, w1, _ := syscalls(c.pid())
	row.OtherCPUPct = otherLoad(s0, snapshot())
	if n := float64(row.Requests); n > 0 {
		row.CPUPerReqUs = float64(cpu1-cpu0) / float64(time.Microsecond) / n
		row.Reads, row.Writes = float64(r1-r0)/n, float64(w1-w0)/n
	}
	return row
}

// summarizeCPU sums up each scenario's rounds, in cpuScenarios order,
// non-streaming first.
func summarizeCPU(rows []cpuRow) []cpuSummary {
	var out []cpuSummary
	for _, streaming := range []bool{false, true} {
		base := map[int]float64{} // reverse_proxy's figure in each round
		for _, r := range rows {
			if r.Scenario == proxy.name && r.Streaming == streaming {
				base[r.Round] = r.CPUPerReqUs
			}
		}
		for _, s := range cpuScenarios {
			if sum, ok := summarizeScenario(rows, s.sc.name, streaming, base); ok {
				out = append(out, sum)
			}
		}
	}
	return out
}

// summarizeScenario is one scenario's summary; base holds reverse_proxy's
// figure in each round, the denominators of the round's ratio.
func summarizeScenario(rows []cpuRow, name string, streaming bool, base map[int]float64) (cpuSummary, bool) {
	sum := cpuSummary{Scenario: name, Streaming: streaming}
	var p50, p99, reads, writes []float64
	for _, r := range rows {
		if r.Scenario != name || r.Streaming != streaming {
			continue
		}
		sum.Rounds = append(sum.Rounds, r.CPUPerReqUs)
		p50, p99 = append(p50, r.P50), append(p99, r.P99)
		reads, writes = append(reads, r.Reads), append(writes, r.Writes)
		if b := base[r.Round]; b > 0 {
			sum.VsProxyRounds = append(sum.VsProxyRounds, r.CPUPerReqUs/b)
		}
	}
	if len(sum.Rounds) == 0 {
		return sum, false
	}
	sum.CPUPerReqUs, sum.P50, sum.P99 = med(sum.Rounds), med(p50), med(p99)
	sum.Reads, sum.Writes = med(reads), med(writes)
	sum.Min, sum.Max = slices.Min(sum.Rounds), slices.Max(sum.Rounds)
	if len(sum.VsProxyRounds) > 0 {
		sum.VsProxy = med(sum.VsProxyRounds)
		sum.VsProxyMin, sum.VsProxyMax = slices.Min(sum.VsProxyRounds), slices.Max(sum.VsProxyRounds)
	}
	return sum, true
}

// cpuTable is the report's table of the cpu mode.
func cpuTable(sums []cpuSummary, rate, workers, streams int) string {
	var rows [][]string
	for _, s := range sums {
		mode := fmt.Sprintf("non-streaming, %d/s", rate)
		if rate == 0 {
			mode = fmt.Sprintf("non-streaming, closed loop of %d", workers)
		}
		unit := "us/request"
		if s.Streaming {
			mode, unit = fmt.Sprintf("streaming, %d streams of %d chunks", streams, streamChunks), "us/stream"
		}
		rows = append(rows, []string{s.Scenario, mode,
			fmt.Sprintf("%s %s (%s-%s)", f1(s.CPUPerReqUs), unit, f1(s.Min), f1(s.Max)),
			joinF(s.Rounds, 1),
			fmt.Sprintf("%sx (%s-%s)", f3(s.VsProxy), f3(s.VsProxyMin), f3(s.VsProxyMax)),
			f1(s.Reads) + " / " + f1(s.Writes), f2(s.P50), f2(s.P99)})
	}
	return table([]string{"scenario", "load", "Caddy CPU, median (min-max)", "each round",
		"vs reverse_proxy, median of the rounds' ratios (min-max)", "reads / writes per request", "p50 ms", "p99 ms"}, rows)
}

// cpuTarget is issue 32's: CPU per request at or below reverse_proxy's,
// router-1 and router-8, non-streaming and streaming.
func (b *bench) cpuTarget() target {
	t := target{Name: "CPU per request vs reverse_proxy (same process, alternating rounds)",
		Goal: "router-1 and router-8 at or below reverse_proxy's median, non-streaming and streaming"}
	if len(b.res.CPUSummary) == 0 {
		t.Figure, t.Status = "not run", "NOT MEASURED"
		return t
	}
	ok := true
	var figs []string
	for _, s := range b.res.CPUSummary {
		if s.Scenario == proxy.name {
			continue
		}
		ok = ok && s.VsProxy <= 1
		figs = append(figs, fmt.Sprintf("%s%s %.3fx (%.3f-%.3f)", s.Scenario, map[bool]string{true: " streaming"}[s.Streaming],
			s.VsProxy, s.VsProxyMin, s.VsProxyMax))
	}
	slices.Sort(figs)
	t.Figure, t.Status = strings.Join(figs, ", "), status(ok)
	return t
}
