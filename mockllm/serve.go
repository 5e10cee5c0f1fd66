package mockllm

import (
	"bytes"
	"crypto/subtle"
	"encoding/json"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"
)

// Request handling: routing a path to an endpoint of the dialect,
// answering an API request (the order of checks documented on
// Handler), and writing plain answers and JSON bodies.

// Endpoints the mock answers API requests on.
const (
	epChat = iota
	epEmbeddings
	epMessages       // anthropic
	epGenerate       // gemini :generateContent
	epStreamGenerate // gemini :streamGenerateContent
	epResponses      // openai Responses API
	epCompletions    // openai legacy completions
	epInvoke         // bedrock InvokeModel
	epInvokeStream   // bedrock InvokeModelWithResponseStream
	epConverse       // bedrock Converse
	epConverseStream // bedrock ConverseStream
	epRawPredict     // vertex anthropic :rawPredict
	epStreamRaw      // vertex anthropic :streamRawPredict
)

// Wire formats of answers: what an answer body and stream look like,
// whatever the dialect (bedrock's invoke and vertex's rawPredict answer
// Anthropic's Messages, vertex's generateContent Gemini's).
const (
	wireOpenAI = iota
	wireAnthropic
	wireGemini
	wireConverse // bedrock Converse
)

// call is an API request routed to an endpoint.
type call struct {
	ep    int
	wire  int    // the answer's wire format
	model string // gemini, bedrock, vertex: the model named by the path
	array bool   // gemini stream without ?alt=sse: a streamed JSON array
}

// streamed reports whether the endpoint streams whatever the body says.
func (c call) streamed() bool {
	switch c.ep {
	case epStreamGenerate, epInvokeStream, epConverseStream, epStreamRaw:
		return true
	}
	return false
}

// serve answers the paths the mock owns and reports whether it did.
func (h *Handler) serve(w http.ResponseWriter, r *http.Request) bool {
	p := r.URL.Path
	switch r.Method {
	case http.MethodPost:
		if strings.HasSuffix(p, "/llm_mock/reset") {
			h.Reset()
			writeJSON(w, http.StatusOK, h.Stats())
			return true
		}
		if h.dialect == dlAnthropic && strings.HasSuffix(p, "/messages/count_tokens") {
			h.countTokens(w, r)
			return true
		}
		if h.dialect == dlVertex && strings.HasSuffix(p, "/token") {
			h.serveToken(w, r)
			return true
		}
		c, ok := h.route(r)
		if !ok {
			return h.refuseUnrouted(w, r)
		}
		h.serveAPI(w, r, c)
	case http.MethodGet:
		switch {
		case strings.HasSuffix(p, "/llm_mock/stats"):
			writeJSON(w, http.StatusOK, h.Stats())
		case strings.HasSuffix(p, "/models"):
			h.serveModels(w)
		default:
			return h.serveStored(w, r)
		}
	case http.MethodDelete:
		return h.serveStored(w, r)
	default:
		return false
	}
	return true
}

// route finds the API endpoint of a POST in the handler's dialect.
func (h *Handler) route(r *http.Request) (call, bool) {
	p := r.URL.Path
	switch h.dialect {
	case dlAnthropic:
		if strings.HasSuffix(p, "/messages") {
			return call{ep: epMessages, wire: wireAnthropic}, true
		}
	case dlGemini:
		return geminiRoute(r)
	case dlBedrock:
		return bedrockRoute(r)
	case dlVertex:
		return vertexRoute(r)
	default:
		switch {
		case strings.HasSuffix(p, "/chat/completions"):
			return call{ep: epChat}, true
		case strings.HasSuffix(p, "/embeddings"):
			return call{ep: epEmbeddings}, true
		case strings.HasSuffix(p, "/responses"):
			return call{ep: epResponses}, true
		case strings.HasSuffix(p, "/completions"):
			return call{ep: epCompletions}, true
		}
	}
	return call{}, false
}

func (h *Handler) serveModels(w http.ResponseWriter) {
	id := h.Model
	if id == "" {
		id = DefaultModelID
	}
	var b []byte
	switch h.dialect {
	case dlAnthropic:
		b = anthropicModels(id)
	case dlGemini:
		b = geminiModels(id)
	case dlBedrock:
		b = bedrockModels(id)
	case dlVertex:
		b = vertexModels(id)
	default:
		b = openaiModels(id)
	}
	writeBody(w, http.StatusOK, b)
}

var bufPool = sync.Pool{New: func() any { return new(bytes.Buffer) }}

// apiRequest is the part of a request body the mock looks at.
type apiRequest struct {
	Model  string `json:"model"`
	Stream bool   `json:"stream"`
	// PreviousResponseID continues a response (Responses API).
	PreviousResponseID string `json:"previous_response_id"`
}

// serveAPI answers an API request: chat completions, embeddings,
// messages, generateContent, invoke, converse or rawPredict. Its steps:
// the body read, the request refused (key, body, continuation, stored
// state), the answer's rate limits, a fault injected, the answer written.
func (h *Handler) serveAPI(w http.ResponseWriter, r *http.Request, c call) {
	start := time.Now()
	buf := bufPool.Get().(*bytes.Buffer)
	buf.Reset()
	defer func() {
		if buf.Cap() <= 1<<20 {
			bufPool.Put(buf)
		}
	}()
	body, req, err := h.readAPIRequest(w, r, c, buf)
	key := h.requestKey(r)
	n := h.record(r, req.Model, key, h.principal(r), body)

	p := pacer{ctx: r.Context(), done: h.st.done}
	defer p.stop()

	hdr := w.Header()
	if h.dialect != dlOpenAI {
		// On the mock's clock, which rate-limit resets are relative to.
		hdr.Set("Date", h.now().UTC().Format(http.TimeFormat))
	}
	if h.dialect == dlBedrock {
		hdr.Set("X-Amzn-Requestid", requestID(h.st.ids.Add(1)))
	}
	cont, refused := h.refuse(w, r, c, key, body, req, err)
	if refused {
		return
	}
	a, lim, admitted := h.admit(w, c, body, req, cont, start)
	if !admitted {
		return
	}
	// Admitted: the generation takes Latency, and the headers, computed
	// at admission, come with the answer after it (PROVIDERS.md).
	if !p.wait(time.Duration(h.Latency)) {
		h.abandon(r)
		return
	}
	embeddings := c.ep == epEmbeddings
	stream := req.Stream && !embeddings
	a.fault = h.pickFault(n, stream)
	if !embeddings && (c.wire == wireOpenAI || c.wire == wireAnthropic) {
		a.cached = min(h.cachedTokens(body), a.prompt)
	}
	if h.injectFault(w, r, c, a, lim, n, stream) {
		return
	}
	toolCall := !embeddings && !cont.on && h.wantsToolCall(c, body)
	if d := a.fault.slowDelay(); d > 0 && (!stream || toolCall) {
		// A slow fault: a plain answer (or a tool-call stream, written
		// at once) comes late; a stream's first chunk does (stream.go).
		if !p.wait(d) {
			h.abandon(r)
			return
		}
	}
	h.writeAPIAnswer(w, r, &p, c, a, body, stream, toolCall)
}

// readAPIRequest reads r's body (at most maxBodyBytes, into buf) and what
// the mock looks at of it; the model and streaming come from the path for
// the dialects that put them there. err is the body's read or JSON error.
func (h *Handler) readAPIRequest(w http.ResponseWriter, r *http.Request, c call, buf *bytes.Buffer) ([]byte, apiRequest, error) {
	_, err := buf.ReadFrom(http.MaxBytesReader(w, r.Body, maxBodyBytes))
	body := buf.Bytes()
	var req apiRequest
	switch {
	case c.wire == wireAnthropic && h.dialect == dlVertex:
		// The model is in the path; "stream" in the body, or the
		// method, streams.
		if err == nil {
			err = json.Unmarshal(body, &req)
		}
		req.Model, req.Stream = c.model, req.Stream || c.streamed()
	case h.dialect != dlOpenAI && h.dialect != dlAnthropic:
		// The model and streaming are in the path; the body only has
		// to be a JSON object (a GenerateContentRequest, an InvokeModel
		// or Converse body, checked further by checkBody).
		var obj struct{}
		if err == nil {
			err = json.Unmarshal(body, &obj)
		}
		req = apiRequest{Model: c.model, Stream: c.streamed()}
	case err == nil:
		err = json.Unmarshal(body, &req)
	}
	return body, req, err
}

// refuse answers a request the provider would refuse before generating
// (a wrong key, a bad body, a continuation it rejects, a previous
// response it does not hold, another organization's encrypted item),
// with the headers of a request that used nothing, and reports whether it
// did; cont is the request's continuation.
func (h *Handler) refuse(w http.ResponseWriter, r *http.Request, c call, key string, body []byte, req apiRequest, err error) (cont continuation, refused bool) {
	unlimited := func() { h.setLimitHeaders(w.Header(), h.limit(0, false)) }
	if res, checked := h.authenticate(r, key, body); checked {
		h.countAuth(res.denied)
		if res.denied {
			unlimited()
			h.writeUnauthorized(w, key, res)
			return cont, true
		}
	}
	if err != nil {
		unlimited()
		h.writeBadRequest(w)
		return cont, true
	}
	if msg := h.checkBody(c, body); msg != "" {
		unlimited()
		h.writeInvalid(w, msg)
		return cont, true
	}
	cont = h.continuationOf(c, body)
	if cont.on {
		h.st.mu.Lock()
		h.st.stats.Continuations++
		h.st.mu.Unlock()
		msg := cont.invalid
		if h.Continuation == ContinuationReject {
			msg = msgPrefillRejected
		}
		if msg != "" {
			unlimited()
			h.writeContinuationError(w, c, msg)
			return cont, true
		}
	}
	if c.ep != epResponses {
		return cont, false
	}
	if req.PreviousResponseID != "" && !h.st.responses.has(req.PreviousResponseID) {
		unlimited()
		writeError(w, http.StatusBadRequest, "Previous response with id '"+req.PreviousResponseID+"' not found.",
			"invalid_request_error", "previous_response_not_found")
		return cont, true
	}
	if h.Organization != "" {
		if enc := foreignItem(body, h.Organization); enc != "" {
			unlimited()
			writeError(w, http.StatusBadRequest, "The encrypted content "+clipped(enc)+
				" could not be verified. Reason: Encrypted content could not be decrypted or parsed.",
				"invalid_request_error", "invalid_encrypted_content")
			return cont, true
		}
	}
	return cont, false
}

// admit is the request's answer (its model, prompt tokens as bytes / 4,
// its completion) and the rate limits it is counted in, their headers
// set; a request over a limit is answered 429 and not admitted.
func (h *Handler) admit(w http.ResponseWriter, c call, body []byte, req apiRequest, cont continuation, start time.Time) (*answer, limitState, bool) {
	model := h.Model
	if model == "" {
		model = req.Model
	}
	if model == "" {
		model = DefaultModelID
	}
	prompt := (len(body) + 3) / 4
	a := &answer{
		model:  model,
		prompt: prompt,
		text:   h.reply,
		pieces: h.pieces,
		wire:   c.wire,
		start:  start,
	}
	if c.ep != epEmbeddings {
		a.completion = h.chunks()
	}
	if cont.on {
		h.continueAnswer(a, cont.prefix)
	}
	lim := h.limit(prompt+a.completion, true)
	h.setLimitHeaders(w.Header(), lim)
	if lim.exceeded != "" {
		h.st.mu.Lock()
		h.st.stats.RateLimited++
		h.st.mu.Unlock()
		h.writeRateLimited(w, lim, model)
		return nil, lim, false
	}
	return a, lim, true
}

// injectFault applies a's fault, if any, to request number n: its
// headers, and for a fault that is the whole answer (a hang, a 429, a
// status, a plain answer's error event) that answer; it reports whether
// the request is answered.
func (h *Handler) injectFault(w http.ResponseWriter, r *http.Request, c call, a *answer, lim limitState, n int64, stream bool) bool {
	f := a.fault
	if f == nil {
		return false
	}
	h.st.mu.Lock()
	h.st.stats.Faults++
	h.st.mu.Unlock()
	if ce := h.logger.Check(zap.DebugLevel, "injecting fault"); ce != nil {
		ce.Write(zap.String("kind", f.Kind), zap.Int64("request", n), zap.String("path", r.URL.Path))
	}
	hdr := w.Header()
	for k, v := range f.Headers {
		// A clone: middleware appending to the response's header
		// values must not write into the shared config.
		hdr[http.CanonicalHeaderKey(k)] = slices.Clone(v)
	}
	switch f.Kind {
	case FaultHang:
		h.hang(r)
		return true
	case FaultStall:
		if !stream {
			h.hang(r)
			return true
		}
	case FaultRateLimit:
		h.writeFaultRateLimit(w, f, lim, a.model)
		return true
	case FaultStatus:
		h.writeStatusFault(w, f, statusOr(f.Status, http.StatusInternalServerError), c.wire)
		return true
	case FaultErrorEvent:
		if stream {
			return false
		}
		if h.dialect == dlBedrock {
			h.writeStatusFault(w, f, statusOr(f.Status, h.errorEventStatus(c.wire)), c.wire)
			return true
		}
		writeBody(w, statusOr(f.Status, h.errorEventStatus(c.wire)), h.errorPayload(f, c.wire))
		return true
	}
	return false
}

// writeAPIAnswer writes an admitted request's answer a in its endpoint's
// shape: an embedding, a tool call (streamed or not), a stream, a
// response, a text completion, or a plain answer.
func (h *Handler) writeAPIAnswer(w http.ResponseWriter, r *http.Request, p *pacer, c call, a *answer, body []byte, stream, toolCall bool) {
	switch {
	case c.ep == epEmbeddings:
		h.writePlain(w, h.embedding(*a, body), a.fault)
	case toolCall && stream:
		h.writeToolCallStream(w, *a, c)
	case toolCall:
		h.writePlain(w, h.toolCallAnswer(*a, c), a.fault)
	case stream:
		h.stream(w, r, p, *a, h.streamFormat(*a, c))
	case c.ep == epResponses:
		h.writePlain(w, h.response(*a), a.fault)
	case c.ep == epCompletions:
		h.writePlain(w, h.textCompletion(*a), a.fault)
	default:
		if c.ep == epInvoke {
			setInvokeHeaders(w.Header(), *a)
		}
		h.writePlain(w, h.plainAnswer(*a, c), a.fault)
	}
}

// countTokens answers the anthropic dialect's count_tokens: the body's
// size in bytes / 4, as prompts are counted; a wrong key gets 401. It is
// counted in Stats.CountTokens, not as an API request.
func (h *Handler) countTokens(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBodyBytes))
	key := h.requestKey(r)
	var model struct {
		Model string `json:"model"`
	}
	_ = json.Unmarshal(body, &model)
	h.recordAs(r, model.Model, key, "", body, &h.st.stats.CountTokens)
	if h.apiKey != "" {
		refused := !keyEqual(key, h.apiKey)
		h.countAuth(refused)
		if refused {
			h.writeUnauthorized(w, key, authResult{})
			return
		}
	}
	if err != nil || !json.Valid(body) {
		h.writeBadRequest(w)
		return
	}
	writeJSON(w, http.StatusOK, map[string]int{"input_tokens": (len(body) + 3) / 4})
}

// requestKey is the API key r sends where the dialect expects it.
func (h *Handler) requestKey(r *http.Request) string {
	switch h.dialect {
	case dlAnthropic:
		return r.Header.Get("x-api-key")
	case dlGemini:
		if k := r.Header.Get("x-goog-api-key"); k != "" {
			return k
		}
		return r.URL.Query().Get("key")
	}
	// openai, bedrock (an API key), vertex (an access token)
	k, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if !ok {
		return ""
	}
	return k
}

// principal is who r authenticates as, whether or not its credentials
// are valid: the access key id of a SigV4 signature (bedrock), the
// service account an access token was issued to (vertex); else "".
func (h *Handler) principal(r *http.Request) string {
	switch h.dialect {
	case dlBedrock:
		if sig, err := parseSigV4(r.Header.Get("Authorization")); err == nil {
			return sig.accessKeyID
		}
	case dlVertex:
		if k, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer "); ok {
			t, _ := lookupToken(k)
			return t.principal
		}
	}
	return ""
}

// authResult is the outcome of checking a request's credentials; the
// zero value accepts. Bedrock refusals carry their exception.
type authResult struct {
	denied  bool
	errType string // bedrock: the exception, for x-amzn-ErrorType
	msg     string // bedrock: its message
}

// countAuth counts a credentials check in Stats.
func (h *Handler) countAuth(refused bool) {
	h.st.mu.Lock()
	if refused {
		h.st.stats.AuthRefused++
	} else {
		h.st.stats.AuthAccepted++
	}
	h.st.mu.Unlock()
}

// authenticate checks r's credentials (key is requestKey's answer, body
// the request's body); checked is false when the mock requires none.
func (h *Handler) authenticate(r *http.Request, key string, body []byte) (res authResult, checked bool) {
	switch h.dialect {
	case dlBedrock:
		if h.apiKey == "" && h.awsKey.AccessKeyID == "" {
			return authResult{}, false
		}
		return h.bedrockAuth(r, key, body), true
	case dlVertex:
		if !h.tokenValid(key) {
			return authResult{denied: true}, true
		}
		return authResult{}, true
	}
	if h.apiKey == "" {
		return authResult{}, false
	}
	return authResult{denied: !keyEqual(key, h.apiKey)}, true
}

// keyEqual compares a key sent with the expected one in constant time.
func keyEqual(got, want string) bool {
	return subtle.ConstantTimeCompare([]byte(got), []byte(want)) == 1
}

func (h *Handler) writeUnauthorized(w http.ResponseWriter, key string, res authResult) {
	switch h.dialect {
	case dlBedrock:
		writeBedrockError(w, http.StatusForbidden, res.errType, res.msg)
	case dlVertex:
		writeBody(w, http.StatusUnauthorized, vertexError(http.StatusUnauthorized, vertexUnauthenticated))
	case dlAnthropic:
		writeBody(w, http.StatusUnauthorized, anthropicError("authentication_error", "invalid x-api-key"))
	case dlGemini:
		if key == "" {
			writeBody(w, http.StatusForbidden, googleError(http.StatusForbidden,
				"Method doesn't allow unregistered callers (callers without established identity). Please use API Key or other form of API consumer identity to call this API."))
			return
		}
		writeBody(w, http.StatusUnauthorized, googleAPIKeyInvalid())
	default:
		msg := "Incorrect API key provided."
		if key != "" {
			msg = "Incorrect API key provided: " + openAIShownKey(key) + ". You can find your API key at https://platform.openai.com/account/api-keys."
		}
		writeError(w, http.StatusUnauthorized, msg, "invalid_request_error", "invalid_api_key")
	}
}

// openAIShownKey is a wrong key as OpenAI's 401 shows it: its first 8 and
// last 4 characters around a star for each one between, whole when it
// has 12 characters or fewer ("Incorrect API key provided:
// sk-proj-****...****SJh4", "... provided: sk-xxxxxx", as users report
// them: continuedev/continue#10250, IIC2440/Syllabus-2025-1#13,
// chatanywhere/GPT_API_free#81).
func openAIShownKey(key string) string {
	if len(key) <= 12 {
		return key
	}
	return key[:8] + strings.Repeat("*", len(key)-12) + key[len(key)-4:]
}

// refuseUnrouted answers a POST to a path the mock does not serve with a
// wrong key (openai, anthropic and gemini dialects, an api_key set) as
// providers do, authentication before routing: 401. It reports whether
// it answered; else the path is the next handler's.
func (h *Handler) refuseUnrouted(w http.ResponseWriter, r *http.Request) bool {
	if h.apiKey == "" || h.dialect > dlGemini {
		return false
	}
	key := h.requestKey(r)
	if keyEqual(key, h.apiKey) {
		return false
	}
	h.countAuth(true)
	h.writeUnauthorized(w, key, authResult{denied: true})
	return true
}

func (h *Handler) writeBadRequest(w http.ResponseWriter) {
	switch h.dialect {
	case dlAnthropic:
		writeBody(w, http.StatusBadRequest, anthropicError("invalid_request_error", "There was an issue with the format of your request: invalid JSON body"))
	case dlGemini:
		writeBody(w, http.StatusBadRequest, googleError(http.StatusBadRequest, "Invalid JSON payload received."))
	case dlBedrock:
		writeBedrockError(w, http.StatusBadRequest, "ValidationException"+bedrockCoral, "Malformed input request, please reformat your input and try again.")
	case dlVertex:
		writeBody(w, http.StatusBadRequest, vertexError(http.StatusBadRequest, "Invalid JSON payload received."))
	default:
		writeError(w, http.StatusBadRequest, "We could not parse the JSON body of your request.", "invalid_request_error", "")
	}
}

// checkBody checks a JSON body against the provider's request schema
// where the mock knows it (bedrock, vertex's anthropic publisher) and
// returns why it is rejected, or "".
func (h *Handler) checkBody(c call, body []byte) string {
	switch {
	case h.dialect == dlBedrock && c.wire == wireAnthropic:
		return checkInvokeBody(c.model, body)
	case h.dialect == dlBedrock:
		return checkConverseBody(body)
	case h.dialect == dlVertex && c.wire == wireAnthropic:
		return checkVertexAnthropicBody(body)
	}
	return ""
}

// writeInvalid answers 400 for a body checkBody rejects.
func (h *Handler) writeInvalid(w http.ResponseWriter, msg string) {
	if h.dialect == dlBedrock {
		writeBedrockError(w, http.StatusBadRequest, "ValidationException"+bedrockCoral, msg)
		return
	}
	writeBody(w, http.StatusBadRequest, vertexError(http.StatusBadRequest, msg))
}

// plainAnswer is the non-streamed answer to a chat request.
func (h *Handler) plainAnswer(a answer, c call) []byte {
	switch c.wire {
	case wireAnthropic:
		return h.anthropicMessage(a)
	case wireGemini:
		return h.geminiResponse(a)
	case wireConverse:
		return h.converseResponse(a)
	}
	return h.completion(a)
}

// answer is what one successful (or faulted) response is made of.
type answer struct {
	model      string
	prompt     int
	completion int
	cached     int      // of prompt, read from the prompt cache (Handler.cachedTokens)
	text       string   // the answer's text: Reply, or a continuation's rest of it
	pieces     []string // text in Chunks pieces, for streams
	fault      *Fault
	wire       int       // the call's wire format
	start      time.Time // when the request arrived (real time), for latency metrics
}

// writePlain sends a non-streamed answer, or half of it then an abort
// for a cut fault, or only its first half (a broken JSON body) for a
// malformed fault.
func (h *Handler) writePlain(w http.ResponseWriter, body []byte, f *Fault) {
	if f != nil && f.Kind == FaultMalformed {
		body = body[:len(body)/2]
	}
	hdr := w.Header()
	hdr.Set("Content-Type", "application/json")
	hdr.Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(http.StatusOK)
	if f != nil && f.Kind == FaultCut {
		_, _ = w.Write(body[:len(body)/2])
		_ = http.NewResponseController(w).Flush()
		panic(http.ErrAbortHandler)
	}
	_, _ = w.Write(body)
}

func statusOr(code, def int) int {
	if code != 0 {
		return code
	}
	return def
}

func writeBody(w http.ResponseWriter, status int, body []byte) {
	hdr := w.Header()
	if hdr.Get("Content-Type") == "" {
		hdr.Set("Content-Type", "application/json")
	}
	hdr.Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

// appendJSON appends v encoded by encoding/json, without its HTML
// escaping of <, > and & (providers send them as they are), so the
// bytes are what the configured Reply and model names look like in a
// provider's answer. v holds strings and numbers only, which cannot
// fail to encode.
func appendJSON(b []byte, v any) []byte {
	buf := bytes.NewBuffer(b)
	enc := json.NewEncoder(buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		panic(err)
	}
	b = buf.Bytes()
	return b[:len(b)-1] // Encode's newline
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	writeBody(w, status, appendJSON(nil, v))
}
