package adapters

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/llmrouter/caddy-llm-router/internal/excerpt"
	"github.com/llmrouter/caddy-llm-router/internal/jsonbody"
	"github.com/llmrouter/caddy-llm-router/internal/wire/responses"
	"github.com/llmrouter/caddy-llm-router/provider"
)

// OpenAI speaks the OpenAI Chat Completions wire format, which OpenAI, Groq,
// Mistral, DeepSeek, Together, Fireworks, OpenRouter, Cerebras, vLLM and
// Ollama all serve. Requests go to BaseURL + "/chat/completions" (and
// "/embeddings") with "Authorization: Bearer <key>"; a Chat request goes
// as the client wrote it, with the upstream model in place of the model
// group, and other formats through their Chat form.
//
// Rate-limit dialects it decodes (fixtures in testdata/):
//   - OpenAI, Groq: x-ratelimit-{limit,remaining,reset}-{requests,tokens},
//     resets as Go durations ("20s", "2m59.56s", "7.44ms");
//     https://platform.openai.com/docs/guides/rate-limits
//   - Cerebras: the same names with a "-day" or "-minute" suffix, resets in
//     seconds; the tightest window of each kind wins;
//   - Together: x-ratelimit-{limit,remaining,reset} (requests, reset in
//     seconds) and x-tokenlimit-{limit,remaining};
//   - Mistral: ratelimitbysize-{limit,remaining,reset} and
//     x-ratelimitbysize-*-minute (tokens, reset in seconds);
//   - Retry-After (seconds or HTTP-date), Azure's retry-after-ms, and the
//     "Please try again in 125ms." hint in the error message.
type OpenAI struct {
	Endpoint provider.Endpoint
	// Responses says the server serves the Responses API
	// (BaseURL + "/responses"): a Responses request goes to it as the
	// client wrote it, and one that continues the provider's state
	// (previous_response_id) can be served. False: through its Chat form.
	Responses bool
	// Continuation is how the server continues an assistant's text it did
	// not write (a resume's request): NoContinuation for OpenAI itself,
	// which answers a final assistant message afresh.
	Continuation provider.Continuation
}

// Serves implements provider.Provider: Chat, Embeddings, Responses and
// Completions as they came, Messages through its Chat form (openAIFormats).
func (*OpenAI) Serves(f provider.Format) bool { return slices.Contains(openAIFormats, f) }

// openAIFormats are the formats the OpenAI format's types (openai, azure)
// serve: a client API added later is not among them until they plan it.
var openAIFormats = []provider.Format{provider.Chat, provider.Embeddings, provider.Messages, provider.Responses, provider.Completions}

// Plan implements provider.Provider.
func (p *OpenAI) Plan(ctx context.Context, model string, r *provider.Request) (provider.Plan, error) {
	return planOpenAIFamily(model, r, p.Responses, p.ContinuationFor(model), chatReader{}, func(op string, body []byte, stream bool) (*http.Request, error) {
		return openAIPost(ctx, &p.Endpoint, p.Endpoint.BaseURL+"/"+op, model, body, stream)
	})
}

// planOpenAIFamily plans an attempt on a provider of the OpenAI format
// (openai, azure): embeddings as they came, a Responses request as it came
// when the provider serves that API (responses), anything else through
// its Chat form (a resume's request too, continued as cont says); post builds the request of an operation ("embeddings",
// "responses", "chat/completions"), rd reads its Chat answers.
func planOpenAIFamily(model string, r *provider.Request, responses bool, cont provider.Continuation, rd reader, post func(op string, body []byte, stream bool) (*http.Request, error)) (provider.Plan, error) {
	switch {
	case r.Format == provider.Embeddings:
		req, err := post("embeddings", r.Body, false)
		if err != nil {
			return nil, err
		}
		return &plan{req: req, format: provider.Embeddings, native: true, r: embeddingsReader{}}, nil
	case r.Continues && (r.Format == provider.Completions || cont == provider.NoContinuation):
		return nil, provider.ErrNoContinuation
	case r.Format == provider.Completions:
		body, err := askUsage(r.Body, r)
		if err != nil {
			return nil, err
		}
		req, err := post("completions", body, r.Stream)
		if err != nil {
			return nil, err
		}
		return &plan{req: req, format: provider.Completions, native: true, model: model,
			choices: max(r.Choices, 1), includeUsage: r.IncludeUsage, r: completionsReader{}}, nil
	case r.Format == provider.Responses && responses && !r.Continues:
		req, err := post("responses", r.Body, r.Stream)
		if err != nil {
			return nil, err
		}
		return &plan{req: req, format: provider.Responses, native: true, model: model, r: responsesReader{}}, nil
	}
	body, err := r.Chat()
	if err != nil {
		return nil, err
	}
	if body, err = askUsage(body, r); err != nil {
		return nil, err
	}
	if r.Continues {
		if body, err = provider.ContinueChat(body, cont); err != nil {
			return nil, err
		}
	}
	req, err := post("chat/completions", body, r.Stream)
	if err != nil {
		return nil, err
	}
	return chatPlan(req, model, r, true, rd), nil
}

// askUsage asks for the usage chunk of a stream the client did not ask it
// for (stream_options.include_usage: the router counts every answer's
// tokens; the chunk is kept from the client, see
// provider.NewUsageCounter). A body that asked already, or no stream, is
// sent as it is.
func askUsage(body []byte, r *provider.Request) ([]byte, error) {
	if !r.Stream || r.IncludeUsage {
		return body, nil
	}
	start, end, err := jsonbody.FindMember(body, "stream_options")
	if err != nil {
		return nil, err
	}
	if start >= 0 && body[start] == '{' {
		// The client's other stream options stay.
		opts, err := jsonbody.SetRaw(body[start:end], "include_usage", []byte("true"))
		if err != nil {
			return nil, err
		}
		return append(append(append(make([]byte, 0, len(body)+24), body[:start]...), opts...), body[end:]...), nil
	}
	return jsonbody.SetRaw(body, "stream_options", []byte(`{"include_usage":true}`))
}

// openAIPost builds a POST of body, with model set, to url with the
// provider's Bearer key and extra headers; nothing of the client's.
func openAIPost(ctx context.Context, ep *provider.Endpoint, url, model string, body []byte, stream bool) (*http.Request, error) {
	out, err := provider.SetModel(body, model)
	if err != nil {
		return nil, err
	}
	return ep.NewRequest(ctx, url, out, stream, bearerKey.name, bearerKey.prefix)
}

// chatReader reads Chat Completions answers and streams.
type chatReader struct{}

// answer checks the body is a chat completion and names its model. A 200
// that is not (an HTML page, an empty body, an error object, no choices) is
// an error, so the router fails over instead of passing it on as an answer.
func (chatReader) answer(p *plan, body []byte) ([]byte, error) {
	if err := checkCompletion(body); err != nil {
		return nil, err
	}
	return withModel(body, p.model), nil
}

// checkCompletion checks body is a chat completion: valid JSON, an object
// whose error member is absent or null and whose choices are a non-empty
// array of objects, each with a message object whose content is absent,
// null, a string or an array of parts. It scans rather than decodes: this
// runs on every answer.
func checkCompletion(body []byte) error {
	if !jsonbody.Valid(body) {
		return errNotCompletion
	}
	var errValue []byte
	choices, err := 0, error(nil)
	walk := jsonbody.EachMember(body, func(key []byte, start, end int) bool {
		v := body[start:end]
		switch string(key) {
		case "error":
			if v[0] != 'n' {
				errValue = v
			}
		case "choices":
			choices, err = checkChoices(v)
		}
		return true
	})
	switch {
	case walk != nil:
		return errNotCompletion
	case errValue != nil:
		return errors.New("the answer is an error: " + parseErrorValue(errValue).message)
	case err != nil:
		return err
	case choices == 0:
		return errors.New("the answer has no choices")
	}
	return nil
}

var errNotCompletion = errors.New("the answer is not a JSON chat completion")

// checkChoices checks a completion's choices value (valid JSON) and
// returns how many it holds.
func checkChoices(v []byte) (int, error) {
	if v[0] == 'n' {
		return 0, nil
	}
	if v[0] != '[' {
		return 0, errNotCompletion
	}
	n, err := 0, error(nil)
	jsonbody.EachElement(v, func(start, end int) bool {
		n++
		message := -1
		if v[start] == '{' {
			ms, me, _ := jsonbody.FindMember(v[start:end], "message")
			if ms >= 0 {
				m := v[start+ms : start+me]
				switch m[0] {
				case 'n':
				case '{':
					message = 1
					if cs, _, _ := jsonbody.FindMember(m, "content"); cs >= 0 {
						if c := m[cs]; c != '"' && c != '[' && c != 'n' {
							err = errors.New("the answer's content is neither text nor parts")
						}
					}
				default:
					err = errNotCompletion
				}
			}
		} else if v[start] != 'n' {
			err = errNotCompletion
		}
		if err == nil && message < 0 {
			err = errors.New("the answer has a choice without a message")
		}
		return err == nil
	})
	return n, err
}

func (chatReader) decoder(p *plan) provider.EventDecoder {
	return &chatStream{choices: p.choices, includeUsage: p.includeUsage}
}

// embeddingsReader reads embeddings answers, which are passed on as they
// came once they prove to be a list with data.
type embeddingsReader struct{}

func (embeddingsReader) answer(_ *plan, body []byte) ([]byte, error) {
	var e struct {
		Data  json.RawMessage `json:"data"`
		Error json.RawMessage `json:"error"`
	}
	if err := json.Unmarshal(body, &e); err != nil {
		return nil, errors.New("the answer is not JSON")
	}
	if len(e.Error) > 0 && !bytes.Equal(e.Error, []byte("null")) {
		return nil, errors.New("the answer is an error: " + parseErrorValue(e.Error).message)
	}
	if len(e.Data) == 0 || e.Data[0] != '[' {
		return nil, errors.New("the answer has no data")
	}
	return body, nil
}

func (embeddingsReader) decoder(*plan) provider.EventDecoder { return &chatStream{choices: 1} }

// completionsReader reads legacy completions, passed on as they came.
type completionsReader struct{}

// answer checks the body is a completion: a JSON object without an error
// and with a non-empty choices array.
func (completionsReader) answer(p *plan, body []byte) ([]byte, error) {
	var c struct {
		Choices []json.RawMessage `json:"choices"`
		Error   json.RawMessage   `json:"error"`
	}
	if err := json.Unmarshal(body, &c); err != nil {
		return nil, errors.New("the answer is not a JSON completion")
	}
	if len(c.Error) > 0 && !bytes.Equal(c.Error, []byte("null")) {
		return nil, errors.New("the answer is an error: " + parseErrorValue(c.Error).message)
	}
	if len(c.Choices) == 0 {
		return nil, errors.New("the answer has no choices")
	}
	return withModel(body, p.model), nil
}

func (completionsReader) decoder(p *plan) provider.EventDecoder {
	return &completionsStream{choices: p.choices, includeUsage: p.includeUsage}
}

// completionsStream decodes a legacy completions stream: chunks whose
// choices carry text, relayed as they are, then [DONE].
type completionsStream struct {
	chatStream
	choices      int
	includeUsage bool
}

// Complete implements provider.EventDecoder.
func (s *completionsStream) Complete() bool {
	return s.finals >= max(s.choices, 1) && (s.usage || !s.includeUsage)
}

// Decode implements provider.EventDecoder.
func (s *completionsStream) Decode(ev *provider.Event) (provider.Event, provider.EventKind, provider.Observation) {
	data := bytes.TrimSpace(ev.Data)
	switch {
	case bytes.Equal(data, []byte("[DONE]")):
		return provider.Event{}, provider.EventDone, provider.Observation{}
	case len(data) == 0:
		return provider.Event{}, provider.EventSkip, provider.Observation{}
	}
	choices, obs, ok := decodeChunk[struct {
		Index        int     `json:"index"`
		Text         string  `json:"text"`
		FinishReason *string `json:"finish_reason"`
	}](&s.chatStream, data)
	if !ok {
		return provider.Event{}, provider.EventError, obs
	}
	kind := provider.EventSkip
	if s.content {
		kind = provider.EventData
	}
	for _, c := range choices {
		if c.Text != "" {
			kind, s.content = provider.EventData, true
		}
		if c.FinishReason != nil && *c.FinishReason != "" {
			kind, s.content = provider.EventFinal, true
			s.finish(c.Index)
		}
	}
	return provider.Event{Data: data}, kind, provider.Observation{}
}

// responsesReader reads Responses answers and streams, passed on as they
// came.
type responsesReader struct{}

// answer checks the body is a response object: a JSON object whose error
// is absent or null and whose output is an array. Anything else (an HTML
// page, an error object with a 200) fails over.
func (responsesReader) answer(_ *plan, body []byte) ([]byte, error) {
	var r struct {
		Object string          `json:"object"`
		Output json.RawMessage `json:"output"`
		Error  json.RawMessage `json:"error"`
	}
	if err := json.Unmarshal(body, &r); err != nil {
		return nil, errors.New("the answer is not a JSON response object")
	}
	if len(r.Error) > 0 && !bytes.Equal(r.Error, []byte("null")) {
		return nil, errors.New("the answer is an error: " + parseErrorValue(r.Error).message)
	}
	if len(r.Output) == 0 || r.Output[0] != '[' {
		return nil, errors.New("the answer has no output")
	}
	return body, nil
}

func (responsesReader) decoder(*plan) provider.EventDecoder {
	return responses.NewDecoder(func(code, message string) provider.Observation {
		return classifyStreamError(apiError{code: code, message: message})
	})
}

// Observe implements provider.Provider.
func (*OpenAI) Observe(status int, h http.Header, body []byte, now time.Time) provider.Observation {
	return observeOpenAI(status, h, body, now)
}

func observeOpenAI(status int, h http.Header, body []byte, now time.Time) provider.Observation {
	ref := provider.RefTime(h, now)
	o := provider.NewObservation(provider.OK)
	o.Requests, o.Tokens = openAIWindows(h, ref)
	// OpenAI's (and Groq's, Azure's) tokens per minute admit a request on
	// its own estimate, characters and max_tokens (PROVIDERS.md): a request
	// larger than the whole limit never fits.
	o.Tokens.BoundsRequest = o.Tokens.Limit > 0 && provider.ParseCount(h.Get("X-Ratelimit-Limit-Tokens")) == o.Tokens.Limit
	o.RetryAfter = provider.RetryAfter(h, ref)
	if status >= 200 && status < 300 {
		return o
	}
	e := parseOpenAIError(body)
	if e.message == "" {
		e.message = fmt.Sprintf("the provider answered %d %s without a message", status, http.StatusText(status))
	}
	o.Message, o.Code = e.message, e.code
	o.Class = classifyOpenAI(status, e)
	hint := provider.MessageHint(e.message)
	if (status == http.StatusTooManyRequests || status == http.StatusForbidden) &&
		o.RetryAfter < 0 && hint < 0 && !exhausted(o.Requests) && !exhausted(o.Tokens) && quotaMessage(e.message) {
		// A monthly, daily, trial or billing quota stated only in the
		// message, with no wait stated anywhere: not a rate limit that
		// clears in seconds. (Not for a 400, whose message may echo the
		// client's own words.)
		o.Class = provider.QuotaExhausted
	}
	if limit, ok := tooLarge(status, e.message); ok {
		o.Class = provider.TooLarge
		if o.Tokens.Limit < 0 {
			o.Tokens.Limit = limit // stated only in the message
		}
		o.Tokens.BoundsRequest = true
	}
	if o.RetryAfter < 0 && (o.Class == provider.RateLimited || o.Class == provider.Overloaded) {
		o.RetryAfter = hint
	}
	return o
}

// tooLargeMessage is OpenAI's 429 (Groq's 413) for a request larger than
// a token window's whole limit: "Request too large for gpt-4o in
// organization org-... on tokens per min (TPM): Limit 30000, Requested
// 36278. The input or output tokens must be reduced in order to run
// successfully." (The window is full and its reset 0s: waiting cannot
// cure it.) Sources: testdata/dialects.json.
var tooLargeMessage = regexp.MustCompile(`(?i)\brequest too large\b.*?\blimit:? ?(\d+), requested:? ?(\d+)`)

// tooLarge reports whether a 429's message (OpenAI), or a 413's (Groq
// sends the same message with 413), says the request is larger than a
// window's whole limit (and not only than what is left of it), and the
// limit it names, in tokens.
func tooLarge(status int, msg string) (limit int64, ok bool) {
	if status != http.StatusTooManyRequests && status != http.StatusRequestEntityTooLarge {
		return 0, false
	}
	m := tooLargeMessage.FindStringSubmatch(msg)
	if m == nil {
		return 0, false
	}
	limit, requested := provider.ParseCount(m[1]), provider.ParseCount(m[2])
	return limit, limit > 0 && requested > limit
}

// exhausted reports whether a stated window is spent, with a reset.
func exhausted(w provider.Window) bool { return w.Remaining == 0 && w.Reset >= 0 }

// chatStream decodes a Chat Completions stream: chunks are relayed as they
// are. It counts what completeness needs: the choices that finished, and
// the usage chunk (with stream_options.include_usage, usage comes in a
// chunk of its own after the last finish_reason).
type chatStream struct {
	choices      int
	includeUsage bool
	finished     [2]uint64 // the choice indexes (0..127) that finished
	finals       int       // how many distinct ones
	usage        bool
	content      bool // a chunk carried content (see hasContent)
}

// Complete implements provider.EventDecoder: every choice finished (each
// index once, however many times it says so), and usage came when asked.
func (s *chatStream) Complete() bool {
	return s.finals >= max(s.choices, 1) && (s.usage || !s.includeUsage)
}

// finish notes that choice index finished.
func (s *chatStream) finish(index int) {
	if index < 0 || index >= 128 {
		return // n is at most 128: no such choice
	}
	if bit := uint64(1) << (index % 64); s.finished[index/64]&bit == 0 {
		s.finished[index/64] |= bit
		s.finals++
	}
}

// Decode implements provider.EventDecoder.
func (s *chatStream) Decode(ev *provider.Event) (provider.Event, provider.EventKind, provider.Observation) {
	data := bytes.TrimSpace(ev.Data)
	if ev.Name == "error" {
		// Some servers send errors as a named event, whatever the payload.
		e := parseErrorValue(data)
		if top := parseOpenAIError(data); top.message != "" || top.typ != "" {
			e = top
		}
		return provider.Event{}, provider.EventError, classifyStreamError(e)
	}
	if bytes.Equal(data, []byte("[DONE]")) {
		return provider.Event{}, provider.EventDone, provider.Observation{}
	}
	if len(data) == 0 {
		return provider.Event{}, provider.EventSkip, provider.Observation{}
	}
	// Most chunks carry neither an error, nor a finish_reason, nor usage
	// (some servers send "usage":null in every chunk): the pass that checks
	// the chunk is JSON notes what it holds (chunkMarks) before any
	// decoding, and usage is looked for only while it is awaited. An
	// escaped quote inside content never reads as a key. A chunk that
	// holds nothing a UsageCounter looks for is marked Plain for it.
	var m chunkMarks
	if !scanJSON(data, &m) {
		return provider.Event{}, provider.EventError, streamBroken("invalid JSON event in stream")
	}
	if !m.err && !m.finish && (!s.includeUsage || s.usage || m.usage != '{') {
		return provider.Event{Data: data, Plain: !m.sage && !m.reason}, s.contentKind(data), provider.Observation{}
	}
	choices, obs, ok := decodeChunk[struct {
		Index        int     `json:"index"`
		FinishReason *string `json:"finish_reason"`
	}](s, data)
	if !ok {
		return provider.Event{}, provider.EventError, obs
	}
	kind := s.contentKind(data)
	for _, c := range choices {
		if c.FinishReason != nil && *c.FinishReason == "error" {
			return provider.Event{}, provider.EventError, streamBroken("finish_reason error")
		}
		if c.FinishReason != nil && *c.FinishReason != "" {
			kind = provider.EventFinal
			s.content = true
			s.finish(c.Index)
		}
	}
	return provider.Event{Data: data}, kind, provider.Observation{}
}

// decodeChunk decodes a streamed chunk (chat or legacy completions) for
// its choices, of type C; ok false with what the stream broke on for a
// chunk that is not JSON or carries an error. It notes usage in s.
func decodeChunk[C any](s *chatStream, data []byte) (choices []C, obs provider.Observation, ok bool) {
	var chunk struct {
		Error   json.RawMessage `json:"error"`
		Choices []C             `json:"choices"`
		Usage   json.RawMessage `json:"usage"`
	}
	if err := json.Unmarshal(data, &chunk); err != nil {
		return nil, streamBroken("invalid JSON event in stream"), false
	}
	if len(chunk.Error) > 0 && !bytes.Equal(chunk.Error, []byte("null")) {
		return nil, classifyStreamError(parseErrorValue(chunk.Error)), false
	}
	if len(chunk.Usage) > 0 && chunk.Usage[0] == '{' {
		s.usage = true
	}
	return chunk.Choices, provider.Observation{}, true
}

// contentKind is the kind of a valid chunk that is not final: EventData
// once the stream has carried content, else EventData only when this chunk
// does (see hasContent) and EventSkip for what opens streams without
// content (a role-only delta, an empty string, usage alone): relayed once
// the stream is committed, but no first token, so that an error right
// after it still fails over.
func (s *chatStream) contentKind(data []byte) provider.EventKind {
	if !s.content {
		if !hasContent(data) {
			return provider.EventSkip
		}
		s.content = true
	}
	return provider.EventData
}

// hasContent reports whether a chunk's choices carry content: a delta
// member other than role whose value is not empty (see emptyValue):
// content, refusal, a tool call with a name or arguments, reasoning,
// audio, and members added later.
func hasContent(chunk []byte) bool {
	start, end, _ := jsonbody.FindMember(chunk, "choices")
	if start < 0 || chunk[start] != '[' {
		return false
	}
	choices, found := chunk[start:end], false
	_ = jsonbody.EachElement(choices, func(cs, ce int) bool {
		ds, de, _ := jsonbody.FindMember(choices[cs:ce], "delta")
		found = ds >= 0 && !emptyValue(choices[cs+ds:cs+de], 0)
		return !found
	})
	return found
}

// emptyValue reports whether a delta's value carries nothing: null, false,
// a number, "", or an array or object whose values are all empty, an
// object's index, id, type and role aside ({"index":0},
// {"function":{"arguments":""}}). Past a few levels of nesting, a value
// counts as content.
func emptyValue(v []byte, depth int) bool {
	if depth > 6 {
		return false
	}
	switch v[0] {
	case 'n', 'f':
		return true
	case 't':
		return false
	case '"':
		return len(v) == 2
	case '[':
		empty := true
		_ = jsonbody.EachElement(v, func(s, e int) bool {
			empty = emptyValue(v[s:e], depth+1)
			return empty
		})
		return empty
	case '{':
		empty := true
		_ = jsonbody.EachMember(v, func(k []byte, s, e int) bool {
			switch string(k) {
			case "index", "id", "type", "role":
			default:
				empty = emptyValue(v[s:e], depth+1)
			}
			return empty
		})
		return empty
	}
	return true // a number: an index, a logprob
}

func classifyStreamError(e apiError) provider.Observation {
	o := provider.NewObservation(provider.Server)
	o.Message = e.message
	status := 0
	if n := provider.ParseCount(e.code); n >= 100 && n < 600 {
		status = int(n)
	}
	switch {
	case status != 0:
		o.Class = classifyOpenAI(status, e)
	case strings.Contains(e.code+e.typ, "rate_limit"):
		o.Class = provider.RateLimited
	case strings.Contains(e.code+e.typ, "insufficient_quota") || strings.Contains(e.code, "billing"):
		o.Class = provider.QuotaExhausted
	case e.code == "invalid_api_key" || strings.Contains(e.typ, "authentication") || strings.Contains(e.typ, "permission"):
		o.Class = provider.Auth
	case strings.Contains(e.code+e.typ, "overloaded"):
		o.Class = provider.Overloaded
	}
	if o.Class.Transient() {
		o.RetryAfter = provider.MessageHint(e.message)
	}
	return o
}

// apiError is an OpenAI-family error body, whichever of its shapes was sent:
// {"error":{"message","type","code"}}, {"error":"text"} (Ollama),
// {"message":"..."} (Mistral), {"object":"error","message","type","code":400}
// (old vLLM), {"error":{"code":429,"message","metadata":{"raw"}}} (OpenRouter).
type apiError struct {
	message, typ, code string
}

func parseOpenAIError(body []byte) apiError {
	if b := bytes.TrimSpace(body); len(b) > 0 && b[0] == '[' {
		// Gemini's OpenAI-compatible endpoint: [{"error":{...}}].
		var list []json.RawMessage
		if json.Unmarshal(b, &list) == nil && len(list) > 0 {
			return parseOpenAIError(list[0])
		}
	}
	var top struct {
		Error     json.RawMessage `json:"error"`
		Message   string          `json:"message"`
		Type      string          `json:"type"`
		Code      json.RawMessage `json:"code"`
		ErrorType string          `json:"error_type"`
		Detail    json.RawMessage `json:"detail"` // FastAPI servers
	}
	if json.Unmarshal(body, &top) != nil {
		return apiError{message: bodyText(body)}
	}
	if top.Message == "" && len(top.Detail) > 0 {
		top.Message = detailText(top.Detail)
	}
	if len(top.Error) > 0 && !bytes.Equal(top.Error, []byte("null")) {
		e := parseErrorValue(top.Error)
		if e.typ == "" {
			e.typ = top.ErrorType // TGI: {"error":"...","error_type":"validation"}
		}
		return e
	}
	return apiError{message: excerpt.Of(top.Message, 500), typ: top.Type, code: rawString(top.Code)}
}

// detailText reads a FastAPI error's detail: a string, or a list of
// validation errors ({"loc":[...],"msg":"..."}), their messages joined.
func detailText(raw json.RawMessage) string {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return excerpt.Of(s, 500)
	}
	var list []struct {
		Msg string `json:"msg"`
	}
	if json.Unmarshal(raw, &list) != nil {
		return ""
	}
	msgs := make([]string, 0, len(list))
	for _, d := range list {
		if d.Msg != "" {
			msgs = append(msgs, d.Msg)
		}
	}
	return excerpt.Of(strings.Join(msgs, "; "), 500)
}

func parseErrorValue(raw json.RawMessage) apiError {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return apiError{message: excerpt.Of(s, 500)}
	}
	var e struct {
		Message  string          `json:"message"`
		Type     string          `json:"type"`
		Code     json.RawMessage `json:"code"`
		Metadata struct {
			Raw string `json:"raw"`
		} `json:"metadata"`
	}
	_ = json.Unmarshal(raw, &e)
	msg := e.Message
	if e.Metadata.Raw != "" {
		msg += ": " + e.Metadata.Raw
	}
	return apiError{message: excerpt.Of(msg, 500), typ: e.Type, code: rawString(e.Code)}
}

// rawString turns a JSON string or number into its text ("429", "rate_limit_exceeded").
func rawString(raw json.RawMessage) string {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	if len(raw) > 0 && raw[0] != 'n' && raw[0] != '{' && raw[0] != '[' {
		return string(raw)
	}
	return ""
}

// classifyOpenAI maps a status and an error body to a class (docs/providers.md,
// "How each provider response is classified"). insufficient_quota arrives as a 429 but is not transient.
func classifyOpenAI(status int, e apiError) provider.Class {
	code, typ, msg := strings.ToLower(e.code), strings.ToLower(e.typ), strings.ToLower(e.message)
	switch {
	case code == "insufficient_quota" || typ == "insufficient_quota" ||
		code == "billing_hard_limit_reached" || status == http.StatusPaymentRequired:
		return provider.QuotaExhausted
	case typ == "overloaded":
		// TGI's queue is full: {"error":"Model is overloaded","error_type":"overloaded"}, 429.
		return provider.Overloaded
	case status == http.StatusTooManyRequests:
		return provider.RateLimited
	case status == http.StatusUnauthorized || status == http.StatusForbidden:
		return provider.Auth
	case status >= 400 && status < 500 && status != http.StatusRequestTimeout && isContextLength(code, msg):
		return provider.ContextLength
	case status == http.StatusNotFound:
		// The client asked for a model group that exists; a 404 means this
		// deployment's model or URL is wrong (a deprecated model, a typo in
		// base_url): the deployment's failure, not the client's.
		return provider.Server
	case status == 498 || status == http.StatusServiceUnavailable || status == 529:
		// Groq's 498 is "flex tier at capacity"; 529 is Anthropic-style overload.
		return provider.Overloaded
	case status >= 500 || status == http.StatusRequestTimeout:
		return provider.Server
	case status >= 400:
		return provider.ClientError
	}
	// 1xx/3xx where a JSON answer was expected: the provider misbehaves.
	return provider.Server
}

// quotaMessage reports whether an error's message speaks of a quota over a
// long period or of money rather than of a rate: "monthly free tier
// exhausted", "trial key limited to 1000 API calls / month", "billing hard
// limit reached", "insufficient credits", "50 free model requests per
// day". A message that also names a short period or a wait ("per minute",
// "40 rpm", "retry in 26s") is a rate limit. Sources: testdata/dialects.json.
func quotaMessage(msg string) bool {
	m := strings.ToLower(msg)
	return quotaWords.MatchString(m) && !rateWords.MatchString(m)
}

var (
	quotaWords = regexp.MustCompile(`per (month|day|week)|/ ?(month|day|week)\b|\ba (month|day|week)\b|\b(monthly|daily|weekly)\b|` +
		`\bbilling\b|\bcredits\b|credit balance|out of credit|insufficient (balance|funds|credit)|account balance|` +
		`payment required|spend(ing)? limit|hard limit|free[ -]tier|trial (key|account)|exceeded your current quota|quota (exhausted|exceeded for (the|this) (month|day))|out of quota`)
	rateWords = regexp.MustCompile(`per (minute|second|min|sec|hour)\b|/ ?(minute|second|min|sec|hour)\b|\b(rpm|tpm|rps|tps|itpm|otpm)\b|` +
		`try again in|retry in|retry after|retry-after`)
)

func isContextLength(code, msg string) bool {
	return code == "context_length_exceeded" ||
		strings.Contains(msg, "maximum context length") ||
		strings.Contains(msg, "context length") ||
		strings.Contains(msg, "context window") ||
		strings.Contains(msg, "prompt is too long")
}

// openAIWindows decodes the OpenAI family's rate-limit headers into the
// tightest request and token windows.
func openAIWindows(h http.Header, ref time.Time) (requests, tokens provider.Window) {
	var req, tok windowSet
	for k, vs := range h {
		if len(vs) == 0 {
			continue
		}
		v := vs[0]
		switch {
		case hasPrefixFold(k, "x-ratelimitbysize-"): // Mistral: tokens
			field, suffix := splitField(k[len("x-ratelimitbysize-"):])
			tok.set(suffix, field, v, ref)
		case hasPrefixFold(k, "ratelimitbysize-"): // Mistral: tokens
			field, suffix := splitField(k[len("ratelimitbysize-"):])
			tok.set(suffix, field, v, ref)
		case hasPrefixFold(k, "x-tokenlimit-"): // Together: tokens
			field, suffix := splitField(k[len("x-tokenlimit-"):])
			tok.set(suffix, field, v, ref)
		case hasPrefixFold(k, "x-ratelimit-"):
			field, rest := splitField(k[len("x-ratelimit-"):])
			dim, suffix := splitField(rest)
			switch {
			case strings.EqualFold(dim, "tokens"):
				tok.set(suffix, field, v, ref)
			case strings.EqualFold(dim, "requests"), dim == "": // Together: no dimension = requests
				req.set(suffix, field, v, ref)
			}
		}
	}
	return req.tightest(), tok.tightest()
}

// splitField splits "Limit-Requests-Day" into "Limit" and "Requests-Day".
func splitField(s string) (string, string) {
	if i := strings.IndexByte(s, '-'); i >= 0 {
		return s[:i], s[i+1:]
	}
	return s, ""
}

func hasPrefixFold(s, prefix string) bool {
	return len(s) >= len(prefix) && strings.EqualFold(s[:len(prefix)], prefix)
}

// windowSet collects the windows of one kind a response states, one per
// suffix ("", "Day", "Minute"); a handful at most.
type windowSet struct {
	n        int
	suffixes [4]string
	windows  [4]provider.Window
}

func (s *windowSet) set(suffix, field, v string, ref time.Time) {
	i := 0
	for i < s.n && !strings.EqualFold(s.suffixes[i], suffix) {
		i++
	}
	if i == s.n {
		if s.n == len(s.windows) {
			return
		}
		s.n++
		s.suffixes[i], s.windows[i] = suffix, provider.UnknownWindow
	}
	w := &s.windows[i]
	switch {
	case strings.EqualFold(field, "limit"):
		w.Limit = provider.ParseCount(v)
	case strings.EqualFold(field, "remaining"):
		w.Remaining = provider.ParseCount(v)
	case strings.EqualFold(field, "reset"):
		w.SetReset(v, ref)
	}
}

// tightest returns the window with the fewest remaining (ties: the later
// reset), the one that will stop requests first.
func (s *windowSet) tightest() provider.Window {
	best := provider.UnknownWindow
	for _, w := range s.windows[:s.n] {
		switch {
		case best == provider.UnknownWindow:
			best = w
		case w.Remaining >= 0 && (best.Remaining < 0 || w.Remaining < best.Remaining):
			best = w
		case w.Remaining == best.Remaining && w.Reset > best.Reset:
			best = w
		}
	}
	return best
}
