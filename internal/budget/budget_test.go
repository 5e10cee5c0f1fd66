package budget

import (
	"math"
	"strings"
	"testing"
	"time"
)

// `budget <USD> per <duration>`: an amount ("$" allowed) per a duration;
// what is not one is an error that says what is expected.
func TestParse(t *testing.T) {
	if l, err := Parse([]string{"$2.5", "per", "24h"}, time.ParseDuration); err != nil || l != (Limit{USD: 2.5, Per: 24 * time.Hour}) {
		t.Errorf("got %+v %v", l, err)
	}
	for args, want := range map[string]string{
		"5":           "budget takes <USD> per <duration>",
		"5 each 1h":   "budget takes <USD> per <duration>",
		"five per 1h": `budget: "five" is not an amount of USD`,
		"5 per soon":  `budget: bad duration "soon"`,
		"0 per 1h":    "budget must be more than 0 USD",
		"NaN per 1h":  "budget must be more than 0 USD",
		"Inf per 1h":  "budget must be more than 0 USD",
		"5 per 10ms":  "budget period must be at least 1s",
	} {
		if _, err := Parse(strings.Fields(args), time.ParseDuration); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v, want %q", args, err, want)
		}
	}
	if err := (Limit{USD: math.Inf(1), Per: time.Hour}).Validate(); err == nil {
		t.Error("an infinite budget validated")
	}
}

// One deployment, one budget: given in one group, or the same in several;
// two different ones are an error naming both groups.
func TestPerDeployment(t *testing.T) {
	a, b := &Limit{USD: 1, Per: time.Hour}, &Limit{USD: 2, Per: time.Hour}
	got, err := PerDeployment([]Listing{{"id1", "p/x", "m", a}, {"id1", "p/x", "n", nil}, {"id1", "p/x", "o", &Limit{USD: 1, Per: time.Hour}}, {"id2", "p/y", "m", nil}})
	if _, has := got["id2"]; err != nil || len(got) != 1 || got["id1"] != *a || has {
		t.Errorf("got %v %v", got, err)
	}
	_, err = PerDeployment([]Listing{{"id1", "p/x", "m", a}, {"id1", "p/x", "n", b}})
	if err == nil || err.Error() != "deployment p/x has two budgets (in model m and model n): give it one" {
		t.Errorf("two budgets: %v", err)
	}
}
