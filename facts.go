package llmrouter

import (
	"slices"

	"github.com/caddyserver/caddy/v2"
)

// What the registered provider types state of themselves: the facts of
// package provider's optional interfaces (provider.KeyHeader, TraceNamer,
// Continuer, CachePricer) and, on the module, the Caddyfile options of its own
// (ProviderOptions). Nothing here is a table keyed by a type's name, so a
// third party's type built in with xcaddy states its facts as the built-in
// ones do.

// ProviderOptions is a provider type's module whose Caddyfile block takes
// subdirectives of its own (those its UnmarshalCaddyfile hands
// ParseProviderBlock's own function), named so that a misplaced or
// mistyped one is told where it belongs: "unknown subdirective region in
// provider (an option of type bedrock, vertex)", `(did you mean
// "responses"?)`.
//
// Asked only when a provider block holds a subdirective its type does not
// take. Default: the type's options are named in no such error.
type ProviderOptions interface {
	// ProviderOptions returns the names of the type's own subdirectives.
	ProviderOptions() []string
}

// ProviderOptions implements ProviderOptions.
func (*OpenAI) ProviderOptions() []string { return []string{"responses", "continuation"} }

// ProviderOptions implements ProviderOptions.
func (*Bedrock) ProviderOptions() []string { return []string{"region", "profile", "role_arn"} }

// ProviderOptions implements ProviderOptions.
func (*Vertex) ProviderOptions() []string { return []string{"project", "region", "credentials_file"} }

// typesWith lists the registered provider types (their names, sorted) whose
// module, new, has what has asks of it.
func typesWith(has func(caddy.Module) bool) []string {
	var names []string
	for _, info := range caddy.GetModules(ProviderNamespace) {
		if has(info.New()) {
			names = append(names, info.ID.Name())
		}
	}
	slices.Sort(names)
	return names
}

// typeOptions are the registered types' own options, each once, sorted.
func typeOptions() []string {
	var keys []string
	typesWith(func(m caddy.Module) bool {
		if o, ok := m.(ProviderOptions); ok {
			keys = append(keys, o.ProviderOptions()...)
		}
		return false
	})
	slices.Sort(keys)
	return slices.Compact(keys)
}

// Interface guards
var (
	_ ProviderOptions = (*OpenAI)(nil)
	_ ProviderOptions = (*Bedrock)(nil)
	_ ProviderOptions = (*Vertex)(nil)
)
