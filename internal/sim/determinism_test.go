package sim

import (
	"crypto/sha256"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

var reproduceFlag = flag.Bool("sim.reproduce", false, "TestSimIsReproducible: every scenario (or sim.scenario) on seeds 1..sim.seeds (or sim.seed), not the replayed runs alone")

// replayed are runs whose traces differed from run to run of their seed
// before the timeline and the turnstile (TESTING.md, "Determinism"):
// window-roll seed 9 failed once in three runs (30 served of an ideal
// 40), seed 19 served 20 once and 38 on replays; rounded-resets seed 19's
// trace differed in every run; mixed seed 3 crosses every fault and both
// client APIs; baseline seed 7 (once TestSimReplays) its outcomes.
var replayed = []replay{{"window-roll", 9}, {"window-roll", 19}, {"rounded-resets", 19}, {"mixed", 3}, {"baseline", 7}}

// replay is one scenario's run on one seed.
type replay struct {
	scenario string
	seed     uint64
}

// TestSimIsReproducible runs each of replayed three times: the traces
// (every event and decision, in order, with its virtual instant) must be
// the same byte for byte. With -sim.reproduce it runs the scenarios and
// seeds TestSim would.
func TestSimIsReproducible(t *testing.T) {
	runs := replayed
	if *reproduceFlag {
		runs = nil
		for _, sc := range scenarios {
			for _, seed := range seedsToRun() {
				if *scenarioFlag == "" || sc.name == *scenarioFlag {
					runs = append(runs, replay{sc.name, seed})
				}
			}
		}
	}
	for _, r := range runs {
		sc := scenarioNamed(t, r.scenario)
		t.Run(fmt.Sprintf("%s/%d", r.scenario, r.seed), func(t *testing.T) {
			var first []string
			var sum [sha256.Size]byte
			for run := range 3 {
				w := simulate(t, sc, r.seed)
				h := sha256.Sum256([]byte(strings.Join(w.trace, "\n")))
				if run == 0 {
					first, sum = w.trace, h
					continue
				}
				if h != sum {
					t.Fatalf("run %d's trace differs from run 0's (%d and %d events, in %s and %s): %s", run, len(w.trace), len(first),
						writeTrace(r, 0, first), writeTrace(r, run, w.trace), firstDifference(first, w.trace))
				}
			}
		})
	}
}

// scenarioNamed is the scenario of that name.
func scenarioNamed(t *testing.T, name string) scenario {
	for _, sc := range scenarios {
		if sc.name == name {
			return sc
		}
	}
	t.Fatalf("no scenario %s", name)
	return scenario{}
}

// writeTrace writes run's trace of r to a file, and returns its path.
func writeTrace(r replay, run int, trace []string) string {
	path := filepath.Join(os.TempDir(), fmt.Sprintf("llm-router-sim-%s-%d-run%d.trace", r.scenario, r.seed, run))
	if err := os.WriteFile(path, []byte(strings.Join(trace, "\n")+"\n"), 0o644); err != nil {
		return "(not written: " + err.Error() + ")"
	}
	return path
}

// firstDifference is where traces a and b first differ: the line of
// each.
func firstDifference(a, b []string) string {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return fmt.Sprintf("event %d:\n  %s\n  %s", i, a[i], b[i])
		}
	}
	return fmt.Sprintf("one trace ends at event %d", min(len(a), len(b)))
}
