package main

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
)

// goBench is one line of `go test -bench` output.
type goBench struct {
	Name    string             `json:"name"` // without the -GOMAXPROCS suffix
	N       int64              `json:"n"`
	Metrics map[string]float64 `json:"metrics"` // unit -> value: ns/op, B/op, allocs/op, ns/event...
}

var procSuffix = regexp.MustCompile(`-\d+$`)

// goBenchmarks runs the package benchmarks of ./internal/router,
// ./internal/adapters, ./internal/jsonbody, ./internal/api, ./provider,
// ./internal/redact and the handler's (BenchmarkHandler, .) (on every CPU
// when pinned: they are single-threaded, but compiling is not).
func (b *bench) goBenchmarks() error {
	b.waitQuiet()
	pkgs := []string{"./internal/router", "./internal/adapters", "./internal/jsonbody", "./internal/api", "./provider", "./internal/redact", "."}
	b.logf("go test -bench %s (benchtime %s)", strings.Join(pkgs, " "), b.o.benchtime)
	argv := append([]string{"go", "test", "-run", "^$", "-bench", ".", "-benchmem", "-benchtime", b.o.benchtime}, pkgs...)
	if b.o.allCPUs != "" {
		argv = append([]string{"taskset", "-c", b.o.allCPUs}, argv...)
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Dir = b.o.repo
	out, err := cmd.CombinedOutput()
	_ = os.WriteFile(filepath.Join(b.o.out, "gobench.txt"), out, 0o644)
	if err != nil {
		return fmt.Errorf("go test -bench: %v\n%s", err, out)
	}
	b.res.GoBench = parseGoBench(out)
	for _, g := range b.res.GoBench {
		b.logf("  %-55s %10.0f ns/op %6.0f allocs/op", g.Name, g.Metrics["ns/op"], g.Metrics["allocs/op"])
	}
	return nil
}

func parseGoBench(out []byte) []goBench {
	var list []goBench
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 4 || !strings.HasPrefix(f[0], "Benchmark") {
			continue
		}
		n, err := strconv.ParseInt(f[1], 10, 64)
		if err != nil {
			continue
		}
		g := goBench{Name: procSuffix.ReplaceAllString(f[0], ""), N: n, Metrics: map[string]float64{}}
		for i := 2; i+1 < len(f); i += 2 {
			if v, err := strconv.ParseFloat(f[i], 64); err == nil {
				g.Metrics[f[i+1]] = v
			}
		}
		list = append(list, g)
	}
	return list
}

func (b *bench) goBench(name string) (goBench, bool) {
	for _, g := range b.res.GoBench {
		if g.Name == name {
			return g, true
		}
	}
	return goBench{}, false
}
