package llmrouter

import (
	"cmp"
	"errors"
	"fmt"
	"path"
	"slices"
	"strconv"
	"strings"

	"github.com/llmrouter/caddy-llm-router/internal/router"
)

// Model names as clients send them: a model group's name is exact, or a
// pattern (path.Match syntax: `*`, `?`, `[...]`) that takes every name it
// matches, so that agents sending dated model ids (claude-sonnet-4-5-20250929)
// need no config change per release; ModelGroup.Aliases add exact names.
// Exact names and aliases win over patterns; among patterns the most
// specific (the most characters that are not wildcards), then the first
// by name.

// isPattern reports whether a model group's name is a pattern.
func isPattern(name string) bool { return strings.ContainsAny(name, `*?[\`) }

// namesProblem checks the groups' names and aliases: patterns well formed,
// aliases exact and not empty, no name given twice.
func namesProblem(models map[string]*ModelGroup) error {
	owner := map[string]string{}
	for _, name := range sortedKeys(models) {
		owner[name] = name
		if isPattern(name) {
			if _, err := path.Match(name, ""); err != nil {
				return within(fmt.Errorf("a malformed pattern (%v)", err), "model "+name+": ", "models", name)
			}
		}
	}
	for _, name := range sortedKeys(models) {
		g := models[name]
		if g == nil {
			continue
		}
		for i, a := range g.Aliases {
			var err error
			switch {
			case a == "":
				err = errors.New("an empty alias")
			case isPattern(a):
				err = fmt.Errorf("alias %q is a pattern; aliases are exact names (a pattern goes in the model's own name)", a)
			case owner[a] != "":
				err = fmt.Errorf("alias %q is already the name or an alias of model %s", a, owner[a])
			}
			if err != nil {
				return within(err, "model "+name+": ", "models", name, "aliases", strconv.Itoa(i))
			}
			owner[a] = name
		}
	}
	return nil
}

// names is how a handler finds a model group by the name a client sent.
type names struct {
	exact    map[string]*router.Group // names and aliases
	patterns []pattern                // most specific first
}

type pattern struct {
	glob  string
	group *router.Group
}

// newNames indexes groups (by their names) with their configs' aliases.
func newNames(groups map[string]*router.Group, models map[string]*ModelGroup) names {
	n := names{exact: map[string]*router.Group{}}
	for name, g := range groups {
		if isPattern(name) {
			n.patterns = append(n.patterns, pattern{name, g})
		} else {
			n.exact[name] = g
		}
		if m := models[name]; m != nil {
			for _, a := range m.Aliases {
				n.exact[a] = g
			}
		}
	}
	literal := func(p string) int {
		k := 0
		for _, c := range p {
			if !strings.ContainsRune(`*?[]\`, c) {
				k++
			}
		}
		return k
	}
	slices.SortFunc(n.patterns, func(a, b pattern) int {
		return cmp.Or(cmp.Compare(literal(b.glob), literal(a.glob)), cmp.Compare(a.glob, b.glob))
	})
	return n
}

// group returns the model group that serves the name a client sent.
func (n names) group(model string) (*router.Group, bool) {
	if g, ok := n.exact[model]; ok {
		return g, true
	}
	if len(model) > 256 {
		return nil, false
	}
	for _, p := range n.patterns {
		if ok, _ := path.Match(p.glob, model); ok {
			return p.group, true
		}
	}
	return nil, false
}

// list is every name /v1/models shows: groups (patterns as written) and
// aliases, sorted.
func (n names) list() []string {
	out := make([]string, 0, len(n.exact)+len(n.patterns))
	for name := range n.exact {
		out = append(out, name)
	}
	for _, p := range n.patterns {
		out = append(out, p.glob)
	}
	slices.Sort(out)
	return out
}
