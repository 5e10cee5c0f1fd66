package mockllm

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws/protocol/eventstream"
)

// The bedrock dialect: the Amazon Bedrock runtime API. InvokeModel and
// InvokeModelWithResponseStream with Anthropic Messages bodies (POST
// .../model/{modelId}/invoke, .../invoke-with-response-stream), Converse
// and ConverseStream for any model (.../converse, .../converse-stream),
// their application/vnd.amazon.eventstream streams (encoded with the AWS
// SDK's eventstream.Encoder), Bedrock's exceptions (x-amzn-ErrorType and
// {"message": ...}) and request validation. Authentication (SigV4 or a
// Bedrock API key) is in sigv4.go.

// eventStreamContentType is the Content-Type of Bedrock's streams.
const eventStreamContentType = "application/vnd.amazon.eventstream"

// bedrockAnthropicVersion is the anthropic_version Bedrock requires in
// an InvokeModel body for Anthropic models.
const bedrockAnthropicVersion = "bedrock-2023-05-31"

// Bedrock exception messages.
const (
	bedrockTooManyRequests  = "Too many requests, please wait before trying again."
	bedrockTooManyTokens    = "Too many tokens, please wait before trying again."
	bedrockTooManyTokensDay = "Too many tokens per day, please wait before trying again."
	bedrockUnavailable      = "Bedrock is unable to process your request."
	bedrockInternal         = "The system encountered an unexpected error during processing. Try your request again."
	bedrockInputTooLong     = "Input is too long for requested model."
	bedrockModelTimeout     = "Model has timed out in processing the request. Try your request again."
	bedrockStreamError      = "An error occurred while streaming the response. Retry your request."
	bedrockSignatureDiffer  = "The request signature we calculated does not match the signature you provided. Check your AWS Secret Access Key and signing method. Consult the service documentation for details."

	// bedrockCoral follows the exception name in x-amzn-ErrorType, as
	// Bedrock sends it.
	bedrockCoral = ":http://internal.amazon.com/coral/com.amazon.bedrock/"
)

// bedrockRoute matches .../model/{modelId}/{action}; modelId is one
// segment of the escaped path (an ARN sends its "/" as %2F), unescaped.
func bedrockRoute(r *http.Request) (call, bool) {
	p := r.URL.EscapedPath()
	j := strings.LastIndexByte(p, '/')
	if j < 0 {
		return call{}, false
	}
	action, rest := p[j+1:], p[:j]
	i := strings.LastIndexByte(rest, '/')
	if i < 0 || !strings.HasSuffix(rest[:i], "/model") {
		return call{}, false
	}
	model, err := url.PathUnescape(rest[i+1:])
	if err != nil || model == "" {
		return call{}, false
	}
	c := call{model: model, wire: wireAnthropic}
	switch action {
	case "invoke":
		c.ep = epInvoke
	case "invoke-with-response-stream":
		c.ep = epInvokeStream
	case "converse":
		c.ep, c.wire = epConverse, wireConverse
	case "converse-stream":
		c.ep, c.wire = epConverseStream, wireConverse
	default:
		return call{}, false
	}
	return c, true
}

// requestID is the x-amzn-RequestId of the nth answer, UUID-shaped.
func requestID(n uint64) string {
	s := strconv.FormatUint(n, 16)
	if len(s) < 12 {
		s = strings.Repeat("0", 12-len(s)) + s
	}
	return "6d6f636b-0000-4000-8000-" + s
}

// checkInvokeBody checks an InvokeModel body (a JSON object) for model
// as Bedrock does for Anthropic models and returns why it is rejected,
// or "".
func checkInvokeBody(model string, body []byte) string {
	if !strings.Contains(model, "anthropic.") {
		return "llm_mock: invoke and invoke-with-response-stream take Anthropic models only (a model id containing \"anthropic.\"), got " +
			strconv.Quote(model) + "; use converse for other models."
	}
	var m map[string]json.RawMessage
	_ = json.Unmarshal(body, &m)
	malformed := func(s string) string {
		return "Malformed input request: " + s + ", please reformat your input and try again."
	}
	v, ok := m["anthropic_version"]
	if !ok {
		return malformed("#: required key [anthropic_version] not found")
	}
	var version string
	if json.Unmarshal(v, &version) != nil || version != bedrockAnthropicVersion {
		return malformed("#/anthropic_version: " + string(v) + " is not a valid enum value, expected \"" + bedrockAnthropicVersion + "\"")
	}
	for _, k := range [...]string{"model", "stream"} {
		if _, ok := m[k]; ok {
			return malformed("#: extraneous key [" + k + "] is not permitted")
		}
	}
	if v, ok := m["anthropic_beta"]; ok {
		var betas []string
		if json.Unmarshal(v, &betas) != nil {
			return malformed("#/anthropic_beta: expected type: JSONArray of strings, found: " + string(v))
		}
	}
	for _, k := range [...]string{"max_tokens", "messages"} {
		if _, ok := m[k]; !ok {
			return malformed("#: required key [" + k + "] not found")
		}
	}
	return ""
}

// converseRequest is the part of a Converse request the mock checks.
type converseRequest struct {
	Messages []struct {
		Role    string                       `json:"role"`
		Content []map[string]json.RawMessage `json:"content"`
	} `json:"messages"`
	System          []map[string]json.RawMessage `json:"system"`
	InferenceConfig *struct {
		MaxTokens     *int     `json:"maxTokens"`
		Temperature   *float64 `json:"temperature"`
		TopP          *float64 `json:"topP"`
		StopSequences []string `json:"stopSequences"`
	} `json:"inferenceConfig"`
	ToolConfig *struct {
		Tools []struct {
			ToolSpec *struct {
				Name string `json:"name"`
			} `json:"toolSpec"`
		} `json:"tools"`
		ToolChoice map[string]json.RawMessage `json:"toolChoice"`
	} `json:"toolConfig"`
}

// converseBlockTypes are the members of a Converse ContentBlock.
var converseBlockTypes = [...]string{"text", "image", "document", "video", "toolUse", "toolResult",
	"guardContent", "cachePoint", "reasoningContent", "citationsContent"}

// checkConverseBody checks a Converse body (a JSON object) as Bedrock
// does and returns why it is rejected, or "".
func checkConverseBody(body []byte) string {
	var r converseRequest
	if err := json.Unmarshal(body, &r); err != nil {
		return "llm_mock: the body is not a Converse request: " + err.Error()
	}
	if len(r.Messages) == 0 {
		return "A conversation must start with a user message. Try again with a conversation that starts with a user message."
	}
	usesTools := false
	for i, m := range r.Messages {
		switch {
		case m.Role != "user" && m.Role != "assistant":
			return "1 validation error detected: Value '" + m.Role + "' at 'messages." + strconv.Itoa(i+1) +
				".member.role' failed to satisfy constraint: Member must satisfy enum value set: [user, assistant]"
		case i == 0 && m.Role != "user":
			return "A conversation must start with a user message. Try again with a conversation that starts with a user message."
		case i > 0 && m.Role == r.Messages[i-1].Role:
			return "A conversation must alternate between user and assistant roles. Make sure the conversation alternates between user and assistant roles and try again."
		case len(m.Content) == 0:
			return "The content field in the Message object at messages." + strconv.Itoa(i) +
				" is empty. Add a ContentBlock object to the content field and try again."
		}
		for j, b := range m.Content {
			known := false
			for _, t := range converseBlockTypes {
				if _, ok := b[t]; ok {
					known = true
				}
			}
			if !known {
				return "llm_mock: the content block at messages." + strconv.Itoa(i) + ".content." + strconv.Itoa(j) +
					" has none of the ContentBlock members (text, image, document, video, toolUse, toolResult, ...)."
			}
			_, tu := b["toolUse"]
			_, tr := b["toolResult"]
			usesTools = usesTools || tu || tr
		}
	}
	if tc := r.ToolConfig; tc != nil {
		if len(tc.Tools) == 0 {
			return "1 validation error detected: Value '[]' at 'toolConfig.tools' failed to satisfy constraint: Member must have length greater than or equal to 1"
		}
		for i, t := range tc.Tools {
			if t.ToolSpec != nil && t.ToolSpec.Name == "" {
				return "1 validation error detected: Value at 'toolConfig.tools." + strconv.Itoa(i+1) +
					".member.toolSpec.name' failed to satisfy constraint: Member must not be null"
			}
		}
	} else if usesTools {
		return "The toolConfig field must be defined when using toolUse and toolResult content blocks."
	}
	return ""
}

// bedrockMessage is Bedrock's error body.
func bedrockMessage(msg string) []byte {
	return appendJSON(nil, &struct {
		Message string `json:"message"`
	}{msg})
}

// writeBedrockError answers with a Bedrock exception: its name in
// x-amzn-ErrorType (unless a fault's headers set one) and the message.
func writeBedrockError(w http.ResponseWriter, code int, errType, msg string) {
	if w.Header().Get("X-Amzn-Errortype") == "" {
		w.Header().Set("X-Amzn-Errortype", errType)
	}
	writeBody(w, code, bedrockMessage(msg))
}

// writeBedrockFault answers a fault with the Bedrock exception errType
// (a service exception, so with bedrockCoral), or f.Body when set.
func writeBedrockFault(w http.ResponseWriter, f *Fault, code int, errType, msg string) {
	if f.Body == "" {
		writeBedrockError(w, code, errType+bedrockCoral, msg)
		return
	}
	if w.Header().Get("X-Amzn-Errortype") == "" {
		w.Header().Set("X-Amzn-Errortype", errType+bedrockCoral)
	}
	writeBody(w, code, []byte(f.Body))
}

// bedrockStatusError is the exception Bedrock answers with status code.
func bedrockStatusError(code int) (errType, msg string) {
	switch code {
	case http.StatusBadRequest:
		return "ValidationException", bedrockInputTooLong
	case http.StatusForbidden:
		return "AccessDeniedException", "You don't have access to the model with the specified model ID."
	case http.StatusNotFound:
		return "ResourceNotFoundException", "Could not resolve the foundation model from the provided model identifier."
	case http.StatusRequestTimeout:
		return "ModelTimeoutException", bedrockModelTimeout
	case http.StatusFailedDependency:
		return "ModelErrorException", bedrockInternal
	case http.StatusTooManyRequests:
		return "ThrottlingException", bedrockTooManyRequests
	case http.StatusInternalServerError:
		return "InternalServerException", bedrockInternal
	case http.StatusServiceUnavailable, statusOverloaded:
		return "ServiceUnavailableException", bedrockUnavailable
	}
	if code >= 400 && code < 500 {
		return "ValidationException", "mock status " + strconv.Itoa(code)
	}
	return "InternalServerException", "mock status " + strconv.Itoa(code)
}

// bedrockStreamException is the event-stream exception an error_event
// fault of status (0 when unset) sends mid-stream.
func bedrockStreamException(status int) (excType, msg string) {
	switch status {
	case 0, http.StatusServiceUnavailable, statusOverloaded:
		return "serviceUnavailableException", bedrockUnavailable
	case http.StatusTooManyRequests:
		return "throttlingException", bedrockTooManyRequests
	case http.StatusInternalServerError:
		return "internalServerException", bedrockInternal
	case http.StatusRequestTimeout:
		return "modelTimeoutException", bedrockModelTimeout
	case http.StatusBadRequest:
		return "validationException", bedrockInputTooLong
	}
	return "modelStreamErrorException", bedrockStreamError
}

// setInvokeHeaders sets the x-amzn-bedrock-* headers of a non-streamed
// InvokeModel answer.
func setInvokeHeaders(hdr http.Header, a answer) {
	hdr.Set("X-Amzn-Bedrock-Input-Token-Count", strconv.Itoa(a.prompt-a.cached))
	hdr.Set("X-Amzn-Bedrock-Output-Token-Count", strconv.Itoa(a.completion))
	hdr.Set("X-Amzn-Bedrock-Invocation-Latency", strconv.FormatInt(time.Since(a.start).Milliseconds(), 10))
}

// converseUsage is Converse's usage (TokenUsage).
type converseUsage struct {
	InputTokens  int `json:"inputTokens"`
	OutputTokens int `json:"outputTokens"`
	TotalTokens  int `json:"totalTokens"`
}

type converseMetrics struct {
	LatencyMs int64 `json:"latencyMs"`
}

func (a answer) converseUsage() converseUsage {
	return converseUsage{InputTokens: a.prompt, OutputTokens: a.completion, TotalTokens: a.prompt + a.completion}
}

func (a answer) converseMetrics() converseMetrics {
	return converseMetrics{LatencyMs: time.Since(a.start).Milliseconds()}
}

// converseAnswer is a Converse response holding content.
func converseAnswer(a answer, content any, stopReason string) []byte {
	var r struct {
		Output struct {
			Message struct {
				Role    string `json:"role"`
				Content any    `json:"content"`
			} `json:"message"`
		} `json:"output"`
		StopReason string          `json:"stopReason"`
		Usage      converseUsage   `json:"usage"`
		Metrics    converseMetrics `json:"metrics"`
	}
	r.Output.Message.Role = "assistant"
	r.Output.Message.Content = content
	r.StopReason = stopReason
	r.Usage = a.converseUsage()
	r.Metrics = a.converseMetrics()
	return appendJSON(nil, &r)
}

// converseResponse is the answer of Converse: the reply as one text block.
func (h *Handler) converseResponse(a answer) []byte {
	return converseAnswer(a, [1]struct {
		Text string `json:"text"`
	}{{a.text}}, "end_turn")
}

// converseToolUseID is the toolUseId of the scripted call n.
func converseToolUseID(n string) string { return "tooluse_mock" + n }

// converseWantsToolCall reports whether a Converse request gets the
// scripted call: its toolConfig offers the tool and its last message
// brings no toolResult.
func (h *Handler) converseWantsToolCall(body []byte) bool {
	var r converseRequest
	if json.Unmarshal(body, &r) != nil || r.ToolConfig == nil {
		return false
	}
	offered := false
	for _, t := range r.ToolConfig.Tools {
		if t.ToolSpec != nil && t.ToolSpec.Name == h.ToolCall.Name {
			offered = true
		}
	}
	if !offered {
		return false
	}
	if len(r.Messages) > 0 {
		for _, b := range r.Messages[len(r.Messages)-1].Content {
			if _, ok := b["toolResult"]; ok {
				return false
			}
		}
	}
	return true
}

// converseToolCall is the scripted call as a Converse answer.
func (h *Handler) converseToolCall(a answer, n string) []byte {
	type toolUse struct {
		ToolUseID string          `json:"toolUseId"`
		Name      string          `json:"name"`
		Input     json.RawMessage `json:"input"`
	}
	return converseAnswer(a, [1]struct {
		ToolUse toolUse `json:"toolUse"`
	}{{toolUse{converseToolUseID(n), h.ToolCall.Name, h.ToolCall.Arguments}}}, "tool_use")
}

// writeConverseToolStream sends the scripted call as a ConverseStream:
// messageStart, contentBlockStart with the tool's id and name, its input
// in two contentBlockDelta, contentBlockStop, messageStop and metadata.
func (h *Handler) writeConverseToolStream(w http.ResponseWriter, a answer) {
	n := strconv.FormatUint(h.st.ids.Add(1), 10)
	s := newConverseStream(a)
	b := s.head(nil)
	b = s.event(b, "contentBlockStart", map[string]any{"contentBlockIndex": 0,
		"start": map[string]any{"toolUse": map[string]any{"toolUseId": converseToolUseID(n), "name": h.ToolCall.Name}}})
	for _, part := range splitReply(string(h.ToolCall.Arguments), 2) {
		b = s.event(b, "contentBlockDelta", map[string]any{"contentBlockIndex": 0,
			"delta": map[string]any{"toolUse": map[string]any{"input": part}}})
	}
	b = s.finish(b, "tool_use")
	h.writeFrames(w, b)
}

// writeFrames sends a whole event stream, one flushed message at a time.
func (h *Handler) writeFrames(w http.ResponseWriter, b []byte) {
	w.Header().Set("Content-Type", eventStreamContentType)
	w.WriteHeader(http.StatusOK)
	sendFrames(w, http.NewResponseController(w), b)
}

// appendEventMessage appends an event-stream event message of type
// eventType holding payload (JSON), encoded by enc.
func appendEventMessage(enc *eventstream.Encoder, b []byte, eventType string, payload []byte) []byte {
	var m eventstream.Message
	m.Headers.Set(":event-type", eventstream.StringValue(eventType))
	m.Headers.Set(":content-type", eventstream.StringValue("application/json"))
	m.Headers.Set(":message-type", eventstream.StringValue("event"))
	m.Payload = payload
	return appendMessage(enc, b, m)
}

// appendExceptionMessage appends an event-stream exception message.
func appendExceptionMessage(enc *eventstream.Encoder, b []byte, excType string, payload []byte) []byte {
	var m eventstream.Message
	m.Headers.Set(":exception-type", eventstream.StringValue(excType))
	m.Headers.Set(":content-type", eventstream.StringValue("application/json"))
	m.Headers.Set(":message-type", eventstream.StringValue("exception"))
	m.Payload = payload
	return appendMessage(enc, b, m)
}

func appendMessage(enc *eventstream.Encoder, b []byte, m eventstream.Message) []byte {
	buf := bytes.NewBuffer(b)
	if err := enc.Encode(buf, m); err != nil {
		panic(err) // headers and payloads are the mock's own, never too long
	}
	return buf.Bytes()
}

// faultException is the exception message of a's error_event fault.
func faultException(enc *eventstream.Encoder, b []byte, a answer, payload []byte) []byte {
	status := 0
	if a.fault != nil {
		status = a.fault.Status
	}
	typ, _ := bedrockStreamException(status)
	return appendExceptionMessage(enc, b, typ, payload)
}

// invokeStream is an InvokeModelWithResponseStream answer: each SSE
// event of the Anthropic stream (inner) becomes a chunk message whose
// payload is {"bytes": <the event's data, base64>, "p": padding}; the
// message_stop event gains amazon-bedrock-invocationMetrics.
type invokeStream struct {
	a       answer
	inner   streamFormat // nil when converting a whole stream (frames)
	enc     *eventstream.Encoder
	first   time.Duration // firstByteLatency
	started bool
	sse     []byte // scratch for inner's events
}

func newInvokeStream(a answer, inner streamFormat) *invokeStream {
	return &invokeStream{a: a, inner: inner, enc: eventstream.NewEncoder()}
}

// firstByte notes the first content going out.
func (s *invokeStream) firstByte() {
	if !s.started {
		s.started = true
		s.first = time.Since(s.a.start)
	}
}

func (s *invokeStream) contentType() string { return eventStreamContentType }

func (s *invokeStream) head(b []byte) []byte {
	s.sse = s.inner.head(s.sse[:0])
	return s.frames(b, s.sse)
}

func (s *invokeStream) keepAlive() []byte {
	ka := s.inner.keepAlive()
	if ka == nil {
		return nil
	}
	return s.frames(nil, ka)
}

func (s *invokeStream) chunk(b []byte, i int, piece string, last bool) []byte {
	s.firstByte()
	s.sse = s.inner.chunk(s.sse[:0], i, piece, last)
	return s.frames(b, s.sse)
}

func (s *invokeStream) end(b []byte) []byte {
	s.sse = s.inner.end(s.sse[:0])
	return s.frames(b, s.sse)
}

func (s *invokeStream) errorEvent(b, payload []byte) []byte {
	return faultException(s.enc, b, s.a, payload)
}

// malformed is a chunk message whose payload is cut short in its
// bytes: those of a content_block_delta, themselves cut short.
func (s *invokeStream) malformed(b []byte) []byte {
	data := base64.StdEncoding.EncodeToString([]byte(malformedAnthropicDelta))
	return appendEventMessage(s.enc, b, "chunk", []byte(`{"bytes":"`+data[:len(data)/2]))
}

// invocationMetrics is amazon-bedrock-invocationMetrics.
type invocationMetrics struct {
	InputTokenCount          int   `json:"inputTokenCount"`
	OutputTokenCount         int   `json:"outputTokenCount"`
	InvocationLatency        int64 `json:"invocationLatency"`
	FirstByteLatency         int64 `json:"firstByteLatency"`
	CacheReadInputTokenCount int   `json:"cacheReadInputTokenCount,omitempty"`
}

// frames appends to b one chunk message per SSE event of sse.
func (s *invokeStream) frames(b, sse []byte) []byte {
	for ev := range bytes.SplitSeq(sse, []byte("\n\n")) {
		var name string
		var data []byte
		for line := range bytes.SplitSeq(ev, []byte("\n")) {
			if v, ok := bytes.CutPrefix(line, []byte("event: ")); ok {
				name = string(v)
			} else if v, ok := bytes.CutPrefix(line, []byte("data: ")); ok {
				data = v
			}
		}
		if data == nil {
			continue
		}
		if name == "message_stop" && len(data) > 1 && data[len(data)-1] == '}' {
			m := invocationMetrics{
				InputTokenCount:          s.a.prompt - s.a.cached,
				OutputTokenCount:         s.a.completion,
				InvocationLatency:        time.Since(s.a.start).Milliseconds(),
				FirstByteLatency:         s.first.Milliseconds(),
				CacheReadInputTokenCount: s.a.cached,
			}
			d := make([]byte, 0, len(data)+160)
			d = append(d, data[:len(data)-1]...)
			d = append(d, `,"amazon-bedrock-invocationMetrics":`...)
			d = appendJSON(d, &m)
			data = append(d, '}')
		}
		payload := appendJSON(nil, &struct {
			Bytes []byte `json:"bytes"`
			P     string `json:"p"`
		}{data, "abcd"})
		b = appendEventMessage(s.enc, b, "chunk", payload)
	}
	return b
}

// converseStream is a ConverseStream answer: messageStart, one
// contentBlockDelta per chunk, contentBlockStop, messageStop, metadata;
// each an event message whose payload is the event's member.
type converseStream struct {
	a   answer
	enc *eventstream.Encoder
}

func newConverseStream(a answer) *converseStream {
	return &converseStream{a: a, enc: eventstream.NewEncoder()}
}

func (s *converseStream) contentType() string { return eventStreamContentType }
func (s *converseStream) keepAlive() []byte   { return nil }

func (s *converseStream) event(b []byte, name string, v any) []byte {
	return appendEventMessage(s.enc, b, name, appendJSON(nil, v))
}

func (s *converseStream) head(b []byte) []byte {
	return s.event(b, "messageStart", map[string]string{"role": "assistant"})
}

func (s *converseStream) chunk(b []byte, _ int, piece string, _ bool) []byte {
	var d struct {
		ContentBlockIndex int `json:"contentBlockIndex"`
		Delta             struct {
			Text string `json:"text"`
		} `json:"delta"`
	}
	d.Delta.Text = piece
	return s.event(b, "contentBlockDelta", &d)
}

func (s *converseStream) end(b []byte) []byte {
	return s.finish(b, "end_turn")
}

// finish ends a stream: contentBlockStop, messageStop, metadata.
func (s *converseStream) finish(b []byte, stopReason string) []byte {
	b = s.event(b, "contentBlockStop", map[string]int{"contentBlockIndex": 0})
	b = s.event(b, "messageStop", map[string]string{"stopReason": stopReason})
	return s.event(b, "metadata", &struct {
		Usage   converseUsage   `json:"usage"`
		Metrics converseMetrics `json:"metrics"`
	}{s.a.converseUsage(), s.a.converseMetrics()})
}

// malformed is a contentBlockDelta event whose payload is cut short.
func (s *converseStream) malformed(b []byte) []byte {
	return appendEventMessage(s.enc, b, "contentBlockDelta", []byte(`{"contentBlockIndex":0,"delta":{"text":"x`))
}

func (s *converseStream) errorEvent(b, payload []byte) []byte {
	return faultException(s.enc, b, s.a, payload)
}

// bedrockModels is a model list in the form of Bedrock's
// ListFoundationModels.
func bedrockModels(id string) []byte {
	type summary struct {
		ModelID                    string    `json:"modelId"`
		ModelArn                   string    `json:"modelArn"`
		ModelName                  string    `json:"modelName"`
		ProviderName               string    `json:"providerName"`
		InputModalities            [1]string `json:"inputModalities"`
		OutputModalities           [1]string `json:"outputModalities"`
		ResponseStreamingSupported bool      `json:"responseStreamingSupported"`
	}
	return appendJSON(nil, &struct {
		ModelSummaries [1]summary `json:"modelSummaries"`
	}{[1]summary{{
		ModelID:                    id,
		ModelArn:                   "arn:aws:bedrock:us-east-1::foundation-model/" + id,
		ModelName:                  id,
		ProviderName:               "llm_mock",
		InputModalities:            [1]string{"TEXT"},
		OutputModalities:           [1]string{"TEXT"},
		ResponseStreamingSupported: true,
	}}})
}
