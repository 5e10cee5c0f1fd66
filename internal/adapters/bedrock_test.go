package adapters

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws/protocol/eventstream"

	"github.com/llmrouter/caddy-llm-router/internal/jsontest"
	"github.com/llmrouter/caddy-llm-router/internal/wire/chat"
	"github.com/llmrouter/caddy-llm-router/provider"
)

const bedrockBase = "https://bedrock-runtime.us-east-1.amazonaws.com"

func newBedrock() *Bedrock {
	return &Bedrock{Endpoint: provider.Endpoint{BaseURL: bedrockBase, Header: http.Header{}}}
}

func planBody(t *testing.T, pl provider.Plan) []byte {
	t.Helper()
	b, err := io.ReadAll(pl.Request().Body)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// A Messages request to an Anthropic model on Bedrock goes to InvokeModel
// with the model in the path (escaped), the body as Bedrock wants it (no
// model, no stream, its anthropic_version, the client's betas in the body)
// and the answer read as Messages; its errors are restated (not native).
func TestBedrockPlansMessagesForInvokeModel(t *testing.T) {
	p := newBedrock()
	for _, tt := range []struct {
		model, path string
		stream      bool
	}{
		{"us.anthropic.claude-sonnet-4-5-20250929-v1:0", "/model/us.anthropic.claude-sonnet-4-5-20250929-v1:0/invoke", false},
		{"anthropic.claude-3-haiku-20240307-v1:0", "/model/anthropic.claude-3-haiku-20240307-v1:0/invoke-with-response-stream", true},
		{"arn:aws:bedrock:us-east-1:123456789012:inference-profile/us.anthropic.claude-3-7-sonnet-20250219-v1:0",
			"/model/arn:aws:bedrock:us-east-1:123456789012:inference-profile%2Fus.anthropic.claude-3-7-sonnet-20250219-v1:0/invoke", false},
	} {
		body := `{"model":"claude","max_tokens":100,"stream":` + map[bool]string{true: "true", false: "false"}[tt.stream] +
			`,"thinking":{"type":"enabled","budget_tokens":1024},"messages":[{"role":"user","content":[{"type":"text","text":"hi","cache_control":{"type":"ephemeral"}}]}]}`
		req := &provider.Request{Format: provider.Messages, Body: []byte(body), Stream: tt.stream,
			Header: http.Header{"Anthropic-Beta": {"interleaved-thinking-2025-05-14, context-1m-2025-08-07"}}}
		pl, err := p.Plan(context.Background(), tt.model, req)
		if err != nil {
			t.Fatal(err)
		}
		u := pl.Request().URL
		if got := u.EscapedPath(); got != tt.path {
			t.Errorf("%s: path %s, want %s", tt.model, got, tt.path)
		}
		if u.Host != "bedrock-runtime.us-east-1.amazonaws.com" || pl.Request().Method != http.MethodPost {
			t.Errorf("%s: %s %s", tt.model, pl.Request().Method, u)
		}
		if pl.Format() != provider.Messages || pl.Native() {
			t.Errorf("%s: format %v native %v, want messages, not native", tt.model, pl.Format(), pl.Native())
		}
		jsontest.Same(t, planBody(t, pl), `{"max_tokens":100,"thinking":{"type":"enabled","budget_tokens":1024},
			"messages":[{"role":"user","content":[{"type":"text","text":"hi","cache_control":{"type":"ephemeral"}}]}],
			"anthropic_version":"bedrock-2023-05-31","anthropic_beta":["interleaved-thinking-2025-05-14","context-1m-2025-08-07"]}`)
		if h := pl.Request().Header; h.Get("Anthropic-Beta") != "" || h.Get("Authorization") != "" {
			t.Errorf("%s: headers %v: the betas go in the body, no auth without a key (the transport signs)", tt.model, h)
		}
	}
}

// A Bedrock API key goes as a bearer token.
func TestBedrockAPIKeyIsABearerToken(t *testing.T) {
	p := newBedrock()
	p.Endpoint.APIKey = "ABSKbedrockkey"
	pl, err := p.Plan(context.Background(), "anthropic.claude-3-haiku-20240307-v1:0", chatReq([]byte(`{"model":"g","messages":[{"role":"user","content":"hi"}]}`), false))
	if err != nil {
		t.Fatal(err)
	}
	if got := pl.Request().Header.Get("Authorization"); got != "Bearer ABSKbedrockkey" {
		t.Errorf("Authorization %q", got)
	}
}

// A Chat request to an Anthropic model is translated to Messages, in
// Bedrock's form; its answers are read into Chat.
func TestBedrockTranslatesChatForAnthropicModels(t *testing.T) {
	p := newBedrock()
	pl, err := p.Plan(context.Background(), "anthropic.claude-3-haiku-20240307-v1:0",
		chatReq([]byte(`{"model":"g","max_tokens":50,"stream":true,"messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"hi"}]}`), true))
	if err != nil {
		t.Fatal(err)
	}
	if pl.Format() != provider.Chat || pl.Native() || !strings.HasSuffix(pl.Request().URL.Path, "/invoke-with-response-stream") {
		t.Fatalf("plan %v %v %s", pl.Format(), pl.Native(), pl.Request().URL)
	}
	jsontest.Same(t, planBody(t, pl), `{"max_tokens":50,"system":"Be brief.","messages":[{"role":"user","content":"hi"}],"anthropic_version":"bedrock-2023-05-31"}`)
	ans, err := pl.Answer([]byte(`{"id":"msg_bdrk_01","type":"message","role":"assistant","model":"claude-3-haiku-20240307","content":[{"type":"text","text":"Hi."}],"stop_reason":"end_turn","usage":{"input_tokens":9,"output_tokens":3}}`))
	if err != nil {
		t.Fatal(err)
	}
	if got := jsontest.Field(t, ans, "choices"); !strings.Contains(mustJSON(t, got), `"content":"Hi."`) {
		t.Errorf("answer %s", ans)
	}
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// frame encodes one event-stream message with the AWS SDK's encoder.
func frame(t *testing.T, w io.Writer, messageType, typ string, payload string) {
	t.Helper()
	var m eventstream.Message
	m.Headers.Set(":message-type", eventstream.StringValue(messageType))
	switch messageType {
	case "event":
		m.Headers.Set(":event-type", eventstream.StringValue(typ))
	case "exception":
		m.Headers.Set(":exception-type", eventstream.StringValue(typ))
	}
	m.Headers.Set(":content-type", eventstream.StringValue("application/json"))
	m.Payload = []byte(payload)
	if err := eventstream.NewEncoder().Encode(w, m); err != nil {
		t.Fatal(err)
	}
}

// chunkFrame is an InvokeModelWithResponseStream chunk carrying one of
// Anthropic's stream events.
func chunkFrame(t *testing.T, w io.Writer, event string) {
	t.Helper()
	frame(t, w, "event", "chunk", `{"bytes":"`+base64.StdEncoding.EncodeToString([]byte(event))+`","p":"abcdefgh"}`)
}

var anthropicEvents = []string{
	`{"type":"message_start","message":{"id":"msg_bdrk_01","type":"message","role":"assistant","model":"claude-3-haiku-20240307","content":[],"stop_reason":null,"usage":{"input_tokens":9,"output_tokens":1}}}`,
	`{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}`,
	`{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hel"}}`,
	`{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"lo"}}`,
	`{"type":"content_block_stop","index":0}`,
	`{"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"output_tokens":2}}`,
	`{"type":"message_stop","amazon-bedrock-invocationMetrics":{"inputTokenCount":9,"outputTokenCount":2,"invocationLatency":300,"firstByteLatency":120}}`,
}

type drained struct {
	events []provider.Event
	kinds  []provider.EventKind
	errObs *provider.Observation
	err    error
}

// assemble reads the chunks of a drained Chat stream as an OpenAI client
// would; a chunk without choices is the usage chunk.
func assemble(t *testing.T, d drained) streamResult {
	t.Helper()
	res := streamResult{ids: map[string]bool{}, models: map[string]bool{}}
	for _, ev := range d.events {
		var u struct {
			Choices []any
			Usage   *chat.Usage
		}
		if err := json.Unmarshal(ev.Data, &u); err == nil && len(u.Choices) == 0 && u.Usage != nil {
			res.usage = u.Usage // the usage chunk, as OpenAI sends it: no choices
			continue
		}
		res.accumulate(t, ev.Data)
	}
	return res
}

// drain reads a stream to its end as the router does.
func drain(s provider.Stream) drained {
	var d drained
	for {
		ev, kind, obs, err := s.Next()
		if err != nil {
			if !errors.Is(err, io.EOF) {
				d.err = err
			}
			return d
		}
		if kind == provider.EventError {
			d.errObs = &obs
			return d
		}
		d.kinds = append(d.kinds, kind)
		if len(ev.Data) > 0 {
			d.events = append(d.events, provider.Event{Name: ev.Name, Data: append([]byte(nil), ev.Data...)})
		}
	}
}

// InvokeModelWithResponseStream's event stream: a Messages client gets
// Anthropic's events as they were, each named; a Chat client chunks.
func TestBedrockInvokeStream(t *testing.T) {
	var body bytes.Buffer
	for _, e := range anthropicEvents {
		chunkFrame(t, &body, e)
	}
	p := newBedrock()
	msgReq := &provider.Request{Format: provider.Messages, Stream: true, Body: []byte(`{"model":"c","max_tokens":10,"stream":true,"messages":[{"role":"user","content":"hi"}]}`)}
	pl, err := p.Plan(context.Background(), "anthropic.claude-3-haiku-20240307-v1:0", msgReq)
	if err != nil {
		t.Fatal(err)
	}
	s := pl.Stream(bytes.NewReader(body.Bytes()))
	d := drain(s)
	if d.err != nil || d.errObs != nil {
		t.Fatalf("stream failed: %v %+v", d.err, d.errObs)
	}
	// message_stop is the terminator (EventDone), written by the client
	// API as Anthropic's own; the others are relayed as they came.
	if len(d.events) != len(anthropicEvents)-1 || d.kinds[len(d.kinds)-1] != provider.EventDone {
		t.Fatalf("relayed %d events, want %d, then the terminator (kinds %v)", len(d.events), len(anthropicEvents)-1, d.kinds)
	}
	for i, ev := range d.events {
		var typ struct{ Type string }
		_ = json.Unmarshal([]byte(anthropicEvents[i]), &typ)
		if ev.Name != typ.Type || string(ev.Data) != anthropicEvents[i] {
			t.Errorf("event %d: %q %s, want %q %s", i, ev.Name, ev.Data, typ.Type, anthropicEvents[i])
		}
	}
	if !s.Complete() {
		t.Error("a stream with message_delta and message_stop is complete")
	}

	pl, err = p.Plan(context.Background(), "anthropic.claude-3-haiku-20240307-v1:0", chatReq([]byte(`{"model":"g","stream":true,"messages":[{"role":"user","content":"hi"}]}`), true))
	if err != nil {
		t.Fatal(err)
	}
	res := assemble(t, drain(pl.Stream(bytes.NewReader(body.Bytes()))))
	if res.content != "Hello" || res.finish != "stop" {
		t.Errorf("chat stream: %q finish %q", res.content, res.finish)
	}
}

// An exception inside the event stream is an in-band error of its class;
// a body cut inside a frame or a frame whose checksum fails is a broken
// stream, not its end.
func TestBedrockStreamFailures(t *testing.T) {
	p := newBedrock()
	plan := func() provider.Plan {
		pl, err := p.Plan(context.Background(), "anthropic.claude-3-haiku-20240307-v1:0", chatReq([]byte(`{"model":"g","stream":true,"messages":[{"role":"user","content":"hi"}]}`), true))
		if err != nil {
			t.Fatal(err)
		}
		return pl
	}
	var body bytes.Buffer
	chunkFrame(t, &body, anthropicEvents[0])
	chunkFrame(t, &body, anthropicEvents[2])
	frame(t, &body, "exception", "throttlingException", `{"message":"Too many tokens, please wait before trying again."}`)
	d := drain(plan().Stream(bytes.NewReader(body.Bytes())))
	if d.errObs == nil || d.errObs.Class != provider.RateLimited || d.errObs.Code != "ThrottlingException" ||
		!strings.Contains(d.errObs.Message, "Too many tokens") {
		t.Errorf("exception: %+v", d.errObs)
	}
	for _, tt := range []struct{ typ, class string }{
		{"modelStreamErrorException", "server"}, {"internalServerException", "server"},
		{"serviceUnavailableException", "overloaded"}, {"validationException", "client_error"},
		{"modelTimeoutException", "server"},
	} {
		var b bytes.Buffer
		frame(t, &b, "exception", tt.typ, `{"message":"x"}`)
		d := drain(plan().Stream(&b))
		if d.errObs == nil || d.errObs.Class.String() != tt.class {
			t.Errorf("%s: %+v, want %s", tt.typ, d.errObs, tt.class)
		}
	}

	var whole bytes.Buffer
	chunkFrame(t, &whole, anthropicEvents[0])
	chunkFrame(t, &whole, anthropicEvents[2])
	cut := whole.Bytes()[:whole.Len()-7]
	s := plan().Stream(bytes.NewReader(cut))
	d = drain(s)
	if d.err == nil || errors.Is(d.err, io.EOF) && !errors.Is(d.err, io.ErrUnexpectedEOF) {
		t.Errorf("cut inside a frame: err %v, want a broken stream", d.err)
	}
	if s.Complete() {
		t.Error("a cut stream is not complete")
	}
	corrupt := append([]byte(nil), whole.Bytes()...)
	corrupt[len(corrupt)-10] ^= 0xff // inside the last payload: its CRC fails
	if d := drain(plan().Stream(bytes.NewReader(corrupt))); d.err == nil {
		t.Error("a frame whose checksum fails must break the stream")
	}
	// A clean end between frames before the answer finished: EOF, and not
	// complete (the router ends it with an in-band error).
	s = plan().Stream(bytes.NewReader(whole.Bytes()))
	if d := drain(s); d.err != nil || d.errObs != nil || s.Complete() {
		t.Errorf("early end: %+v complete %v", d, s.Complete())
	}
}

// Other models go through Converse, translated from Chat: system prompts,
// tool calls and their results (merged into one user turn), inference
// settings, tools and the tool choice.
func TestChatToConverse(t *testing.T) {
	p := newBedrock()
	body := `{"model":"g","max_tokens":200,"temperature":0.2,"top_p":0.9,"stop":["END"],
		"messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"Weather in Paris?"},
		{"role":"assistant","content":null,"tool_calls":[{"id":"call_1","type":"function","function":{"name":"weather","arguments":"{\"city\":\"Paris\"}"}}]},
		{"role":"tool","tool_call_id":"call_1","content":"Sunny"},{"role":"user","content":"And tomorrow?"}],
		"tools":[{"type":"function","function":{"name":"weather","description":"Weather now","parameters":{"type":"object","properties":{"city":{"type":"string"}}}}}],
		"tool_choice":"required"}`
	pl, err := p.Plan(context.Background(), "amazon.nova-pro-v1:0", chatReq([]byte(body), false))
	if err != nil {
		t.Fatal(err)
	}
	if got := pl.Request().URL.EscapedPath(); got != "/model/amazon.nova-pro-v1:0/converse" {
		t.Errorf("path %s", got)
	}
	jsontest.Same(t, planBody(t, pl), `{"messages":[
		{"role":"user","content":[{"text":"Weather in Paris?"}]},
		{"role":"assistant","content":[{"toolUse":{"toolUseId":"call_1","name":"weather","input":{"city":"Paris"}}}]},
		{"role":"user","content":[{"toolResult":{"toolUseId":"call_1","content":[{"text":"Sunny"}]}},{"text":"And tomorrow?"}]}],
		"system":[{"text":"Be brief."}],
		"inferenceConfig":{"maxTokens":200,"temperature":0.2,"topP":0.9,"stopSequences":["END"]},
		"toolConfig":{"tools":[{"toolSpec":{"name":"weather","description":"Weather now","inputSchema":{"json":{"type":"object","properties":{"city":{"type":"string"}}}}}}],"toolChoice":{"any":{}}}}`)

	// A tool's result with text and an image: each a block of the result.
	res := `{"model":"g","messages":[{"role":"user","content":"Look."},
		{"role":"assistant","tool_calls":[{"id":"call_2","type":"function","function":{"name":"shot","arguments":"{}"}}]},
		{"role":"tool","tool_call_id":"call_2","content":[{"type":"text","text":"r1"},{"type":"text","text":"r2"},{"type":"image_url","image_url":{"url":"data:image/jpeg;base64,/9j/4AAQ"}}]}],
		"tools":[{"type":"function","function":{"name":"shot"}}]}`
	pl, err = p.Plan(context.Background(), "amazon.nova-pro-v1:0", chatReq([]byte(res), false))
	if err != nil {
		t.Fatal(err)
	}
	jsontest.Same(t, planBody(t, pl), `{"messages":[{"role":"user","content":[{"text":"Look."}]},
		{"role":"assistant","content":[{"toolUse":{"toolUseId":"call_2","name":"shot","input":{}}}]},
		{"role":"user","content":[{"toolResult":{"toolUseId":"call_2","content":[{"text":"r1"},{"text":"r2"},{"image":{"format":"jpeg","source":{"bytes":"/9j/4AAQ"}}}]}}]}],
		"toolConfig":{"tools":[{"toolSpec":{"name":"shot","inputSchema":{"json":{"type":"object","properties":{}}}}}]}}`)

	for _, bad := range []struct{ body, want string }{
		{`{"model":"g","messages":[{"role":"user","content":"hi"},{"role":"assistant","tool_calls":[{"id":"","type":"function","function":{"name":"f","arguments":"{}"}}]}]}`, "a tool call without an id"},
		{`{"model":"g","n":2,"messages":[{"role":"user","content":"hi"}]}`, "n > 1"},
		{`{"model":"g","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"https://example.com/a.png"}}]}]}`, "data URLs"},
		{`{"model":"g","response_format":{"type":"json_object"},"messages":[{"role":"user","content":"hi"}]}`, "response_format"},
		{`{"model":"g","messages":[{"role":"assistant","content":"hi"}]}`, "start with a user message"},
		{`{"model":"g","messages":[{"role":"user","content":"hi"},{"role":"tool","tool_call_id":"x","content":"r"}]}`, "answers no earlier tool call"},
	} {
		if _, err := p.Plan(context.Background(), "meta.llama3-70b-instruct-v1:0", chatReq([]byte(bad.body), false)); err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("%s: err %v, want %q", bad.body, err, bad.want)
		}
	}
	img := `{"model":"g","messages":[{"role":"user","content":[{"type":"text","text":"What is it?"},{"type":"image_url","image_url":{"url":"data:image/png;base64,iVBORw0KGgo="}}]}]}`
	pl, err = p.Plan(context.Background(), "amazon.nova-pro-v1:0", chatReq([]byte(img), true))
	if err != nil {
		t.Fatal(err)
	}
	if got := pl.Request().URL.EscapedPath(); got != "/model/amazon.nova-pro-v1:0/converse-stream" {
		t.Errorf("path %s", got)
	}
	jsontest.Same(t, planBody(t, pl), `{"messages":[{"role":"user","content":[{"text":"What is it?"},{"image":{"format":"png","source":{"bytes":"iVBORw0KGgo="}}}]}]}`)
}

// A Converse answer read into a chat.completion: text, tool calls, the
// finish reason and usage (cached tokens counted in the prompt).
func TestConverseAnswer(t *testing.T) {
	p := newBedrock()
	pl, err := p.Plan(context.Background(), "amazon.nova-pro-v1:0", chatReq([]byte(`{"model":"g","messages":[{"role":"user","content":"hi"}]}`), false))
	if err != nil {
		t.Fatal(err)
	}
	ans, err := pl.Answer([]byte(`{"output":{"message":{"role":"assistant","content":[{"text":"Let me check."},{"toolUse":{"toolUseId":"tooluse_1","name":"weather","input":{"city":"Paris"}}}]}},
		"stopReason":"tool_use","usage":{"inputTokens":10,"outputTokens":5,"totalTokens":15,"cacheReadInputTokens":4},"metrics":{"latencyMs":300}}`))
	if err != nil {
		t.Fatal(err)
	}
	jsontest.Same(t, withoutCreated(t, ans), `{"id":"`+jsontest.Field(t, ans, "id").(string)+`","object":"chat.completion","model":"amazon.nova-pro-v1:0",
		"choices":[{"index":0,"message":{"role":"assistant","content":"Let me check.","tool_calls":[{"id":"tooluse_1","type":"function","function":{"name":"weather","arguments":"{\"city\":\"Paris\"}"}}]},"logprobs":null,"finish_reason":"tool_calls"}],
		"usage":{"prompt_tokens":14,"completion_tokens":5,"total_tokens":19,"prompt_tokens_details":{"cached_tokens":4}}}`)
	for stop, finish := range map[string]string{"end_turn": "stop", "stop_sequence": "stop", "max_tokens": "length", "guardrail_intervened": "content_filter", "content_filtered": "content_filter"} {
		if got := converseFinish(stop); got != finish {
			t.Errorf("%s: %s, want %s", stop, got, finish)
		}
	}
	if _, err := pl.Answer([]byte(`{"message":"not an answer"}`)); err == nil {
		t.Error("a body without output is no answer")
	}
}

// ConverseStream's events read into chunks: text, a tool call's start and
// input, the finish at messageStop; the usage chunk (metadata), and the
// stream is whole once it came when the client asked for usage.
func TestConverseStream(t *testing.T) {
	var body bytes.Buffer
	frame(t, &body, "event", "messageStart", `{"role":"assistant"}`)
	frame(t, &body, "event", "contentBlockDelta", `{"contentBlockIndex":0,"delta":{"text":"Checking"}}`)
	frame(t, &body, "event", "contentBlockStop", `{"contentBlockIndex":0}`)
	frame(t, &body, "event", "contentBlockStart", `{"contentBlockIndex":1,"start":{"toolUse":{"toolUseId":"tooluse_1","name":"weather"}}}`)
	frame(t, &body, "event", "contentBlockDelta", `{"contentBlockIndex":1,"delta":{"toolUse":{"input":"{\"city\":"}}}`)
	frame(t, &body, "event", "contentBlockDelta", `{"contentBlockIndex":1,"delta":{"toolUse":{"input":"\"Paris\"}"}}}`)
	frame(t, &body, "event", "contentBlockStop", `{"contentBlockIndex":1}`)
	frame(t, &body, "event", "messageStop", `{"stopReason":"tool_use"}`)
	beforeMetadata := body.Len()
	frame(t, &body, "event", "metadata", `{"usage":{"inputTokens":10,"outputTokens":5,"totalTokens":15},"metrics":{"latencyMs":200}}`)

	p := newBedrock()
	for _, includeUsage := range []bool{false, true} {
		req := chatReq([]byte(`{"model":"g","stream":true,"messages":[{"role":"user","content":"hi"}]}`), true)
		req.IncludeUsage = includeUsage
		pl, err := p.Plan(context.Background(), "amazon.nova-pro-v1:0", req)
		if err != nil {
			t.Fatal(err)
		}
		s := pl.Stream(bytes.NewReader(body.Bytes()))
		d := drain(s)
		if d.err != nil || d.errObs != nil {
			t.Fatalf("stream failed: %v %+v", d.err, d.errObs)
		}
		res := assemble(t, d)
		if res.content != "Checking" || len(res.tools) != 1 || res.tools[0].name != "weather" || res.tools[0].id != "tooluse_1" ||
			res.tools[0].args != `{"city":"Paris"}` || res.finish != "tool_calls" {
			t.Errorf("usage %v: content %q tools %+v finish %q", includeUsage, res.content, res.tools, res.finish)
		}
		// The usage chunk always: the router counts it, and keeps it from a
		// client that did not ask (provider.UsageCounter).
		if res.usage == nil || res.usage.TotalTokens != 15 {
			t.Errorf("usage %v: got %+v", includeUsage, res.usage)
		}
		if !s.Complete() || len(res.ids) != 1 {
			t.Errorf("usage %v: complete %v, ids %v", includeUsage, s.Complete(), res.ids)
		}
		// Cut after messageStop: whole unless usage was asked for.
		s = pl.Stream(bytes.NewReader(body.Bytes()[:beforeMetadata]))
		drain(s)
		if s.Complete() == includeUsage {
			t.Errorf("usage %v: cut before metadata, complete %v", includeUsage, s.Complete())
		}
	}
}

// Bedrock's error dialect: the type from x-amzn-ErrorType or the body,
// the message, the class; a throttle's stated wait spends the window its
// message names.
func TestBedrockObserve(t *testing.T) {
	p := newBedrock()
	now := time.Date(2025, 8, 21, 12, 40, 0, 0, time.UTC)
	h := func(typ string, extra ...string) http.Header {
		out := http.Header{"X-Amzn-Errortype": {typ}}
		for i := 0; i+1 < len(extra); i += 2 {
			out.Set(extra[i], extra[i+1])
		}
		return out
	}
	o := p.Observe(429, h("ThrottlingException:http://internal.amazon.com/coral/com.amazon.bedrock/", "Retry-After", "7"),
		[]byte(`{"message":"Too many tokens, please wait before trying again."}`), now)
	if o.Class != provider.RateLimited || o.RetryAfter != 7*time.Second || o.Tokens.Remaining != 0 || o.Tokens.Reset != 7*time.Second ||
		o.Requests.Remaining != provider.Unknown || o.Code != "ThrottlingException" {
		t.Errorf("token throttle: %+v", o)
	}
	o = p.Observe(429, h("ThrottlingException", "Retry-After", "3"), []byte(`{"message":"Too many requests, please wait before trying again."}`), now)
	if o.Requests.Remaining != 0 || o.Requests.Reset != 3*time.Second || o.Tokens.Remaining != provider.Unknown {
		t.Errorf("request throttle: %+v", o)
	}
	o = p.Observe(429, h("ThrottlingException"), []byte(`{"message":"Too many requests, please wait before trying again."}`), now)
	if o.Class != provider.RateLimited || o.RetryAfter != provider.Unknown || o.Requests.Remaining != provider.Unknown {
		t.Errorf("throttle without a wait: the backoff decides, nothing is known spent: %+v", o)
	}
	// The type in the body when the header is missing (a proxy dropped it).
	o = p.Observe(400, http.Header{}, []byte(`{"__type":"com.amazonaws.bedrock#ValidationException","message":"Input is too long for requested model."}`), now)
	if o.Class != provider.ContextLength || o.Code != "ValidationException" {
		t.Errorf("body type: %+v", o)
	}
	o = p.Observe(502, http.Header{}, []byte(`<html><title>502 Bad Gateway</title></html>`), now)
	if o.Class != provider.Server || !strings.Contains(o.Message, "502 Bad Gateway") {
		t.Errorf("HTML: %+v", o)
	}
	if o := p.Observe(200, http.Header{}, nil, now); o.Class != provider.OK {
		t.Errorf("200: %+v", o)
	}
}

// The event-stream fixtures (testdata/streams/bedrock-*.bin, framed by the
// AWS SDK's encoder from the documented events; see testdata/README.md)
// read to the text they carry, or to the throttle they end with.
func TestBedrockStreamFixtures(t *testing.T) {
	p := newBedrock()
	read := func(name string) []byte {
		b, err := os.ReadFile(filepath.Join("testdata", "streams", name))
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	text := func(d drained) string {
		res := assemble(t, d)
		return res.content + "|" + res.finish
	}
	for _, tt := range []struct{ file, model, want string }{
		{"bedrock-invoke-stream.bin", "anthropic.claude-3-haiku-20240307-v1:0", "Hello|stop"},
		{"bedrock-converse-stream.bin", "amazon.nova-pro-v1:0", ""},
	} {
		pl, err := p.Plan(context.Background(), tt.model, chatReq([]byte(`{"model":"g","stream":true,"messages":[{"role":"user","content":"hi"}]}`), true))
		if err != nil {
			t.Fatal(err)
		}
		s := pl.Stream(bytes.NewReader(read(tt.file)))
		d := drain(s)
		if d.err != nil || d.errObs != nil || !s.Complete() {
			t.Fatalf("%s: %v %+v complete %v", tt.file, d.err, d.errObs, s.Complete())
		}
		if got := text(d); tt.want != "" && got != tt.want || !strings.HasSuffix(got, "|stop") || strings.HasPrefix(got, "|") {
			t.Errorf("%s: %q", tt.file, got)
		}
	}
	pl, _ := p.Plan(context.Background(), "anthropic.claude-3-haiku-20240307-v1:0", chatReq([]byte(`{"model":"g","stream":true,"messages":[{"role":"user","content":"hi"}]}`), true))
	d := drain(pl.Stream(bytes.NewReader(read("bedrock-stream-throttled.bin"))))
	if d.errObs == nil || d.errObs.Class != provider.RateLimited || !strings.Contains(d.errObs.Message, "Too many tokens") {
		t.Errorf("throttled: %+v %v", d.errObs, d.err)
	}
}

// A frame that claims more than a message may hold (up to 4 GiB in its
// prelude) breaks the stream before any of it is read, as does a headers
// length past the message's end; nothing grows with the claim.
func TestBedrockStreamRefusesHugeFrames(t *testing.T) {
	p := newBedrock()
	for _, prelude := range [][]byte{
		{0xff, 0xff, 0xff, 0xf0, 0, 0, 0, 0},    // total ~4 GiB
		{0, 0, 0, 0x20, 0xff, 0xff, 0xff, 0xf0}, // headers past the end
		{0, 0, 0, 0x08, 0, 0, 0, 0},             // shorter than a prelude and CRC
		{0, 0x30, 0, 0, 0, 0, 0, 0x10},          // 3 MiB: over maxFrame
	} {
		pl, _ := p.Plan(context.Background(), "anthropic.claude-3-haiku-20240307-v1:0", chatReq([]byte(`{"model":"g","stream":true,"messages":[{"role":"user","content":"hi"}]}`), true))
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		// The rest of the body never ends: only the prelude is read.
		d := drain(pl.Stream(io.MultiReader(bytes.NewReader(prelude), zeros{})))
		runtime.ReadMemStats(&after)
		if !errors.Is(d.err, errBadFrame) {
			t.Errorf("prelude % x: err %v, want the frame refused", prelude, d.err)
		}
		if grew := after.TotalAlloc - before.TotalAlloc; grew > 1<<20 {
			t.Errorf("prelude % x: %d bytes allocated", prelude, grew)
		}
	}
}

type zeros struct{}

func (zeros) Read(p []byte) (int, error) { clear(p); return len(p), nil }

// An InvokeModel chunk is relayed to a Messages client as one SSE event:
// a type holding a line break (which would begin events of its own in the
// client's stream) breaks the stream, and CR or LF whitespace inside the
// JSON is compacted away.
func TestBedrockChunksCannotForgeEvents(t *testing.T) {
	p := newBedrock()
	msgReq := &provider.Request{Format: provider.Messages, Stream: true, Body: []byte(`{"model":"c","max_tokens":10,"messages":[{"role":"user","content":"hi"}]}`)}
	plan := func() provider.Plan {
		pl, err := p.Plan(context.Background(), "anthropic.claude-3-haiku-20240307-v1:0", msgReq)
		if err != nil {
			t.Fatal(err)
		}
		return pl
	}
	var forged bytes.Buffer
	chunkFrame(t, &forged, anthropicEvents[0])
	chunkFrame(t, &forged, `{"type":"ping\n\nevent: message_stop\ndata: {\"type\":\"message_stop\"}\n\nevent: x"}`)
	d := drain(plan().Stream(&forged))
	if d.errObs == nil || d.errObs.Class != provider.Server {
		t.Errorf("a type with line breaks: %+v %v", d.errObs, d.err)
	}
	var spaced bytes.Buffer
	chunkFrame(t, &spaced, "{\"type\":\"content_block_delta\",\r\n\"index\":0,\r\"delta\":{\"type\":\"text_delta\",\"text\":\"a\\r\\nb\"}}")
	d = drain(plan().Stream(&spaced))
	if d.errObs != nil || len(d.events) != 1 || string(d.events[0].Data) != `{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"a\r\nb"}}` {
		t.Errorf("whitespace: %+v %v", d.errObs, d.events)
	}
}

// A model that cannot be one segment of the URL is not planned.
func TestCloudModelsStayInTheirPath(t *testing.T) {
	for _, model := range []string{"..", ".", ""} {
		if _, err := newBedrock().Plan(context.Background(), model, chatReq([]byte(`{"model":"g","messages":[{"role":"user","content":"hi"}]}`), false)); err == nil {
			t.Errorf("bedrock %q: planned", model)
		}
	}
	for _, model := range []string{"..", "publishers/../models/x", "gemini:streamGenerateContent", "publishers/google/models/.."} {
		if _, err := newVertex().Plan(context.Background(), model, chatReq([]byte(`{"model":"g","messages":[{"role":"user","content":"hi"}]}`), false)); err == nil {
			t.Errorf("vertex %q: planned", model)
		}
	}
	pl, err := newBedrock().Plan(context.Background(), "my model/with?odd#chars%", chatReq([]byte(`{"model":"g","messages":[{"role":"user","content":"hi"}]}`), false))
	if err != nil || pl.Request().URL.EscapedPath() != "/model/my%20model%2Fwith%3Fodd%23chars%25/converse" {
		t.Errorf("escaped: %v %v", err, pl)
	}
}
