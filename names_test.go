package llmrouter

import (
	"slices"
	"testing"

	"github.com/llmrouter/caddy-llm-router/internal/router"
)

// A name a client sends finds its group: an exact name or alias first,
// then the most specific pattern; a name nothing takes, none.
func TestModelNames(t *testing.T) {
	models := map[string]*ModelGroup{
		"claude-*":          {},
		"claude-sonnet-*":   {Aliases: []string{"sonnet"}},
		"claude-sonnet-4-5": {},
		"gpt-5":             {Aliases: []string{"gpt-5-2025-08-07", "best"}},
		"o?":                {},
	}
	if err := namesProblem(models); err != nil {
		t.Fatal(err)
	}
	groups := map[string]*router.Group{}
	for name := range models {
		groups[name] = router.NewGroup(name, nil)
	}
	n := newNames(groups, models)
	for sent, want := range map[string]string{
		"claude-sonnet-4-5":          "claude-sonnet-4-5", // exact beats both patterns
		"claude-sonnet-4-5-20250929": "claude-sonnet-*",   // the more specific pattern
		"claude-opus-4-1":            "claude-*",
		"sonnet":                     "claude-sonnet-*",
		"gpt-5-2025-08-07":           "gpt-5",
		"best":                       "gpt-5",
		"o3":                         "o?",
		"o3-mini":                    "",
		"gpt-4o":                     "",
		"claude-*":                   "claude-*",
	} {
		g, ok := n.group(sent)
		switch {
		case want == "" && ok:
			t.Errorf("%s: expected no group, got %s", sent, g.Name)
		case want != "" && (!ok || g.Name != want):
			t.Errorf("%s: expected %s, got %v", sent, want, g)
		}
	}
	want := []string{"best", "claude-*", "claude-sonnet-*", "claude-sonnet-4-5", "gpt-5", "gpt-5-2025-08-07", "o?", "sonnet"}
	if got := n.list(); !slices.Equal(got, want) {
		t.Errorf("list: expected %v, got %v", want, got)
	}
}
