package consumer

import (
	"strings"
	"testing"
	"time"
)

// A request over two limits is told the wait of the later one: retried
// after its Retry-After, it is admitted; a second before, it is not.
func TestRetryAfterIsTheWaitOfEveryLimit(t *testing.T) {
	r := registry(t, []Plan{{Name: DefaultPlan, RPM: 10, TPM: 1000}}, nil)
	for i := range 9 {
		if _, ref := r.Admit(t0, "a", "g", 1); ref != nil {
			t.Fatalf("request %d refused: %+v", i, ref)
		}
	}
	if _, ref := r.Admit(t0.Add(30*time.Second), "a", "g", 990); ref != nil {
		t.Fatalf("request 10 refused: %+v", ref)
	}
	// At 40 s: rpm frees at 60 s (the 9 leave), tpm only at 90 s (the 990).
	at := t0.Add(40 * time.Second)
	_, ref := r.Admit(at, "a", "g", 20)
	if ref == nil {
		t.Fatal("expected a 429")
	}
	if ref.RetryAfter != 50*time.Second {
		t.Errorf("Retry-After %s, the request is admitted only at 90 s (50 s)", ref.RetryAfter)
	}
	if _, ref := r.Admit(at.Add(ref.RetryAfter-time.Second), "a", "g", 20); ref == nil {
		t.Error("admitted a second before its Retry-After: the wait was too long")
	}
	if _, ref := r.Admit(at.Add(ref.RetryAfter), "a", "g", 20); ref != nil {
		t.Errorf("retried after its Retry-After, refused again: %+v", ref)
	}
}

// A keys file saved with a byte-order mark (Windows editors) and lines
// with a trailing comment (as docs/consumers.md's example has) reads as
// the same consumers.
func TestKeysFileBOMAndTrailingComments(t *testing.T) {
	file := "\ufeffalice " + hashOf("sk-alice") + "\r\n" +
		"bob   " + hashOf("sk-bob") + "   # sha256 of its key\r\n"
	k, err := ParseKeys(strings.NewReader(file), "llm-keys")
	if err != nil {
		t.Fatal(err)
	}
	for key, want := range map[string]string{"sk-alice": "alice", "sk-bob": "bob"} {
		if got, ok := k.Lookup(key); !ok || got != want {
			t.Errorf("Lookup(%s) = %q, %v; want %q", key, got, ok, want)
		}
	}
	if _, err := ParseKeys(strings.NewReader("alice "+hashOf("k")+" extra\n"), "f"); err == nil {
		t.Error("a third field that is no comment: expected an error")
	}
}

// A weight so small that a request's turn (1/weight of virtual time) is
// infinite would stall the queue's virtual time for every consumer: a
// weight is 0 (the default) or from 1/MaxWeight to MaxWeight.
func TestWeightBelowItsBoundIsRefused(t *testing.T) {
	for _, w := range []float64{5e-324, 1e-9, 0.0009} {
		p := Plan{Name: "tiny", Weight: w}
		if err := p.Validate(); err == nil {
			t.Errorf("weight %v: expected an error", w)
		}
	}
	for _, w := range []float64{0, 0.001, 0.5, 1000} {
		p := Plan{Name: "ok", Weight: w}
		if err := p.Validate(); err != nil {
			t.Errorf("weight %v: %v", w, err)
		}
	}
}

// A line too long to be a key's (a file of another kind, a hash pasted
// without its newlines) is an error naming its line.
func TestKeysFileLongLineNamesItsLine(t *testing.T) {
	file := "alice " + hashOf("sk-alice") + "\n" + strings.Repeat("x", 100<<10) + "\n"
	_, err := ParseKeys(strings.NewReader(file), "llm-keys")
	if err == nil || !strings.Contains(err.Error(), "llm-keys:2") {
		t.Errorf("expected an error at llm-keys:2, got %v", err)
	}
}

// A reload that changes a budget's period (the counts shared through the
// pool, ShareCounts) keeps what the current window spent: carried into
// the new period's window that holds now, never forgiven by the reload,
// either way; one that changes only the amount keeps it too.
func TestABudgetPeriodChangeOnReloadKeepsTheSpend(t *testing.T) {
	reload := func(old *Registry, usd float64, per time.Duration) *Registry {
		r := registry(t, []Plan{{Name: DefaultPlan, BudgetUSD: usd, BudgetPer: per}}, nil)
		r.ShareCounts(old.Counts())
		return r
	}
	at := t0 // 10:00 UTC: in the 24h window from 00:00 and the 12h window from 00:00
	for _, c := range []struct {
		name        string
		from, to    time.Duration
		usd         float64
		renewsAfter time.Duration // from at, in the new period
	}{
		{"24h to 12h", 24 * time.Hour, 12 * time.Hour, 50, 2 * time.Hour},
		{"12h to 24h", 12 * time.Hour, 24 * time.Hour, 50, 14 * time.Hour},
		{"the amount alone", 24 * time.Hour, 24 * time.Hour, 40, 14 * time.Hour},
	} {
		t.Run(c.name, func(t *testing.T) {
			old := registry(t, []Plan{{Name: DefaultPlan, BudgetUSD: 50, BudgetPer: c.from}}, nil)
			tk, ref := old.Admit(at, "a", "g", 1)
			if ref != nil {
				t.Fatal(ref)
			}
			tk.Done(at, 45)
			r := reload(old, c.usd, c.to)
			if c.usd == 50 {
				if _, ref := r.Admit(at, "a", "g", 1); ref != nil {
					t.Fatalf("45 of 50 spent: refused: %+v", ref)
				} else {
					r.Spend(at, "a", 5)
				}
			}
			_, ref = r.Admit(at.Add(time.Minute), "a", "g", 1)
			if ref == nil || ref.Limit != LimitBudget {
				t.Fatalf("the window's spend was forgiven by the reload: admitted (%+v)", ref)
			}
			if ref.RetryAfter != c.renewsAfter-time.Minute {
				t.Errorf("Retry-After %s, expected the new period's renewal in %s", ref.RetryAfter, c.renewsAfter-time.Minute)
			}
			spent := 45.0
			if c.usd == 50 {
				spent = 50
			}
			if u := r.Report(at.Add(time.Minute)); len(u) != 1 || u[0].SpentUSD != spent {
				t.Errorf("expected %v USD spent in the report, got %+v", spent, u)
			}
			if _, ref := r.Admit(at.Add(c.renewsAfter), "a", "g", 1); ref != nil {
				t.Errorf("the new period's window renewed: still refused: %+v", ref)
			}
		})
	}
}

// A budget's period is said as the config writes it, in its refusal and
// in the report: "24h", "90m" as "1h30m", never Go's "24h0m0s".
func TestBudgetPeriodsReadAsWritten(t *testing.T) {
	for per, want := range map[time.Duration]string{24 * time.Hour: "24h", 90 * time.Minute: "1h30m", time.Hour: "1h", 30 * time.Second: "30s"} {
		r := registry(t, []Plan{{Name: DefaultPlan, BudgetUSD: 1, BudgetPer: per}}, nil)
		r.Spend(t0, "a", 2)
		_, ref := r.Admit(t0, "a", "g", 1)
		if ref == nil || !strings.Contains(ref.Message, "USD per "+want+" spent;") {
			t.Errorf("%s: expected the refusal to say per %s, got %+v", per, want, ref)
		}
		if u := r.Report(t0); len(u) != 1 || u[0].BudgetPer != want {
			t.Errorf("%s: expected budget_per %q, got %+v", per, want, u)
		}
	}
}
