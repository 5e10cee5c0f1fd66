package llmrouter

import (
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
)

// `budget <USD> per <duration>` in a deployment and a model group block,
// and its errors.
func TestBudgetConfig(t *testing.T) {
	var h Handler
	if err := h.UnmarshalCaddyfile(caddyfile.NewTestDispenser(`llm_router {
		provider p {
			type openai
			base_url http://127.0.0.1:1/v1
			api_key none
		}
		model m {
			budget $50 per 24h
			deployment p x {
				cost_input 1
				cost_cached_input 0.1
				budget 2.5 per 1h
			}
		}
	}`)); err != nil {
		t.Fatal(err)
	}
	mg := h.Models["m"]
	if mg.Budget == nil || mg.Budget.USD != 50 || time.Duration(mg.Budget.Per) != 24*time.Hour ||
		mg.Deployments[0].Budget.USD != 2.5 || *mg.Deployments[0].CostCachedInput != 0.1 {
		t.Fatalf("parsed %+v %+v", mg, mg.Deployments[0])
	}
	if err := h.Provision(newCaddyContext(t)); err != nil {
		t.Fatal(err)
	}
	defer h.Cleanup()
	g := h.groups["m"]
	if g.Spending == nil || g.Deployments[0].Spending == nil || g.Deployments[0].Spending.Limit().USD != 2.5 || g.Deployments[0].CostCached != 0.1 {
		t.Errorf("provisioned %+v", g)
	}
	for input, want := range map[string]string{
		"budget 5":                         "budget takes <USD> per <duration>",
		"budget 5 each 1h":                 "budget takes <USD> per <duration>",
		"budget five per 1h":               `budget: "five" is not an amount of USD`,
		"budget 0 per 1h":                  "budget must be more than 0 USD",
		"budget 5 per 10ms":                "budget period must be at least 1s",
		"budget 5 per 1h\nbudget 6 per 1h": "duplicate subdirective budget in model m",
	} {
		var h Handler
		err := h.UnmarshalCaddyfile(caddyfile.NewTestDispenser("llm_router {\nprovider p {\ntype openai\nbase_url http://h\napi_key none\n}\nmodel m {\n" + input + "\ndeployment p x\n}\n}"))
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v, want %q", input, err, want)
		}
	}
}

// A budget changed by a reload keeps what was spent in its window; one
// deployment has one budget, in whichever groups list it.
func TestBudgetReloads(t *testing.T) {
	load := func(budget, other string) (*Handler, error) {
		var h Handler
		if err := h.UnmarshalCaddyfile(caddyfile.NewTestDispenser(`llm_router {
			provider p {
				type openai
				base_url http://127.0.0.1:1/v1
				api_key none
			}
			model m {
				deployment p x {
					budget ` + budget + `
				}
			}
			model n {
				deployment p x ` + other + `
			}
		}`)); err != nil {
			return nil, err
		}
		return &h, h.Provision(newCaddyContext(t))
	}
	h1, err := load("1 per 1h", "")
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	sp := h1.groups["m"].Deployments[0].Spending
	if sp == nil || h1.groups["n"].Deployments[0].Spending != sp {
		t.Fatalf("one deployment, one budget: %p %p", sp, h1.groups["n"].Deployments[0].Spending)
	}
	sp.Add(now, 0.75)
	h2, err := load("2 per 1h", "")
	if err != nil {
		t.Fatal(err)
	}
	h1.Cleanup()
	defer h2.Cleanup()
	if r := h2.groups["m"].Deployments[0].Spending.Report(now); r.SpentUSD != 0.75 || r.BudgetUSD != 2 {
		t.Errorf("after the reload: %+v, want 0.75 spent of 2", r)
	}
	// A reload that removes the budget of a deployment whose budget is
	// spent lets it back.
	st := h2.groups["m"].Deployments[0].State
	st.BudgetSpent(now, now.Add(time.Hour), "spent")
	h3 := handlerFromCaddyfile(t, "llm_router {\nprovider p {\ntype openai\nbase_url http://127.0.0.1:1/v1\napi_key none\n}\nmodel m {\ndeployment p x\n}\n}")
	defer h3.Cleanup()
	if snap := h3.groups["m"].Deployments[0].State.Snapshot(now); h3.groups["m"].Deployments[0].State != st || !snap.BudgetSpentUntil.IsZero() {
		t.Errorf("budget removed by a reload: still spent until %v", snap.BudgetSpentUntil)
	}
	if _, err := load("1 per 1h", "{\nbudget 2 per 1h\n}"); err == nil || !strings.Contains(err.Error(), "deployment p/x has two budgets (in model m and model n): give it one") {
		t.Errorf("two budgets: %v", err)
	}
}
