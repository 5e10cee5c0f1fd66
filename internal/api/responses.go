package api

import (
	"errors"
	"io"
	"net/http"
	"strconv"

	"github.com/llmrouter/caddy-llm-router/internal/jsonbody"
	"github.com/llmrouter/caddy-llm-router/internal/router"
	"github.com/llmrouter/caddy-llm-router/internal/wire/responses"
	"github.com/llmrouter/caddy-llm-router/provider"
)

// Responses is OpenAI's Responses API
// (https://platform.openai.com/docs/api-reference/responses): POST
// .../responses, streamed or not, over the same model groups. Deployments
// whose provider serves it (OpenAI; Azure's v1 API; an OpenAI-compatible
// server with `responses native`) take it natively, their answers and
// events passed on; the others get its Chat Completions form
// (responses.ToChat), and their answers are translated back. A request
// that continues the provider's state (previous_response_id,
// conversation) has no Chat form: only a native deployment serves it; nor
// has a background create (background: true, ErrBackground).
// Errors as Chat Completions' ({"error":{"message","type","param","code"}}).
type Responses struct {
	Chat
	// Remember, when set, is told the id of each response given and the
	// deployment that made it; native is false for a response translated
	// from Chat Completions (no provider keeps its state).
	Remember func(id string, d *router.Deployment, native bool)
	// Output, when set, is told each output item of a native answer (a
	// response's output[], a stream's response.output_item.done items and
	// its response.completed's output[]) and the deployment that made it:
	// an item with encrypted_content only that deployment's organization
	// reads.
	Output func(d *router.Deployment, item []byte)
	// answering is the deployment of the result being written.
	answering *router.Deployment
	// echo is what a translated response restates of its request
	// (WithRequest).
	echo responses.Echo
}

// WithRequest returns x for the request body body: a response it
// translates from a Chat answer restates the request's instructions,
// temperature and top_p, as OpenAI's responses do.
func (x Responses) WithRequest(body []byte) Responses {
	x.echo = responses.EchoOf(body)
	return x
}

// responsesKeys are the body keys the router reads (see chatKeys).
var responsesKeys = []string{"model", "input", "stream", "max_output_tokens", "previous_response_id", "background"}

// ErrBackground is the Chat form of a background response (background:
// true): there is none, since the provider account that runs the job keeps
// the response (polled, cancelled, streamed again there). Only a
// deployment that serves the Responses API natively takes it.
var ErrBackground = errors.New("a Responses request with background: true leaves its response with the provider account that runs it; it has no Chat Completions form")

func backgroundToChat([]byte) ([]byte, error) { return nil, ErrBackground }

// Format implements API.
func (Responses) Format() provider.Format { return provider.Responses }

// Parse implements API: a JSON object with a model, and an input that is a
// non-empty string or a non-empty array (or a previous_response_id to
// continue from); max_output_tokens, when given, an integer of at least 16
// (OpenAI's floor). The items themselves are read by the translation, or
// by the provider.
func (Responses) Parse(body []byte, _ http.Header) (*router.Request, string, *Error) {
	var r responsesScan
	if e := scanBody(body, responsesKeys, &r.scan, r.member); e != nil {
		return nil, "", e
	}
	switch {
	case r.model == "":
		return nil, "", missingModel()
	case !r.input && !r.previous:
		return nil, "", Errorf(http.StatusBadRequest, MissingParameter, "input",
			"'input' must be a non-empty string or array of items")
	case r.maxOutputTokens != nil && *r.maxOutputTokens < 16:
		return nil, "", Errorf(http.StatusBadRequest, InvalidValue, "max_output_tokens",
			"'max_output_tokens' must be at least 16")
	}
	pr := &provider.Request{Format: provider.Responses, Body: body, Stream: r.stream,
		// The Chat form asks for usage, which response.completed reports.
		Choices: 1, IncludeUsage: r.stream, ToChat: responses.ToChat}
	if r.background {
		pr.ToChat = backgroundToChat
	}
	var maxTokens int64
	if r.maxOutputTokens != nil {
		maxTokens = *r.maxOutputTokens
	}
	rr := r.sized(pr, maxTokens)
	// The provider runs a background response to its end whoever waits:
	// a hedge's twin would be a second job, billed too.
	rr.NoHedge = r.background
	return rr, r.model, nil
}

// responsesScan is what routing reads of a Responses body.
type responsesScan struct {
	model           string
	stream          bool
	input, previous bool // a non-empty input; a previous_response_id
	background      bool
	maxOutputTokens *int64
	scan
}

func (r *responsesScan) member(name, v []byte) {
	switch key := string(name); key {
	case "model":
		r.model = r.str(key, v)
	case "stream":
		r.stream = r.boolean(key, v)
	case "max_output_tokens":
		n := r.integer(key, v)
		r.maxOutputTokens = &n
	case "previous_response_id":
		r.previous = r.str(key, v) != ""
	case "background":
		r.background = r.boolean(key, v)
	case "input":
		switch v[0] {
		case '"':
			r.input = r.str(key, v) != ""
		case '[':
			_ = jsonbody.EachElement(v, func(start, end int) bool {
				if v[start] != '{' {
					r.fail(Errorf(http.StatusBadRequest, InvalidValue, "input",
						"input[]: each item must be an object"))
					return false
				}
				r.input = true
				return true
			})
		default:
			r.typeError(key, "a string or an array")
		}
	}
}

// WriteError implements API.
func (x Responses) WriteError(w http.ResponseWriter, e *Error) { writeError(w, x, e) }

// Write implements API.
func (x Responses) Write(w http.ResponseWriter, res *router.Result) error {
	x.answering = res.Deployment
	return write(w, x, res)
}

func (x Responses) fromChat(body []byte) ([]byte, error) {
	return responses.FromChatAnswerTo(body, x.echo)
}

func (x Responses) answered(res *router.Result, body []byte) {
	if res.Format == provider.Responses {
		eachOutput(body, res.Deployment, x.Output)
	}
	if x.Remember == nil {
		return
	}
	if id, ok := jsonbody.GetString(body, "id"); ok && id != "" {
		x.Remember(id, res.Deployment, res.Format == provider.Responses)
	}
}

// newStream returns the writer of one stream: the provider's own events,
// or a Chat stream's translation.
func (x Responses) newStream(from provider.Format) streamWriter {
	if from == provider.Responses {
		return &nativeResponses{remember: x.Remember, output: x.Output, d: x.answering}
	}
	return &translatedResponses{enc: responses.NewChatEncoder().Restating(x.echo), remember: x.Remember, d: x.answering}
}

// nativeResponses writes the provider's own Responses events as they come
// (response.completed among them: the decoder relays it as the stream's
// end), and a response.failed numbered after them when the stream fails.
type nativeResponses struct {
	next      int
	id, model string // of the provider's response, from response.created
	remember  func(id string, d *router.Deployment, native bool)
	output    func(d *router.Deployment, item []byte)
	d         *router.Deployment
}

// eachOutput tells output each item of a response's output array.
func eachOutput(response []byte, d *router.Deployment, output func(*router.Deployment, []byte)) {
	if output == nil {
		return
	}
	eachObject(response, "output", func(item []byte) { output(d, item) })
}

// told tells s.output the items a native event carries.
func (s *nativeResponses) told(name string, data []byte) {
	if s.output == nil {
		return
	}
	member := map[string]string{"response.output_item.done": "item", "response.completed": "response"}[name]
	if member == "" {
		return
	}
	if start, end, _ := jsonbody.FindMember(data, member); start >= 0 && data[start] == '{' {
		if member == "item" {
			s.output(s.d, data[start:end])
		} else {
			eachOutput(data[start:end], s.d, s.output)
		}
	}
}

func (s *nativeResponses) event(w io.Writer, ev provider.Event) error {
	if start, end, _ := jsonbody.FindMember(ev.Data, "sequence_number"); start >= 0 {
		if n, err := strconv.Atoi(string(ev.Data[start:end])); err == nil {
			s.next = n + 1
		}
	}
	if s.id == "" {
		// response.created names the response first.
		if start, end, _ := jsonbody.FindMember(ev.Data, "response"); start >= 0 && ev.Data[start] == '{' {
			if id, ok := jsonbody.GetString(ev.Data[start:end], "id"); ok && id != "" {
				s.id = id
				s.model, _ = jsonbody.GetString(ev.Data[start:end], "model")
				if s.remember != nil {
					s.remember(id, s.d, true)
				}
			}
		}
	}
	// Named by its data's type, which is what the router read it as (a
	// provider's event: line may say otherwise).
	name, _ := jsonbody.GetString(ev.Data, "type")
	if name == "" {
		name = ev.Name
	}
	s.told(name, ev.Data)
	return provider.WriteEvent(w, name, ev.Data)
}

func (*nativeResponses) done(io.Writer) error { return nil }

func (s *nativeResponses) failed(w io.Writer, e *router.StreamError) error {
	_, err := w.Write(responses.FailedEvent(s.next, s.id, s.model, failureCode(e), streamFailure(e)))
	return err
}

// translatedResponses writes a Chat stream as Responses events.
type translatedResponses struct {
	enc      *responses.ChatEncoder
	remember func(id string, d *router.Deployment, native bool)
	d        *router.Deployment
}

func (s *translatedResponses) event(w io.Writer, ev provider.Event) error {
	_, err := w.Write(s.enc.Chunk(ev.Data))
	if s.remember != nil && s.enc.ID() != "" {
		s.remember(s.enc.ID(), s.d, false)
		s.remember = nil
	}
	return err
}

func (s *translatedResponses) done(w io.Writer) error {
	_, err := w.Write(s.enc.Done())
	return err
}

func (s *translatedResponses) failed(w io.Writer, e *router.StreamError) error {
	_, err := w.Write(s.enc.Failed(failureCode(e), streamFailure(e)))
	return err
}

// failureCode is a failed response's error code, by the failure's class.
func failureCode(e *router.StreamError) string {
	switch e.Class {
	case provider.RateLimited:
		return "rate_limit_exceeded"
	case provider.Overloaded:
		return "server_is_overloaded"
	}
	return "server_error"
}
