package sim

import (
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"testing/synctest"
)

var (
	seedFlag     = flag.Uint64("sim.seed", 0, "run this seed alone (0: seeds 1..sim.seeds)")
	seedsFlag    = flag.Int("sim.seeds", 4, "how many seeds to run, 1..N")
	scenarioFlag = flag.String("sim.scenario", "", "run this scenario alone")
	traceFlag    = flag.Bool("sim.trace", false, "log every run's whole trace")
)

// TestSim runs every scenario on each seed, in virtual time; a broken
// invariant fails the scenario with its trace and the command that
// replays it, unless the scenario is knownFailing.
func TestSim(t *testing.T) {
	seeds := seedsToRun()
	kinds := map[string]int{}
	var known []string
	for _, sc := range scenarios {
		kinds[sc.name] = sc.kind
		if *scenarioFlag != "" && sc.name != *scenarioFlag {
			continue
		}
		t.Run(sc.name, func(t *testing.T) {
			if failed := runScenario(t, sc, seeds); failed > 0 && knownFailing[sc.name] > 0 {
				known = append(known, fmt.Sprintf("%s (kind %d) on %d of %d seeds", sc.name, knownFailing[sc.name], failed, len(seeds)))
			}
		})
	}
	if len(known) > 0 {
		t.Logf("known failing: %s", strings.Join(known, "; "))
	}
	for name, kind := range knownFailing {
		if k, ok := kinds[name]; !ok || k != kind {
			t.Errorf("knownFailing names %s of kind %d, which is no scenario of that kind", name, kind)
		}
	}
}

// seedsToRun are the seeds the flags ask for: sim.seed alone, or
// 1..sim.seeds.
func seedsToRun() []uint64 {
	if *seedFlag != 0 {
		return []uint64{*seedFlag}
	}
	var seeds []uint64
	for s := range *seedsFlag {
		seeds = append(seeds, uint64(s+1))
	}
	return seeds
}

// runScenario runs sc on each seed: it returns on how many some
// invariant broke.
func runScenario(t *testing.T, sc scenario, seeds []uint64) int {
	kind, known := knownFailing[sc.name]
	failed := 0
	for _, seed := range seeds {
		w := simulate(t, sc, seed)
		if *traceFlag {
			t.Logf("seed %d's trace:\n%s", seed, strings.Join(w.trace, "\n"))
		}
		if len(w.violations) == 0 {
			t.Logf("seed %d: ok: %s", seed, w.summary)
			continue
		}
		failed++
		if known && *seedFlag != 0 {
			t.Logf("known failing (kind %d): %s", kind, report(sc, seed, w)) // a replay: the whole report
			continue
		}
		if known {
			t.Logf("seed %d: known failing (kind %d): %s; %d violations, the first: %s", seed, kind, w.summary, len(w.violations), w.violations[0])
			continue
		}
		t.Errorf("%s", report(sc, seed, w))
	}
	if known && failed == 0 && *seedFlag == 0 {
		t.Errorf("%s (kind %d) passes on every seed: take it out of knownFailing", sc.name, kind)
	}
	return failed
}

// simulate runs sc on seed in a synctest bubble: virtual time, advanced
// only when every goroutine of the run is blocked.
func simulate(t *testing.T, sc scenario, seed uint64) *world {
	var w *world
	synctest.Test(t, func(t *testing.T) {
		set := sc.build(&draw{r: rand.New(rand.NewPCG(seed, uint64(len(sc.name))))})
		w = newWorld(seed, set)
		w.logf("scenario %s, seed %d", sc.name, seed)
		w.run(set.clients)
		w.finish()
	})
	return w
}

// report is a failing run: its violations, the end of its trace (all of
// it in a file), and how to replay it.
func report(sc scenario, seed uint64, w *world) string {
	var b strings.Builder
	fmt.Fprintf(&b, "scenario %s, seed %d: %s; %d violations\n", sc.name, seed, w.summary, len(w.violations))
	for i, v := range w.violations {
		if i == 10 {
			fmt.Fprintf(&b, "  ... and %d more\n", len(w.violations)-i)
			break
		}
		fmt.Fprintf(&b, "  %s\n", v)
	}
	path := filepath.Join(os.TempDir(), fmt.Sprintf("llm-router-sim-%s-%d.trace", sc.name, seed))
	if err := os.WriteFile(path, []byte(strings.Join(w.trace, "\n")+"\n"), 0o644); err != nil {
		path = "(not written: " + err.Error() + ")"
	}
	tail := w.trace[max(len(w.trace)-40, 0):]
	fmt.Fprintf(&b, "the trace's last %d events (all %d in %s):\n%s\n", len(tail), len(w.trace), path, strings.Join(tail, "\n"))
	fmt.Fprintf(&b, "replay: make sim SCENARIO=%s SEED=%d", sc.name, seed)
	return b.String()
}
