package adapters

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws/protocol/eventstream"

	"github.com/llmrouter/caddy-llm-router/internal/excerpt"
	"github.com/llmrouter/caddy-llm-router/internal/jsonbody"
	"github.com/llmrouter/caddy-llm-router/provider"
)

// BedrockAnthropicVersion is the anthropic_version Bedrock's InvokeModel
// takes in a Messages body
// (https://docs.aws.amazon.com/bedrock/latest/userguide/model-parameters-anthropic-claude-messages-request-response.html).
const BedrockAnthropicVersion = "bedrock-2023-05-31"

// Bedrock speaks Amazon Bedrock's runtime API
// (https://docs.aws.amazon.com/bedrock/latest/APIReference/API_Operations_Amazon_Bedrock_Runtime.html)
// at Endpoint.BaseURL, such as "https://bedrock-runtime.us-east-1.amazonaws.com".
// The model is in the path, path-escaped: a model id
// ("anthropic.claude-sonnet-4-5-20250929-v1:0"), an inference profile id
// ("us.anthropic.claude-...", "global.anthropic...") or an ARN.
//
// Anthropic's models (an id with "anthropic." in it) go through
// InvokeModel (POST /model/{id}/invoke) and
// InvokeModelWithResponseStream (/invoke-with-response-stream) with the
// Messages body Bedrock expects (cloudMessages: no model, anthropic_version
// BedrockAnthropicVersion, the client's anthropic-beta features as
// "anthropic_beta"), so that a Messages client keeps tools, thinking and
// prompt caching; a Chat client's request is translated to Messages first.
// Every other model goes through Converse (/converse, /converse-stream),
// translated from Chat (converse.go). Streams are AWS event streams,
// decoded with the AWS SDK's eventstream package: InvokeModel's "chunk"
// events carry Anthropic's stream events base64-encoded; Converse's are
// its own events.
//
// Authentication is the transport's (SigV4 or a Bedrock API key as
// "Authorization: Bearer", set up by the provider type): when
// Endpoint.APIKey is set it is sent as that bearer token.
//
// Bedrock states no remaining counts. What it says (fixtures bedrock-*.http;
// https://docs.aws.amazon.com/bedrock/latest/APIReference/CommonErrors.html
// and each operation's Errors) is an error type, in the x-amzn-ErrorType
// header and the body's "__type" (or "code"), and a message: see
// classifyBedrock.
type Bedrock struct {
	Endpoint provider.Endpoint
}

// Serves implements provider.Provider: Chat, and Messages and Responses
// (natively or through their Chat form: chatFormats); no embeddings, no
// legacy completions.
func (*Bedrock) Serves(f provider.Format) bool { return slices.Contains(chatFormats, f) }

// bedrockAnthropic reports whether a Bedrock model id names one of
// Anthropic's models (served through InvokeModel in the Messages format).
func bedrockAnthropic(model string) bool {
	return strings.Contains(strings.ToLower(model), "anthropic.")
}

// Plan implements provider.Provider. It fails when the request holds what
// the model's API cannot express (see messages.FromChat and chatToConverse).
func (p *Bedrock) Plan(ctx context.Context, model string, r *provider.Request) (provider.Plan, error) {
	if r.Format == provider.Embeddings || r.Format == provider.Completions {
		return nil, errNoEmbeddings
	}
	if err := checkSegment(model, false); err != nil {
		return nil, err
	}
	if bedrockAnthropic(model) {
		return planClaude(ctx, p, model, r)
	}
	if r.Continues {
		return nil, provider.ErrNoContinuation // Converse's models differ in what they continue
	}
	chatBody, err := r.Chat()
	if err != nil {
		return nil, err
	}
	body, err := chatToConverse(chatBody)
	if err != nil {
		return nil, err
	}
	op := "/converse"
	if r.Stream {
		op = "/converse-stream"
	}
	req, err := p.post(ctx, model, op, body, r.Stream)
	if err != nil {
		return nil, err
	}
	return chatPlan(req, model, r, false, converseReader{}), nil
}

// post builds a POST of body to /model/{model}{op}, the model
// path-escaped (an ARN's "/" and ":" too).
func (p *Bedrock) post(ctx context.Context, model, op string, body []byte, stream bool) (*http.Request, error) {
	req, err := p.Endpoint.NewRequest(ctx, p.Endpoint.BaseURL+"/model/"+url.PathEscape(model)+op, body, stream, bearerKey.name, bearerKey.prefix)
	if err != nil {
		return nil, err
	}
	if stream {
		req.Header.Set("Accept", "application/vnd.amazon.eventstream")
	}
	return req, nil
}

// bedrockInvokeReader reads InvokeModel's answers (a Messages answer, as
// Anthropic's API sends it) and InvokeModelWithResponseStream's event
// stream (Anthropic's stream events inside "chunk" events).
type bedrockInvokeReader struct{ native bool }

func (b bedrockInvokeReader) answer(p *plan, body []byte) ([]byte, error) {
	return anthropicReader(b).answer(p, body)
}

func (b bedrockInvokeReader) decoder(p *plan) provider.EventDecoder {
	return anthropicReader(b).decoder(p)
}

func (b bedrockInvokeReader) stream(p *plan, body io.Reader) provider.Stream {
	dec := b.decoder(p)
	return newEventStream(body, dec.Complete, func(typ string, payload []byte) (provider.Event, provider.EventKind, provider.Observation) {
		if typ != "chunk" {
			return provider.Event{}, provider.EventSkip, provider.Observation{}
		}
		var chunk struct {
			Bytes []byte `json:"bytes"` // base64 in JSON
		}
		if err := json.Unmarshal(payload, &chunk); err != nil || len(chunk.Bytes) == 0 {
			return provider.Event{}, provider.EventError, streamBroken("invalid chunk event in stream")
		}
		// The event is relayed as an SSE event: compacted, so that it is one
		// data line (JSON may hold CR and LF as whitespace), and named by a
		// type that is a plain word (a line break in it would begin fields
		// of its own in the client's stream).
		var data bytes.Buffer
		if err := json.Compact(&data, chunk.Bytes); err != nil {
			return provider.Event{}, provider.EventError, streamBroken("invalid JSON event in stream")
		}
		name, _ := jsonbody.GetString(data.Bytes(), "type")
		if !eventName.MatchString(name) {
			return provider.Event{}, provider.EventError, streamBroken("stream event without a valid type")
		}
		return dec.Decode(&provider.Event{Name: name, Data: data.Bytes()})
	})
}

// eventName is what an event's type may be: a plain word.
var eventName = regexp.MustCompile(`^[A-Za-z0-9_.\-]{1,64}$`)

// maxFrame bounds one event-stream message, in bytes: an InvokeModel chunk
// carries one of Anthropic's events (at most provider.MaxEventSize)
// base64-encoded (4/3 of it) in JSON, with headers. A longer message
// (the prelude may claim up to 4 GiB) breaks the stream before anything
// of it is read.
const maxFrame = 2*provider.MaxEventSize + 64<<10

// eventStream reads an AWS event stream
// (application/vnd.amazon.eventstream: binary messages with headers and a
// payload, each checked by its CRCs) with the AWS SDK's decoder. An
// "event" message goes to decode with its :event-type; an "exception" or
// "error" message is an in-band error.
type eventStream struct {
	r        countingReader
	dec      *eventstream.Decoder
	buf      []byte
	decode   func(typ string, payload []byte) (provider.Event, provider.EventKind, provider.Observation)
	complete func() bool
}

func newEventStream(body io.Reader, complete func() bool,
	decode func(typ string, payload []byte) (provider.Event, provider.EventKind, provider.Observation)) *eventStream {
	return &eventStream{r: countingReader{r: bufio.NewReaderSize(body, 4096)}, dec: eventstream.NewDecoder(), decode: decode, complete: complete}
}

// countingReader counts the bytes read, so that a body that ends inside
// a message (which the SDK's decoder may report as io.EOF) is told from
// one that ends between messages.
type countingReader struct {
	r *bufio.Reader
	n int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}

// Next implements provider.Stream. A body cut inside a message is
// io.ErrUnexpectedEOF; a message whose CRC fails is an error too.
func (s *eventStream) Next() (provider.Event, provider.EventKind, provider.Observation, error) {
	before := s.r.n
	if p, err := s.r.r.Peek(8); err == nil {
		// The prelude: the message's total length and its headers' length.
		total, headers := binary.BigEndian.Uint32(p), binary.BigEndian.Uint32(p[4:])
		if total > maxFrame || total < 16 || headers > total-16 {
			return provider.Event{}, provider.EventSkip, provider.Observation{}, errBadFrame
		}
	}
	m, err := s.dec.Decode(&s.r, s.buf[:0])
	if err != nil {
		if errors.Is(err, io.EOF) && s.r.n != before {
			err = io.ErrUnexpectedEOF // the body ended inside a message
		}
		if errors.Is(err, io.EOF) {
			return provider.Event{}, provider.EventSkip, provider.Observation{}, io.EOF
		}
		return provider.Event{}, provider.EventSkip, provider.Observation{}, err
	}
	s.buf = m.Payload
	header := func(name string) string {
		if v := m.Headers.Get(name); v != nil {
			return v.String()
		}
		return ""
	}
	switch header(":message-type") {
	case "event":
		ev, kind, obs := s.decode(header(":event-type"), m.Payload)
		return ev, kind, obs, nil
	case "exception":
		return provider.Event{}, provider.EventError, bedrockStreamError(header(":exception-type"), m.Payload), nil
	case "error":
		o := bedrockStreamError(header(":error-code"), nil)
		o.Message = excerpt.Of(header(":error-message"), 500)
		return provider.Event{}, provider.EventError, o, nil
	}
	return provider.Event{}, provider.EventError, streamBroken("event stream message of unknown type"), nil
}

// Complete implements provider.Stream.
func (s *eventStream) Complete() bool { return s.complete() }

// errBadFrame breaks a stream whose next message claims a length no
// message may have.
var errBadFrame = errors.New("event stream message longer than allowed or malformed")

// bedrockStreamError classifies an exception inside an event stream (it
// began with a 200): its :exception-type ("throttlingException",
// "modelStreamErrorException", ...) and its {"message": ...}.
func bedrockStreamError(typ string, payload []byte) provider.Observation {
	var e struct {
		Message string `json:"message"`
	}
	_ = decodeJSON(payload, &e)
	typ = bedrockErrorName(typ)
	o := provider.NewObservation(classifyBedrock(0, typ, strings.ToLower(e.Message)))
	o.Message, o.Code = excerpt.Of(e.Message, 500), typ
	if o.Message == "" {
		o.Message = o.Code
	}
	return o
}

// Observe implements provider.Provider.
func (*Bedrock) Observe(status int, h http.Header, body []byte, now time.Time) provider.Observation {
	ref := provider.RefTime(h, now)
	o := provider.NewObservation(provider.OK)
	o.RetryAfter = provider.RetryAfter(h, ref)
	if status >= 200 && status < 300 {
		return o
	}
	typ, msg := parseBedrockError(h, body)
	o.Class = classifyBedrock(status, typ, strings.ToLower(msg))
	o.Message, o.Code = msg, typ
	if o.Class == provider.RateLimited {
		if o.RetryAfter < 0 {
			o.RetryAfter = provider.MessageHint(msg)
		}
		// Which rate was exceeded: "Too many tokens" is the tokens-per-minute
		// quota, "Too many requests" the requests one. With a stated wait,
		// that window is spent until then.
		if o.RetryAfter > 0 {
			spent := provider.Window{Limit: provider.Unknown, Remaining: 0, Reset: o.RetryAfter}
			if bedrockTokenThrottle(msg) {
				o.Tokens = spent
			} else {
				o.Requests = spent
			}
		}
	}
	return o
}

// bedrockTokenThrottle reports whether a ThrottlingException's message is
// the token rate's ("Too many tokens, please wait before trying again.")
// rather than the request rate's ("Too many requests, ...").
func bedrockTokenThrottle(msg string) bool {
	return strings.Contains(strings.ToLower(msg), "tokens")
}

// parseBedrockError reads an error answer's type and message: the type
// from the x-amzn-ErrorType header ("ThrottlingException:http://internal.amazon.com/coral/com.amazon.bedrock/")
// or the body's "__type" or "code" ("com.amazonaws.bedrock#ThrottlingException"),
// the message from the body's "message" or "Message"; a body that is no
// JSON keeps its start as the message.
func parseBedrockError(h http.Header, body []byte) (typ, msg string) {
	var e struct {
		Type     string `json:"__type"`
		Code     string `json:"code"`
		Message  string `json:"message"`
		Message2 string `json:"Message"`
	}
	if decodeJSON(body, &e) != nil {
		e.Message = bodyText(body)
	}
	typ = bedrockErrorName(h.Get("X-Amzn-Errortype"))
	if typ == "" {
		typ = bedrockErrorName(e.Type)
	}
	if typ == "" {
		typ = bedrockErrorName(e.Code)
	}
	msg = e.Message
	if msg == "" {
		msg = e.Message2
	}
	return typ, excerpt.Of(msg, 500)
}

// bedrockErrorName is an error type without its namespace or URI, with a
// capital first letter: "ThrottlingException:http://..." and
// "com.amazonaws.bedrock#ThrottlingException" and the event stream's
// "throttlingException" are all "ThrottlingException".
func bedrockErrorName(t string) string {
	t = strings.TrimSpace(t)
	if i := strings.IndexByte(t, ':'); i >= 0 {
		t = t[:i]
	}
	if i := strings.LastIndexByte(t, '#'); i >= 0 {
		t = t[i+1:]
	}
	if t == "" {
		return ""
	}
	return strings.ToUpper(t[:1]) + t[1:]
}

// classifyBedrock maps a status (0 inside an event stream) and an error
// type and message (lower case) to a class. The type wins over the
// status; sources: fixtures bedrock-*.http, each operation's Errors in
// Bedrock's API reference.
func classifyBedrock(status int, typ, msg string) provider.Class {
	switch typ {
	case "ThrottlingException":
		if strings.Contains(msg, "per day") {
			// "Too many tokens per day": the daily quota, not a rate.
			return provider.QuotaExhausted
		}
		return provider.RateLimited
	case "ServiceQuotaExceededException":
		// The account's quota for the model (tokens or requests per minute,
		// or per day): "You can resubmit your request later".
		if strings.Contains(msg, "per day") || strings.Contains(msg, "daily") {
			return provider.QuotaExhausted
		}
		return provider.RateLimited
	case "ModelNotReadyException", "ServiceUnavailableException":
		return provider.Overloaded
	case "AccessDeniedException", "UnrecognizedClientException", "InvalidSignatureException",
		"IncompleteSignatureException", "MissingAuthenticationTokenException", "ExpiredTokenException",
		"InvalidClientTokenId", "SignatureDoesNotMatch":
		return provider.Auth
	case "ValidationException":
		switch {
		case bedrockContextLength(msg):
			return provider.ContextLength
		case strings.Contains(msg, "model identifier is invalid"):
			// This deployment's model id is wrong: its failure, not the
			// client's (as ResourceNotFound).
			return provider.Server
		}
		return provider.ClientError
	case "ModelTimeoutException", "ModelErrorException", "ModelStreamErrorException",
		"InternalServerException", "ResourceNotFoundException":
		// ResourceNotFound names this deployment's model wrong (a typo, a
		// model not enabled in the region): its failure, not the client's.
		return provider.Server
	}
	switch {
	case status == http.StatusTooManyRequests:
		return provider.RateLimited
	case status == http.StatusServiceUnavailable:
		return provider.Overloaded
	case status == http.StatusUnauthorized || status == http.StatusForbidden:
		return provider.Auth
	case status >= 400 && status < 500 && status != http.StatusRequestTimeout && status != http.StatusNotFound && status != http.StatusFailedDependency:
		if bedrockContextLength(msg) {
			return provider.ContextLength
		}
		return provider.ClientError
	}
	return provider.Server
}

// bedrockContextLength reports whether a ValidationException's message (lower
// case) says the input is too long for the model: "Input is too long for
// requested model.", Anthropic's "prompt is too long: 215000 tokens >
// 200000 maximum", "too many input tokens".
func bedrockContextLength(msg string) bool {
	return strings.Contains(msg, "input is too long") || strings.Contains(msg, "too many input tokens") ||
		strings.Contains(msg, "input length") && strings.Contains(msg, "exceed") ||
		isContextLength("", msg)
}
