package llmrouter

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"
	"unsafe"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap/zapcore"
)

// logFields are extra's fields (Caddy keeps them unexported: read with
// reflect).
func logFields(extra *caddyhttp.ExtraLogFields) []zapcore.Field {
	v := reflect.ValueOf(extra).Elem().FieldByName("fields")
	return reflect.NewAt(v.Type(), unsafe.Pointer(v.UnsafeAddr())).Elem().Interface().([]zapcore.Field)
}

// logFieldCount is how many fields the handler gave extra.
func logFieldCount(extra *caddyhttp.ExtraLogFields) int { return len(logFields(extra)) }

// accessLogEntry encodes extra's fields as Caddy's access log does (its
// JSON encoder, the fields appended to the entry's), as an object. Caddy
// keeps the fields unexported: they are read with reflect.
func accessLogEntry(t *testing.T, extra *caddyhttp.ExtraLogFields) map[string]any {
	t.Helper()
	fields := logFields(extra)
	enc := zapcore.NewJSONEncoder(zapcore.EncoderConfig{MessageKey: "msg"})
	buf, err := enc.EncodeEntry(zapcore.Entry{Message: "handled request"}, fields)
	if err != nil {
		t.Fatal(err)
	}
	var entry map[string]any
	if err := json.Unmarshal(buf.Bytes(), &entry); err != nil {
		t.Fatalf("%v: %s", err, buf)
	}
	return entry
}

// A served request tells the access log which deployment answered, after
// how many attempts, in which group, what the answer used (OpenAI's
// recorded 200: 9 prompt and 2 completion tokens) and cost (at 3 and 15
// USD per 1M); later handlers read the same as placeholders (an empty
// one, and one the router does not set, as the replacer's empty value).
func TestAccessLogFieldsAndPlaceholders(t *testing.T) {
	h := benchHandler(t, 1, true, "cost_input 3", "cost_output 15")
	repl := caddy.NewReplacer()
	extra := new(caddyhttp.ExtraLogFields)
	r := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", strings.NewReader(benchBody))
	r.Header.Set("Content-Type", "application/json")
	ctx := context.WithValue(r.Context(), caddy.ReplacerCtxKey, repl)
	ctx = context.WithValue(ctx, caddyhttp.ExtraLogFieldsCtxKey, extra)
	w := httptest.NewRecorder()
	if err := h.ServeHTTP(w, r.WithContext(ctx), nil); err != nil || w.Code != http.StatusOK {
		t.Fatalf("%d %s %v", w.Code, w.Body, err)
	}
	entry := accessLogEntry(t, extra)
	want := map[string]any{"msg": "handled request",
		"llm_deployment": "up0/gpt-4o-mini", "llm_attempts": 1.0, "llm_failover_reason": "", "llm_model_group": "bench",
		"llm_input_tokens": 9.0, "llm_output_tokens": 2.0, "llm_cached_input_tokens": 0.0, "llm_cache_write_tokens": 0.0,
		"llm_cache_write_1h_tokens": 0.0, "llm_reasoning_tokens": 0.0, "llm_cost_usd": 57e-6}
	if !reflect.DeepEqual(entry, want) {
		t.Errorf("access log entry:\n got %v\nwant %v", entry, want)
	}
	got := repl.ReplaceAll("{http.llm_router.deployment} {http.llm_router.attempts} [{http.llm_router.failover_reason}] "+
		"{http.llm_router.model_group} {http.llm_router.input_tokens} {http.llm_router.output_tokens} "+
		"{http.llm_router.cached_input_tokens} {http.llm_router.reasoning_tokens} {http.llm_router.cost_usd} [{http.llm_router.other}]", "?")
	if want := "up0/gpt-4o-mini 1 [?] bench 9 2 0 0 0.000057 [?]"; got != want {
		t.Errorf("placeholders: got %q, want %q", got, want)
	}
}
