package main

import (
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"
)

// target is one goal of issue 6 and where it stands.
type target struct {
	Name   string `json:"name"`
	Goal   string `json:"goal"`
	Figure string `json:"figure"`
	Status string `json:"status"` // MET, NOT MET, NOT MEASURED
}

func status(ok bool) string {
	if ok {
		return "MET"
	}
	return "NOT MET"
}

func ftoa(v float64, prec int) string { return strconv.FormatFloat(v, 'f', prec, 64) }

// ratio is a/b for added latencies: undefined when the baseline adds
// nothing measurable (under 1 us).
func ratio(a, b float64) (float64, bool) {
	if b < 0.001 {
		return 0, false
	}
	return a / b, true
}

func (b *bench) loadRow(rows []loadRow, set string, lat int64, rate int, sc string) (loadRow, bool) {
	for _, r := range rows {
		if r.Upstream == set && r.LatencyMs == lat && r.Rate == rate && r.Scenario == sc {
			return r, true
		}
	}
	return loadRow{}, false
}

// highestBoth is the highest fixed rate at which reverse_proxy and sc were
// both sustained against an upstream set; 0 if none.
func (b *bench) highestBoth(u upstreamSet, sc string) int {
	best := 0
	for _, rate := range b.o.rates {
		p, ok1 := b.loadRow(b.res.Load, u.name, u.latency.Milliseconds(), rate, proxy.name)
		r, ok2 := b.loadRow(b.res.Load, u.name, u.latency.Milliseconds(), rate, sc)
		if ok1 && ok2 && p.Sustained && r.Sustained && rate > best {
			best = rate
		}
	}
	return best
}

// latencyTarget compares sc's added latency with reverse_proxy's: on the
// head-to-head medians when there are some, else on the matrix's runs at
// the highest fixed rate both sustained.
func (b *bench) latencyTarget(u upstreamSet, sc string, q string, limit float64) target {
	t := target{Name: fmt.Sprintf("%s added latency, %s (%s upstream)", q, sc, u.label()),
		Goal: fmt.Sprintf("<= %.2fx reverse_proxy's at the highest fixed rate both sustain", limit)}
	var rate int
	var pa, ra float64
	var note string
	if p, ok := findSummary(b.res.HeadToHead, u.name, proxy.name); ok && u == bare0 {
		r, _ := findSummary(b.res.HeadToHead, u.name, sc)
		rate = b.res.HeadToHeadRate
		pa, ra = p.AddedP50, r.AddedP50
		if q == "p99" {
			pa, ra = p.AddedP99, r.AddedP99
		}
		note = fmt.Sprintf(" (medians of %d rounds; sustained in %d/%d, reverse_proxy %d/%d)", r.Rounds, r.Sustained, r.Rounds, p.Sustained, p.Rounds)
		if 2*r.Sustained <= r.Rounds {
			t.Figure = fmt.Sprintf("at %d/s: %s not sustained in most rounds%s", rate, sc, note)
			t.Status = "NOT MET"
			return t
		}
	} else {
		rate = b.highestBoth(u, sc)
		if rate == 0 {
			t.Figure, t.Status = "no fixed rate sustained by both", "NOT MEASURED"
			return t
		}
		p, _ := b.loadRow(b.res.Load, u.name, u.latency.Milliseconds(), rate, proxy.name)
		r, _ := b.loadRow(b.res.Load, u.name, u.latency.Milliseconds(), rate, sc)
		pa, ra = p.AddedP50, r.AddedP50
		if q == "p99" {
			pa, ra = p.AddedP99, r.AddedP99
		}
	}
	x, ok := ratio(ra, pa)
	if !ok {
		t.Figure = fmt.Sprintf("at %d/s: %s +%.3f ms, reverse_proxy +%.3f ms (no measurable baseline: ratio undefined)%s", rate, sc, ra, pa, note)
		t.Status = status(ra <= 0.001)
		return t
	}
	t.Figure = fmt.Sprintf("at %d/s: %s +%.3f ms vs reverse_proxy +%.3f ms = %.2fx%s", rate, sc, ra, pa, x, note)
	t.Status = status(x <= limit)
	return t
}

func (b *bench) targets() []target {
	var ts []target
	for _, sc := range []string{router1.name, router8.name} {
		ts = append(ts, b.latencyTarget(bare0, sc, "p50", 1.15), b.latencyTarget(bare0, sc, "p99", 1.3))
	}
	for _, sc := range []string{router1.name, router8.name} {
		t := target{Name: "throughput, " + sc + " (bare 0ms upstream, closed loop)", Goal: ">= 0.9x reverse_proxy's"}
		p, ok1 := findSummary(b.res.ClosedSummary, bare0.name, proxy.name)
		r, ok2 := findSummary(b.res.ClosedSummary, bare0.name, sc)
		if ok1 && ok2 && p.Throughput > 0 {
			x := r.Throughput / p.Throughput
			t.Figure = fmt.Sprintf("%.0f/s vs %.0f/s = %.2fx (medians of %d rounds; Caddy CPU %.0f%% vs %.0f%%, %.0f vs %.0f us/req)",
				r.Throughput, p.Throughput, x, r.Rounds, r.CaddyCPUPct, p.CaddyCPUPct, r.CPUPerReqUs, p.CPUPerReqUs)
			t.Status = status(x >= 0.9)
		} else {
			t.Figure, t.Status = "not run", "NOT MEASURED"
		}
		ts = append(ts, t)
	}

	ts = append(ts, b.cpuTarget())

	rank := target{Name: "ranking 16 deployments (BenchmarkRank16)", Goal: "<= 1 us and 0 allocs"}
	if g, ok := b.goBench("BenchmarkRank16"); ok {
		ns, allocs := g.Metrics["ns/op"], g.Metrics["allocs/op"]
		rank.Figure = fmt.Sprintf("%.0f ns, %.0f allocs", ns, allocs)
		rank.Status = status(ns <= 1000 && allocs == 0)
	} else {
		rank.Figure, rank.Status = "not run", "NOT MEASURED"
	}
	ts = append(ts, rank)
	ts = append(ts, b.benchGroup("a header decode (BenchmarkObserve/*)", "<= 2 us each", "BenchmarkObserve/", 2000))
	ts = append(ts, b.benchGroup("4 KB body rewrite (BenchmarkSetString4KB, BenchmarkChatRequest/*)", "<= 20 us each", "BenchmarkSetString4KB", 20000, "BenchmarkChatRequest/"))

	mem := target{Name: fmt.Sprintf("memory per open stream (router-1, %d streams)", b.o.openStreams), Goal: "<= 64 KiB"}
	mem.Status, mem.Figure = "NOT MEASURED", "not run"
	for _, m := range b.res.Memory {
		if m.Scenario == router1.name {
			mem.Figure = fmt.Sprintf("%.1f KiB (peak RSS %.1f MiB over a %.1f MiB baseline, %d/%d streams ok)", m.PerStreamKiB, m.PeakMiB, m.BaselineMiB, m.OK, m.Streams)
			for _, p := range b.res.Memory {
				if p.Scenario == proxy.name {
					mem.Figure += fmt.Sprintf("; reverse_proxy %.1f KiB", p.PerStreamKiB)
				}
			}
			mem.Status = status(m.PerStreamKiB <= 64 && m.OK == m.Streams)
		}
	}
	ts = append(ts, mem)

	for _, f := range b.res.Failover {
		t := target{Name: "failover after a 429 (" + f.Mode + ")", Goal: "adds <= 1 ms (429 sent -> next deployment's request received)"}
		t.Figure = fmt.Sprintf("p50 %.3f ms, p99 %.3f ms, max %.3f ms (%d/%d failed over)", f.P50, f.P99, f.Max, f.Failovers, f.Requests)
		switch {
		case f.Failovers == 0:
			t.Status = "NOT MEASURED"
		case f.P99 <= 1:
			t.Status = "MET"
		case f.P50 <= 1:
			t.Status = "MET at p50, NOT MET at p99"
		default:
			t.Status = "NOT MET"
		}
		ts = append(ts, t)
	}

	ts = append(ts, b.contentionTargets()...)
	ts = append(ts, b.fleetTargets()...)

	for _, sc := range []string{router1.name, router8.name} {
		t := target{Name: "streaming: no per-event delay (" + sc + ", bare upstream, 200 chunks 2 ms apart)",
			Goal: "events flushed as they arrive: per-event delay p50 within 0.1 ms of reverse_proxy's, not growing along the stream (last 10 events vs first 10 within 0.5 ms), every stream complete"}
		t.Status, t.Figure = "NOT MEASURED", "not run"
		var p, r *streamRow
		for i := range b.res.Streaming {
			s := &b.res.Streaming[i]
			if s.Upstream == bare0.name && s.Scenario == proxy.name {
				p = s
			}
			if s.Upstream == bare0.name && s.Scenario == sc {
				r = s
			}
		}
		if p != nil && r != nil && r.Delays > 0 {
			growth := r.DelayLast - r.DelayFirst
			t.Figure = fmt.Sprintf("event delay p50 %.3f ms / p99 %.3f ms (reverse_proxy %.3f / %.3f); last 10 events vs first 10: %+.3f ms; %d/%d streams complete",
				r.DelayP50, r.DelayP99, p.DelayP50, p.DelayP99, growth, r.OK, r.Streams)
			t.Status = status(r.DelayP50-p.DelayP50 <= 0.1 && growth <= 0.5 && r.OK == r.Streams)
			if t.Status == "MET" && r.DelayP99-p.DelayP99 > 1 {
				t.Status = fmt.Sprintf("MET (but its p99 tail is %.1f ms longer than reverse_proxy's)", r.DelayP99-p.DelayP99)
			}
		}
		ts = append(ts, t)
	}
	return ts
}

// benchGroup judges every benchmark whose name starts with one of the
// prefixes against a limit in ns/op.
func (b *bench) benchGroup(name, goal, prefix string, limit float64, more ...string) target {
	t := target{Name: name, Goal: goal}
	var figs, over []string
	for _, g := range b.res.GoBench {
		match := strings.HasPrefix(g.Name, prefix)
		for _, m := range more {
			match = match || strings.HasPrefix(g.Name, m)
		}
		if !match {
			continue
		}
		short := strings.TrimPrefix(g.Name, "Benchmark")
		figs = append(figs, fmt.Sprintf("%s %s", short, fmtNs(g.Metrics["ns/op"])))
		if g.Metrics["ns/op"] > limit {
			over = append(over, short)
		}
	}
	if len(figs) == 0 {
		t.Figure, t.Status = "not run", "NOT MEASURED"
		return t
	}
	t.Figure = strings.Join(figs, ", ")
	t.Status = status(len(over) == 0)
	if len(over) > 0 {
		t.Status = "NOT MET (" + strings.Join(over, ", ") + ")"
	}
	return t
}

func fmtNs(ns float64) string {
	if ns >= 1000 {
		return ftoa(ns/1000, 2) + " us"
	}
	return ftoa(ns, 0) + " ns"
}

// table renders a Markdown table with aligned columns.
func table(head []string, rows [][]string) string {
	w := make([]int, len(head))
	for i, h := range head {
		w[i] = len(h)
	}
	for _, r := range rows {
		for i, c := range r {
			w[i] = max(w[i], len(c))
		}
	}
	var s strings.Builder
	line := func(cells []string) {
		s.WriteString("|")
		for i, c := range cells {
			s.WriteString(" " + c + strings.Repeat(" ", w[i]-len(c)) + " |")
		}
		s.WriteString("\n")
	}
	line(head)
	sep := make([]string, len(head))
	for i := range sep {
		sep[i] = strings.Repeat("-", w[i])
	}
	line(sep)
	for _, r := range rows {
		line(r)
	}
	return s.String()
}

func f2(v float64) string { return ftoa(v, 2) }
func f3(v float64) string { return ftoa(v, 3) }
func f1(v float64) string { return ftoa(v, 1) }
func f0(v float64) string { return ftoa(v, 0) }

func signed(v float64) string {
	if v >= 0 {
		return "+" + f3(v)
	}
	return f3(v)
}

func joinF(xs []float64, prec int) string {
	parts := make([]string, len(xs))
	for i, x := range xs {
		parts[i] = ftoa(x, prec)
	}
	return strings.Join(parts, ", ")
}

func ratioCell(a, b float64) string {
	x, ok := ratio(a, b)
	if !ok {
		return "n/a"
	}
	return f2(x) + "x"
}

func (b *bench) report() string {
	var s strings.Builder
	m := b.res.Machine
	fmt.Fprintf(&s, "# llm_router benchmark\n\n%s; %d CPUs; %s; %s; %s; commit %s%s; %s.\nPinning: %s. Each fixed-rate run: %s warm-up, then %s measured, on a fresh Caddy. \"others %%\": CPU used meanwhile by processes this benchmark did not start, in %% of one CPU (a run over %.0f%% is measured again, up to %d times).\n\n",
		m.CPU, m.CPUs, m.Memory, m.Kernel, m.Go, m.Commit, map[bool]string{true: " (with uncommitted changes)", false: ""}[m.Dirty], m.Date,
		m.Pinning, b.o.warm, b.o.dur, b.o.noise, b.o.retries)

	s.WriteString("## Non-streaming, fixed rates\n\nLatency as the load generator sees it (vegeta, keep-alive); +p50/+p99: over direct at the same rate; CPU: the Caddy process's utime+stime per request; RSS: its VmHWM.\n\n")
	head := []string{"upstream", "rate/s", "scenario", "ok", "achieved/s", "p50 ms", "p99 ms", "+p50 ms", "+p99 ms", "CPU us/req", "peak RSS MiB", "sustained", "others %"}
	var rows [][]string
	for _, r := range b.res.Load {
		cpu, rss, add50, add99 := "-", "-", "-", "-"
		if r.Scenario != direct.name {
			cpu, rss, add50, add99 = f1(r.CaddyCPUPerReqUs), f1(r.PeakRSSMiB), signed(r.AddedP50), signed(r.AddedP99)
		}
		rows = append(rows, []string{fmt.Sprintf("%s %dms", r.Upstream, r.LatencyMs), strconv.Itoa(r.Rate), r.Scenario,
			fmt.Sprintf("%d/%d", r.OK, r.Requests), f0(r.Throughput), f3(r.P50), f3(r.P99), add50, add99, cpu, rss,
			map[bool]string{true: "yes", false: "NO"}[r.Sustained], f0(r.OtherCPUPct)})
	}
	s.WriteString(table(head, rows))

	s.WriteString("\n## Ratios router / reverse_proxy\n\nAdded latency (over direct) of the router divided by reverse_proxy's; throughput and CPU per request likewise. Targets: +p50 <= 1.15x, +p99 <= 1.3x, throughput >= 0.9x.\n\n")
	head = []string{"upstream", "rate/s", "router", "+p50 ratio", "+p99 ratio", "throughput ratio", "CPU/req ratio", "both sustained"}
	rows = nil
	for _, u := range b.upstreamSets() {
		for _, rate := range b.o.rates {
			p, ok := b.loadRow(b.res.Load, u.name, u.latency.Milliseconds(), rate, proxy.name)
			if !ok {
				continue
			}
			for _, sc := range []string{router1.name, router8.name} {
				r, ok := b.loadRow(b.res.Load, u.name, u.latency.Milliseconds(), rate, sc)
				if !ok {
					continue
				}
				rows = append(rows, []string{u.label(), strconv.Itoa(rate), sc, ratioCell(r.AddedP50, p.AddedP50), ratioCell(r.AddedP99, p.AddedP99),
					f2(r.Throughput / math.Max(p.Throughput, 1e-9)), ratioCell(r.CaddyCPUPerReqUs, p.CaddyCPUPerReqUs),
					map[bool]string{true: "yes", false: "no"}[p.Sustained && r.Sustained]})
			}
		}
	}
	s.WriteString(table(head, rows))

	if len(b.res.HeadToHead) > 0 {
		h := b.res.HeadToHead
		fmt.Fprintf(&s, "\n## Head to head at %d/s (bare 0 ms upstream, %d interleaved rounds, medians)\n\nThe latency targets are read here: the medians over rounds of each scenario's p50 and p99, and the added latency over direct's medians.\n\n",
			b.res.HeadToHeadRate, h[0].Rounds)
		head = []string{"scenario", "sustained", "p50 ms (rounds)", "p99 ms (rounds)", "+p50 ms", "+p99 ms", "+p50 vs rp", "+p99 vs rp", "CPU us/req"}
		rows = nil
		p, _ := findSummary(h, bare0.name, proxy.name)
		for _, r := range h {
			add50, add99, x50, x99, cpu := "-", "-", "-", "-", "-"
			if r.Scenario != direct.name {
				add50, add99, cpu = signed(r.AddedP50), signed(r.AddedP99), f1(r.CPUPerReqUs)
				x50, x99 = ratioCell(r.AddedP50, p.AddedP50), ratioCell(r.AddedP99, p.AddedP99)
			}
			rows = append(rows, []string{r.Scenario, fmt.Sprintf("%d/%d", r.Sustained, r.Rounds),
				f3(r.P50) + " (" + joinF(r.P50s, 3) + ")", f3(r.P99) + " (" + joinF(r.P99s, 2) + ")", add50, add99, x50, x99, cpu})
		}
		s.WriteString(table(head, rows))
	}

	if len(b.res.ClosedSummary) > 0 {
		fmt.Fprintf(&s, "\n## Highest throughput (closed loop, %d concurrent requests, 0 ms upstreams; medians of the rounds)\n\n", b.o.closedWorkers)
		head = []string{"upstream", "scenario", "rounds", "req/s (min-max)", "vs reverse_proxy", "p50 ms", "p99 ms", "Caddy CPU %", "CPU us/req"}
		rows = nil
		for _, r := range b.res.ClosedSummary {
			vs, cpuPct, cpu := "-", "-", "-"
			if p, ok := findSummary(b.res.ClosedSummary, r.Upstream, proxy.name); ok && r.Scenario != direct.name && p.Throughput > 0 {
				vs = f2(r.Throughput/p.Throughput) + "x"
			}
			if r.Scenario != direct.name {
				cpuPct, cpu = f0(r.CaddyCPUPct), f1(r.CPUPerReqUs)
			}
			rows = append(rows, []string{fmt.Sprintf("%s %dms", r.Upstream, r.LatencyMs), r.Scenario, strconv.Itoa(r.Rounds),
				fmt.Sprintf("%.0f (%.0f-%.0f)", r.Throughput, r.ThroughputMin, r.ThroughputMax), vs, f3(r.P50), f3(r.P99), cpuPct, cpu})
		}
		s.WriteString(table(head, rows))
	}

	if len(b.res.Streaming) > 0 {
		fmt.Fprintf(&s, "\n## Streaming: %d-chunk answers, chunks %s apart, %.0f streams/s\n\nFirst event: request sent -> first content event read; total: -> [DONE]. Event delay: upstream wrote the chunk -> client read it (bare upstream only: its chunks carry the instant). +: over direct.\n\n",
			streamChunks, streamInterval, streamRate)
		head = []string{"upstream", "scenario", "ok", "first event p50/p99 ms", "+first p50", "total p50/p99 ms", "+total p50", "event delay p50/p99/max ms", "+delay p50/p99", "first10/last10 ms", "CPU us/stream", "peak RSS MiB", "others %"}
		rows = nil
		for _, r := range b.res.Streaming {
			delay, added, growth, addF, addT, cpu, rss := "-", "-", "-", "-", "-", "-", "-"
			if r.Delays > 0 {
				delay = f3(r.DelayP50) + " / " + f3(r.DelayP99) + " / " + f3(r.DelayMax)
				growth = f3(r.DelayFirst) + " / " + f3(r.DelayLast)
			}
			if r.Scenario != direct.name {
				addF, addT = signed(r.AddedFirstEvent), signed(r.AddedTotal)
				cpu, rss = f0(r.CaddyCPUPerStreamUs), f1(r.PeakRSSMiB)
				if r.Delays > 0 {
					added = signed(r.AddedDelayP50) + " / " + signed(r.AddedDelayP99)
				}
			}
			rows = append(rows, []string{r.Upstream, r.Scenario, fmt.Sprintf("%d/%d", r.OK, r.Streams),
				f2(r.FirstEventP50) + " / " + f2(r.FirstEventP99), addF, f1(r.TotalP50) + " / " + f1(r.TotalP99), addT,
				delay, added, growth, cpu, rss, f0(r.OtherCPUPct)})
		}
		s.WriteString(table(head, rows))
	}

	if len(b.res.Memory) > 0 {
		s.WriteString("\n## Open streams: memory\n\nSlow streams (20 chunks 250 ms apart) opened at 1000/s, all open at once; per stream = (VmHWM - RSS before) / streams. Go heap in use (live objects and garbage not yet collected) and goroutine stacks: from Caddy's Go runtime (/debug/vars) once all were open, minus before, per stream; they count spans, not resident pages, and may reuse memory resident before, so they need not add up to the RSS figure.\n\n")
		head = []string{"scenario", "streams", "ok", "RSS before MiB", "peak RSS MiB", "KiB per stream", "Go heap in use KiB/stream", "stacks KiB/stream", "goroutines/stream", "others %"}
		rows = nil
		for _, r := range b.res.Memory {
			rows = append(rows, []string{r.Scenario, strconv.Itoa(r.Streams), strconv.Itoa(r.OK), f1(r.BaselineMiB), f1(r.PeakMiB), f1(r.PerStreamKiB), f1(r.HeapPerStreamKiB), f1(r.StackPerStreamKiB), f1(r.GoroutinesPerStream), f0(r.OtherCPUPct)})
		}
		s.WriteString(table(head, rows))
	}

	if len(b.res.Failover) > 0 {
		s.WriteString("\n## Failover cost\n\nDeployment a answers 429, b answers; sequential requests 20 ms apart. Measured at the upstream, on one clock: a's 429 written -> b's request received.\n\n")
		head = []string{"mode", "requests", "failed over", "p50 ms", "p99 ms", "max ms", "others %"}
		rows = nil
		for _, r := range b.res.Failover {
			rows = append(rows, []string{r.Mode, strconv.Itoa(r.Requests), strconv.Itoa(r.Failovers), f3(r.P50), f3(r.P99), f3(r.Max), f0(r.OtherCPUPct)})
		}
		s.WriteString(table(head, rows))
	}

	if len(b.res.Contention) > 0 {
		s.WriteString("\n## Contention\n\nProviders (llm_mock) with fixed 2 s windows stated in x-ratelimit-* headers, 429 once spent; one warm-up request per deployment and instance teaches the limits, then the arrivals come once the warm-up windows ended. Ideal: each request, in order, takes the earliest free place of a window opening before its deadline (less 100 ms for the answer). Overruns: answers later than the deadline + 100 ms.\n\n")
		for _, r := range b.res.Contention {
			s.WriteString("- **" + r.Scenario + "**: " + r.Description + "\n")
		}
		s.WriteString("\n" + contentionTable(b.res.Contention))
	}

	if len(b.res.Fleet) > 0 {
		s.WriteString("\n## Fleet at scale\n\nRouter instances sharing one redis-server on loopback, one llm_mock upstream stating windows it never reaches (every attempt spends the fleet's budget), the total rate spread evenly over the instances. Redis commands: INFO commandstats' delta over the measured part, the commands scripts run included. Hottest key: its share of key accesses in a one-second MONITOR sample.\n\n")
		s.WriteString(fleetTable(b.res.Fleet))
	}

	if len(b.res.Affinity) > 0 {
		s.WriteString("\n## Affinity\n\nTwo deployments of equal rank on llm_mocks that report cached input tokens for a conversation prefix they saw before (as providers' prompt caches do); 20 conversations of 6 turns about a document of their own (about 1,000 tokens), each turn resending the conversation with a new question. `none`: `affinity none`, the router spreads near-ties; `default`: no `affinity` directive, prompt-cache affinity (the conversation's first 1,024 bytes of prompt name it); `body`: `affinity body` (the body's `user` names the conversation).\n\n")
		s.WriteString(affinityTable(b.res.Affinity))
	}

	if len(b.res.GoBench) > 0 {
		s.WriteString("\n## Go benchmarks\n\n")
		units := map[string]bool{}
		for _, g := range b.res.GoBench {
			for u := range g.Metrics {
				units[u] = true
			}
		}
		extra := []string{}
		for u := range units {
			if u != "ns/op" && u != "B/op" && u != "allocs/op" && u != "MB/s" {
				extra = append(extra, u)
			}
		}
		sort.Strings(extra)
		head = append([]string{"benchmark", "ns/op", "B/op", "allocs/op"}, extra...)
		rows = nil
		for _, g := range b.res.GoBench {
			row := []string{g.Name, f0(g.Metrics["ns/op"]), f0(g.Metrics["B/op"]), f0(g.Metrics["allocs/op"])}
			for _, u := range extra {
				if v, ok := g.Metrics[u]; ok {
					row = append(row, ftoa(v, 2))
				} else {
					row = append(row, "")
				}
			}
			rows = append(rows, row)
		}
		s.WriteString(table(head, rows))
	}

	if len(b.res.CPUSummary) > 0 {
		fmt.Fprintf(&s, "\n## CPU per request, one Caddy process (cpu mode, bare 0 ms upstream, %d alternating rounds, medians)\n\nOne Caddy serves reverse_proxy, router-1 and router-8 on ports of their own; each round's figure is the process's utime+stime over the round divided by the requests (streams) sent in it; a router's ratio is the median of its rounds' figures each divided by reverse_proxy's in the same round. Streams: %.0f opened per second.\n\n", b.o.cpuRounds, b.o.cpuStreamRate)
		s.WriteString(cpuTable(b.res.CPUSummary, b.o.cpuRate, b.o.closedWorkers, b.o.cpuStreams))
	}
	if len(b.res.HeadlineMax) > 0 {
		fmt.Fprintf(&s, "\n## Headline: highest rate at p99 added latency < 5 ms (bare 0 ms upstream; load generator and upstream on CPU %s, Caddy on CPU %s)\n\nOne Caddy serves both; rates from %d/s in steps of %d/s, direct, reverse_proxy and router-1 in turn at each; a rate counts when at least 99.9%% succeeded, 97%% of it was issued and p99 less direct's p99 stayed under 5 ms; each ramp ends at a scenario's first rate that does not.\n\n",
			orNone(b.o.driverCPUs), orNone(b.o.caddyCPUs), b.o.headlineStart, b.o.headlineStep)
		s.WriteString(b.headlineTable())
	}
	s.WriteString("\n## Targets (issue 6)\n\n")
	rows = nil
	for _, t := range b.res.Targets {
		rows = append(rows, []string{t.Name, t.Goal, t.Figure, t.Status})
	}
	s.WriteString(table([]string{"target", "goal", "figure", "status"}, rows))

	for _, p := range b.res.Profiles {
		fmt.Fprintf(&s, "\n## CPU profile: %s at %d/s (go tool pprof -top)\n\n```\n%s\n```\n", p.Scenario, p.Rate, p.Top)
	}
	fmt.Fprintf(&s, "\nTotal time: %s.\n", b.res.Elapsed)
	return s.String()
}
