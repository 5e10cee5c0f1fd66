package llmrouter

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddytest"
)

// TestCaddyfileAdapt checks each testdata/caddyfile_adapt/*.caddyfiletest:
// a Caddyfile, a line of dashes, and the JSON that `caddy adapt` must give.
func TestCaddyfileAdapt(t *testing.T) {
	files, err := filepath.Glob("testdata/caddyfile_adapt/*.caddyfiletest")
	if err != nil || len(files) == 0 {
		t.Fatalf("expected golden files, got %v %v", files, err)
	}
	for _, f := range files {
		raw, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		parts := strings.SplitN(string(raw), "----------", 2)
		if len(parts) != 2 {
			t.Fatalf("%s: expected a Caddyfile and JSON separated by ----------", f)
		}
		if !caddytest.CompareAdapt(t, f, parts[0], "caddyfile", strings.TrimSpace(parts[1])) {
			t.Errorf("%s: adapted JSON differs", f)
		}
	}
}

func TestCaddyfileErrors(t *testing.T) {
	const providers = `provider p {
		type openai
		api_key none
		base_url http://127.0.0.1:1/v1
	}`
	for _, tc := range []struct {
		name, input, want string
	}{
		{"unknown subdirective", `llm_router { bogus 1 ` + "\n" + providers + "\n model m {\n deployment p x\n }\n}", "unknown subdirective bogus"},
		{"duplicate subdirective", "llm_router {\n deadline 1s\n deadline 2s\n" + providers + "\n model m {\n deployment p x\n }\n}", "duplicate subdirective deadline"},
		{"negative duration", "llm_router {\n deadline -1s\n" + providers + "\n model m {\n deployment p x\n }\n}", "must not be negative"},
		{"negative provider timeout", "llm_router {\n provider p {\n type openai\n api_key none\n base_url http://h/v1\n timeout -5s\n }\n model m {\n deployment p x\n }\n}", "must not be negative"},
		{"unknown provider", "llm_router {\n" + providers + "\n model m {\n deployment nope x\n }\n}", `model m: deployment names unknown provider "nope" (configured: p), at Testfile:8`},
		{"duplicate deployment", "llm_router {\n" + providers + "\n model m {\n deployment p x\n deployment p x\n }\n}", "twice"},
		{"empty model group", "llm_router {\n" + providers + "\n model m {\n }\n}", "has no deployment"},
		{"no model", "llm_router {\n" + providers + "\n}", "no model group: add a `model` block, at Testfile:1"},
		{"duplicate provider", "llm_router {\n" + providers + "\n" + providers + "\n model m {\n deployment p x\n }\n}", "duplicate provider p"},
		{"duplicate provider field", "llm_router {\n provider p {\n type openai\n api_key none\n type openai\n base_url http://h\n }\n model m {\n deployment p x\n }\n}", "duplicate subdirective type"},
		{"unknown provider field", "llm_router {\n provider p {\n type openai\n api_key none\n base_url http://h\n colour red\n }\n model m {\n deployment p x\n }\n}", "unknown subdirective colour"},
		{"provider without type", "llm_router {\n provider p {\n base_url http://h\n }\n model m {\n deployment p x\n }\n}", "needs a type"},
		{"deployment arity", "llm_router {\n" + providers + "\n model m {\n deployment p\n }\n}", "deployment takes"},
		{"quality range", "llm_router {\n" + providers + "\n model m {\n deployment p x {\n quality 2\n }\n }\n}", "quality must be within"},
		{"bad weight feature", "llm_router {\n weights speed 1\n" + providers + "\n model m {\n deployment p x\n }\n}", "unknown feature speed"},
		{"max_attempts zero", "llm_router {\n max_attempts 0\n" + providers + "\n model m {\n deployment p x\n }\n}", "at least 1"},
		{"resume mode", "llm_router {\n resume sometimes\n" + providers + "\n model m {\n deployment p x\n }\n}", `resume: "sometimes" is not one of same_model, any, off`},
		{"negative hedge_after", "llm_router {\n hedge_after -1s\n" + providers + "\n model m {\n deployment p x\n }\n}", "must not be negative"},
		{"continuation value", "llm_router {\n provider p {\n type openai\n api_key none\n base_url http://h/v1\n continuation maybe\n }\n model m {\n deployment p x\n }\n}", `continuation: "maybe" is not one of none, prefill, prefix, continue_final_message`},
		{"continuation of another type", "llm_router {\n provider p {\n type anthropic\n api_key none\n base_url http://h/v1\n continuation prefix\n }\n model m {\n deployment p x\n }\n}", "openai"},
		{"NaN cost", "llm_router {\n" + providers + "\n model m {\n deployment p x {\n cost_input NaN\n }\n }\n}", "model m: cost_input must be from 0 to 1e+06 USD per 1M tokens, got NaN, at Testfile:9"},
		{"Inf weight", "llm_router {\n weights cost +Inf\n" + providers + "\n model m {\n deployment p x\n }\n}", "weights: cost must be a finite number, not negative, got +Inf, at Testfile:2"},
		{"max_queued zero", "llm_router {\n" + providers + "\n model m {\n max_queued 0\n deployment p x\n }\n}", "max_queued must be at least 1, got 0 (leave max_queued out for its default), at Testfile:8"},
		{"max_queued twice", "llm_router {\n" + providers + "\n model m {\n max_queued 5\n max_queued 6\n deployment p x\n }\n}", "duplicate subdirective max_queued in model m"},
		{"misplaced max_queued", "llm_router {\n max_queued 5\n" + providers + "\n model m {\n deployment p x\n }\n}", "(max_queued belongs in a model block)"},
		{"bad stream size", "llm_router {\n max_stream_bytes 0\n" + providers + "\n model m {\n deployment p x\n }\n}", `max_stream_bytes: invalid size "0"`},
		{"max_stream_bytes twice", "llm_router {\n max_stream_bytes 1MiB\n max_stream_bytes 2MiB\n" + providers + "\n model m {\n deployment p x\n }\n}", "duplicate subdirective max_stream_bytes"},
		{"bad size", "llm_router {\n max_body lots\n" + providers + "\n model m {\n deployment p x\n }\n}", "invalid size"},
		{"backoff", "llm_router {\n backoff_base 2s\n backoff_max 1s\n" + providers + "\n model m {\n deployment p x\n }\n}", "must not exceed backoff_max"},
		{"priority braces", "llm_router {\n priority \"x{\"\n" + providers + "\n model m {\n deployment p x\n }\n}", "unbalanced braces"},
		{"priority range", "llm_router {\n priority 12\n" + providers + "\n model m {\n deployment p x\n }\n}", "whole number from 0 to 9"},
		{"reserve syntax", "llm_router {\n reserve 20% for 7\n" + providers + "\n model m {\n deployment p x\n }\n}", "expected reserve <percent>% for priority >= <n>"},
		{"reserve share", "llm_router {\n reserve 100% for priority >= 7\n" + providers + "\n model m {\n deployment p x\n }\n}", "less than 100%"},
		{"reserve priority", "llm_router {\n reserve 20% for priority >= 0\n" + providers + "\n model m {\n deployment p x\n }\n}", "from 1 to 9"},
		{"did you mean base_url", "llm_router {\n provider p {\n type openai\n api_key none\n baseurl http://h\n }\n model m {\n deployment p x\n }\n}", `unknown subdirective baseurl in provider (did you mean "base_url"?)`},
		{"did you mean model", "llm_router {\n" + providers + "\n modle m { deployment p x } }", `unknown subdirective modle (did you mean "model"?)`},
		{"misplaced fallback_group", "llm_router {\n fallback_group x\n" + providers + "\n model m {\n deployment p x\n }\n}", `unknown subdirective fallback_group (fallback_group belongs in a model block)`},
		{"misplaced tier", "llm_router {\n provider p {\n type openai\n api_key none\n base_url http://h\n tier 2\n }\n model m {\n deployment p x\n }\n}", `(tier belongs in a deployment block)`},
		{"capitals", "llm_router {\n provider p {\n type openai\n api_key none\n BASE_URL http://h\n }\n model m {\n deployment p x\n }\n}", `(did you mean "base_url"?)`},
		{"fallback_group block", "llm_router {\n" + providers + "\n model m {\n fallback_group n {\n }\n deployment p x\n }\n model n { deployment p y }\n}", "fallback_group takes one model group name, no block"},
		{"did you mean deadline", "llm_router {\n dedline 5s\n" + providers + "\n model m {\n deployment p x\n }\n}", `unknown subdirective dedline (did you mean "deadline"?)`},
		{"did you mean context_window", "llm_router {\n" + providers + "\n model m {\n deployment p x {\n context_windows 8000\n }\n }\n}", `(did you mean "context_window"?)`},
		{"no suggestion far off", "llm_router {\n" + providers + "\n model m {\n deployment p x {\n colour red\n }\n }\n}", `unknown subdirective colour in deployment, at`},
		{"tier range", "llm_router {\n" + providers + "\n model m {\n deployment p x {\n tier 0\n }\n }\n}", "tier must be at least 1, got 0 (leave tier out for its default), at Testfile:9"},
		{"base_url endpoint", "llm_router {\n provider p {\n type openai\n api_key none\n base_url https://api.openai.com/v1/chat/completions\n }\n model m {\n deployment p x\n }\n}", "is an endpoint: give the API root (without /chat/completions)"},
		{"base_url scheme", "llm_router {\n provider p {\n type openai\n api_key none\n base_url api.openai.com/v1\n }\n model m {\n deployment p x\n }\n}", "must be an absolute http or https URL"},
		{"affinity word", "llm_router {\n affinity off\n" + providers + "\n model m {\n deployment p x\n }\n}", `affinity: "off" is not body, none or a placeholder`},
		{"base_url query", "llm_router {\n provider p {\n type openai\n api_key none\n base_url http://user:pt-password-9876@h/v1?api-key=querysecret123\n }\n model m {\n deployment p x\n }\n}", `base_url "http://xxxxx@h/v1?api-key=xxxxx": must not have a query or fragment (the provider type appends the API path), at Testfile:5`},
		{"base_url endpoint masked", "llm_router {\n provider p {\n type openai\n api_key none\n base_url https://ops:hunter2hunter2@api.openai.com/v1/chat/completions\n }\n model m {\n deployment p x\n }\n}", `base_url "https://xxxxx@api.openai.com/v1/chat/completions" is an endpoint`},
		{"fallback unknown", "llm_router {\n" + providers + "\n model m {\n deployment p x\n fallback_group nope\n }\n}", `model m: fallback_group names unknown model group "nope" (configured: m), at Testfile:9`},
		{"fallback loop", "llm_router {\n" + providers + "\n model a {\n fallback_group b\n deployment p x\n }\n model b {\n fallback_group c\n deployment p y\n }\n model c {\n fallback_group a\n deployment p z\n }\n}", "model a: fallback_group makes a loop: a -> b -> c -> a, at Testfile:8"},
		{"fallback to itself", "llm_router {\n" + providers + "\n model a {\n fallback_group a\n deployment p x\n }\n}", "model a: fallback_group makes a loop: a -> a"},
		{"fallback twice", "llm_router {\n" + providers + "\n model a {\n fallback_group b\n fallback_group b\n deployment p x\n }\n model b { deployment p y }\n}", "duplicate subdirective fallback_group in model a"},
		{"did you mean fallback_group", "llm_router {\n" + providers + "\n model a {\n fallback b\n deployment p x\n }\n}", `(did you mean "fallback_group"?)`},
		{"no api_key", "llm_router {\n provider p {\n type openai\n base_url http://h/v1\n }\n model m {\n deployment p x\n }\n}", "provider p: needs an api_key, usually {env.NAME}; write `api_key none` for a server that takes no key (a local vLLM or Ollama), at Testfile:2"},
		{"empty credential header", "llm_router {\n provider p {\n type openai\n base_url http://h/v1\n header Authorization \"Bearer \"\n }\n model m {\n deployment p x\n }\n}", "provider p: needs an api_key"},
		{"pass_through unknown", "llm_router {\n pass_through nope\n" + providers + "\n model m {\n deployment p x\n }\n}", `pass_through names unknown provider "nope" (configured: p)`},
		{"alias twice", "llm_router {\n" + providers + "\n model a {\n alias x\n deployment p x\n }\n model b {\n alias x\n deployment p y\n }\n}", `model b: alias "x" is already the name or an alias of model a`},
		{"alias of a group", "llm_router {\n" + providers + "\n model a {\n alias b\n deployment p x\n }\n model b {\n deployment p y\n }\n}", `alias "b" is already the name or an alias of model b`},
		{"alias pattern", "llm_router {\n" + providers + "\n model a {\n alias a-*\n deployment p x\n }\n}", "is a pattern; aliases are exact names"},
		{"alias arity", "llm_router {\n" + providers + "\n model a {\n alias\n deployment p x\n }\n}", "wrong argument count"},
		{"bad pattern", "llm_router {\n" + providers + "\n model claude-[ {\n deployment p x\n }\n}", "model claude-[: a malformed pattern"},
		{"openai responses", "llm_router {\n provider p {\n type openai\n api_key none\n base_url http://h/v1\n responses sometimes\n }\n model m {\n deployment p x\n }\n}", `responses: "sometimes" is neither native nor chat`},
		{"bad header", "llm_router {\n provider p {\n type openai\n api_key none\n base_url http://h\n header \"Bad Name\" v\n }\n model m {\n deployment p x\n }\n}", "not a valid header name"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var h Handler
			err := h.UnmarshalCaddyfile(caddyfile.NewTestDispenser(tc.input))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("expected an error containing %q, got %v", tc.want, err)
			}
		})
	}
}
