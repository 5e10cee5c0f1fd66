package main

import (
	"os"
	"os/exec"
	"runtime"
	"strings"
	"time"
)

// machine describes where the figures come from.
type machine struct {
	CPU     string `json:"cpu"`
	CPUs    int    `json:"cpus"`
	Memory  string `json:"memory"`
	Kernel  string `json:"kernel"`
	Go      string `json:"go"`
	Commit  string `json:"commit"`
	Dirty   bool   `json:"dirty"`
	Date    string `json:"date"`
	Lscpu   string `json:"lscpu"`
	Pinning string `json:"pinning"`
}

func describeMachine(o options) machine {
	m := machine{CPUs: runtime.NumCPU(), Go: runtime.Version(), Date: time.Now().UTC().Format(time.RFC3339)}
	if o.allCPUs != "" {
		m.CPUs = strings.Count(o.allCPUs, ",") + 1
		if a, b, ok := strings.Cut(o.allCPUs, "-"); ok {
			m.CPUs = atoi(b) - atoi(a) + 1
		}
		m.Pinning = "load generator and upstreams on CPU " + o.driverCPUs + ", Caddy under test on CPU " + o.caddyCPUs
	} else {
		m.Pinning = "none"
	}
	if out, err := exec.Command("lscpu").Output(); err == nil {
		m.Lscpu = string(out)
		for _, line := range strings.Split(m.Lscpu, "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "Model name" {
				m.CPU = strings.TrimSpace(v)
			}
		}
	}
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok && k == "MemTotal" {
				kb := atoi(strings.TrimSuffix(strings.TrimSpace(v), " kB"))
				m.Memory = strings.TrimSpace(formatGiB(kb)) + " RAM"
			}
		}
	}
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m.Kernel = "Linux " + strings.TrimSpace(string(b))
	}
	if out, err := exec.Command("go", "version").Output(); err == nil {
		m.Go = strings.TrimSpace(string(out))
	}
	if out, err := exec.Command("git", "-C", o.repo, "rev-parse", "--short", "HEAD").Output(); err == nil {
		m.Commit = strings.TrimSpace(string(out))
	}
	if out, err := exec.Command("git", "-C", o.repo, "status", "--porcelain", "--untracked-files=no").Output(); err == nil {
		m.Dirty = len(strings.TrimSpace(string(out))) > 0
	}
	return m
}

func atoi(s string) int {
	n := 0
	for _, c := range strings.TrimSpace(s) {
		if c < '0' || c > '9' {
			break
		}
		n = n*10 + int(c-'0')
	}
	return n
}

func formatGiB(kb int) string {
	return strings.TrimRight(strings.TrimRight(ftoa(float64(kb)/(1<<20), 1), "0"), ".") + " GiB"
}
