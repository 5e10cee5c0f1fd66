package mockllm

import (
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"sync"
)

// The openai dialect's Responses API (POST .../responses): a response
// object, or a stream of its typed events (response.created ...
// response.output_text.delta ... response.completed), each with its
// sequence_number. A request with previous_response_id is answered only
// when this mock gave that response (as OpenAI keeps a response at the
// account that produced it): else 400, "Previous response with id '...'
// not found.".

// responseIDs remembers the responses a mock gave, each id with its
// last response object (bounded: the oldest half is forgotten past
// maxResponseIDs), for previous_response_id and GET and DELETE
// .../responses/{id}.
type responseIDs struct {
	mu     sync.Mutex
	ids    map[string]storedResponse
	next   int
	prefix string // unique to this mock: ids of two mocks never collide
}

// storedResponse is a remembered response: its order of creation and its
// response object as last written (in_progress until a stream ends).
type storedResponse struct {
	n    int
	body []byte
}

const maxResponseIDs = 1 << 16

func (r *responseIDs) add(id string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.ids == nil {
		r.ids = map[string]storedResponse{}
	}
	r.next++
	r.ids[id] = storedResponse{n: r.next}
	if len(r.ids) > maxResponseIDs {
		for k, v := range r.ids {
			if v.n < r.next-maxResponseIDs/2 {
				delete(r.ids, k)
			}
		}
	}
}

// keep records body as the response object of id, when id is remembered.
func (r *responseIDs) keep(id string, body []byte) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if v, ok := r.ids[id]; ok {
		v.body = body
		r.ids[id] = v
	}
}

// get returns the response object of id, and whether id is remembered.
func (r *responseIDs) get(id string) ([]byte, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	v, ok := r.ids[id]
	return v.body, ok
}

// forget deletes id and reports whether it was remembered.
func (r *responseIDs) forget(id string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	_, ok := r.ids[id]
	delete(r.ids, id)
	return ok
}

// deletedResponse is OpenAI's answer to a DELETE of a response.
type deletedResponse struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Deleted bool   `json:"deleted"`
}

func (r *responseIDs) has(id string) bool {
	_, ok := r.get(id)
	return ok
}

// serveStored answers GET and DELETE .../responses/{id} (openai dialect)
// as OpenAI does for the responses it keeps: the response object, or
// {"id","object":"response","deleted":true}; an id this mock did not give
// (or deleted) is 404 "Response with id '...' not found."; with APIKey, a
// wrong key is 401 first. It reports whether the path was one.
func (h *Handler) serveStored(w http.ResponseWriter, r *http.Request) bool {
	i := strings.LastIndex(r.URL.Path, "/responses/")
	if h.dialect != dlOpenAI || i < 0 {
		return false
	}
	id := r.URL.Path[i+len("/responses/"):]
	if id == "" || strings.Contains(id, "/") {
		return false
	}
	if key := h.requestKey(r); h.apiKey != "" && !keyEqual(key, h.apiKey) {
		h.countAuth(true)
		h.writeUnauthorized(w, key, authResult{denied: true})
		return true
	}
	body, ok := h.st.responses.get(id)
	switch {
	case ok && r.Method == http.MethodDelete && h.st.responses.forget(id):
		writeBody(w, http.StatusOK, appendJSON(nil, deletedResponse{ID: id, Object: "response", Deleted: true}))
	case ok && r.Method == http.MethodGet && body != nil:
		writeBody(w, http.StatusOK, body)
	default:
		writeError(w, http.StatusNotFound, "Response with id '"+id+"' not found.", "invalid_request_error", "")
	}
	return true
}

// newResponseID returns a fresh response id, remembered.
func (h *Handler) newResponseID() string {
	r := &h.st.responses
	r.mu.Lock()
	if r.prefix == "" {
		r.prefix = "resp_mock" + rand.Text()[:8] + "_"
	}
	id := r.prefix + strconv.FormatUint(h.st.ids.Add(1), 10)
	r.mu.Unlock()
	r.add(id)
	return id
}

type mockResponse struct {
	ID                string            `json:"id"`
	Object            string            `json:"object"`
	CreatedAt         int64             `json:"created_at"`
	Status            string            `json:"status"`
	Model             string            `json:"model"`
	Output            []json.RawMessage `json:"output"`
	Usage             *responsesUsage   `json:"usage"`
	Error             any               `json:"error"`
	IncompleteDetails any               `json:"incomplete_details"`
	PreviousResponse  *string           `json:"previous_response_id"`
}

type responsesUsage struct {
	InputTokens        int `json:"input_tokens"`
	InputTokensDetails struct {
		CachedTokens int `json:"cached_tokens"`
	} `json:"input_tokens_details"`
	OutputTokens int `json:"output_tokens"`
	TotalTokens  int `json:"total_tokens"`
}

func messageOutput(id, text, status string) json.RawMessage {
	return appendJSON(nil, map[string]any{"type": "message", "id": id, "status": status, "role": "assistant",
		"content": []any{map[string]any{"type": "output_text", "text": text, "annotations": []any{}}}})
}

// sealed is an encrypted_content that only a mock of organization org
// reads (Handler.Organization).
func sealed(org, id string) string {
	return "gAAAA" + base64.StdEncoding.EncodeToString([]byte(org+"|"+id))
}

// foreignItem returns the first encrypted_content of a Responses body's
// input that a mock of organization org cannot read, "" when none.
func foreignItem(body []byte, org string) string {
	var req struct {
		Input json.RawMessage `json:"input"`
	}
	var items []struct {
		EncryptedContent string `json:"encrypted_content"`
	}
	if json.Unmarshal(body, &req) != nil || json.Unmarshal(req.Input, &items) != nil {
		return ""
	}
	for _, it := range items {
		if enc := it.EncryptedContent; enc != "" {
			raw, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(enc, "gAAAA"))
			if owner, _, _ := strings.Cut(string(raw), "|"); err != nil || owner != org {
				return enc
			}
		}
	}
	return ""
}

// clipped is an encrypted_content as OpenAI quotes it: its first and
// last four characters.
func clipped(enc string) string {
	if len(enc) <= 8 {
		return enc
	}
	return enc[:4] + "..." + enc[len(enc)-4:]
}

// reasoningOutput is the reasoning item of a response of an
// Organization's mock, nil without one.
func (h *Handler) reasoningOutput(id string) json.RawMessage {
	if h.Organization == "" {
		return nil
	}
	rs := "rs_" + strings.TrimPrefix(id, "resp_")
	return appendJSON(nil, map[string]any{"type": "reasoning", "id": rs, "summary": []any{}, "encrypted_content": sealed(h.Organization, rs)})
}

func (h *Handler) responseObject(a answer, id, status string, text string, usage bool) mockResponse {
	r := mockResponse{ID: id, Object: "response", CreatedAt: h.now().Unix(), Status: status, Model: a.model,
		Output: []json.RawMessage{}}
	if rs := h.reasoningOutput(id); rs != nil && status == "completed" {
		r.Output = append(r.Output, rs)
	}
	if text != "" || status == "completed" {
		r.Output = append(r.Output, messageOutput("msg_"+strings.TrimPrefix(id, "resp_"), text, status))
	}
	if usage {
		r.Usage = &responsesUsage{InputTokens: a.prompt, OutputTokens: a.completion, TotalTokens: a.prompt + a.completion}
		r.Usage.InputTokensDetails.CachedTokens = a.cached
	}
	return r
}

// response is the non-streamed answer of the Responses API.
func (h *Handler) response(a answer) []byte {
	id := h.newResponseID()
	b := appendJSON(nil, h.responseObject(a, id, "completed", a.text, true))
	h.st.responses.keep(id, b)
	return b
}

// responsesStream is a Responses stream.
type responsesStream struct {
	h    *Handler
	a    answer
	id   string
	seq  int
	text strings.Builder
}

func (s *responsesStream) event(b []byte, typ string, v map[string]any) []byte {
	v["type"] = typ
	v["sequence_number"] = s.seq
	s.seq++
	b = append(b, "event: "...)
	b = append(b, typ...)
	b = append(b, "\ndata: "...)
	b = appendJSON(b, v)
	return append(b, "\n\n"...)
}

func (s *responsesStream) contentType() string { return "text/event-stream" }
func (s *responsesStream) keepAlive() []byte   { return keepAliveComment }

func (s *responsesStream) head(b []byte) []byte {
	r := s.h.responseObject(s.a, s.id, "in_progress", "", false)
	s.h.st.responses.keep(s.id, appendJSON(nil, r))
	b = s.event(b, "response.created", map[string]any{"response": r})
	b = s.event(b, "response.in_progress", map[string]any{"response": r})
	if rs := s.h.reasoningOutput(s.id); rs != nil {
		// An Organization's reasoning item, first: its encrypted_content
		// comes with its .done.
		b = s.event(b, "response.output_item.added", map[string]any{"output_index": 0,
			"item": map[string]any{"type": "reasoning", "id": "rs_" + strings.TrimPrefix(s.id, "resp_"), "summary": []any{}}})
		b = s.event(b, "response.output_item.done", map[string]any{"output_index": 0, "item": rs})
	}
	return b
}

// at is the message's output_index: after the reasoning item, when one
// comes first.
func (s *responsesStream) at() int {
	if s.h.Organization != "" {
		return 1
	}
	return 0
}

func (s *responsesStream) itemID() string { return "msg_" + strings.TrimPrefix(s.id, "resp_") }

func (s *responsesStream) chunk(b []byte, i int, piece string, _ bool) []byte {
	if i == 0 {
		b = s.event(b, "response.output_item.added", map[string]any{"output_index": s.at(),
			"item": map[string]any{"type": "message", "id": s.itemID(), "status": "in_progress", "role": "assistant", "content": []any{}}})
		b = s.event(b, "response.content_part.added", map[string]any{"item_id": s.itemID(), "output_index": s.at(),
			"content_index": 0, "part": map[string]any{"type": "output_text", "text": "", "annotations": []any{}}})
	}
	s.text.WriteString(piece)
	return s.event(b, "response.output_text.delta", map[string]any{"item_id": s.itemID(), "output_index": s.at(),
		"content_index": 0, "delta": piece})
}

func (s *responsesStream) end(b []byte) []byte {
	text := s.text.String()
	part := map[string]any{"type": "output_text", "text": text, "annotations": []any{}}
	b = s.event(b, "response.output_text.done", map[string]any{"item_id": s.itemID(), "output_index": s.at(), "content_index": 0, "text": text})
	b = s.event(b, "response.content_part.done", map[string]any{"item_id": s.itemID(), "output_index": s.at(), "content_index": 0, "part": part})
	b = s.event(b, "response.output_item.done", map[string]any{"output_index": s.at(), "item": messageOutput(s.itemID(), text, "completed")})
	r := s.h.responseObject(s.a, s.id, "completed", "", true)
	r.Output = append(r.Output[:len(r.Output)-1], messageOutput(s.itemID(), text, "completed"))
	s.h.st.responses.keep(s.id, appendJSON(nil, r))
	return s.event(b, "response.completed", map[string]any{"response": r})
}

// malformed is an output_text.delta event whose data is cut short.
func (s *responsesStream) malformed(b []byte) []byte {
	return append(b, "event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"delta\":\"x\n\n"...)
}

// errorEvent is the stream's error event: {"type":"error","code","message"}.
func (s *responsesStream) errorEvent(b, payload []byte) []byte {
	var e openaiErrorBody
	_ = json.Unmarshal(payload, &e)
	code := ""
	if e.Error.Code != nil {
		code = *e.Error.Code
	}
	return s.event(b, "error", map[string]any{"code": code, "message": e.Error.Message, "param": nil})
}
