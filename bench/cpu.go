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
// touches them alike.

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
	// P50 and P99: latency (non-streaming) or time to [DONE] (streaming), ms.
	P50         float64 `json:"p50_ms"`
	P99         float64 `json:"p99_ms"`
	OtherCPUPct float64 `json:"other_cpu_percent"`
}

// cpuSummary is a scenario's median over the rounds, and its ratio to
// reverse_proxy's median in the same run.
type cpuSummary struct {
	Scenario    string    `json:"scenario"`
	Streaming   bool      `json:"streaming"`
	CPUPerReqUs float64   `json:"median_cpu_per_request_us"`
	Rounds      []float64 `json:"cpu_per_request_us"`
	VsProxy     float64   `json:"vs_reverse_proxy"`
	P50         float64   `json:"median_p50_ms"`
	P99         float64   `json:"median_p99_ms"`
}

// cpuRun is the cpu mode: -rounds rounds of each scenario, non-streaming
// at -cpu-rate for -duration, then streaming (-streams streams of 200
// chunks 2 ms apart, 20 per second).
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
	for round := 1; round <= b.o.rounds; round++ {
		for k := range cpuScenarios {
			s := cpuScenarios[(k+round-1)%len(cpuScenarios)] // rotate the order
			b.waitQuiet()
			row := b.cpuOnce(client, c, s.sc, s.port, streaming, b.o.dur)
			row.Round = round
			if row.OK < row.Requests {
				b.logf("  cpu %s: only %d of %d answered", s.sc.name, row.OK, row.Requests)
			}
			b.res.CPU = append(b.res.CPU, row)
			b.logf("cpu round %d %-13s %-13s ok %d/%d  cpu %6.1f us/%s  p50 %6.2f ms  p99 %6.2f ms  others %3.0f%%",
				round, s.sc.name, map[bool]string{false: fmt.Sprintf("%d/s", rate), true: "streaming"}[streaming], // 0/s: closed loop
				row.OK, row.Requests, row.CPUPerReqUs, map[bool]string{false: "req", true: "stream"}[streaming],
				row.P50, row.P99, row.OtherCPUPct)
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
	s0 := snapshot()
	if streaming {
		n := max(int(dur.Seconds()*streamRate), 1)
		if dur >= b.o.dur {
			n = b.o.streamN
		}
		st := streams(client, url, streamBody(streamChunks, streamInterval, ""), n, streamRate, nil)
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
	row.OtherCPUPct = otherLoad(s0, snapshot())
	if row.Requests > 0 {
		row.CPUPerReqUs = float64(cpu1-cpu0) / float64(time.Microsecond) / float64(row.Requests)
	}
	return row
}

// summarizeCPU takes each scenario's medians over its rounds, in
// cpuScenarios order, non-streaming first.
func summarizeCPU(rows []cpuRow) []cpuSummary {
	var out []cpuSummary
	for _, streaming := range []bool{false, true} {
		var base float64
		for _, s := range cpuScenarios {
			sum := cpuSummary{Scenario: s.sc.name, Streaming: streaming}
			var p50, p99 []float64
			for _, r := range rows {
				if r.Scenario == s.sc.name && r.Streaming == streaming {
					sum.Rounds = append(sum.Rounds, r.CPUPerReqUs)
					p50, p99 = append(p50, r.P50), append(p99, r.P99)
				}
			}
			if len(sum.Rounds) == 0 {
				continue
			}
			sum.CPUPerReqUs, sum.P50, sum.P99 = med(sum.Rounds), med(p50), med(p99)
			if s.sc == proxy {
				base = sum.CPUPerReqUs
			}
			if base > 0 {
				sum.VsProxy = sum.CPUPerReqUs / base
			}
			out = append(out, sum)
		}
	}
	return out
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
		rows = append(rows, []string{s.Scenario, mode, f1(s.CPUPerReqUs) + " " + unit,
			joinF(s.Rounds, 1), f2(s.VsProxy) + "x", f2(s.P50), f2(s.P99)})
	}
	return table([]string{"scenario", "load", "Caddy CPU (median)", "each round", "vs reverse_proxy", "p50 ms", "p99 ms"}, rows)
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
		figs = append(figs, fmt.Sprintf("%s%s %.2fx", s.Scenario, map[bool]string{true: " streaming"}[s.Streaming], s.VsProxy))
	}
	slices.Sort(figs)
	t.Figure, t.Status = strings.Join(figs, ", "), status(ok)
	return t
}
