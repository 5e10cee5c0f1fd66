// Package budget holds the spending limits of deployments and model
// groups (the config's `budget <USD> per <duration>`): the rules a budget
// keeps, its Caddyfile form, and which budget each deployment has when
// several model groups list it. What a budget spent is counted by
// capacity.Spending; the root's Caddy module keeps the spendings across
// config reloads (Caddy's UsagePool) and gives them to the router.
package budget

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/llmrouter/caddy-llm-router/internal/capacity"
)

// Limit is a spending limit: at most USD (US dollars, more than 0) per
// Per (at least a second), in fixed windows of Per from the Unix epoch
// (per 24h renews at 00:00 UTC, per 1h on the hour).
type Limit struct {
	USD float64
	Per time.Duration
}

// Validate reports a limit that is not one: USD not more than 0 (or not
// finite), Per shorter than a second.
func (l Limit) Validate() error {
	switch {
	case !(l.USD > 0) || math.IsInf(l.USD, 0):
		return fmt.Errorf("budget must be more than 0 USD, got %v", l.USD)
	case l.Per < time.Second:
		return fmt.Errorf("budget period must be at least 1s, got %s", l.Per)
	}
	return nil
}

// Spend is the limit as capacity.Spending counts it.
func (l Limit) Spend() capacity.SpendLimit {
	return capacity.SpendLimit{USD: l.USD, Period: l.Per}
}

// Parse reads the arguments of `budget <USD> per <duration>`: an amount
// ("$5" is 5) and a duration read by parseDuration (Caddy's, which takes
// "1d"); the limit is validated.
func Parse(args []string, parseDuration func(string) (time.Duration, error)) (Limit, error) {
	if len(args) != 3 || args[1] != "per" {
		return Limit{}, fmt.Errorf("budget takes <USD> per <duration>, such as: budget 50 per 24h")
	}
	usd, err := strconv.ParseFloat(strings.TrimPrefix(args[0], "$"), 64)
	if err != nil {
		return Limit{}, fmt.Errorf("budget: %q is not an amount of USD", args[0])
	}
	per, err := parseDuration(args[2])
	if err != nil {
		return Limit{}, fmt.Errorf("budget: bad duration %q: %v", args[2], err)
	}
	l := Limit{USD: usd, Per: per}
	return l, l.Validate()
}

// Listing is one deployment as a model group lists it: its identity (its
// account and model), its name for errors ("<provider>/<model>"), the
// group, and the budget it is given there (nil: none).
type Listing struct {
	Identity, Name, Group string
	Limit                 *Limit
}

// PerDeployment returns the budget of each deployment (by identity) of
// listings: one deployment is one account and model, so it has one
// budget, given in any of the groups that list it (the others give none,
// or the same). Two different budgets of one deployment are an error that
// names both groups.
func PerDeployment(listings []Listing) (map[string]Limit, error) {
	out := map[string]Limit{}
	where := map[string]string{}
	for _, l := range listings {
		if l.Limit == nil {
			continue
		}
		if prev, ok := out[l.Identity]; ok && prev != *l.Limit {
			return nil, fmt.Errorf("deployment %s has two budgets (in model %s and model %s): give it one", l.Name, where[l.Identity], l.Group)
		}
		out[l.Identity], where[l.Identity] = *l.Limit, l.Group
	}
	return out, nil
}

// GroupScope and DeploymentScope name what a budget limits, for the pool
// that keeps spendings across reloads; StoreKey is a scope's key in the
// fleet's store.
func GroupScope(name string) string          { return "group|" + name }
func DeploymentScope(identity string) string { return "deployment|" + identity }
func StoreKey(scope string) string           { return "budget:" + scope }
