package mockllm

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/aws/protocol/eventstream"
	v4 "github.com/aws/aws-sdk-go-v2/aws/signer/v4"
	"github.com/aws/smithy-go/encoding/httpbinding"
	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

const (
	bedrockModel     = "us.anthropic.claude-sonnet-4-5-20250929-v1:0"
	bedrockARN       = "arn:aws:bedrock:us-east-1:123456789012:inference-profile/us.anthropic.claude-sonnet-4-5-20250929-v1:0"
	invokeBody       = `{"anthropic_version":"bedrock-2023-05-31","max_tokens":64,"messages":[{"role":"user","content":"hi"}]}`
	converseBody     = `{"messages":[{"role":"user","content":[{"text":"hi"}]}],"inferenceConfig":{"maxTokens":64}}`
	testAKID         = "AKIAMOCKACCESSKEY01"
	testSecret       = "mock/secret+access/key"
	signatureMessage = `{"message":"The request signature we calculated does not match the signature you provided. Check your AWS Secret Access Key and signing method. Consult the service documentation for details."}`
	throttlingType   = "ThrottlingException:http://internal.amazon.com/coral/com.amazon.bedrock/"
)

// sdkPath is the path of a Bedrock runtime operation as the AWS SDK
// builds it: the model id escaped as a URI label (":" as %3A, "/" as %2F).
func sdkPath(model, action string) string {
	return "/model/" + httpbinding.EscapePath(model, true) + "/" + action
}

// esMessage is one decoded event-stream message.
type esMessage struct {
	headers map[string]string
	payload []byte
	at      time.Duration
}

// readFrames decodes an event stream with the AWS SDK's decoder; err is
// nil when it ended cleanly between messages.
func readFrames(resp *http.Response, start time.Time) (msgs []esMessage, err error) {
	defer resp.Body.Close()
	dec := eventstream.NewDecoder()
	for {
		m, err := dec.Decode(resp.Body, nil)
		if err == io.EOF {
			return msgs, nil
		}
		if err != nil {
			return msgs, err
		}
		hs := make(map[string]string, len(m.Headers))
		for _, h := range m.Headers {
			hs[h.Name] = h.Value.String()
		}
		msgs = append(msgs, esMessage{headers: hs, payload: m.Payload, at: time.Since(start)})
	}
}

// invokeEvent is an Anthropic stream event carried by a chunk message.
type invokeEvent struct {
	Type    string `json:"type"`
	Message *struct {
		Model string `json:"model"`
	} `json:"message"`
	Delta *struct {
		Type       string `json:"type"`
		Text       string `json:"text"`
		StopReason string `json:"stop_reason"`
	} `json:"delta"`
	Metrics *struct {
		InputTokenCount   *int   `json:"inputTokenCount"`
		OutputTokenCount  *int   `json:"outputTokenCount"`
		InvocationLatency *int64 `json:"invocationLatency"`
		FirstByteLatency  *int64 `json:"firstByteLatency"`
	} `json:"amazon-bedrock-invocationMetrics"`
	raw string
}

// chunkEvents checks each message is a chunk event and decodes the
// Anthropic events they carry.
func chunkEvents(t *testing.T, msgs []esMessage) []invokeEvent {
	t.Helper()
	var out []invokeEvent
	for i, m := range msgs {
		if m.headers[":message-type"] != "event" || m.headers[":event-type"] != "chunk" || m.headers[":content-type"] != "application/json" {
			t.Fatalf("message %d: expected a chunk event, got headers %v payload %s", i, m.headers, m.payload)
		}
		var c struct {
			Bytes []byte `json:"bytes"`
			P     string `json:"p"`
		}
		if err := json.Unmarshal(m.payload, &c); err != nil || c.P == "" {
			t.Fatalf("message %d: expected {bytes, p}, got %s (%v)", i, m.payload, err)
		}
		var ev invokeEvent
		if err := json.Unmarshal(c.Bytes, &ev); err != nil {
			t.Fatalf("message %d: chunk bytes %q: %v", i, c.Bytes, err)
		}
		ev.raw = string(c.Bytes)
		out = append(out, ev)
	}
	return out
}

func eventTypes(evs []invokeEvent) string {
	var s []string
	for _, e := range evs {
		s = append(s, e.Type)
	}
	return strings.Join(s, ",")
}

func TestBedrockInvoke(t *testing.T) {
	for _, path := range []string{
		"/model/" + bedrockModel + "/invoke",       // ":" as is
		sdkPath(bedrockModel, "invoke"),            // ":" as %3A, as the SDK sends it
		"/bedrock" + sdkPath(bedrockARN, "invoke"), // an ARN, with a prefix
	} {
		t.Run(path, func(t *testing.T) {
			s := serve(t, Handler{Dialect: DialectBedrock}, nil)
			resp := s.post(t, path, invokeBody)
			body := readAll(t, resp)
			if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "application/json" {
				t.Fatalf("expected 200 application/json, got %d %q: %s", resp.StatusCode, resp.Header.Get("Content-Type"), body)
			}
			want := bedrockModel
			if strings.Contains(path, "arn") {
				want = bedrockARN
			}
			var m anthropicMsg
			if err := json.Unmarshal([]byte(body), &m); err != nil {
				t.Fatal(err)
			}
			if m.Type != "message" || m.Role != "assistant" || m.Model != want || len(m.Content) != 1 || m.Content[0].Text != DefaultReply ||
				m.StopReason == nil || *m.StopReason != "end_turn" || m.Usage.InputTokens != tokensOf(invokeBody) || m.Usage.OutputTokens != DefaultChunks {
				t.Errorf("expected the anthropic dialect's message for %s, got %s", want, body)
			}
			if st := s.h.Stats(); st.LastModel != want || st.Requests != 1 {
				t.Errorf("expected last_model %q, got %+v", want, st)
			}
			if resp.Header.Get("X-Amzn-Bedrock-Input-Token-Count") != strconv.Itoa(tokensOf(invokeBody)) ||
				resp.Header.Get("X-Amzn-Bedrock-Output-Token-Count") != "5" || resp.Header.Get("X-Amzn-Requestid") == "" {
				t.Errorf("expected Bedrock's headers, got %v", resp.Header)
			}
		})
	}

	// The same bytes as the anthropic dialect's answer, but for the id.
	b := serve(t, Handler{Dialect: DialectBedrock, Reply: "<é>"}, nil)
	a := serve(t, Handler{Dialect: DialectAnthropic, Reply: "<é>"}, nil)
	got := readAll(t, b.post(t, sdkPath(bedrockModel, "invoke"), invokeBody))
	want := readAll(t, a.post(t, "/v1/messages", strings.Replace(invokeBody, "{", `{"model":"`+bedrockModel+`",`, 1)))
	var gm, wm map[string]any
	_ = json.Unmarshal([]byte(got), &gm)
	_ = json.Unmarshal([]byte(want), &wm)
	delete(gm, "id")
	delete(wm, "id")
	delete(gm, "usage") // the bodies differ in size
	delete(wm, "usage")
	gj, _ := json.Marshal(gm)
	wj, _ := json.Marshal(wm)
	if string(gj) != string(wj) {
		t.Errorf("expected the anthropic dialect's answer %s, got %s", wj, gj)
	}
}

func TestBedrockInvokeStream(t *testing.T) {
	s := serve(t, Handler{Dialect: DialectBedrock, Chunks: 3, Reply: "abcdef", FirstTokenDelay: caddyMs(150), ChunkInterval: caddyMs(40)}, nil)
	start := time.Now()
	resp := s.post(t, sdkPath(bedrockModel, "invoke-with-response-stream"), invokeBody)
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "application/vnd.amazon.eventstream" {
		t.Fatalf("expected a 200 event stream, got %d %q: %s", resp.StatusCode, resp.Header.Get("Content-Type"), readAll(t, resp))
	}
	msgs, err := readFrames(resp, start)
	if err != nil {
		t.Fatalf("expected a clean end, got %v", err)
	}
	evs := chunkEvents(t, msgs)
	const want = "message_start,content_block_start,ping,content_block_delta,content_block_delta,content_block_delta,content_block_stop,message_delta,message_stop"
	if got := eventTypes(evs); got != want {
		t.Fatalf("expected events %s, got %s", want, got)
	}
	if evs[0].Message == nil || evs[0].Message.Model != bedrockModel {
		t.Errorf("expected message_start of %s, got %s", bedrockModel, evs[0].raw)
	}
	var text strings.Builder
	for _, e := range evs[3:6] {
		text.WriteString(e.Delta.Text)
	}
	if text.String() != "abcdef" {
		t.Errorf("expected the reply in the deltas, got %q", text.String())
	}
	if d := evs[7].Delta; d == nil || d.StopReason != "end_turn" {
		t.Errorf("expected message_delta end_turn, got %s", evs[7].raw)
	}
	m := evs[8].Metrics
	if m == nil || m.InputTokenCount == nil || *m.InputTokenCount != tokensOf(invokeBody) || *m.OutputTokenCount != 3 ||
		m.InvocationLatency == nil || *m.InvocationLatency < 230 || m.FirstByteLatency == nil || *m.FirstByteLatency < 150 ||
		*m.FirstByteLatency > *m.InvocationLatency {
		t.Errorf("expected invocation metrics in message_stop, got %s", evs[8].raw)
	}
	// Pacing: the prelude before FirstTokenDelay, then the chunks.
	if msgs[2].at >= 150*time.Millisecond || msgs[3].at < 150*time.Millisecond || msgs[5].at-msgs[3].at < 80*time.Millisecond {
		t.Errorf("expected the prelude at once and paced chunks, got %v %v %v", msgs[2].at, msgs[3].at, msgs[5].at)
	}

	// The events are the anthropic dialect's, byte for byte but for ids.
	a := serve(t, Handler{Dialect: DialectAnthropic, Chunks: 3, Reply: "abcdef"}, nil)
	sse := readEvents(a.post(t, "/v1/messages", strings.Replace(invokeBody, "{", `{"model":"`+bedrockModel+`","stream":true,`, 1)), time.Now())
	if len(sse.events) != len(evs) {
		t.Fatalf("expected as many events as the anthropic dialect's %d, got %d", len(sse.events), len(evs))
	}
	for i, e := range sse.events[1:8] {
		if e.data != evs[i+1].raw {
			t.Errorf("event %d: expected %s, got %s", i+1, e.data, evs[i+1].raw)
		}
	}
}

func caddyMs(n int) caddy.Duration { return caddy.Duration(time.Duration(n) * time.Millisecond) }

func TestBedrockInvokeValidation(t *testing.T) {
	const malformed = "Malformed input request: "
	for _, tt := range []struct {
		name, model, body, want string
	}{
		{"no version", bedrockModel, `{"max_tokens":1,"messages":[]}`, "required key [anthropic_version] not found"},
		{"wrong version", bedrockModel, `{"anthropic_version":"vertex-2023-10-16","max_tokens":1,"messages":[]}`, "#/anthropic_version"},
		{"model", bedrockModel, `{"anthropic_version":"bedrock-2023-05-31","model":"x","max_tokens":1,"messages":[]}`, "extraneous key [model] is not permitted"},
		{"stream", bedrockModel, `{"anthropic_version":"bedrock-2023-05-31","stream":true,"max_tokens":1,"messages":[]}`, "extraneous key [stream] is not permitted"},
		{"beta not an array", bedrockModel, `{"anthropic_version":"bedrock-2023-05-31","anthropic_beta":"x","max_tokens":1,"messages":[]}`, "#/anthropic_beta"},
		{"no max_tokens", bedrockModel, `{"anthropic_version":"bedrock-2023-05-31","messages":[]}`, "required key [max_tokens] not found"},
		{"not anthropic", "amazon.nova-pro-v1:0", invokeBody, "use converse"},
		{"bad JSON", bedrockModel, `{"anthropic_version":`, "Malformed input request"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			s := serve(t, Handler{Dialect: DialectBedrock}, nil)
			for _, action := range []string{"invoke", "invoke-with-response-stream"} {
				resp := s.post(t, sdkPath(tt.model, action), tt.body)
				body := readAll(t, resp)
				var e struct{ Message string }
				_ = json.Unmarshal([]byte(body), &e)
				if resp.StatusCode != 400 || !strings.HasPrefix(resp.Header.Get("X-Amzn-Errortype"), "ValidationException") ||
					!strings.Contains(e.Message, tt.want) || (strings.HasPrefix(tt.want, "required") && !strings.HasPrefix(e.Message, malformed)) {
					t.Errorf("%s: expected 400 ValidationException with %q, got %d %q %s", action, tt.want, resp.StatusCode, resp.Header.Get("X-Amzn-Errortype"), body)
				}
			}
		})
	}
	s := serve(t, Handler{Dialect: DialectBedrock}, nil)
	ok := `{"anthropic_version":"bedrock-2023-05-31","anthropic_beta":["context-1m-2025-08-07"],"max_tokens":1,"messages":[]}`
	if resp := s.post(t, sdkPath(bedrockModel, "invoke"), ok); resp.StatusCode != 200 {
		t.Errorf("expected anthropic_beta accepted, got %d %s", resp.StatusCode, readAll(t, resp))
	}
}

type converseOut struct {
	Output struct {
		Message struct {
			Role    string `json:"role"`
			Content []struct {
				Text    *string `json:"text"`
				ToolUse *struct {
					ToolUseID string          `json:"toolUseId"`
					Name      string          `json:"name"`
					Input     json.RawMessage `json:"input"`
				} `json:"toolUse"`
			} `json:"content"`
		} `json:"message"`
	} `json:"output"`
	StopReason string `json:"stopReason"`
	Usage      struct {
		InputTokens, OutputTokens, TotalTokens int
	} `json:"usage"`
	Metrics *struct {
		LatencyMs *int64 `json:"latencyMs"`
	} `json:"metrics"`
}

func TestBedrockConverse(t *testing.T) {
	for _, model := range []string{bedrockModel, "amazon.nova-pro-v1:0", bedrockARN} {
		s := serve(t, Handler{Dialect: DialectBedrock, Reply: "Hi <there>"}, nil)
		resp := s.post(t, sdkPath(model, "converse"), converseBody)
		body := readAll(t, resp)
		if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "application/json" {
			t.Fatalf("%s: expected 200, got %d: %s", model, resp.StatusCode, body)
		}
		var c converseOut
		if err := json.Unmarshal([]byte(body), &c); err != nil {
			t.Fatal(err)
		}
		p := tokensOf(converseBody)
		if c.Output.Message.Role != "assistant" || len(c.Output.Message.Content) != 1 || c.Output.Message.Content[0].Text == nil ||
			*c.Output.Message.Content[0].Text != "Hi <there>" || c.StopReason != "end_turn" ||
			c.Usage.InputTokens != p || c.Usage.OutputTokens != 5 || c.Usage.TotalTokens != p+5 || c.Metrics == nil || c.Metrics.LatencyMs == nil {
			t.Errorf("%s: unexpected answer %s", model, body)
		}
		if !strings.Contains(body, `"text":"Hi <there>"`) {
			t.Errorf("expected no HTML escaping, got %s", body)
		}
		if st := s.h.Stats(); st.LastModel != model {
			t.Errorf("expected last_model %q, got %q", model, st.LastModel)
		}
	}
}

// converseEvents checks each message is an event of Converse and
// returns "name payload" lines.
func converseEvents(t *testing.T, msgs []esMessage) []string {
	t.Helper()
	var out []string
	for i, m := range msgs {
		if m.headers[":message-type"] != "event" || m.headers[":content-type"] != "application/json" || m.headers[":event-type"] == "" {
			t.Fatalf("message %d: expected an event, got %v %s", i, m.headers, m.payload)
		}
		out = append(out, m.headers[":event-type"]+" "+string(m.payload))
	}
	return out
}

func TestBedrockConverseStream(t *testing.T) {
	s := serve(t, Handler{Dialect: DialectBedrock, Chunks: 2, Reply: "abcd"}, nil)
	resp := s.post(t, sdkPath("amazon.nova-pro-v1:0", "converse-stream"), converseBody)
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "application/vnd.amazon.eventstream" {
		t.Fatalf("expected a 200 event stream, got %d %q", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	msgs, err := readFrames(resp, time.Now())
	if err != nil {
		t.Fatalf("expected a clean end, got %v", err)
	}
	evs := converseEvents(t, msgs)
	p := tokensOf(converseBody)
	want := []string{
		`messageStart {"role":"assistant"}`,
		`contentBlockDelta {"contentBlockIndex":0,"delta":{"text":"ab"}}`,
		`contentBlockDelta {"contentBlockIndex":0,"delta":{"text":"cd"}}`,
		`contentBlockStop {"contentBlockIndex":0}`,
		`messageStop {"stopReason":"end_turn"}`,
		`metadata {"usage":{"inputTokens":` + strconv.Itoa(p) + `,"outputTokens":2,"totalTokens":` + strconv.Itoa(p+2) + `},"metrics":{"latencyMs":`,
	}
	if len(evs) != len(want) {
		t.Fatalf("expected %d events, got %q", len(want), evs)
	}
	for i := range want {
		if !strings.HasPrefix(evs[i], want[i]) {
			t.Errorf("event %d: expected %s, got %s", i, want[i], evs[i])
		}
	}
}

func TestBedrockConverseValidation(t *testing.T) {
	for _, tt := range []struct{ name, body, want string }{
		{"no messages", `{"messages":[]}`, "must start with a user message"},
		{"first assistant", `{"messages":[{"role":"assistant","content":[{"text":"x"}]}]}`, "must start with a user message"},
		{"not alternating", `{"messages":[{"role":"user","content":[{"text":"x"}]},{"role":"user","content":[{"text":"y"}]}]}`, "must alternate between user and assistant"},
		{"empty content", `{"messages":[{"role":"user","content":[]}]}`, "messages.0 is empty"},
		{"bad role", `{"messages":[{"role":"system","content":[{"text":"x"}]}]}`, "Member must satisfy enum value set: [user, assistant]"},
		{"string content", `{"messages":[{"role":"user","content":"hi"}]}`, "not a Converse request"},
		{"string system", `{"system":"be nice","messages":[{"role":"user","content":[{"text":"x"}]}]}`, "not a Converse request"},
		{"unknown block", `{"messages":[{"role":"user","content":[{"type":"text"}]}]}`, "content block at messages.0.content.0"},
		{"tools without toolConfig", `{"messages":[{"role":"user","content":[{"text":"x"}]},{"role":"assistant","content":[{"toolUse":{"toolUseId":"t","name":"f","input":{}}}]},{"role":"user","content":[{"toolResult":{"toolUseId":"t","content":[{"text":"ok"}]}}]}]}`,
			"The toolConfig field must be defined when using toolUse and toolResult content blocks."},
		{"empty tools", `{"messages":[{"role":"user","content":[{"text":"x"}]}],"toolConfig":{"tools":[]}}`, "toolConfig.tools"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			s := serve(t, Handler{Dialect: DialectBedrock}, nil)
			for _, action := range []string{"converse", "converse-stream"} {
				resp := s.post(t, sdkPath(bedrockModel, action), tt.body)
				body := readAll(t, resp)
				if resp.StatusCode != 400 || resp.Header.Get("X-Amzn-Errortype") != "ValidationException:http://internal.amazon.com/coral/com.amazon.bedrock/" ||
					!strings.Contains(body, tt.want) || !strings.HasPrefix(body, `{"message":"`) {
					t.Errorf("%s: expected 400 ValidationException %q, got %d %q %s", action, tt.want, resp.StatusCode, resp.Header.Get("X-Amzn-Errortype"), body)
				}
			}
		})
	}
}

func TestBedrockToolCall(t *testing.T) {
	tc := &ToolCall{Name: "get_weather", Arguments: json.RawMessage(`{"city":"Paris","days":[1,2]}`)}
	const tools = `"toolConfig":{"tools":[{"toolSpec":{"name":"get_weather","description":"w","inputSchema":{"json":{"type":"object"}}}}],"toolChoice":{"auto":{}}}`
	ask := `{"messages":[{"role":"user","content":[{"text":"Weather?"}]}],` + tools + `}`
	answer := `{"messages":[{"role":"user","content":[{"text":"Weather?"}]},{"role":"assistant","content":[{"toolUse":{"toolUseId":"tooluse_mock1","name":"get_weather","input":{"city":"Paris"}}}]},` +
		`{"role":"user","content":[{"toolResult":{"toolUseId":"tooluse_mock1","content":[{"json":{"sky":"sunny"}}],"status":"success"}}]}],` + tools + `}`
	s := serve(t, Handler{Dialect: DialectBedrock, Reply: "Sunny.", ToolCall: tc}, nil)

	var c converseOut
	body := readAll(t, s.post(t, sdkPath(bedrockModel, "converse"), ask))
	if err := json.Unmarshal([]byte(body), &c); err != nil {
		t.Fatal(err)
	}
	if c.StopReason != "tool_use" || len(c.Output.Message.Content) != 1 || c.Output.Message.Content[0].ToolUse == nil {
		t.Fatalf("expected a toolUse, got %s", body)
	}
	if tu := c.Output.Message.Content[0].ToolUse; !strings.HasPrefix(tu.ToolUseID, "tooluse_") || tu.Name != "get_weather" || string(tu.Input) != `{"city":"Paris","days":[1,2]}` {
		t.Errorf("unexpected toolUse %s", body)
	}
	if body := readAll(t, s.post(t, sdkPath(bedrockModel, "converse"), answer)); !strings.Contains(body, `"text":"Sunny."`) || !strings.Contains(body, `"stopReason":"end_turn"`) {
		t.Errorf("expected the reply after the result, got %s", body)
	}
	if body := readAll(t, s.post(t, sdkPath(bedrockModel, "converse"), converseBody)); !strings.Contains(body, `"text":"Sunny."`) {
		t.Errorf("expected the reply when the tool is not offered, got %s", body)
	}

	msgs, err := readFrames(s.post(t, sdkPath(bedrockModel, "converse-stream"), ask), time.Now())
	if err != nil {
		t.Fatal(err)
	}
	evs := converseEvents(t, msgs)
	names := make([]string, len(evs))
	var input strings.Builder
	for i, e := range evs {
		name, payload, _ := strings.Cut(e, " ")
		names[i] = name
		if name == "contentBlockDelta" {
			var d struct {
				Delta struct {
					ToolUse struct{ Input string } `json:"toolUse"`
				} `json:"delta"`
			}
			_ = json.Unmarshal([]byte(payload), &d)
			input.WriteString(d.Delta.ToolUse.Input)
		}
	}
	if got := strings.Join(names, ","); got != "messageStart,contentBlockStart,contentBlockDelta,contentBlockDelta,contentBlockStop,messageStop,metadata" {
		t.Errorf("unexpected tool stream %s", got)
	}
	if !strings.Contains(evs[1], `{"contentBlockIndex":0,"start":{"toolUse":{"name":"get_weather","toolUseId":"tooluse_`) ||
		evs[5] != `messageStop {"stopReason":"tool_use"}` || input.String() != `{"city":"Paris","days":[1,2]}` {
		t.Errorf("unexpected tool stream %q (input %q)", evs, input.String())
	}

	// invoke scripts the call as the anthropic dialect does.
	inv := `{"anthropic_version":"bedrock-2023-05-31","max_tokens":9,"messages":[{"role":"user","content":"Weather?"}]}`
	if body := readAll(t, s.post(t, sdkPath(bedrockModel, "invoke"), inv)); !strings.Contains(body, `"stop_reason":"tool_use"`) || !strings.Contains(body, `"name":"get_weather"`) {
		t.Errorf("expected an Anthropic tool_use, got %s", body)
	}
	msgs, err = readFrames(s.post(t, sdkPath(bedrockModel, "invoke-with-response-stream"), inv), time.Now())
	if err != nil {
		t.Fatal(err)
	}
	ievs := chunkEvents(t, msgs)
	if got := eventTypes(ievs); got != "message_start,content_block_start,content_block_delta,content_block_stop,message_delta,message_stop" ||
		!strings.Contains(ievs[1].raw, `"tool_use"`) || ievs[5].Metrics == nil {
		t.Errorf("unexpected invoke tool stream %s: %v", got, ievs)
	}
}

// signed sends a request signed as the AWS SDK signs Bedrock runtime
// requests, at path; edit changes it after signing.
func signed(t *testing.T, s *served, path, body string, creds aws.Credentials, edit func(*http.Request)) *http.Response {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, s.srv.URL+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json")
	sum := sha256.Sum256([]byte(body))
	if err := v4.NewSigner().SignHTTP(context.Background(), creds, req, hex.EncodeToString(sum[:]), "bedrock", "us-west-2", time.Now()); err != nil {
		t.Fatal(err)
	}
	// Headers clients add after signing are not part of the signature.
	req.Header.Set("User-Agent", "aws-sdk-go-v2/1.0 mock-test")
	req.Header.Set("Amz-Sdk-Invocation-Id", "abc")
	if edit != nil {
		edit(req)
	}
	resp, err := s.srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

func TestBedrockSigV4(t *testing.T) {
	good := aws.Credentials{AccessKeyID: testAKID, SecretAccessKey: testSecret}
	tests := []struct {
		name     string
		path     string
		creds    aws.Credentials
		edit     func(*http.Request)
		body     string
		wantType string // "" for accepted
	}{
		{"model id", sdkPath(bedrockModel, "invoke"), good, nil, "", ""},
		{"model id with a raw colon", "/model/" + bedrockModel + "/invoke", good, nil, "", ""},
		{"ARN", sdkPath(bedrockARN, "invoke"), good, nil, "", ""},
		{"ARN converse", sdkPath(bedrockARN, "converse"), good, nil, converseBody, ""},
		{"ARN path-escaped", "/model/" + url.PathEscape(bedrockARN) + "/invoke", good, nil, "", ""}, // ":" raw, "/" as %2F
		{"session token", sdkPath(bedrockModel, "invoke"), aws.Credentials{AccessKeyID: testAKID, SecretAccessKey: testSecret, SessionToken: "FwoGZXIvYXdzEMock//token=="}, nil, "", ""},
		{"content sha256", sdkPath(bedrockModel, "invoke"), good, func(r *http.Request) {
			sum := sha256.Sum256([]byte(invokeBody))
			r.Header.Set("X-Amz-Content-Sha256", hex.EncodeToString(sum[:]))
		}, "", ""},
		{"wrong secret", sdkPath(bedrockModel, "invoke"), aws.Credentials{AccessKeyID: testAKID, SecretAccessKey: "wrong"}, nil, "", "InvalidSignatureException"},
		{"wrong secret ARN", sdkPath(bedrockARN, "invoke"), aws.Credentials{AccessKeyID: testAKID, SecretAccessKey: "wrong"}, nil, "", "InvalidSignatureException"},
		{"unknown key id", sdkPath(bedrockModel, "invoke"), aws.Credentials{AccessKeyID: "AKIAOTHER", SecretAccessKey: testSecret}, nil, "", "UnrecognizedClientException"},
		{"no authorization", sdkPath(bedrockModel, "invoke"), good, func(r *http.Request) { r.Header.Del("Authorization") }, "", "MissingAuthenticationTokenException"},
		{"body changed", sdkPath(bedrockModel, "invoke"), good, func(r *http.Request) {
			b := strings.Replace(invokeBody, "hi", "ho", 1)
			r.Body, r.ContentLength = io.NopCloser(strings.NewReader(b)), int64(len(b))
		}, "", "InvalidSignatureException"},
		{"path changed", sdkPath(bedrockModel, "invoke"), good, func(r *http.Request) {
			r.URL.Path = strings.Replace(r.URL.Path, "sonnet", "opus", 1)
			r.URL.RawPath = strings.Replace(r.URL.RawPath, "sonnet", "opus", 1)
		}, "", "InvalidSignatureException"},
		{"signed header changed", sdkPath(bedrockModel, "invoke"), good, func(r *http.Request) { r.Header.Set("Accept", "*/*") }, "", "InvalidSignatureException"},
		{"wrong content sha256", sdkPath(bedrockModel, "invoke"), good, func(r *http.Request) { r.Header.Set("X-Amz-Content-Sha256", strings.Repeat("0", 64)) }, "", "InvalidSignatureException"},
		{"other service", sdkPath(bedrockModel, "invoke"), good, func(r *http.Request) {
			r.Header.Set("Authorization", strings.Replace(r.Header.Get("Authorization"), "/bedrock/", "/s3/", 1))
		}, "", "InvalidSignatureException"},
		{"no date", sdkPath(bedrockModel, "invoke"), good, func(r *http.Request) { r.Header.Del("X-Amz-Date") }, "", "IncompleteSignatureException"},
		{"basic auth", sdkPath(bedrockModel, "invoke"), good, func(r *http.Request) { r.SetBasicAuth("a", "b") }, "", "IncompleteSignatureException"},
		{"wrong api key", sdkPath(bedrockModel, "invoke"), good, func(r *http.Request) { r.Header.Set("Authorization", "Bearer nope") }, "", "UnrecognizedClientException"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := serve(t, Handler{Dialect: DialectBedrock, AWSCredentials: &AWSCredentials{AccessKeyID: testAKID, SecretAccessKey: testSecret}}, nil)
			body := tt.body
			if body == "" {
				body = invokeBody
			}
			resp := signed(t, s, tt.path, body, tt.creds, tt.edit)
			got := readAll(t, resp)
			st := s.h.Stats()
			if tt.wantType == "" {
				if resp.StatusCode != 200 || st.AuthAccepted != 1 || st.AuthRefused != 0 {
					t.Fatalf("expected the signature accepted, got %d %s (%+v)", resp.StatusCode, got, st)
				}
				if st.LastPrincipal != testAKID || st.LastAPIKey != "" {
					t.Errorf("expected principal %s, got %q %q", testAKID, st.LastPrincipal, st.LastAPIKey)
				}
				return
			}
			if resp.StatusCode != 403 || resp.Header.Get("X-Amzn-Errortype") != tt.wantType || st.AuthRefused != 1 || st.AuthAccepted != 0 {
				t.Fatalf("expected 403 %s, got %d %q %s (%+v)", tt.wantType, resp.StatusCode, resp.Header.Get("X-Amzn-Errortype"), got, st)
			}
			if tt.wantType == "InvalidSignatureException" && !strings.Contains(tt.name, "service") && got != signatureMessage {
				t.Errorf("expected %s, got %s", signatureMessage, got)
			}
		})
	}

	// Streams are signed the same way.
	s := serve(t, Handler{Dialect: DialectBedrock, AWSCredentials: &AWSCredentials{AccessKeyID: testAKID, SecretAccessKey: testSecret}}, nil)
	for _, p := range []string{sdkPath(bedrockARN, "invoke-with-response-stream"), sdkPath(bedrockModel, "converse-stream")} {
		body := invokeBody
		if strings.Contains(p, "converse") {
			body = converseBody
		}
		resp := signed(t, s, p, body, good, nil)
		if msgs, err := readFrames(resp, time.Now()); resp.StatusCode != 200 || err != nil || len(msgs) < 5 {
			t.Errorf("%s: expected a signed stream accepted, got %d %v %d messages", p, resp.StatusCode, err, len(msgs))
		}
	}
}

func TestBedrockAPIKey(t *testing.T) {
	s := serve(t, Handler{Dialect: DialectBedrock, APIKey: "ABSKbW9ja2tleQ==", AWSCredentials: &AWSCredentials{AccessKeyID: testAKID, SecretAccessKey: testSecret}}, nil)
	path := sdkPath(bedrockModel, "invoke")
	if resp := s.post(t, path, invokeBody, "Authorization", "Bearer ABSKbW9ja2tleQ=="); resp.StatusCode != 200 {
		t.Errorf("expected the API key accepted, got %d %s", resp.StatusCode, readAll(t, resp))
	}
	if st := s.h.Stats(); st.LastAPIKey != "ABSKbW9ja2tleQ==" || st.AuthAccepted != 1 {
		t.Errorf("unexpected stats %+v", st)
	}
	resp := s.post(t, path, invokeBody, "Authorization", "Bearer ABSKother")
	if body := readAll(t, resp); resp.StatusCode != 403 || resp.Header.Get("X-Amzn-Errortype") != "UnrecognizedClientException" {
		t.Errorf("expected 403 for a wrong key, got %d %s", resp.StatusCode, body)
	}
	resp = s.post(t, path, invokeBody)
	if body := readAll(t, resp); resp.StatusCode != 403 || resp.Header.Get("X-Amzn-Errortype") != "MissingAuthenticationTokenException" ||
		body != `{"message":"Missing Authentication Token"}` {
		t.Errorf("expected 403 without a key, got %d %q %s", resp.StatusCode, resp.Header.Get("X-Amzn-Errortype"), body)
	}
	if resp := signed(t, s, path, invokeBody, aws.Credentials{AccessKeyID: testAKID, SecretAccessKey: testSecret}, nil); resp.StatusCode != 200 {
		t.Errorf("expected a signature accepted too, got %d", resp.StatusCode)
	}
	if st := s.h.Stats(); st.AuthAccepted != 2 || st.AuthRefused != 2 || st.Requests != 4 {
		t.Errorf("unexpected stats %+v", st)
	}

	// An API key alone: signatures are refused.
	k := serve(t, Handler{Dialect: DialectBedrock, APIKey: "k"}, nil)
	if resp := signed(t, k, path, invokeBody, aws.Credentials{AccessKeyID: testAKID, SecretAccessKey: testSecret}, nil); resp.StatusCode != 403 ||
		resp.Header.Get("X-Amzn-Errortype") != "UnrecognizedClientException" {
		t.Errorf("expected a signature refused without aws_credentials, got %d", resp.StatusCode)
	}
	// No credentials configured: anything goes, nothing is counted.
	o := serve(t, Handler{Dialect: DialectBedrock}, nil)
	if resp := o.post(t, path, invokeBody, "Authorization", "Bearer whatever"); resp.StatusCode != 200 {
		t.Errorf("expected an open mock, got %d", resp.StatusCode)
	}
	if st := o.h.Stats(); st.AuthAccepted != 0 || st.AuthRefused != 0 {
		t.Errorf("expected no auth counted, got %+v", st)
	}
}

func TestBedrockFaults(t *testing.T) {
	const coral = ":http://internal.amazon.com/coral/com.amazon.bedrock/"
	tests := []struct {
		name       string
		fault      Fault
		wantStatus int
		wantType   string
		wantBody   string
		wantRetry  string
	}{
		{"rate_limit", Fault{Kind: FaultRateLimit}, 429, throttlingType, `{"message":"Too many requests, please wait before trying again."}`, ""},
		{"rate_limit tokens", Fault{Kind: FaultRateLimit, Quota: QuotaTokens, RetryDelay: caddy.Duration(1500 * time.Millisecond)}, 429, throttlingType,
			`{"message":"Too many tokens, please wait before trying again."}`, "2"},
		{"rate_limit tokens per day", Fault{Kind: FaultRateLimit, Quota: QuotaTokensDay}, 429, throttlingType,
			`{"message":"Too many tokens per day, please wait before trying again."}`, ""},
		{"rate_limit header", Fault{Kind: FaultRateLimit, Headers: http.Header{"Retry-After": {"7"}}}, 429, throttlingType, `{"message":"Too many requests, please wait before trying again."}`, "7"},
		{"status default", Fault{Kind: FaultStatus}, 500, "InternalServerException" + coral,
			`{"message":"The system encountered an unexpected error during processing. Try your request again."}`, ""},
		{"status 503", Fault{Kind: FaultStatus, Status: 503}, 503, "ServiceUnavailableException" + coral, `{"message":"Bedrock is unable to process your request."}`, ""},
		{"status 424", Fault{Kind: FaultStatus, Status: 424}, 424, "ModelErrorException" + coral, "", ""},
		{"status 408", Fault{Kind: FaultStatus, Status: 408}, 408, "ModelTimeoutException" + coral, "", ""},
		{"status 400 context", Fault{Kind: FaultStatus, Status: 400}, 400, "ValidationException" + coral, `{"message":"Input is too long for requested model."}`, ""},
		{"status 429", Fault{Kind: FaultStatus, Status: 429}, 429, throttlingType, "", ""},
		{"overloaded", Fault{Kind: FaultErrorEvent}, 503, "ServiceUnavailableException" + coral, `{"message":"Bedrock is unable to process your request."}`, ""},
		{"custom body", Fault{Kind: FaultStatus, Status: 500, Body: `{"message":"boom"}`}, 500, "InternalServerException" + coral, `{"message":"boom"}`, ""},
		{"custom type", Fault{Kind: FaultStatus, Status: 403, Headers: http.Header{"X-Amzn-Errortype": {"AccessDeniedException"}}}, 403, "AccessDeniedException", "", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := serve(t, Handler{Dialect: DialectBedrock, Faults: []Fault{tt.fault}}, nil)
			for _, p := range []string{sdkPath(bedrockModel, "invoke"), sdkPath(bedrockModel, "converse")} {
				body := invokeBody
				if strings.HasSuffix(p, "converse") {
					body = converseBody
				}
				resp := s.post(t, p, body)
				got := readAll(t, resp)
				if resp.StatusCode != tt.wantStatus || resp.Header.Get("X-Amzn-Errortype") != tt.wantType ||
					(tt.wantBody != "" && got != tt.wantBody) || resp.Header.Get("Retry-After") != tt.wantRetry {
					t.Errorf("%s: expected %d %s %s Retry-After %q, got %d %q %s %q", p, tt.wantStatus, tt.wantType, tt.wantBody, tt.wantRetry,
						resp.StatusCode, resp.Header.Get("X-Amzn-Errortype"), got, resp.Header.Get("Retry-After"))
				}
				var e struct{ Message string }
				if json.Unmarshal([]byte(got), &e) != nil || e.Message == "" {
					t.Errorf("expected {\"message\": ...}, got %s", got)
				}
			}
		})
	}

	// The RateLimit window: requests, then tokens.
	s := serve(t, Handler{Dialect: DialectBedrock, RateLimit: &RateLimit{Requests: 1}}, newFakeClock())
	readAll(t, s.post(t, sdkPath(bedrockModel, "converse"), converseBody))
	resp := s.post(t, sdkPath(bedrockModel, "converse"), converseBody)
	if got := readAll(t, resp); resp.StatusCode != 429 || resp.Header.Get("X-Amzn-Errortype") != throttlingType ||
		got != `{"message":"Too many requests, please wait before trying again."}` {
		t.Errorf("expected a throttled request, got %d %q %s", resp.StatusCode, resp.Header.Get("X-Amzn-Errortype"), got)
	}
	for name := range resp.Header {
		if strings.Contains(strings.ToLower(name), "ratelimit") {
			t.Errorf("expected no rate-limit headers, got %s", name)
		}
	}
	s = serve(t, Handler{Dialect: DialectBedrock, RateLimit: &RateLimit{Tokens: 10}}, newFakeClock())
	if got := readAll(t, s.post(t, sdkPath(bedrockModel, "converse"), converseBody)); got != `{"message":"Too many tokens, please wait before trying again."}` {
		t.Errorf("expected too many tokens, got %s", got)
	}
}

func TestBedrockStreamFaults(t *testing.T) {
	for _, tt := range []struct {
		name     string
		fault    Fault
		wantExc  string
		wantBody string
	}{
		{"default", Fault{Kind: FaultErrorEvent, After: intp(2)}, "serviceUnavailableException", `{"message":"Bedrock is unable to process your request."}`},
		{"throttling", Fault{Kind: FaultErrorEvent, Status: 429, After: intp(1)}, "throttlingException", `{"message":"Too many requests, please wait before trying again."}`},
		{"internal", Fault{Kind: FaultErrorEvent, Status: 500, After: intp(0)}, "internalServerException", ""},
		{"model stream", Fault{Kind: FaultErrorEvent, Status: 424}, "modelStreamErrorException", ""},
		{"custom body", Fault{Kind: FaultErrorEvent, Status: 429, Body: `{"message":"slow down"}`}, "throttlingException", `{"message":"slow down"}`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			after := 1
			if tt.fault.After != nil {
				after = *tt.fault.After
			}
			s := serve(t, Handler{Dialect: DialectBedrock, Faults: []Fault{tt.fault}}, nil)
			for _, c := range []struct{ action, body string }{{"invoke-with-response-stream", invokeBody}, {"converse-stream", converseBody}} {
				resp := s.post(t, sdkPath(bedrockModel, c.action), c.body)
				msgs, err := readFrames(resp, time.Now())
				if err != nil || len(msgs) == 0 {
					t.Fatalf("%s: expected messages and a clean end, got %d, %v", c.action, len(msgs), err)
				}
				prelude := 3 // message_start, content_block_start, ping
				if c.action == "converse-stream" {
					prelude = 1 // messageStart
				}
				if len(msgs) != prelude+after+1 {
					t.Errorf("%s: expected %d messages then the exception, got %d", c.action, prelude+after, len(msgs)-1)
				}
				last := msgs[len(msgs)-1]
				if last.headers[":message-type"] != "exception" || last.headers[":exception-type"] != tt.wantExc || last.headers[":content-type"] != "application/json" {
					t.Errorf("%s: expected a %s exception, got %v %s", c.action, tt.wantExc, last.headers, last.payload)
				}
				var e struct{ Message string }
				if json.Unmarshal(last.payload, &e) != nil || e.Message == "" || (tt.wantBody != "" && string(last.payload) != tt.wantBody) {
					t.Errorf("%s: unexpected exception payload %s", c.action, last.payload)
				}
			}
		})
	}

	// A cut stream ends mid-message: the decoder fails.
	for _, after := range []int{0, 2, 5} {
		s := serve(t, Handler{Dialect: DialectBedrock, Faults: []Fault{{Kind: FaultCut, After: intp(after)}}}, nil)
		for _, c := range []struct {
			action, body string
			prelude      int
		}{{"invoke-with-response-stream", invokeBody, 3}, {"converse-stream", converseBody, 1}} {
			resp := s.post(t, sdkPath(bedrockModel, c.action), c.body)
			msgs, err := readFrames(resp, time.Now())
			if err == nil || errors.Is(err, io.EOF) || len(msgs) != c.prelude+after {
				t.Errorf("%s after %d: expected %d messages then an error, got %d, %v", c.action, after, c.prelude+after, len(msgs), err)
			}
		}
	}

	// keepalive: pings as chunk messages while the first token waits.
	s := serve(t, Handler{Dialect: DialectBedrock, FirstTokenDelay: caddyMs(250), Faults: []Fault{{Kind: FaultKeepAlive}}}, nil)
	msgs, err := readFrames(s.post(t, sdkPath(bedrockModel, "invoke-with-response-stream"), invokeBody), time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if evs := chunkEvents(t, msgs); strings.Count(eventTypes(evs), "ping") < 3 {
		t.Errorf("expected keep-alive pings, got %s", eventTypes(evs))
	}
	msgs, err = readFrames(s.post(t, sdkPath(bedrockModel, "converse-stream"), converseBody), time.Now())
	if err != nil || len(msgs) != 1+DefaultChunks+3 {
		t.Errorf("expected a converse stream without keep-alives, got %d %v", len(msgs), err)
	}
}

func TestBedrockRoutes(t *testing.T) {
	s := serve(t, Handler{Dialect: DialectBedrock}, nil)
	for _, p := range []string{
		"/model//invoke",
		"/model/" + bedrockModel + "/explode",
		"/models/" + bedrockModel + "/invoke",
		"/model/arn:aws:bedrock:us-east-1:1:inference-profile/us.anthropic.x/invoke", // a "/" not escaped
		"/v1/messages",
		"/v1/chat/completions",
	} {
		if resp := s.post(t, p, invokeBody); resp.StatusCode != 404 {
			t.Errorf("%s: expected 404, got %d", p, resp.StatusCode)
		}
	}
	resp, err := s.srv.Client().Get(s.srv.URL + "/models")
	if err != nil {
		t.Fatal(err)
	}
	if body := readAll(t, resp); !strings.Contains(body, `"modelSummaries":[{"modelId":"mock"`) {
		t.Errorf("unexpected model list %s", body)
	}
}

// TestBedrockSigV4AfterRewrite: behind a Caddy rewrite (handle_path
// stripping a prefix), the signature is checked against the path the
// client signed, Caddy's original request's.
func TestBedrockSigV4AfterRewrite(t *testing.T) {
	h := &Handler{Dialect: DialectBedrock, AWSCredentials: &AWSCredentials{AccessKeyID: testAKID, SecretAccessKey: testSecret}}
	if err := h.Setup(); err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	for _, rewrite := range []bool{true, false} {
		signedPath := "/aws" + sdkPath(bedrockARN, "invoke")
		r := httptest.NewRequest(http.MethodPost, "http://bedrock.example"+signedPath, strings.NewReader(invokeBody))
		r.Header.Set("Content-Type", "application/json")
		sum := sha256.Sum256([]byte(invokeBody))
		if err := v4.NewSigner().SignHTTP(context.Background(), aws.Credentials{AccessKeyID: testAKID, SecretAccessKey: testSecret},
			r, hex.EncodeToString(sum[:]), "bedrock", "eu-west-1", time.Now()); err != nil {
			t.Fatal(err)
		}
		r.Body = io.NopCloser(strings.NewReader(invokeBody))
		orig := *r
		origURL := *r.URL
		orig.URL = &origURL
		r.URL.Path = strings.TrimPrefix(r.URL.Path, "/aws")
		r.URL.RawPath = strings.TrimPrefix(r.URL.RawPath, "/aws")
		if rewrite {
			r = r.WithContext(context.WithValue(r.Context(), caddyhttp.OriginalRequestCtxKey, orig))
		}
		rec := httptest.NewRecorder()
		h.HTTPHandler().ServeHTTP(rec, r)
		if want := map[bool]int{true: 200, false: 403}[rewrite]; rec.Code != want {
			t.Errorf("rewrite %v: expected %d, got %d %s", rewrite, want, rec.Code, rec.Body)
		}
	}
}

func TestBedrockFaultMalformed(t *testing.T) {
	for _, after := range []int{0, 2} {
		s := serve(t, Handler{Dialect: DialectBedrock, Faults: []Fault{{Kind: FaultMalformed, After: intp(after)}}}, nil)

		// invoke: a chunk message whose payload is JSON cut short.
		msgs, err := readFrames(s.post(t, sdkPath(bedrockModel, "invoke-with-response-stream"), invokeBody), time.Now())
		if err != nil || len(msgs) != 3+after+1 {
			t.Fatalf("invoke after %d: expected %d messages and a clean end, got %d, %v", after, 3+after+1, len(msgs), err)
		}
		evs := chunkEvents(t, msgs[:3+after])
		var text strings.Builder
		for _, e := range evs[3:] {
			text.WriteString(e.Delta.Text)
		}
		if want := strings.Join(splitReply(DefaultReply, DefaultChunks)[:after], ""); eventTypes(evs[:3]) != "message_start,content_block_start,ping" || text.String() != want {
			t.Errorf("invoke after %d: expected the prelude and %q, got %s %q", after, want, eventTypes(evs), text.String())
		}
		last := msgs[len(msgs)-1]
		if last.headers[":message-type"] != "event" || last.headers[":event-type"] != "chunk" || json.Valid(last.payload) ||
			!strings.HasPrefix(string(last.payload), `{"bytes":"eyJ0eXBlIjoiY29udGVudF9ibG9ja19kZWx0YS`) {
			t.Errorf("invoke after %d: expected a chunk with a broken payload, got %v %s", after, last.headers, last.payload)
		}

		// converse: a contentBlockDelta whose payload is cut short.
		msgs, err = readFrames(s.post(t, sdkPath(bedrockModel, "converse-stream"), converseBody), time.Now())
		if err != nil || len(msgs) != 1+after+1 {
			t.Fatalf("converse after %d: expected %d messages and a clean end, got %d, %v", after, 1+after+1, len(msgs), err)
		}
		names := converseEvents(t, msgs)
		if !strings.HasPrefix(names[0], "messageStart ") || (after > 0 && !strings.HasPrefix(names[after], `contentBlockDelta {"contentBlockIndex":0,"delta":{"text":"`)) {
			t.Errorf("converse after %d: unexpected events %q", after, names)
		}
		if got := names[len(names)-1]; got != `contentBlockDelta {"contentBlockIndex":0,"delta":{"text":"x` {
			t.Errorf("converse after %d: expected the broken contentBlockDelta, got %q", after, got)
		}
	}

	// Plain: 200, Bedrock's answer cut in half.
	clock := newFakeClock()
	for _, action := range []string{"invoke", "converse"} {
		body := invokeBody
		if action == "converse" {
			body = converseBody
		}
		want := readAll(t, serve(t, Handler{Dialect: DialectBedrock}, clock).post(t, sdkPath(bedrockModel, action), body))
		s := serve(t, Handler{Dialect: DialectBedrock, Faults: []Fault{{Kind: FaultMalformed}}}, clock)
		resp := s.post(t, sdkPath(bedrockModel, action), body)
		got := readAll(t, resp)
		if resp.StatusCode != 200 || json.Valid([]byte(got)) || !strings.HasPrefix(want, got) || len(got) != len(want)/2 {
			t.Errorf("%s: expected 200 with the first half of %s, got %d %s", action, want, resp.StatusCode, got)
		}
	}
}
