package soak

import (
	"os"
	"runtime"
	"runtime/pprof"
	"testing"
	"time"
)

func TestLeakDebug(t *testing.T) {
	o := DefaultOptions
	o.Requests, o.Concurrency, o.Port, o.Resume = 1500, 50, 9450, os.Getenv("RESUME")
	res, err := Run(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%s", res)
	for i := 0; i < 5; i++ {
		t.Logf("after %ds: %d goroutines", i*2, runtime.NumGoroutine())
		time.Sleep(2 * time.Second)
	}
	pprof.Lookup("goroutine").WriteTo(os.Stdout, 1)
}
