package mockllm

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	_ "github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"
)

func TestUnmarshalCaddyfile(t *testing.T) {
	tests := []struct {
		name  string
		input string
		want  Handler
	}{
		{"bare", `llm_mock`, Handler{}},
		{"empty block", `llm_mock {
		}`, Handler{}},
		{"everything", `llm_mock {
			model             gpt-mock
			latency           150ms
			first_token_delay 1s
			chunks            8
			chunk_interval    20ms
			reply             "Hi there, friend."
			api_key           {env.MOCK_KEY}
			rate_limit {
				requests 100
				tokens   40000
				window   30s
			}
			fault rate_limit {
				every  3
				header Retry-After 30
				header X-Extra one
				header X-Extra two
			}
			fault status {
				from   10s
				for    1m
				status 503
				body   "{\"error\":{\"message\":\"down\"}}"
			}
			fault cut {
				after 0
			}
			fault hang
			fault error_event {
				after 2
			}
			fault keepalive
		}`, Handler{
			Model:           "gpt-mock",
			Latency:         caddy.Duration(150 * time.Millisecond),
			FirstTokenDelay: caddy.Duration(time.Second),
			Chunks:          8,
			ChunkInterval:   caddy.Duration(20 * time.Millisecond),
			Reply:           "Hi there, friend.",
			APIKey:          "{env.MOCK_KEY}",
			RateLimit:       &RateLimit{Requests: 100, Tokens: 40000, Window: caddy.Duration(30 * time.Second)},
			Faults: []Fault{
				{Kind: FaultRateLimit, Every: 3, Headers: http.Header{"Retry-After": {"30"}, "X-Extra": {"one", "two"}}},
				{Kind: FaultStatus, From: caddy.Duration(10 * time.Second), For: caddy.Duration(time.Minute), Status: 503, Body: `{"error":{"message":"down"}}`},
				{Kind: FaultCut, After: intp(0)},
				{Kind: FaultHang},
				{Kind: FaultErrorEvent, After: intp(2)},
				{Kind: FaultKeepAlive},
			},
		}},
		{"anthropic", `llm_mock {
			dialect anthropic
		}`, Handler{Dialect: DialectAnthropic}},
		{"retry_delay and quota_id", `llm_mock {
			dialect openai
			fault rate_limit {
				every       2
				retry_delay 42s
				quota_id    GenerateRequestsPerDayPerProjectPerModel-FreeTier
			}
			fault rate_limit {
				retry_delay 1500ms
			}
		}`, Handler{Dialect: DialectOpenAI, Faults: []Fault{
			{Kind: FaultRateLimit, Every: 2, RetryDelay: caddy.Duration(42 * time.Second), QuotaID: "GenerateRequestsPerDayPerProjectPerModel-FreeTier"},
			{Kind: FaultRateLimit, RetryDelay: caddy.Duration(1500 * time.Millisecond)},
		}}},
		{"bedrock", `llm_mock {
			dialect         bedrock
			api_key         {env.BEDROCK_API_KEY}
			aws_credentials AKIAMOCK "sec/ret+key"
			fault rate_limit {
				quota       tokens
				retry_delay 3s
			}
			fault rate_limit {
				quota tokens_per_day
			}
			fault error_event {
				status 429
				after  2
			}
		}`, Handler{Dialect: DialectBedrock, APIKey: "{env.BEDROCK_API_KEY}",
			AWSCredentials: &AWSCredentials{AccessKeyID: "AKIAMOCK", SecretAccessKey: "sec/ret+key"},
			Faults: []Fault{
				{Kind: FaultRateLimit, Quota: QuotaTokens, RetryDelay: caddy.Duration(3 * time.Second)},
				{Kind: FaultRateLimit, Quota: QuotaTokensDay},
				{Kind: FaultErrorEvent, Status: 429, After: intp(2)},
			}}},
		{"vertex", `llm_mock {
			dialect        vertex
			token_lifetime 90s
			fault rate_limit {
				quota    per_day
				quota_id online_prediction_requests_per_base_model
			}
			fault rate_limit {
				quota shared
			}
			fault rate_limit {
				quota per_minute
			}
		}`, Handler{Dialect: DialectVertex, TokenLifetime: caddy.Duration(90 * time.Second), Faults: []Fault{
			{Kind: FaultRateLimit, Quota: QuotaPerDay, QuotaID: "online_prediction_requests_per_base_model"},
			{Kind: FaultRateLimit, Quota: QuotaShared},
			{Kind: FaultRateLimit, Quota: QuotaPerMinute},
		}}},
		{"continuation and stream faults", `llm_mock {
			dialect      anthropic
			continuation reject
			fault stall {
				every 3
				after 2
			}
			fault malformed {
				after 0
			}
			fault stall
			fault malformed
		}`, Handler{Dialect: DialectAnthropic, Continuation: ContinuationReject, Faults: []Fault{
			{Kind: FaultStall, Every: 3, After: intp(2)},
			{Kind: FaultMalformed, After: intp(0)},
			{Kind: FaultStall},
			{Kind: FaultMalformed},
		}}},
		{"continuation accept", `llm_mock {
			continuation accept
		}`, Handler{Continuation: ContinuationAccept}},
		{"slow fault", `llm_mock {
			fault slow {
				every 10
				delay 800ms
			}
			fault slow {
				delay 2s
				from  1m
			}
		}`, Handler{Faults: []Fault{
			{Kind: FaultSlow, Every: 10, Delay: caddy.Duration(800 * time.Millisecond)},
			{Kind: FaultSlow, Delay: caddy.Duration(2 * time.Second), From: caddy.Duration(time.Minute)},
		}}},
		{"rate limit partial and day duration", `llm_mock {
			rate_limit {
				tokens 10
				window 1d
			}
		}`, Handler{RateLimit: &RateLimit{Tokens: 10, Window: caddy.Duration(24 * time.Hour)}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var got Handler
			if err := got.UnmarshalCaddyfile(caddyfile.NewTestDispenser(tt.input)); err != nil {
				t.Fatalf("expected no error, got %v", err)
			}
			if !reflect.DeepEqual(got, tt.want) {
				gj, _ := json.Marshal(got)
				wj, _ := json.Marshal(tt.want)
				t.Errorf("expected %s, got %s", wj, gj)
			}
			if err := got.Validate(); err != nil {
				t.Errorf("expected the parsed config to validate, got %v", err)
			}
		})
	}
}

func TestUnmarshalCaddyfileErrors(t *testing.T) {
	tests := []struct {
		name  string
		input string
		want  string // substring of the error
	}{
		{"directive argument", `llm_mock foo`, "wrong argument count"},
		{"unknown subdirective", `llm_mock {
			temperature 1
		}`, `unrecognized subdirective "temperature"`},
		{"duplicate subdirective", `llm_mock {
			model a
			model b
		}`, `duplicate subdirective "model"`},
		{"missing argument", `llm_mock {
			model
		}`, "wrong argument count"},
		{"extra argument", `llm_mock {
			reply a b
		}`, "wrong argument count"},
		{"bad number", `llm_mock {
			chunks many
		}`, `chunks: bad number "many"`},
		{"zero chunks", `llm_mock {
			chunks 0
		}`, "chunks must be at least 1"},
		{"bad duration", `llm_mock {
			latency soon
		}`, `latency: bad duration "soon"`},
		{"negative duration", `llm_mock {
			chunk_interval -5ms
		}`, "chunk_interval must not be negative"},
		{"negative first token delay", `llm_mock {
			first_token_delay -1s
		}`, "first_token_delay must not be negative"},
		{"duplicate rate_limit", `llm_mock {
			rate_limit {
				requests 1
			}
			rate_limit {
				tokens 1
			}
		}`, `duplicate subdirective "rate_limit"`},
		{"rate_limit unknown", `llm_mock {
			rate_limit {
				burst 1
			}
		}`, `rate_limit: unrecognized subdirective "burst"`},
		{"rate_limit duplicate", `llm_mock {
			rate_limit {
				requests 1
				requests 2
			}
		}`, `rate_limit: duplicate subdirective "requests"`},
		{"rate_limit negative", `llm_mock {
			rate_limit {
				tokens -1
			}
		}`, "tokens must be at least 0"},
		{"rate_limit zero window", `llm_mock {
			rate_limit {
				window 0s
			}
		}`, "window must be positive"},
		{"rate_limit argument", `llm_mock {
			rate_limit 10
		}`, "wrong argument count"},
		{"fault without kind", `llm_mock {
			fault
		}`, "fault needs a kind"},
		{"fault unknown kind", `llm_mock {
			fault explode
		}`, `unknown fault kind "explode"`},
		{"fault extra argument", `llm_mock {
			fault status 503
		}`, "wrong argument count"},
		{"fault unknown subdirective", `llm_mock {
			fault status {
				code 503
			}
		}`, `fault status: unrecognized subdirective "code"`},
		{"fault duplicate", `llm_mock {
			fault status {
				status 503
				status 502
			}
		}`, `fault status: duplicate subdirective "status"`},
		{"fault every zero", `llm_mock {
			fault hang {
				every 0
			}
		}`, "every must be at least 1"},
		{"fault negative from", `llm_mock {
			fault hang {
				from -1s
			}
		}`, "from must not be negative"},
		{"fault status range", `llm_mock {
			fault status {
				status 700
			}
		}`, "status must be 100-599"},
		{"fault status low", `llm_mock {
			fault status {
				status 42
			}
		}`, "status must be at least 100"},
		{"fault header without value", `llm_mock {
			fault rate_limit {
				header Retry-After
			}
		}`, "wrong argument count"},
		{"unknown dialect", `llm_mock {
			dialect cohere
		}`, `unknown dialect "cohere" (want openai, anthropic, gemini, bedrock or vertex)`},
		{"aws_credentials one argument", `llm_mock {
			aws_credentials AKIA
		}`, "aws_credentials takes <access_key_id> <secret_access_key>"},
		{"aws_credentials three arguments", `llm_mock {
			aws_credentials AKIA secret token
		}`, "aws_credentials takes <access_key_id> <secret_access_key>"},
		{"duplicate aws_credentials", `llm_mock {
			aws_credentials a b
			aws_credentials c d
		}`, `duplicate subdirective "aws_credentials"`},
		{"token_lifetime bad", `llm_mock {
			token_lifetime forever
		}`, `token_lifetime: bad duration "forever"`},
		{"token_lifetime zero", `llm_mock {
			token_lifetime 0s
		}`, "token_lifetime must be positive"},
		{"token_lifetime negative", `llm_mock {
			token_lifetime -1m
		}`, "token_lifetime must not be negative"},
		{"token_lifetime without value", `llm_mock {
			token_lifetime
		}`, "wrong argument count"},
		{"fault unknown quota", `llm_mock {
			fault rate_limit {
				quota hourly
			}
		}`, `fault rate_limit: unknown quota "hourly" (want requests, tokens, tokens_per_day, shared, per_minute or per_day)`},
		{"fault quota without value", `llm_mock {
			fault rate_limit {
				quota
			}
		}`, "wrong argument count"},
		{"fault duplicate quota", `llm_mock {
			fault rate_limit {
				quota tokens
				quota requests
			}
		}`, `fault rate_limit: duplicate subdirective "quota"`},
		{"dialect without name", `llm_mock {
			dialect
		}`, "wrong argument count"},
		{"dialect two names", `llm_mock {
			dialect gemini anthropic
		}`, "wrong argument count"},
		{"duplicate dialect", `llm_mock {
			dialect gemini
			dialect gemini
		}`, `duplicate subdirective "dialect"`},
		{"fault bad retry_delay", `llm_mock {
			fault rate_limit {
				retry_delay soon
			}
		}`, `retry_delay: bad duration "soon"`},
		{"fault negative retry_delay", `llm_mock {
			fault rate_limit {
				retry_delay -1s
			}
		}`, "retry_delay must not be negative"},
		{"fault quota_id without id", `llm_mock {
			fault rate_limit {
				quota_id
			}
		}`, "wrong argument count"},
		{"fault duplicate quota_id", `llm_mock {
			fault rate_limit {
				quota_id a
				quota_id b
			}
		}`, `fault rate_limit: duplicate subdirective "quota_id"`},
		{"unknown continuation", `llm_mock {
			continuation ignore
		}`, `unknown continuation "ignore" (want accept or reject)`},
		{"continuation case", `llm_mock {
			continuation Reject
		}`, `unknown continuation "Reject"`},
		{"continuation without value", `llm_mock {
			continuation
		}`, "wrong argument count"},
		{"continuation two values", `llm_mock {
			continuation accept reject
		}`, "wrong argument count"},
		{"duplicate continuation", `llm_mock {
			continuation accept
			continuation reject
		}`, `duplicate subdirective "continuation"`},
		{"unknown fault kind lists the stream faults", `llm_mock {
			fault freeze
		}`, `unknown fault kind "freeze" (want rate_limit, status, hang, cut, error_event, keepalive, stall, malformed or slow)`},
		{"slow without delay", `llm_mock {
			fault slow {
				every 10
			}
		}`, "fault slow needs a delay"},
		{"slow without block", `llm_mock {
			fault slow
		}`, "fault slow needs a delay"},
		{"slow zero delay", `llm_mock {
			fault slow {
				delay 0s
			}
		}`, "fault slow: delay must be positive"},
		{"slow negative delay", `llm_mock {
			fault slow {
				delay -1s
			}
		}`, "delay must not be negative"},
		{"slow bad delay", `llm_mock {
			fault slow {
				delay soon
			}
		}`, `delay: bad duration "soon"`},
		{"slow duplicate delay", `llm_mock {
			fault slow {
				delay 1s
				delay 2s
			}
		}`, `fault slow: duplicate subdirective "delay"`},
		{"delay of another kind", `llm_mock {
			fault hang {
				delay 1s
			}
		}`, "fault hang: delay is only used by slow faults"},
		{"stall negative after", `llm_mock {
			fault stall {
				after -2
			}
		}`, "after must be at least 0"},
		{"malformed bad after", `llm_mock {
			fault malformed {
				after two
			}
		}`, `after: bad number "two"`},
		{"fault negative after", `llm_mock {
			fault cut {
				after -1
			}
		}`, "after must be at least 0"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var h Handler
			err := h.UnmarshalCaddyfile(caddyfile.NewTestDispenser(tt.input))
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("expected an error containing %q, got %v", tt.want, err)
			}
		})
	}
}

// TestCaddyfileAdapt checks the directive is registered and ordered
// (no "order" line needed) and adapts to the JSON fields documented.
func TestCaddyfileAdapt(t *testing.T) {
	input := "{\n\tadmin off\n}\n\n" + `:8080 {
	respond /health 200
	reverse_proxy /proxied localhost:9999
	llm_mock /v1/* {
		model m
		latency 10ms
		fault status {
			every 2
			status 503
			header Retry-After 1
		}
	}
}
`
	adapter := caddyfile.Adapter{ServerType: httpcaddyfile.ServerType{}}
	out, warnings, err := adapter.Adapt([]byte(input), nil)
	if err != nil {
		t.Fatalf("adapt: %v", err)
	}
	if len(warnings) > 0 {
		t.Errorf("expected no warnings, got %v", warnings)
	}
	got := string(out)
	want := `{"faults":[{"every":2,"headers":{"Retry-After":["1"]},"kind":"status","status":503}],"handler":"llm_mock","latency":10000000,"model":"m"}`
	if !strings.Contains(got, want) {
		t.Errorf("expected handler JSON %s in %s", want, got)
	}
	if i, j := strings.Index(got, `"handler":"llm_mock"`), strings.Index(got, `"handler":"reverse_proxy"`); i < 0 || j < 0 || i > j {
		t.Errorf("expected llm_mock ordered before reverse_proxy, got %s", got)
	}

	// The adapted JSON provisions into a working handler.
	var h Handler
	start := strings.Index(got, `{"faults"`)
	if err := json.Unmarshal([]byte(got[start:start+len(want)]), &h); err != nil {
		t.Fatal(err)
	}
	if err := h.Setup(); err != nil {
		t.Fatal(err)
	}
	if h.Faults[0].Headers.Get("Retry-After") != "1" || time.Duration(h.Latency) != 10*time.Millisecond {
		t.Errorf("unexpected round trip %+v", h)
	}
}

// TestCaddyfileAdaptClouds adapts bedrock and vertex mocks to the JSON
// fields documented, and rejects settings of the other dialect.
func TestCaddyfileAdaptClouds(t *testing.T) {
	for _, c := range []struct{ block, want, wantErr string }{
		{`dialect bedrock
		aws_credentials AKIAMOCK secret
		api_key abc
		fault rate_limit {
			quota tokens
		}`, `{"api_key":"abc","aws_credentials":{"access_key_id":"AKIAMOCK","secret_access_key":"secret"},"dialect":"bedrock","faults":[{"kind":"rate_limit","quota":"tokens"}],"handler":"llm_mock"}`, ""},
		{`dialect vertex
		token_lifetime 2m
		fault rate_limit {
			quota per_minute
		}`, `{"dialect":"vertex","faults":[{"kind":"rate_limit","quota":"per_minute"}],"handler":"llm_mock","token_lifetime":120000000000}`, ""},
		{`dialect bedrock
		continuation reject
		fault stall {
			after 1
		}
		fault malformed`, `{"continuation":"reject","dialect":"bedrock","faults":[{"after":1,"kind":"stall"},{"kind":"malformed"}],"handler":"llm_mock"}`, ""},
		{`dialect anthropic
		fault slow {
			every 10
			delay 800ms
		}`, `{"dialect":"anthropic","faults":[{"delay":800000000,"every":10,"kind":"slow"}],"handler":"llm_mock"}`, ""},
		{`dialect vertex
		aws_credentials a b`, "", "aws_credentials is only used by the bedrock dialect"},
		{`dialect bedrock
		token_lifetime 1m`, "", "token_lifetime is only used by the vertex dialect"},
		{`dialect vertex
		api_key k`, "", "api_key is not used by the vertex dialect"},
		{`dialect vertex
		fault rate_limit {
			quota tokens
		}`, "", `quota "tokens" is not a vertex quota`},
		{`dialect bedrock
		fault rate_limit {
			quota per_day
		}`, "", `quota "per_day" is not a bedrock quota`},
		{`fault rate_limit {
			quota tokens
		}`, "", "quota is only used by the bedrock and vertex dialects"},
	} {
		input := "{\n\tadmin off\n}\n\n:8080 {\n\tllm_mock {\n\t\t" + c.block + "\n\t}\n}\n"
		adapter := caddyfile.Adapter{ServerType: httpcaddyfile.ServerType{}}
		out, _, err := adapter.Adapt([]byte(input), nil)
		if err != nil {
			t.Fatalf("adapt: %v", err)
		}
		// The handler's object: from the "handle" list it opens to the
		// first "}" after its "handler" (its fields are sorted, so the
		// ones after "handler" hold no object).
		got := string(out)
		i := strings.Index(got, `"handler":"llm_mock"`)
		if i < 0 {
			t.Fatalf("no llm_mock handler in %s", got)
		}
		start := strings.LastIndex(got[:i], `"handle":[`) + len(`"handle":[`)
		end := i + strings.IndexByte(got[i:], '}') + 1
		js := got[start:end]
		if c.want != "" && js != c.want {
			t.Errorf("expected handler JSON %s, got %s", c.want, js)
		}
		var h Handler
		if err := json.Unmarshal([]byte(js), &h); err != nil {
			t.Fatalf("%s: %v", js, err)
		}
		err = h.Setup()
		switch {
		case c.wantErr == "" && err != nil:
			t.Errorf("expected %s to validate, got %v", js, err)
		case c.wantErr != "" && (err == nil || !strings.Contains(err.Error(), c.wantErr)):
			t.Errorf("expected an error about %q for %s, got %v", c.wantErr, js, err)
		}
		_ = h.Close()
	}
}

// TestCaddyfileAdaptDialect adapts a gemini mock with a scripted
// per-day quota failure and runs the result.
func TestCaddyfileAdaptDialect(t *testing.T) {
	input := "{\n\tadmin off\n}\n\n" + `:8080 {
	llm_mock {
		dialect gemini
		fault rate_limit {
			retry_delay 42s
			quota_id GenerateRequestsPerDayPerProjectPerModel-FreeTier
		}
	}
}
`
	adapter := caddyfile.Adapter{ServerType: httpcaddyfile.ServerType{}}
	out, warnings, err := adapter.Adapt([]byte(input), nil)
	if err != nil {
		t.Fatalf("adapt: %v", err)
	}
	if len(warnings) > 0 {
		t.Errorf("expected no warnings, got %v", warnings)
	}
	want := `{"dialect":"gemini","faults":[{"kind":"rate_limit","quota_id":"GenerateRequestsPerDayPerProjectPerModel-FreeTier","retry_delay":42000000000}],"handler":"llm_mock"}`
	got := string(out)
	start := strings.Index(got, `{"dialect"`)
	if start < 0 || !strings.HasPrefix(got[start:], want) {
		t.Fatalf("expected handler JSON %s in %s", want, got)
	}
	var h Handler
	if err := json.Unmarshal([]byte(got[start:start+len(want)]), &h); err != nil {
		t.Fatal(err)
	}
	if err := h.Setup(); err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	rec := httptest.NewRecorder()
	h.HTTPHandler().ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/v1beta/models/gemini-x:generateContent", strings.NewReader(`{}`)))
	body := rec.Body.String()
	if rec.Code != 429 || !strings.Contains(body, `"quotaId":"GenerateRequestsPerDayPerProjectPerModel-FreeTier"`) ||
		!strings.Contains(body, `"retryDelay":"42s"`) {
		t.Errorf("expected the scripted per-day quota failure, got %d %s", rec.Code, body)
	}
}
