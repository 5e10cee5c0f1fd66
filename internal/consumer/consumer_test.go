package consumer

import (
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"strings"
	"testing"
	"time"
)

var t0 = time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)

func hashOf(key string) string {
	h := sha256.Sum256([]byte(key))
	return hex.EncodeToString(h[:])
}

func registry(t *testing.T, plans []Plan, members map[string]string) *Registry {
	t.Helper()
	r, err := New(plans, members)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func TestKeysFileMapsHashedKeysToConsumers(t *testing.T) {
	file := "# team keys\n\nalice " + hashOf("sk-alice") + "\nbob " + strings.ToUpper(hashOf("sk-bob")) + "\nalice " + hashOf("sk-alice-2") + "\n"
	k, err := ParseKeys(strings.NewReader(file), "llm-keys")
	if err != nil {
		t.Fatal(err)
	}
	for key, want := range map[string]string{"sk-alice": "alice", "sk-bob": "bob", "sk-alice-2": "alice"} {
		if got, ok := k.Lookup(key); !ok || got != want {
			t.Errorf("key %s: expected %s, got %q (%v)", key, want, got, ok)
		}
	}
	for _, key := range []string{"", "sk-carol", hashOf("sk-alice")} {
		if got, ok := k.Lookup(key); ok {
			t.Errorf("key %q: expected unknown, got %s", key, got)
		}
	}
	if got := k.Consumers(); strings.Join(got, ",") != "alice,bob" {
		t.Errorf("expected consumers alice,bob, got %v", got)
	}
}

func TestKeysFileErrorsNameTheLineNotTheHash(t *testing.T) {
	for _, c := range []struct{ file, want string }{
		{"alice\n", "f:1: expected"},
		{"alice abc\n", "f:1: the hash of consumer alice is not 64 hex digits"},
		{"# x\nalice " + hashOf("k") + "\nbob " + hashOf("k") + "\n", "f:3: the same key's hash as line 2"},
	} {
		_, err := ParseKeys(strings.NewReader(c.file), "f")
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: expected an error with %q, got %v", c.file, c.want, err)
		}
		if err != nil && strings.Contains(err.Error(), hashOf("k")) {
			t.Errorf("the error shows a hash: %v", err)
		}
	}
}

func TestKeyOfReadsBearerAndXAPIKey(t *testing.T) {
	for _, c := range []struct {
		h    http.Header
		want string
	}{
		{http.Header{"Authorization": {"Bearer sk-1"}}, "sk-1"},
		{http.Header{"Authorization": {"bearer  sk-1 "}}, "sk-1"},
		{http.Header{"X-Api-Key": {"sk-2"}}, "sk-2"},
		{http.Header{"Authorization": {"Basic YTpi"}}, ""},
		{http.Header{}, ""},
	} {
		if got := KeyOf(c.h); got != c.want {
			t.Errorf("%v: expected %q, got %q", c.h, c.want, got)
		}
	}
	h := http.Header{"Authorization": {"Bearer sk-1"}, "X-Api-Key": {"sk-2"}, "Anthropic-Version": {"2023-06-01"}}
	StripKey(h)
	if len(h) != 1 {
		t.Errorf("expected only anthropic-version left, got %v", h)
	}
}

func TestPlanOfUsesDefaultPlan(t *testing.T) {
	r := registry(t, []Plan{{Name: "team-a", Weight: 3}, {Name: DefaultPlan, RPM: 1}}, map[string]string{"alice": "team-a"})
	if p := r.PlanOf("alice"); p == nil || p.Name != "team-a" || r.Weight("alice") != 3 {
		t.Errorf("alice: expected team-a of weight 3, got %+v", p)
	}
	if p := r.PlanOf("carol"); p == nil || p.Name != DefaultPlan || r.Weight("carol") != 1 {
		t.Errorf("carol: expected default, got %+v", p)
	}
	r = registry(t, []Plan{{Name: "team-a"}}, nil)
	if p := r.PlanOf("carol"); p != nil || r.Weight("carol") != 1 {
		t.Errorf("no default plan: expected none and weight 1, got %+v", p)
	}
	if _, err := New(nil, map[string]string{"alice": "nope"}); err == nil {
		t.Error("expected an error for a member of an unknown plan")
	}
}

func TestRPMIsASlidingMinuteWithItsRetryAfter(t *testing.T) {
	r := registry(t, []Plan{{Name: DefaultPlan, RPM: 3}}, nil)
	for i := range 3 {
		tk, ref := r.Admit(t0.Add(time.Duration(i)*10*time.Second), "alice", "g", 10)
		if ref != nil {
			t.Fatalf("request %d refused: %+v", i, ref)
		}
		tk.Done(t0, 0)
	}
	// At 30 s the minute holds 3 (0 s, 10 s, 20 s): the first leaves at 60 s.
	_, ref := r.Admit(t0.Add(30*time.Second), "alice", "g", 10)
	if ref == nil || ref.Status != 429 || ref.Limit != LimitRPM || ref.RetryAfter != 30*time.Second {
		t.Fatalf("expected 429 rpm with Retry-After 30s, got %+v", ref)
	}
	if !strings.Contains(ref.Message, "consumer alice is over its rpm") {
		t.Errorf("unexpected message %q", ref.Message)
	}
	// Another consumer of the same plan has its own minute.
	if _, ref := r.Admit(t0.Add(30*time.Second), "bob", "g", 10); ref != nil {
		t.Errorf("bob refused: %+v", ref)
	}
	if _, ref := r.Admit(t0.Add(60*time.Second), "alice", "g", 10); ref != nil {
		t.Errorf("at 60 s the first request left the minute, got %+v", ref)
	}
}

func TestTPMCountsEstimatedTokens(t *testing.T) {
	r := registry(t, []Plan{{Name: DefaultPlan, TPM: 1000}}, nil)
	if _, ref := r.Admit(t0, "a", "g", 5000); ref != nil {
		t.Fatalf("a request larger than tpm into an empty minute: expected admitted, got %+v", ref)
	}
	_, ref := r.Admit(t0.Add(5*time.Second), "a", "g", 10)
	if ref == nil || ref.Limit != LimitTPM || ref.RetryAfter != 55*time.Second {
		t.Fatalf("expected 429 tpm until 60 s, got %+v", ref)
	}
}

func TestConcurrentFreesOnDone(t *testing.T) {
	r := registry(t, []Plan{{Name: DefaultPlan, Concurrent: 2}}, nil)
	a, _ := r.Admit(t0, "a", "g", 1)
	b, _ := r.Admit(t0, "a", "g", 1)
	if _, ref := r.Admit(t0, "a", "g", 1); ref == nil || ref.Limit != LimitConcurrent || ref.RetryAfter != 0 {
		t.Fatalf("expected 429 concurrent with no Retry-After (no request ended yet: no wait is known), got %+v", ref)
	}
	a.Done(t0, 0)
	a.Done(t0, 0) // once
	if _, ref := r.Admit(t0, "a", "g", 1); ref != nil {
		t.Fatalf("expected a slot after Done, got %+v", ref)
	}
	if _, ref := r.Admit(t0, "a", "g", 1); ref == nil {
		t.Fatal("a second Done of one ticket freed a second slot")
	}
	b.Done(t0, 0)
}

// A concurrent refusal's Retry-After is when the first request in flight
// is expected to end: its admission plus how long the consumer's requests
// took (a moving average), a second at least; none while no request has
// ended (no wait is known).
func TestConcurrentRetryAfterIsWhenOneIsExpectedToEnd(t *testing.T) {
	r := registry(t, []Plan{{Name: DefaultPlan, Concurrent: 1}}, nil)
	a, _ := r.Admit(t0, "a", "g", 1)
	if _, ref := r.Admit(t0.Add(time.Second), "a", "g", 1); ref == nil || ref.RetryAfter != 0 {
		t.Fatalf("none ended yet: expected a refusal with no Retry-After, got %+v", ref)
	}
	a.Done(t0.Add(4*time.Second), 0) // requests take 4 s
	b, _ := r.Admit(t0.Add(10*time.Second), "a", "g", 1)
	if _, ref := r.Admit(t0.Add(11*time.Second), "a", "g", 1); ref == nil || ref.Limit != LimitConcurrent || ref.RetryAfter != 3*time.Second {
		t.Fatalf("admitted at 10 s, requests take 4 s: expected Retry-After 3s at 11 s, got %+v", ref)
	}
	if _, ref := r.Admit(t0.Add(20*time.Second), "a", "g", 1); ref == nil || ref.RetryAfter != time.Second {
		t.Fatalf("overdue: expected Retry-After 1s (soon), got %+v", ref)
	}
	b.Done(t0.Add(18*time.Second), 0) // took 8 s: the average moves a quarter of the way, to 5 s
	c, _ := r.Admit(t0.Add(30*time.Second), "a", "g", 1)
	if _, ref := r.Admit(t0.Add(30*time.Second), "a", "g", 1); ref == nil || ref.RetryAfter != 5*time.Second {
		t.Fatalf("expected Retry-After 5s (the moving average), got %+v", ref)
	}
	c.Done(t0.Add(31*time.Second), 0)
}

// A budget holds each admitted request's worst case until it is done:
// requests in flight whose holds fill the budget refuse the next one (with
// when the first is expected to end), and their answers settle the holds
// at what they cost.
func TestBudgetHoldsWorstCasesInFlight(t *testing.T) {
	r := registry(t, []Plan{{Name: DefaultPlan, BudgetUSD: 1, BudgetPer: 24 * time.Hour}}, nil)
	a, ref := r.AdmitHolding(t0, "a", "g", 1, 0.6)
	if ref != nil {
		t.Fatal(ref)
	}
	b, ref := r.AdmitHolding(t0, "a", "g", 1, 0.6) // 0.6 held: below 1
	if ref != nil {
		t.Fatal(ref)
	}
	_, ref = r.AdmitHolding(t0, "a", "g", 1, 0.6) // 1.2 held
	if ref == nil || ref.Limit != LimitBudget || ref.RetryAfter != 0 || !strings.Contains(ref.Message, "1.2 held by its 2 requests in flight") {
		t.Fatalf("expected the budget refusal of what is held, no Retry-After known yet, got %+v", ref)
	}
	if u := r.Report(t0); len(u) != 1 || u[0].HeldUSD != 1.2 || u[0].SpentUSD != 0 {
		t.Errorf("expected 1.2 held and nothing spent, got %+v", u)
	}
	a.Done(t0.Add(2*time.Second), 0.01)
	b.Done(t0.Add(2*time.Second), 0.01)
	if u := r.Report(t0.Add(2 * time.Second)); u[0].HeldUSD != 0 || u[0].SpentUSD != 0.02 {
		t.Errorf("expected the holds settled at 0.02 spent, got %+v", u)
	}
	if _, ref := r.AdmitHolding(t0.Add(2*time.Second), "a", "g", 1, 0.6); ref != nil {
		t.Errorf("expected room once the holds settled, got %+v", ref)
	}
}

func TestBudgetPerPeriodRenewsAtItsWindow(t *testing.T) {
	r := registry(t, []Plan{{Name: DefaultPlan, BudgetUSD: 1, BudgetPer: 24 * time.Hour}}, nil)
	tk, _ := r.Admit(t0, "a", "g", 1)
	tk.Done(t0, 0.6)
	tk, ref := r.Admit(t0, "a", "g", 1)
	if ref != nil {
		t.Fatalf("0.6 of 1 USD spent: expected admitted, got %+v", ref)
	}
	tk.Done(t0, 0.6)
	_, ref = r.Admit(t0.Add(time.Hour), "a", "g", 1)
	// t0 is 10:00 UTC: the window renews at 00:00, 14 h later.
	if ref == nil || ref.Limit != LimitBudget || ref.RetryAfter != 13*time.Hour {
		t.Fatalf("expected 429 budget until 00:00 UTC (13 h), got %+v", ref)
	}
	if _, ref := r.Admit(t0.Add(14*time.Hour), "a", "g", 1); ref != nil {
		t.Errorf("expected the renewed budget to admit, got %+v", ref)
	}
}

func TestGroupsForbidOthersAndRefusalsCountNothing(t *testing.T) {
	r := registry(t, []Plan{{Name: "team", RPM: 1, Groups: []string{"fast"}}}, map[string]string{"alice": "team"})
	_, ref := r.Admit(t0, "alice", "smart", 1)
	if ref == nil || ref.Status != 403 || ref.Limit != LimitGroups || !strings.Contains(ref.Message, "may not use model smart") {
		t.Fatalf("expected 403 groups, got %+v", ref)
	}
	if _, ref := r.Admit(t0, "alice", "fast", 1); ref != nil {
		t.Fatalf("the 403 was counted against rpm: %+v", ref)
	}
	if u := r.Report(t0); len(u) != 1 || u[0].Requests != 1 || u[0].InFlight != 1 || u[0].Plan != "team" {
		t.Errorf("unexpected report %+v", u)
	}
}

func TestPlanValidation(t *testing.T) {
	for _, p := range []Plan{{Name: "x", Weight: -1}, {Name: "x", RPM: -1}, {Name: "x", BudgetUSD: 1}, {Name: "x", Weight: 1e9}} {
		if err := p.Validate(); err == nil {
			t.Errorf("%+v: expected an error", p)
		}
	}
}

// docs/consumers.md's worked example writes its keys file with a comment
// after the hash ("batch-nightly <hash>   # sha256 of its key"): a "#"
// that starts a field begins a comment, as in a Caddyfile.
func TestKeysFileSkipsTrailingComments(t *testing.T) {
	file := "batch-nightly " + hashOf("sk-nightly") + "   # sha256 of its key\n" +
		"batch-evals\t" + hashOf("sk-evals") + "\t#evals\n" +
		"team#1 " + hashOf("sk-team") + "\n"
	k, err := ParseKeys(strings.NewReader(file), "llm-keys")
	if err != nil {
		t.Fatal(err)
	}
	for key, want := range map[string]string{"sk-nightly": "batch-nightly", "sk-evals": "batch-evals", "sk-team": "team#1"} {
		if got, ok := k.Lookup(key); !ok || got != want {
			t.Errorf("key %s: expected %s, got %q (%v)", key, want, got, ok)
		}
	}
	if _, err := ParseKeys(strings.NewReader("alice # no hash\n"), "f"); err == nil || !strings.Contains(err.Error(), "f:1: expected") {
		t.Errorf("a line whose hash is a comment: expected f:1: expected..., got %v", err)
	}
}

// A reload that moves a consumer to another plan (the counts shared
// through the pool, ShareCounts) reports it on its new plan at once, not
// on the plan of its last admitted request; one moved off every plan is
// listed on none, with no limits.
func TestReportFollowsTheConfigsPlans(t *testing.T) {
	old := registry(t, []Plan{{Name: "team-a", RPM: 10}, {Name: "team-b", RPM: 100}}, map[string]string{"alice": "team-a", "bob": "team-a"})
	if _, ref := old.Admit(t0, "alice", "g", 1); ref != nil {
		t.Fatal(ref)
	}
	if _, ref := old.Admit(t0, "bob", "g", 1); ref != nil {
		t.Fatal(ref)
	}
	reloaded := registry(t, []Plan{{Name: "team-a", RPM: 10}, {Name: "team-b", RPM: 100}}, map[string]string{"alice": "team-b"})
	reloaded.ShareCounts(old.Counts())
	u := reloaded.Report(t0.Add(time.Second))
	if len(u) != 2 || u[0].Consumer != "alice" || u[0].Plan != "team-b" || u[0].RPM != 100 || u[0].Requests != 1 {
		t.Errorf("expected alice on team-b (rpm 100) with her 1 request, got %+v", u)
	}
	if len(u) == 2 && (u[1].Consumer != "bob" || u[1].Plan != "" || u[1].RPM != 0 || u[1].Requests != 1) {
		t.Errorf("expected bob on no plan, no rpm, with his 1 request, got %+v", u[1])
	}
}
