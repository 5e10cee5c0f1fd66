// Package provider is the contract between llm_router and a provider type:
// the code that speaks one provider family's wire format. A provider type
// is a Caddy module in the namespace llm_router.providers (see the root
// package's ProviderConfig); this package is its Caddy-free half:
//
//   - Provider: one configured account, asked to Plan each attempt and to
//     Observe each answer;
//   - Plan: one attempt: the upstream request, and how its answer, stream
//     and errors are read;
//   - the vocabulary it answers in: Format, Request, Observation (error
//     Class, rate-limit Windows, Retry-After), Event and EventKind;
//   - decoders for the dialects providers share (ParseCount, ParseReset,
//     RetryAfter, MessageHint) and a server-sent events reader (SSE).
//
// Data flows one way per attempt: the client API parses the client's body
// into a Request; the router asks the chosen deployment's Provider for a
// Plan, sends Plan.Request, and hands every answer to Provider.Observe (the
// capacity it states) and to the Plan (the answer itself, in Plan.Format);
// the client API writes that answer in the client's format.
//
// It imports no Caddy, and of this project only an internal JSON scanner.
package provider

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"sync"
	"time"

	"github.com/llmrouter/caddy-llm-router/internal/jsonbody"
)

// Format is a wire format of requests and answers.
type Format uint8

const (
	// Chat is OpenAI's Chat Completions (POST .../chat/completions): the
	// router's canonical format. Every provider type takes a request in it,
	// and every client API can read an answer in it.
	Chat Format = iota
	// Embeddings is OpenAI's embeddings (POST .../embeddings).
	Embeddings
	// Messages is Anthropic's Messages API (POST .../messages).
	Messages
	// Responses is OpenAI's Responses API (POST .../responses).
	Responses
	// Completions is OpenAI's legacy completions (POST .../completions):
	// served only by providers of the OpenAI format, as it came.
	Completions
)

var formatNames = [...]string{Chat: "chat", Embeddings: "embeddings", Messages: "messages", Responses: "responses", Completions: "completions"}

// String returns the format's name: "chat", "embeddings", "messages",
// "responses", "completions".
func (f Format) String() string {
	if int(f) < len(formatNames) {
		return formatNames[f]
	}
	return "unknown"
}

// Request is one client request as provider types read it. The client API
// makes it; a Plan must not modify it.
type Request struct {
	// Format is the client's format; Body is the client's body in it, with
	// the client-facing model group as its model.
	Format Format
	Body   []byte
	// Header holds the client's request headers that belong to Format and
	// go upstream on a native pass only (anthropic-version and
	// anthropic-beta for Messages). Nothing else of the client's request
	// headers reaches a provider.
	Header http.Header
	// Stream is true when the client asked for a streamed answer.
	Stream bool
	// Choices (n, at least 1) and IncludeUsage
	// (stream_options.include_usage) describe the Chat Completions form
	// (Chat): what a complete stream of it holds.
	Choices      int
	IncludeUsage bool

	// Continues is set on a resume's request: Body ends with the
	// assistant's text that a client already has of the answer (as its own
	// final message), for the provider to continue where that text ends,
	// not to repeat it. A provider type whose provider cannot continue
	// text it did not write returns ErrNoContinuation from Plan (see
	// Continuation).
	Continues bool

	// ToChat translates Body into the Chat Completions format; nil when
	// Format is Chat (or has no Chat form, Embeddings).
	ToChat func(body []byte) ([]byte, error)

	once    sync.Once
	chat    []byte
	chatErr error
}

// Chat returns the request in the Chat Completions format: Body itself for
// a Chat request, else its translation, made once however many attempts
// ask. An error means the request has no Chat Completions form (a Messages
// request with a server tool): only a provider that takes Format natively
// can serve it.
func (r *Request) Chat() ([]byte, error) {
	if r.Format == Chat {
		return r.Body, nil
	}
	r.once.Do(func() {
		if r.ToChat == nil {
			r.chatErr = errNoChatForm{r.Format}
			return
		}
		r.chat, r.chatErr = r.ToChat(r.Body)
	})
	return r.chat, r.chatErr
}

// Continued returns a resume's request: r with body (r's body with the
// assistant's text at its end) and Continues set.
func (r *Request) Continued(body []byte) *Request {
	c := r.WithBody(body)
	c.Continues = true
	return c
}

// WithBody returns r with body in place of its Body, in the same format
// (its Chat form made anew from it): the request rewritten for one
// deployment (a Responses request without the encrypted items another
// organization minted).
func (r *Request) WithBody(body []byte) *Request {
	return &Request{Format: r.Format, Body: body, Header: r.Header, Stream: r.Stream, Choices: r.Choices,
		IncludeUsage: r.IncludeUsage, Continues: r.Continues, ToChat: r.ToChat}
}

// ErrNoContinuation is Plan's error for a resume's request
// (Request.Continues) that the provider cannot continue.
var ErrNoContinuation = errors.New("this deployment cannot continue text it did not write")

// Continuation is how a provider continues an answer from text it did not
// write: a request whose final message is the assistant's (a resume's,
// Request.Continues).
type Continuation uint8

const (
	// NoContinuation: the provider answers a final assistant message
	// afresh, or refuses it (OpenAI, Azure, Gemini, Bedrock's Converse).
	NoContinuation Continuation = iota
	// Prefill: a final assistant message is continued as it is (Anthropic's
	// Messages API on Anthropic, Bedrock and Vertex:
	// https://docs.anthropic.com/en/docs/build-with-claude/prompt-engineering/prefill-claudes-response;
	// llama.cpp's server).
	Prefill
	// PrefixFlag: the final assistant message carries "prefix": true
	// (Mistral: https://docs.mistral.ai/guides/prefix/; DeepSeek's beta
	// endpoint: https://api-docs.deepseek.com/guides/chat_prefix_completion).
	PrefixFlag
	// ContinueFinalMessage: the request carries "continue_final_message":
	// true and "add_generation_prompt": false (vLLM's OpenAI-compatible
	// server: https://docs.vllm.ai/en/latest/serving/openai_compatible_server.html).
	ContinueFinalMessage
)

var continuationNames = [...]string{NoContinuation: "none", Prefill: "prefill", PrefixFlag: "prefix", ContinueFinalMessage: "continue_final_message"}

// String returns the Caddyfile's name of c: "none", "prefill", "prefix",
// "continue_final_message".
func (c Continuation) String() string {
	if int(c) < len(continuationNames) {
		return continuationNames[c]
	}
	return "unknown"
}

// ParseContinuation reads a Continuation's name (see String).
func ParseContinuation(s string) (Continuation, bool) {
	for c, name := range continuationNames {
		if s == name {
			return Continuation(c), true
		}
	}
	return NoContinuation, false
}

// ContinueChat returns body, a Chat Completions request whose final message
// is the assistant's text to continue (a resume's), as a provider that
// continues it the way c says takes it: as it is (Prefill), with that
// message's "prefix": true (PrefixFlag), or with "continue_final_message":
// true and "add_generation_prompt": false (ContinueFinalMessage).
// NoContinuation returns ErrNoContinuation.
func ContinueChat(body []byte, c Continuation) ([]byte, error) {
	switch c {
	case Prefill:
		return body, nil
	case PrefixFlag:
		start, end, err := jsonbody.FindMember(body, "messages")
		if err != nil || start < 0 {
			return nil, errors.New("the request has no messages")
		}
		var msgs []map[string]json.RawMessage
		if err := json.Unmarshal(body[start:end], &msgs); err != nil || len(msgs) == 0 {
			return nil, errors.New("the request's messages are not a non-empty array")
		}
		msgs[len(msgs)-1]["prefix"] = json.RawMessage("true")
		v, err := jsonbody.Marshal(msgs)
		if err != nil {
			return nil, err
		}
		return jsonbody.SetRaw(body, "messages", v)
	case ContinueFinalMessage:
		body, err := jsonbody.SetRaw(body, "continue_final_message", []byte("true"))
		if err != nil {
			return nil, err
		}
		return jsonbody.SetRaw(body, "add_generation_prompt", []byte("false"))
	}
	return nil, ErrNoContinuation
}

type errNoChatForm struct{ f Format }

func (e errNoChatForm) Error() string {
	return "a " + e.f.String() + " request has no Chat Completions form"
}

// Provider is one configured provider account of a provider type. The
// router calls it for every attempt on its deployments, concurrently.
type Provider interface {
	// Serves reports whether the provider answers requests in format f at
	// all, natively or through Chat: a deployment whose provider does not
	// (embeddings on a provider without them) is not tried.
	Serves(f Format) bool
	// Plan prepares one attempt of req on the provider's upstream model
	// (the deployment's), with ctx as the upstream request's context. An
	// error means the provider cannot express req (n > 1, a content kind it
	// lacks): nothing is sent, the router tries another deployment, and
	// answers 400 with the error's message when none can.
	Plan(ctx context.Context, model string, req *Request) (Plan, error)
	// Observe decodes the error class and the capacity (rate-limit windows,
	// Retry-After, hints) of one answer: status and headers always, the
	// body for an error status (nil for a success). now is the local time
	// the answer arrived; absolute times are read against its Date header
	// when present (RefTime), so clock skew with the provider does not
	// matter. For a client error the router passes on, Code and Message are
	// what the client is told when the answer is restated in another
	// format.
	Observe(status int, h http.Header, body []byte, now time.Time) Observation
}

// TokenCounter is a Provider that counts a Messages request's input tokens
// the way its models do (Anthropic's POST /v1/messages/count_tokens:
// https://docs.anthropic.com/en/api/messages-count-tokens).
type TokenCounter interface {
	// CountTokensRequest returns the upstream request that counts the
	// tokens of body (a Messages count_tokens body) for model, with the
	// client's headers of the format (header: anthropic-version,
	// anthropic-beta). Its answer is {"input_tokens": n}.
	CountTokensRequest(ctx context.Context, model string, body []byte, header http.Header) (*http.Request, error)
}

// Plan is one attempt: the upstream request and how its answer is read.
type Plan interface {
	// Request is the upstream HTTP request: the provider's URL, its key and
	// headers, the body in its wire format with the upstream model; nothing
	// of the client's request but what Request.Header allows.
	Request() *http.Request
	// Format is the format of the answers the plan reads: the client's
	// own (a native pass, passed on as it comes) or Chat.
	Format() Format
	// Native reports whether Format is the provider's own wire format, so
	// that its error answers are in Format too and can be passed on as
	// they came; false when the plan translates (the provider's errors are
	// then restated from what Observe decoded of them).
	Native() bool
	// Answer reads a successful (2xx) non-streamed body into Format. An
	// error means the body is no answer (an HTML page, an error object, no
	// choices): the attempt failed (class Server) and the router fails over.
	Answer(body []byte) ([]byte, error)
	// Stream reads a successful streamed body, event by event, into Format.
	Stream(body io.Reader) Stream
}

// Stream reads one streamed answer.
type Stream interface {
	// Next returns the next event and what it means. out is what to relay
	// to the client (for Chat, a chat.completion.chunk's JSON as Data; for
	// a native pass, the provider's own event), empty when there is
	// nothing to relay; it is valid until the next call. err is io.EOF at
	// the end of the body, any other error a broken stream.
	Next() (out Event, kind EventKind, obs Observation, err error)
	// Complete reports whether what was read is a whole answer, so that a
	// stream that ends without its terminator can still be finished for
	// the client: every choice finished, and usage arrived when it was
	// asked for and trails.
	Complete() bool
}

// EventKind says what one upstream stream event means to the router.
type EventKind uint8

const (
	// EventSkip is not content: an SSE comment (": keep-alive"), a ping, a
	// message_start, a chunk whose delta is only a role or empty strings,
	// usage alone. It is not a first token; out, when not empty, is relayed
	// once the stream is committed (a native pass's message_start, an
	// opening role-only chunk). A decoder says EventData only for content
	// that is not empty: text, a tool call, reasoning, a refusal.
	EventSkip EventKind = iota
	// EventData is content, or progress with nothing to relay (out empty:
	// a thinking delta for a Chat Completions client); either way a first
	// token, which commits the stream to this attempt.
	EventData
	// EventFinal is content that also finishes a choice (it carries a
	// finish_reason); a terminator may still follow.
	EventFinal
	// EventDone is the stream's terminator ("data: [DONE]", message_stop);
	// out, when not empty, is relayed before the end.
	EventDone
	// EventError is an in-band error: obs holds its class and message.
	EventError
)

// EventDecoder decodes the server-sent events of one streamed answer (see
// SSE). Decode never sees comments.
type EventDecoder interface {
	// Decode reads one event: see Stream.Next for out and kind.
	Decode(ev *Event) (out Event, kind EventKind, obs Observation)
	// Complete is Stream.Complete.
	Complete() bool
}

// SSE returns a Stream that reads server-sent events from body and decodes
// each with dec. Comments come back as EventSkip with nothing to relay.
func SSE(body io.Reader, dec EventDecoder) Stream {
	return &sseStream{r: NewSSEReader(body), dec: dec}
}

type sseStream struct {
	r   *SSEReader
	dec EventDecoder
}

func (s *sseStream) Next() (Event, EventKind, Observation, error) {
	ev, err := s.r.Next()
	if err != nil {
		return Event{}, EventSkip, Observation{}, err
	}
	if ev.Comment {
		return Event{}, EventSkip, Observation{}, nil
	}
	out, kind, obs := s.dec.Decode(ev)
	return out, kind, obs, nil
}

func (s *sseStream) Complete() bool { return s.dec.Complete() }

// SetModel returns body, a JSON object (a client's request), with its
// top-level "model" set to model, the deployment's upstream model in place
// of the client's model group: one copy, nothing else of body re-encoded.
// It fails when body is not a JSON object.
func SetModel(body []byte, model string) ([]byte, error) {
	return jsonbody.SetString(body, "model", model)
}

// Endpoint is what a provider type needs to reach one account over HTTP
// with a key: the common part of its configuration, resolved (placeholders
// replaced, the trailing slash of the base URL removed).
type Endpoint struct {
	// BaseURL is the API root without a trailing slash, e.g.
	// "https://api.openai.com/v1".
	BaseURL string
	// APIKey is the provider's key. It is only ever put in the upstream
	// request's auth header; never logged or returned.
	APIKey string
	// Header holds extra upstream headers (the Caddyfile `header` lines).
	Header http.Header
}

// The values NewRequest sets, shared by every request (as the account's
// extra headers are): a header that is set again is replaced, never
// written into.
var (
	jsonValue        = []string{"application/json"}
	eventStreamValue = []string{"text/event-stream"}
)

// NewRequest builds a POST of a JSON body to url, with the account's extra
// headers and its key in keyHeader as keyPrefix+key ("Authorization",
// "Bearer "; nothing when there is no key), and Accept for a stream or a
// JSON answer. Nothing of the client's request is in it. The router sends
// it with the deployment's transport, under its timeouts.
func (e *Endpoint) NewRequest(ctx context.Context, url string, body []byte, stream bool, keyHeader, keyPrefix string) (*http.Request, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	for k, v := range e.Header {
		req.Header[k] = v
	}
	req.Header["Content-Type"] = jsonValue
	if stream {
		req.Header["Accept"] = eventStreamValue
	} else {
		req.Header["Accept"] = jsonValue
	}
	if e.APIKey != "" {
		req.Header.Set(keyHeader, keyPrefix+e.APIKey)
	}
	return req, nil
}
