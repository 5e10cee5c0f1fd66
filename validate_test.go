package llmrouter

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
)

// ruleConfigs are one configuration written twice, as a Caddyfile and as
// JSON, with a slot for a line of the handler's block, of the model
// group's and of the deployment's, and their JSON members.
func ruleConfigs(level, line, member string) (caddyText, jsonText string) {
	slot := map[string]string{level: line}
	caddyText = "llm_router {\n " + slot["handler"] + "\n provider p {\n  type openai\n  api_key none\n  base_url http://h/v1\n }\n" +
		" model m {\n  " + slot["model"] + "\n  deployment p x {\n   " + slot["deployment"] + "\n  }\n }\n}"
	js := map[string]string{level: member + ","}
	jsonText = `{` + js["handler"] + `"providers":{"p":{"type":"openai","api_key":"none","base_url":"http://h/v1"}},` +
		`"models":{"m":{` + js["model"] + `"deployments":[{` + js["deployment"] + `"provider":"p","model":"x"}]}}}`
	return caddyText, jsonText
}

// lineOf is the 1-based line of text that holds the first line of want.
func lineOf(text, want string) int {
	first, _, _ := strings.Cut(want, "\n")
	for i, l := range strings.Split(text, "\n") {
		if strings.TrimSpace(l) == strings.TrimSpace(first) {
			return i + 1
		}
	}
	return 0
}

// Every rule of the configuration holds for JSON and for a Caddyfile
// alike, with the same message (one validate): the JSON config that
// breaks it fails Provision, the Caddyfile fails with the file and line
// of the value.
func TestEveryRuleHoldsForJSONAndCaddyfile(t *testing.T) {
	for _, tc := range []struct {
		level, caddy, json, want string
	}{
		{"handler", "deadline -1s", `"deadline":-1000000000`, "deadline must not be negative, got -1s"},
		{"handler", "hedge_after -2s", `"hedge_after":-2000000000`, "hedge_after must not be negative, got -2s"},
		{"handler", "backoff_max -1s", `"backoff_max":-1000000000`, "backoff_max must not be negative, got -1s"},
		{"handler", "max_attempts -1", `"max_attempts":-1`, "max_attempts must be at least 1, got -1"},
		{"handler", "affinity off", `"affinity":"off"`, `affinity: "off" is not body, none or a placeholder`},
		{"handler", "resume sometimes", `"resume":"sometimes"`, `resume: "sometimes" is not one of same_model, any, off`},
		{"handler", "priority 12", `"priority":"12"`, "whole number from 0 to 9"},
		{"handler", "reserve 100% for priority >= 7", `"reserve":{"percent":100,"min_priority":7}`, "reserve: the share must be more than 0% and less than 100%, got 100%"},
		{"handler", "reserve 20% for priority >= 12", `"reserve":{"percent":20,"min_priority":12}`, "reserve: the priority must be a whole number from 1 to 9, got 12"},
		{"handler", "max_body 2TiB", `"max_body":2199023255552`, "max_body must not be negative nor more than 1 TiB, got 2199023255552 bytes"},
		{"handler", "max_stream_bytes 2TiB", `"max_stream_bytes":2199023255552`, "max_stream_bytes must not be negative nor more than 1 TiB"},
		{"handler", "weights capacity -1", `"weights":{"capacity":-1}`, "weights: capacity must be a finite number, not negative, got -1"},
		{"handler", "store redis redis://h:6379 {\n timeout -1s\n }", `"store":{"type":"redis","url":"redis://h:6379","timeout":-1}`, "store: timeout and poll_interval must not be negative"},
		{"handler", "pass_through nope", `"pass_through":"nope"`, `pass_through names unknown provider "nope" (configured: p)`},
		{"model", "max_queued 3000000000", `"max_queued":3000000000`, "model m: max_queued must be a whole number from 1 to 2147483647, got 3000000000"},
		{"model", "max_queued -5", `"max_queued":-5`, "model m: max_queued must be a whole number from 1 to 2147483647, got -5"},
		{"model", "fallback_group nope", `"fallback_group":"nope"`, `model m: fallback_group names unknown model group "nope" (configured: m)`},
		{"model", "fallback_group m", `"fallback_group":"m"`, "model m: fallback_group makes a loop: m -> m"},
		{"model", "alias m-*", `"aliases":["m-*"]`, `model m: alias "m-*" is a pattern`},
		{"model", "alias m", `"aliases":["m"]`, `model m: alias "m" is already the name or an alias of model m`},
		{"model", "budget 5 per 10ms", `"budget":{"usd":5,"per":10000000}`, "budget period must be at least 1s, got 10ms"},
		{"deployment", "tier 101", `"tier":101`, "model m: tier must be from 1 to 100, got 101"},
		{"deployment", "tier -1", `"tier":-1`, "model m: tier must be from 1 to 100, got -1"},
		{"deployment", "quality 1.5", `"quality":1.5`, "model m: quality must be within 0..1, got 1.5"},
		{"deployment", "cost_input -1", `"cost_input":-1`, "model m: cost_input must be from 0 to 1e+06 USD per 1M tokens, got -1"},
		{"deployment", "cost_output 2e7", `"cost_output":2e7`, "model m: cost_output must be from 0 to 1e+06 USD per 1M tokens, got 2e+07"},
		{"deployment", "cost_cached_input -1", `"cost_cached_input":-1`, "model m: cost_cached_input must be from 0 to 1e+06 USD per 1M tokens, got -1"},
		{"deployment", "cost_cache_write -1", `"cost_cache_write":-1`, "model m: cost_cache_write must be from 0 to 1e+06 USD per 1M tokens, got -1"},
		{"deployment", "cost_cache_write_1h 2e7", `"cost_cache_write_1h":2e7`, "model m: cost_cache_write_1h must be from 0 to 1e+06 USD per 1M tokens, got 2e+07"},
		{"deployment", "context_window -1", `"context_window":-1`, "model m: context_window must not be negative, got -1"},
		{"deployment", "weight -1", `"weight":-1`, "model m: weight must not be negative, got -1"},
		{"deployment", "rpm -1", `"rpm":-1`, "model m: rpm must not be negative, got -1"},
		{"deployment", "tpm -1", `"tpm":-1`, "model m: tpm must not be negative, got -1"},
		{"deployment", "budget 0 per 1h", `"budget":{"usd":0,"per":3600000000000}`, "budget must be more than 0 USD, got 0"},
	} {
		t.Run(tc.caddy, func(t *testing.T) {
			caddyText, jsonText := ruleConfigs(tc.level, tc.caddy, tc.json)
			h := handlerFromJSON(t, jsonText)
			err := h.Provision(newCaddyContext(t))
			_ = h.Cleanup()
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("JSON: expected an error containing %q, got %v", tc.want, err)
			}
			at := fmt.Sprintf(", at Testfile:%d", lineOf(caddyText, tc.caddy))
			err = new(Handler).UnmarshalCaddyfile(caddyfile.NewTestDispenser(caddyText))
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.HasSuffix(err.Error(), at) {
				t.Errorf("Caddyfile: expected an error containing %q and ending %q, got %v", tc.want, at, err)
			}
		})
	}
}

// A Caddyfile's 0 for a setting whose JSON 0 is the field left out (its
// default) is refused at its line; the JSON 0 loads with the default.
func TestCaddyfileZeroIsNoDefault(t *testing.T) {
	for _, tc := range []struct {
		level, caddy, json, want string
	}{
		{"handler", "max_attempts 0", `"max_attempts":0`, "max_attempts must be at least 1, got 0 (leave max_attempts out for its default)"},
		{"model", "max_queued 0", `"max_queued":0`, "max_queued must be at least 1, got 0 (leave max_queued out for its default)"},
		{"deployment", "tier 0", `"tier":0`, "tier must be at least 1, got 0 (leave tier out for its default)"},
		{"handler", "max_body 0", `"max_body":0`, `max_body: invalid size "0"`},
	} {
		t.Run(tc.caddy, func(t *testing.T) {
			caddyText, jsonText := ruleConfigs(tc.level, tc.caddy, tc.json)
			want := fmt.Sprintf("%s, at Testfile:%d", tc.want, lineOf(caddyText, tc.caddy))
			if err := new(Handler).UnmarshalCaddyfile(caddyfile.NewTestDispenser(caddyText)); err == nil || err.Error() != want {
				t.Errorf("Caddyfile: expected %q, got %v", want, err)
			}
			h := handlerFromJSON(t, jsonText)
			if err := h.Provision(newCaddyContext(t)); err != nil {
				t.Errorf("JSON: expected %s to load as the default, got %v", tc.json, err)
			}
			_ = h.Cleanup()
		})
	}
}

// A key variable that is unset when a Caddyfile's config loads is an
// error at the line that names it (the config loads as JSON, which has
// no lines: the parser remembers them for the provider's JSON).
func TestUnsetKeyVariableHasItsLine(t *testing.T) {
	for _, tc := range []struct{ line, want string }{
		{"api_key {env.LLM_ROUTER_TEST_UNSET_LINE}", "api_key {env.LLM_ROUTER_TEST_UNSET_LINE} is empty once its placeholders are replaced"},
		{`header Authorization "Bearer {env.LLM_ROUTER_TEST_UNSET_LINE}"`, "header Authorization {env.LLM_ROUTER_TEST_UNSET_LINE} is empty once its placeholders are replaced"},
	} {
		caddyText := "llm_router {\n provider p {\n  type openai\n  base_url http://h/v1\n  " + tc.line + "\n }\n model m {\n  deployment p x\n }\n}"
		parsed := new(Handler)
		if err := parsed.UnmarshalCaddyfile(caddyfile.NewTestDispenser(caddyText)); err != nil {
			t.Fatal(err)
		}
		adapted, err := json.Marshal(parsed) // as the adapter hands the config to Caddy
		if err != nil {
			t.Fatal(err)
		}
		h := handlerFromJSON(t, string(adapted))
		err = h.Provision(newCaddyContext(t))
		_ = h.Cleanup()
		if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.HasSuffix(err.Error(), ", at Testfile:5") {
			t.Errorf("%s: expected an error containing %q at Testfile:5, got %v", tc.line, tc.want, err)
		}
	}
}

// The openai type's own options hold for JSON as for a Caddyfile (at
// the option's line).
func TestOpenAIOptionsHoldForJSONAndCaddyfile(t *testing.T) {
	for _, tc := range []struct{ caddy, json, want string }{
		{"responses sometimes", `"responses":"sometimes"`, `responses: "sometimes" is neither native nor chat`},
		{"continuation maybe", `"continuation":"maybe"`, `continuation: "maybe" is not one of none, prefill, prefix, continue_final_message`},
	} {
		h := handlerFromJSON(t, `{"providers":{"p":{"type":"openai","api_key":"none","base_url":"http://h/v1",`+tc.json+`}},"models":{"m":{"deployments":[{"provider":"p","model":"x"}]}}}`)
		err := h.Provision(newCaddyContext(t))
		_ = h.Cleanup()
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("JSON %s: expected an error containing %q, got %v", tc.json, tc.want, err)
		}
		caddyText := "llm_router {\n provider p {\n  type openai\n  api_key none\n  base_url http://h/v1\n  " + tc.caddy + "\n }\n model m {\n  deployment p x\n }\n}"
		if err := new(Handler).UnmarshalCaddyfile(caddyfile.NewTestDispenser(caddyText)); err == nil || err.Error() != tc.want+", at Testfile:6" {
			t.Errorf("Caddyfile %s: expected %q, got %v", tc.caddy, tc.want+", at Testfile:6", err)
		}
	}
}

// A provider's value that its validate refuses is reported at the line
// that set it (a rule of the whole block, such as a missing api_key, at
// the block's).
func TestProviderErrorsAtTheirLines(t *testing.T) {
	for _, tc := range []struct{ line, want string }{
		{"timeout -5s", "provider p: timeout must not be negative"},
		{"base_url http://h/v1/chat/completions", `provider p: base_url "http://h/v1/chat/completions" is an endpoint`},
		{`header "Bad Name" v`, `provider p: header "Bad Name": not a valid header name`},
		{"organization \"a b\"", "provider p: organization"},
	} {
		caddyText := "llm_router {\n provider p {\n  type openai\n  api_key none\n  base_url http://h/v1\n  " + tc.line + "\n }\n model m {\n  deployment p x\n }\n}"
		if strings.HasPrefix(tc.line, "base_url") {
			caddyText = strings.Replace(caddyText, "  base_url http://h/v1\n", "", 1)
		}
		err := new(Handler).UnmarshalCaddyfile(caddyfile.NewTestDispenser(caddyText))
		at := fmt.Sprintf(", at Testfile:%d", lineOf(caddyText, tc.line))
		if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.HasSuffix(err.Error(), at) {
			t.Errorf("%s: expected an error containing %q and ending %q, got %v", tc.line, tc.want, at, err)
		}
	}
}
