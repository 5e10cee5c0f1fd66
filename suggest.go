package llmrouter

import (
	"fmt"
	"slices"
	"strings"

	"github.com/caddyserver/caddy/v2"
)

// Subdirective names, for "did you mean" in config errors.
var (
	handlerKeys    = []string{"deadline", "max_attempts", "resume", "hedge_after", "backoff_base", "backoff_max", "max_body", "max_stream_bytes", "priority", "affinity", "pass_through", "reserve", "store", "weights", "provider", "model", "consumer", "keys", "plan", "consumers"}
	providerKeys   = []string{"type", "base_url", "api_key", "timeout", "ttft_timeout", "idle_timeout", "header", "organization", "transport"}
	modelKeys      = []string{"deployment", "fallback_group", "alias", "budget", "max_queued"}
	deploymentKeys = []string{"cost_input", "cost_output", "cost_cached_input", "cost_cache_write", "cost_cache_write_1h", "quality", "context_window", "weight", "tier", "rpm", "tpm", "budget"}
	storeKeys      = []string{"key_prefix", "timeout", "poll_interval"}
)

// providerKeyHint is what an unknown subdirective of a provider block is
// told: the types that take it as an option of their own (ProviderOptions),
// else the nearest name a provider block takes (suggest).
func providerKeyHint(key string) string {
	types := typesWith(func(m caddy.Module) bool {
		o, ok := m.(ProviderOptions)
		return ok && slices.Contains(o.ProviderOptions(), key)
	})
	if len(types) > 0 {
		return fmt.Sprintf(" (an option of type %s)", strings.Join(types, ", "))
	}
	return suggest(key, append(slices.Clone(providerKeys), typeOptions()...))
}

// suggest returns ` (did you mean "x"?)` for the known name nearest to
// key, when it is near enough to be a typo (an edit distance of at most a
// third of its length, and at least 1) or key is the start of only that
// name (4 bytes or more: "fallback" for "fallback_group"), else "".
func suggest(key string, known []string) string {
	best, bestD := "", len(key)+1
	prefixOf, prefixes := "", 0
	key = strings.ToLower(key) // BASE_URL is base_url
	for _, k := range known {
		if d := editDistance(key, k); d < bestD {
			best, bestD = k, d
		}
		if len(key) >= 4 && strings.HasPrefix(k, key) {
			prefixOf, prefixes = k, prefixes+1
		}
	}
	switch {
	case best != "" && bestD <= max(1, len(best)/3):
	case prefixes == 1:
		best = prefixOf
	default:
		return misplaced(key)
	}
	return fmt.Sprintf(" (did you mean %q?)", best)
}

// misplaced returns ` (x belongs in a y block)` for the name of another
// block's subdirective, else "".
func misplaced(key string) string {
	for _, b := range []struct {
		block string
		keys  []string
	}{{"llm_router", handlerKeys}, {"provider", providerKeys}, {"model", modelKeys}, {"deployment", deploymentKeys}, {"store", storeKeys}} {
		if slices.Contains(b.keys, strings.ToLower(key)) {
			return fmt.Sprintf(" (%s belongs in a %s block)", strings.ToLower(key), b.block)
		}
	}
	return ""
}

// editDistance is the optimal string alignment distance between a and b
// (bytes): insertions, deletions, substitutions and transpositions of two
// neighbours ("modle" is 1 from "model") each count 1.
func editDistance(a, b string) int {
	d := make([][]int, len(a)+1)
	for i := range d {
		d[i] = make([]int, len(b)+1)
		d[i][0] = i
	}
	for j := range d[0] {
		d[0][j] = j
	}
	for i := 1; i <= len(a); i++ {
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			d[i][j] = min(d[i-1][j]+1, d[i][j-1]+1, d[i-1][j-1]+cost)
			if i > 1 && j > 1 && a[i-1] == b[j-2] && a[i-2] == b[j-1] {
				d[i][j] = min(d[i][j], d[i-2][j-2]+1)
			}
		}
	}
	return d[len(a)][len(b)]
}
