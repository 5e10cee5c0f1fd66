package llmrouter

import (
	"fmt"
	"strings"
)

// Subdirective names, for "did you mean" in config errors.
var (
	handlerKeys    = []string{"deadline", "max_attempts", "backoff_base", "backoff_max", "max_body", "priority", "reserve", "store", "weights", "provider", "model"}
	providerKeys   = []string{"type", "base_url", "api_key", "timeout", "ttft_timeout", "idle_timeout", "header", "transport"}
	modelKeys      = []string{"deployment", "fallback_group"}
	deploymentKeys = []string{"cost_input", "cost_output", "quality", "context_window", "weight", "tier", "rpm", "tpm"}
	storeKeys      = []string{"key_prefix", "timeout", "poll_interval"}
)

// suggest returns ` (did you mean "x"?)` for the known name nearest to
// key, when it is near enough to be a typo (an edit distance of at most a
// third of its length, and at least 1) or key is the start of only that
// name (4 bytes or more: "fallback" for "fallback_group"), else "".
func suggest(key string, known []string) string {
	best, bestD := "", len(key)+1
	prefixOf, prefixes := "", 0
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
		return ""
	}
	return fmt.Sprintf(" (did you mean %q?)", best)
}

// editDistance is the Levenshtein distance between a and b (bytes).
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}
