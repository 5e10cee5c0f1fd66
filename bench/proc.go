package main

import (
	"bytes"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// clockTicks is USER_HZ, the unit of utime and stime in /proc/<pid>/stat:
// 100 on every Linux architecture Go supports.
const clockTicks = 100

// child is a process the driver started: an upstream, an llm_mock Caddy or
// the Caddy under test. Only these are ever signalled, by their own pid.
type child struct {
	name string
	cmd  *exec.Cmd
	done chan struct{}
	err  error
}

var (
	childrenMu sync.Mutex
	children   = map[*child]bool{}
)

// start runs argv with env added, stdout and stderr to logPath, and waits
// until addr accepts connections. cpus, when not empty, pins the process
// with taskset (it execs the command: the pid stays the same).
func start(name string, argv []string, env []string, cpus, logPath, addr string) (*child, error) {
	if conn, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
		// Another process (a benchmark still running) has the port: this
		// one would fail to listen while the dial below succeeds.
		conn.Close()
		return nil, fmt.Errorf("%s: %s is in use by another process", name, addr)
	}
	if cpus != "" {
		argv = append([]string{"taskset", "-c", cpus}, argv...)
	}
	logf, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout, cmd.Stderr = logf, logf
	// Killed with the driver, whatever ends it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	c := &child{name: name, cmd: cmd, done: make(chan struct{})}
	go func() {
		c.err = cmd.Wait()
		logf.Close()
		close(c.done)
	}()
	childrenMu.Lock()
	children[c] = true
	childrenMu.Unlock()
	deadline := time.Now().Add(15 * time.Second)
	for {
		conn, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			conn.Close()
			return c, nil
		}
		select {
		case <-c.done:
			return nil, fmt.Errorf("%s exited before listening on %s (%v); see %s", name, addr, c.err, logPath)
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			c.stop()
			return nil, fmt.Errorf("%s not listening on %s after 15s; see %s", name, addr, logPath)
		}
	}
}

func (c *child) pid() int { return c.cmd.Process.Pid }

// stop asks the process to exit (SIGTERM: Caddy shuts down gracefully) and
// kills it after 10 s.
func (c *child) stop() {
	childrenMu.Lock()
	delete(children, c)
	childrenMu.Unlock()
	select {
	case <-c.done:
		return
	default:
	}
	_ = c.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-c.done:
	case <-time.After(10 * time.Second):
		_ = c.cmd.Process.Kill()
		<-c.done
	}
}

// stopChildren stops every process still running (on exit or interrupt).
func stopChildren() {
	childrenMu.Lock()
	list := make([]*child, 0, len(children))
	for c := range children {
		list = append(list, c)
	}
	childrenMu.Unlock()
	for _, c := range list {
		c.stop()
	}
}

// cpuTime returns the user plus system CPU time of a process, all its
// threads, from /proc/<pid>/stat (10 ms resolution).
func cpuTime(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The command name may hold spaces: fields start after the last ')'.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, fmt.Errorf("unexpected /proc/%d/stat", pid)
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 13 {
		return 0, fmt.Errorf("unexpected /proc/%d/stat", pid)
	}
	// f[0] is field 3 (state): utime is field 14, stime field 15.
	ut, err1 := strconv.ParseInt(f[11], 10, 64)
	st, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("unexpected /proc/%d/stat", pid)
	}
	return time.Duration(ut+st) * time.Second / clockTicks, nil
}

// syscalls returns the read and write system calls a process made so far,
// all its threads (syscr and syscw of /proc/<pid>/io).
func syscalls(pid int) (reads, writes int64, err error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/io", pid))
	if err != nil {
		return 0, 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		k, v, _ := strings.Cut(line, ": ")
		switch k {
		case "syscr":
			reads, _ = strconv.ParseInt(v, 10, 64)
		case "syscw":
			writes, _ = strconv.ParseInt(v, 10, 64)
		}
	}
	return reads, writes, nil
}

// memKiB returns VmRSS and VmHWM (peak RSS) of a process, in KiB.
func memKiB(pid int) (rss, hwm int64, err error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		n, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
		switch k {
		case "VmRSS":
			rss = n
		case "VmHWM":
			hwm = n
		}
	}
	return rss, hwm, nil
}

// pinning splits the CPUs between the driver side (load generator and
// upstreams) and the Caddy under test, so that neither steals the other's
// core: on 2 CPUs, "0" and "1". Empty strings when there is one CPU or no
// taskset.
func pinning() (driver, caddy string) {
	n := runtime.NumCPU() // the CPUs of this process's affinity mask
	if n < 2 {
		return "", ""
	}
	if _, err := exec.LookPath("taskset"); err != nil {
		return "", ""
	}
	half := n / 2
	return cpuRange(0, n-half-1), cpuRange(n-half, n-1)
}

func cpuRange(a, b int) string {
	if a == b {
		return strconv.Itoa(a)
	}
	return fmt.Sprintf("%d-%d", a, b)
}

// absPath resolves p against the working directory.
func absPath(p string) string {
	a, err := filepath.Abs(p)
	if err != nil {
		return p
	}
	return a
}

// cpuSnap is the machine's busy CPU time and the part of it spent by this
// driver and the processes it started, at one instant.
type cpuSnap struct {
	at         time.Time
	busy, ours time.Duration
}

// snapshot reads /proc/stat (all CPUs) and /proc/<pid>/stat of this
// process and its children.
func snapshot() cpuSnap {
	s := cpuSnap{at: time.Now()}
	if b, err := os.ReadFile("/proc/stat"); err == nil {
		line, _, _ := strings.Cut(string(b), "\n")
		f := strings.Fields(line)
		if len(f) >= 8 && f[0] == "cpu" {
			var total, idle int64
			for i, v := range f[1:] {
				n, _ := strconv.ParseInt(v, 10, 64)
				if i >= 8 { // guest time is already in user
					break
				}
				total += n
				if i == 3 || i == 4 { // idle, iowait
					idle += n
				}
			}
			s.busy = time.Duration(total-idle) * time.Second / clockTicks
		}
	}
	pids := []int{os.Getpid()}
	childrenMu.Lock()
	for c := range children {
		pids = append(pids, c.pid())
	}
	childrenMu.Unlock()
	for _, pid := range pids {
		if t, err := cpuTime(pid); err == nil {
			s.ours += t
		}
	}
	return s
}

// otherLoad is the CPU the rest of the machine used between two snapshots,
// in percent of one CPU: other users of a shared machine skew the figures.
func otherLoad(a, b cpuSnap) float64 {
	wall := b.at.Sub(a.at)
	if wall <= 0 {
		return 0
	}
	other := (b.busy - a.busy) - (b.ours - a.ours)
	return max(0, 100*float64(other)/float64(wall))
}
