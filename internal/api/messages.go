package api

import (
	"io"
	"net/http"

	"github.com/llmrouter/caddy-llm-router/internal/jsonbody"
	"github.com/llmrouter/caddy-llm-router/internal/router"
	"github.com/llmrouter/caddy-llm-router/internal/wire/messages"
	"github.com/llmrouter/caddy-llm-router/provider"
)

// Messages is Anthropic's Messages API
// (https://docs.anthropic.com/en/api/messages): POST .../messages,
// streamed or not, over the same model groups. Anthropic deployments take
// it natively (their answers and events pass through); the others get its
// Chat Completions form, and their answers are translated back. Errors as
// {"type":"error","error":{"type","message"},"request_id"}, the type by
// status.
type Messages struct {
	// prompt is the prompt estimate of the stream being written (tokens):
	// a translated stream's message_start states it as input_tokens.
	prompt int64
}

// messagesHeaders are the client headers that belong to the format: the
// API version and beta features, kept on a native pass.
var messagesHeaders = []string{"Anthropic-Version", "Anthropic-Beta"}

// Format implements API.
func (Messages) Format() provider.Format { return provider.Messages }

// messagesKeys are the body keys the router reads (see chatKeys).
var messagesKeys = []string{"model", "messages", "stream", "max_tokens", "system"}

// Parse implements API: a JSON object with a model, max_tokens > 0, a
// system prompt (if any) that is a string or an array, and a non-empty
// messages array of objects, each with a role (a string: which roles a
// deployment takes is its provider's to say; Claude Code sends "system"
// turns, which the API takes) and a content that is a string or an array
// of blocks. What the Chat Completions form cannot express (a server tool)
// is found when a deployment needs that form: only Anthropic deployments
// can then serve it.
func (Messages) Parse(body []byte, header http.Header) (*router.Request, string, *Error) {
	var m messagesScan
	if e := scanBody(body, messagesKeys, &m.scan, m.member); e != nil {
		return nil, "", e
	}
	if m.model == "" {
		return nil, "", missingModel()
	}
	if m.messages == 0 || m.maxTokens <= 0 {
		return nil, "", Errorf(http.StatusBadRequest, MissingParameter, "",
			"messages (a non-empty array) and max_tokens (> 0) are required")
	}
	pr := &provider.Request{Format: provider.Messages, Body: body, Header: MessagesHeaders(header), Stream: m.stream,
		// The Chat form asks OpenAI-format providers for usage, which a
		// Messages stream reports at its end.
		Choices: 1, IncludeUsage: m.stream, ToChat: messages.ToChat}
	return m.sized(pr, m.maxTokens), m.model, nil
}

// MessagesHeaders returns the client's headers that belong to the
// Messages format (its API version and beta features), which go upstream
// on a native pass.
func MessagesHeaders(header http.Header) http.Header {
	h := http.Header{}
	for _, k := range messagesHeaders {
		if v := header.Values(k); len(v) > 0 {
			h[k] = v
		}
	}
	return h
}

// messagesScan is what routing reads of a Messages body.
type messagesScan struct {
	model     string
	stream    bool
	maxTokens int64
	messages  int // how many
	scan
}

func (m *messagesScan) member(name, v []byte) {
	switch key := string(name); key {
	case "model":
		m.model = m.str(key, v)
	case "stream":
		m.stream = m.boolean(key, v)
	case "max_tokens":
		m.maxTokens = m.integer(key, v)
	case "system":
		if v[0] != '"' && v[0] != '[' {
			m.typeError(key, "a string or an array")
		}
	case "messages":
		if v[0] != '[' {
			m.typeError(key, "an array")
			return
		}
		_ = jsonbody.EachElement(v, func(start, end int) bool {
			m.message(v[start:end])
			return m.err == nil
		})
	}
}

// message checks the shape of messages[i], as Anthropic words its errors.
func (m *messagesScan) message(v []byte) {
	i := m.messages
	m.messages++
	if v[0] != '{' {
		m.fail(Errorf(http.StatusBadRequest, InvalidValue, "", "messages.%d: Input should be a valid dictionary", i))
		return
	}
	var role, content []byte
	_ = jsonbody.EachMember(v, func(k []byte, start, end int) bool {
		switch string(k) {
		case "role":
			role = v[start:end]
		case "content":
			content = v[start:end]
		}
		return true
	})
	switch {
	case len(role) < 3 || role[0] != '"':
		m.fail(Errorf(http.StatusBadRequest, InvalidValue, "", "messages.%d.role: Input should be a non-empty string", i))
	case len(content) == 0 || content[0] != '"' && content[0] != '[':
		m.fail(Errorf(http.StatusBadRequest, InvalidValue, "", "messages.%d.content: Input should be a valid string or a list of content blocks", i))
	}
}

// WriteError implements API.
func (m Messages) WriteError(w http.ResponseWriter, e *Error) { writeError(w, m, e) }

// Write implements API.
func (m Messages) Write(w http.ResponseWriter, res *router.Result) error {
	if res.Stream != nil {
		m.prompt = res.Stream.PromptTokens()
	}
	return write(w, m, res)
}

func (Messages) errorBody(e *Error) []byte {
	return messages.NewError(messages.ErrorType(e.Status), e.Message)
}

// isError implements format: {"type":"error","error":{"type":"...","message":"..."}}.
func (Messages) isError(body []byte) bool {
	if typ, _ := jsonbody.GetString(body, "type"); typ != "error" {
		return false
	}
	start, end, _ := jsonbody.FindMember(body, "error")
	if start < 0 || body[start] != '{' {
		return false
	}
	_, ok := jsonbody.GetString(body[start:end], "message")
	return ok
}

func (Messages) restate(status int, said *provider.Observation) []byte {
	return messages.NewError(messages.ErrorType(status), said.Message)
}

func (Messages) fromChat(body []byte) ([]byte, error) { return messages.FromChatAnswer(body) }

func (m Messages) newStream(from provider.Format) streamWriter {
	if from == provider.Messages {
		return nativeMessages{}
	}
	enc := messages.NewChatEncoder()
	enc.PromptTokens = m.prompt
	return &translatedMessages{enc: enc}
}

// nativeMessages writes the provider's own Messages events as they come,
// and the message_stop that ends a complete stream (the decoder keeps the
// provider's, which may have come unnamed, to itself).
type nativeMessages struct{}

func (nativeMessages) event(w io.Writer, ev provider.Event) error {
	return provider.WriteEvent(w, ev.Name, ev.Data)
}

func (nativeMessages) done(w io.Writer) error {
	return provider.WriteEvent(w, "message_stop", []byte(`{"type":"message_stop"}`))
}

func (nativeMessages) failed(w io.Writer, e *router.StreamError) error {
	_, err := w.Write(streamErrorEvent(e))
	return err
}

// translatedMessages writes a Chat stream as Messages events.
type translatedMessages struct{ enc *messages.ChatEncoder }

func (s *translatedMessages) event(w io.Writer, ev provider.Event) error {
	_, err := w.Write(s.enc.Chunk(ev.Data))
	return err
}

func (s *translatedMessages) done(w io.Writer) error {
	_, err := w.Write(s.enc.Done())
	return err
}

func (*translatedMessages) failed(w io.Writer, e *router.StreamError) error {
	_, err := w.Write(streamErrorEvent(e))
	return err
}

// streamErrorEvent is the error event that ends a failed Messages stream,
// its type by the failure's class.
func streamErrorEvent(e *router.StreamError) []byte {
	typ := "api_error"
	switch e.Class {
	case provider.Overloaded:
		typ = "overloaded_error"
	case provider.RateLimited:
		typ = "rate_limit_error"
	}
	return messages.StreamError(typ, streamFailure(e))
}
