package llmrouter

import (
	"context"
	"encoding/json"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
)

// The prompt-cache prices: a deployment's own, from the Caddyfile or
// JSON, else its provider type's defaults (prices.go); a bad one is told
// alike on both paths, with file:line in the Caddyfile.
func TestCachePrices(t *testing.T) {
	const cfg = `{"providers":{
		"a":{"type":"anthropic","api_key":"none","base_url":"http://h/v1"},
		"b":{"type":"bedrock","region":"us-east-1","api_key":"none"},
		"o":{"type":"openai","api_key":"none","base_url":"http://h/v1"},
		"g":{"type":"gemini","api_key":"none","base_url":"http://h/v1beta"}},
	"models":{"m":{"deployments":[
		{"provider":"a","model":"claude-sonnet-4-5","cost_input":3,"cost_output":15},
		{"provider":"b","model":"us.anthropic.claude-sonnet-4-5-20250929-v1:0","cost_input":3,"cost_output":15,"cost_cache_write_1h":5},
		{"provider":"b","model":"amazon.nova-pro-v1:0","cost_input":0.8,"cost_output":3.2},
		{"provider":"o","model":"gpt-4o","cost_input":2.5,"cost_output":10,"cost_cached_input":1.25},
		{"provider":"o","model":"gpt-5","cost_input":1.25,"cost_output":10},
		{"provider":"g","model":"gemini-2.5-pro","cost_input":1.25,"cost_output":10,"cost_cache_write":2}]}}}`
	isolateAWS(t)
	h := handlerFromJSON(t, cfg)
	if err := h.Provision(newCaddyContext(t)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = h.Cleanup() })
	want := [][3]float64{ // read, 5-minute write, 1-hour write
		{0.3, 3.75, 6},
		{0.3, 3.75, 5},
		{0.8, 0.8, 0.8},
		{1.25, 2.5, 2.5},
		{1.25, 1.25, 1.25},
		{0.125, 2, 1.25},
	}
	for i, d := range h.groups["m"].Deployments {
		got := [3]float64{d.CostCached, d.CostCacheWrite, d.CostCacheWrite1h}
		for j := range got {
			if diff := got[j] - want[i][j]; diff > 1e-12 || diff < -1e-12 {
				t.Errorf("%s: cache prices (read, write, 1h write) %v, want %v", d.Name, got, want[i])
				break
			}
		}
	}

	const providers = "provider p {\n type openai\n api_key none\n base_url http://h/v1\n }\n"
	caddy := func(line string) string {
		return "llm_router {\n" + providers + "model m {\n deployment p x {\n" + line + "\n }\n }\n}"
	}
	ok := new(Handler)
	if err := ok.UnmarshalCaddyfile(caddyfile.NewTestDispenser(caddy("cost_cache_write 3.75\n cost_cache_write_1h 6"))); err != nil {
		t.Fatal(err)
	}
	if dc := ok.Models["m"].Deployments[0]; dc.CostCacheWrite == nil || *dc.CostCacheWrite != 3.75 ||
		dc.CostCacheWrite1h == nil || *dc.CostCacheWrite1h != 6 {
		t.Errorf("expected cost_cache_write 3.75 and cost_cache_write_1h 6, got %+v", dc)
	}
	for _, tc := range []struct{ line, want string }{
		{"cost_cache_write -1", "model m: cost_cache_write must be from 0 to 1e+06 USD per 1M tokens, got -1, at Testfile:9"},
		{"cost_cache_write_1h NaN", "model m: cost_cache_write_1h must be from 0 to 1e+06 USD per 1M tokens, got NaN, at Testfile:9"},
		{"cost_cache_write_1h 2e7", "cost_cache_write_1h must be from 0 to 1e+06 USD per 1M tokens, got 2e+07, at Testfile:9"},
		{"cost_cache_write x", `cost_cache_write: expected a number, got "x", at Testfile:9`},
		{"cost_cache_write 1 2", "wrong argument count or unexpected line ending after '2', at Testfile:9"},
	} {
		err := new(Handler).UnmarshalCaddyfile(caddyfile.NewTestDispenser(caddy(tc.line)))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: expected an error containing %q, got %v", tc.line, tc.want, err)
		}
	}
	for _, tc := range []struct{ field, want string }{
		{`"cost_cache_write":-1`, "cost_cache_write must be from 0 to 1e+06 USD per 1M tokens"},
		{`"cost_cache_write_1h":2e7`, "cost_cache_write_1h must be from 0 to 1e+06 USD per 1M tokens"},
	} {
		h := handlerFromJSON(t, `{"providers":{"a":{"type":"openai","api_key":"none","base_url":"http://h"}},"models":{"m":{"deployments":[{"provider":"a","model":"y",`+tc.field+`}]}}}`)
		err := h.Provision(newCaddyContext(t))
		_ = h.Cleanup()
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: expected an error containing %q, got %v", tc.field, tc.want, err)
		}
	}
}

// A Chat Completions client of an Anthropic deployment keeps the cache
// writes in its usage object and in the access log's placeholders, and
// the cost there is Anthropic's bill.
func TestChatClientOfClaudeKeepsCacheWrites(t *testing.T) {
	answer, err := os.ReadFile(filepath.Join("testdata", "bills", "anthropic-mixed.json"))
	if err != nil {
		t.Fatal(err)
	}
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(answer)
	}))
	defer upstream.Close()
	h := handlerFromCaddyfile(t, `llm_router {
		provider an {
			type anthropic
			api_key sk-ant-test
			base_url `+upstream.URL+`/v1
		}
		model claude {
			deployment an claude-sonnet-4-5 {
				cost_input 3
				cost_output 15
			}
		}
	}`)
	defer h.Cleanup()
	repl := caddy.NewReplacer()
	r := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", strings.NewReader(`{"model":"claude","messages":[{"role":"user","content":"hi"}]}`))
	r.Header.Set("Content-Type", "application/json")
	r = r.WithContext(context.WithValue(r.Context(), caddy.ReplacerCtxKey, repl))
	w := httptest.NewRecorder()
	if err := h.ServeHTTP(w, r, nil); err != nil || w.Code != 200 {
		t.Fatalf("%d %s %v", w.Code, w.Body, err)
	}
	var got struct {
		Usage struct {
			PromptTokens        int64 `json:"prompt_tokens"`
			PromptTokensDetails struct {
				CachedTokens     int64 `json:"cached_tokens"`
				CacheWriteTokens int64 `json:"cache_write_tokens"`
			} `json:"prompt_tokens_details"`
			CacheCreation struct {
				Ephemeral5m int64 `json:"ephemeral_5m_input_tokens"`
				Ephemeral1h int64 `json:"ephemeral_1h_input_tokens"`
			} `json:"cache_creation"`
		} `json:"usage"`
	}
	if err := json.Unmarshal(w.Body.Bytes(), &got); err != nil {
		t.Fatal(err)
	}
	if u := got.Usage; u.PromptTokens != 7434 || u.PromptTokensDetails.CachedTokens != 4409 || u.PromptTokensDetails.CacheWriteTokens != 3000 ||
		u.CacheCreation.Ephemeral5m != 2000 || u.CacheCreation.Ephemeral1h != 1000 {
		t.Errorf("the client's usage: %s", w.Body)
	}
	for name, want := range map[string]string{"input_tokens": "7434", "cached_input_tokens": "4409", "cache_write_tokens": "3000",
		"cache_write_1h_tokens": "1000", "output_tokens": "300"} {
		if v, _ := repl.GetString("http.llm_router." + name); v != want {
			t.Errorf("{http.llm_router.%s} = %q, want %s", name, v, want)
		}
	}
	cost, _ := repl.GetString("http.llm_router.cost_usd")
	if f, err := strconv.ParseFloat(cost, 64); err != nil || math.Abs(f-claudeBill(25, 2000, 1000, 4409, 300)) > 1e-9 {
		t.Errorf("{http.llm_router.cost_usd} = %q, want %.7f", cost, claudeBill(25, 2000, 1000, 4409, 300))
	}
}
