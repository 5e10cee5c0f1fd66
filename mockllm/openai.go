package mockllm

import (
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"math"
	"net/http"
	"strconv"
)

// The openai dialect: Chat Completions answers and stream chunks,
// Embeddings, the model list and OpenAI error bodies.

// chatCompletion is the non-streamed answer of Chat Completions.
type chatCompletion struct {
	ID      string              `json:"id"`
	Object  string              `json:"object"`
	Created int64               `json:"created"`
	Model   string              `json:"model"`
	Choices [1]completionChoice `json:"choices"`
	Usage   openaiUsage         `json:"usage"`
}

type completionChoice struct {
	Index        int           `json:"index"`
	Message      openaiMessage `json:"message"`
	FinishReason string        `json:"finish_reason"`
}

type openaiMessage struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

type openaiUsage struct {
	PromptTokens        int                  `json:"prompt_tokens"`
	CompletionTokens    int                  `json:"completion_tokens"`
	TotalTokens         int                  `json:"total_tokens"`
	PromptTokensDetails *openaiPromptDetails `json:"prompt_tokens_details,omitempty"`
}

// openaiPromptDetails is usage.prompt_tokens_details: the cached prompt
// tokens (see Handler.cachedTokens).
type openaiPromptDetails struct {
	CachedTokens int `json:"cached_tokens"`
}

// usage is a's usage in OpenAI's form.
func (a answer) usage() openaiUsage {
	u := openaiUsage{PromptTokens: a.prompt, CompletionTokens: a.completion, TotalTokens: a.prompt + a.completion}
	if a.cached > 0 {
		u.PromptTokensDetails = &openaiPromptDetails{CachedTokens: a.cached}
	}
	return u
}

// chatChunk is one event of a Chat Completions stream.
type chatChunk struct {
	ID      string         `json:"id"`
	Object  string         `json:"object"`
	Created int64          `json:"created"`
	Model   string         `json:"model"`
	Choices [1]chunkChoice `json:"choices"`
	Usage   *openaiUsage   `json:"usage,omitempty"` // the final chunk's
}

type chunkChoice struct {
	Index        int        `json:"index"`
	Delta        chunkDelta `json:"delta"`
	FinishReason *string    `json:"finish_reason"` // null until the final chunk
}

// chunkDelta is {"role":"assistant","content":...} in the first
// chunk, {"content":...} in the others and {} in the final one.
type chunkDelta struct {
	Role    string  `json:"role,omitempty"`
	Content *string `json:"content,omitempty"`
}

// embeddingList is the answer of Embeddings: one fixed 3-dimensional
// embedding per input item, indexed in order.
type embeddingList struct {
	Object string          `json:"object"`
	Data   []embeddingData `json:"data"`
	Model  string          `json:"model"`
	Usage  embeddingUsage  `json:"usage"`
}

type embeddingData struct {
	Object string `json:"object"`
	Index  int    `json:"index"`
	// Embedding is the vector as JSON numbers, or, for a request with
	// encoding_format "base64" (what the OpenAI SDKs ask for by default),
	// a base64 string of its little-endian float32s, as OpenAI answers.
	Embedding any `json:"embedding"`
}

// mockEmbedding is the fixed vector every embedding answer holds.
var mockEmbedding = [3]float32{0.1, 0.2, 0.3}

// embeddingsOf are the embeddings of body's input, one per item (OpenAI's
// input: a string, an array of strings, one array of tokens, or an array
// of token arrays), in the encoding body asks for.
func embeddingsOf(body []byte) []embeddingData {
	var req struct {
		Input          json.RawMessage `json:"input"`
		EncodingFormat string          `json:"encoding_format"`
	}
	_ = json.Unmarshal(body, &req)
	var vector any = [3]float64{0.1, 0.2, 0.3}
	if req.EncodingFormat == "base64" {
		b := make([]byte, 0, 4*len(mockEmbedding))
		for _, f := range mockEmbedding {
			b = binary.LittleEndian.AppendUint32(b, math.Float32bits(f))
		}
		vector = base64.StdEncoding.EncodeToString(b)
	}
	out := make([]embeddingData, inputItems(req.Input))
	for i := range out {
		out[i] = embeddingData{Object: "embedding", Index: i, Embedding: vector}
	}
	return out
}

// inputItems counts the items of an embeddings input: an array of
// strings or of token arrays holds one each; a string or one array of
// tokens is one (so is what is none of these).
func inputItems(input json.RawMessage) int {
	var items []json.RawMessage
	if json.Unmarshal(input, &items) != nil || len(items) == 0 {
		return 1
	}
	var token float64
	if json.Unmarshal(items[0], &token) == nil {
		return 1 // one array of tokens
	}
	return len(items)
}

type embeddingUsage struct {
	PromptTokens int `json:"prompt_tokens"`
	TotalTokens  int `json:"total_tokens"`
}

// openaiErrorBody is an OpenAI error; nil Code is null, Param always is.
type openaiErrorBody struct {
	Error struct {
		Message string  `json:"message"`
		Type    string  `json:"type"`
		Param   *string `json:"param"`
		Code    *string `json:"code"`
	} `json:"error"`
}

type openaiModelList struct {
	Object string         `json:"object"`
	Data   [1]openaiModel `json:"data"`
}

type openaiModel struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	OwnedBy string `json:"owned_by"`
}

// finishStop is the finish_reason of the final chunk.
var finishStop = "stop"

// openaiStream is a Chat Completions stream: data: chunks, a final
// chunk with finish_reason and usage, then [DONE].
type openaiStream struct {
	a  answer
	ev chatChunk // id, created and model shared by every chunk
}

func (h *Handler) newOpenAIStream(a answer) *openaiStream {
	return &openaiStream{a: a, ev: chatChunk{
		ID:      "chatcmpl-mock-" + strconv.FormatUint(h.st.ids.Add(1), 10),
		Object:  "chat.completion.chunk",
		Created: h.now().Unix(),
		Model:   a.model,
	}}
}

func (s *openaiStream) contentType() string  { return "text/event-stream" }
func (s *openaiStream) head(b []byte) []byte { return b }
func (s *openaiStream) keepAlive() []byte    { return keepAliveComment }

func (s *openaiStream) chunk(b []byte, i int, piece string, _ bool) []byte {
	ev := s.ev
	ev.Choices[0].Delta.Content = &piece
	if i == 0 {
		ev.Choices[0].Delta.Role = "assistant"
	}
	b = append(b, "data: "...)
	b = appendJSON(b, &ev)
	return append(b, "\n\n"...)
}

func (s *openaiStream) end(b []byte) []byte {
	ev := s.ev
	ev.Choices[0].FinishReason = &finishStop
	u := s.a.usage()
	ev.Usage = &u
	b = append(b, "data: "...)
	b = appendJSON(b, &ev)
	return append(b, "\n\ndata: [DONE]\n\n"...)
}

func (s *openaiStream) errorEvent(b, payload []byte) []byte {
	b = append(b, "data: "...)
	b = append(b, payload...)
	return append(b, "\n\n"...)
}

// malformedChat is a Chat Completions chunk cut short.
const malformedChat = `{"choices":[{"delta":{"content":"x`

func (s *openaiStream) malformed(b []byte) []byte {
	b = append(b, "data: "...)
	b = append(b, malformedChat...)
	return append(b, "\n\n"...)
}

func (h *Handler) completion(a answer) []byte {
	c := chatCompletion{
		ID:      "chatcmpl-mock-" + strconv.FormatUint(h.st.ids.Add(1), 10),
		Object:  "chat.completion",
		Created: h.now().Unix(),
		Model:   a.model,
		Choices: [1]completionChoice{{
			Message:      openaiMessage{Role: "assistant", Content: a.text},
			FinishReason: "stop",
		}},
		Usage: a.usage(),
	}
	return appendJSON(make([]byte, 0, 256+len(a.text)), &c)
}

// textCompletion is the non-streamed answer of legacy completions.
func (h *Handler) textCompletion(a answer) []byte {
	return appendJSON(nil, map[string]any{"id": "cmpl-mock-" + strconv.FormatUint(h.st.ids.Add(1), 10),
		"object": "text_completion", "created": h.now().Unix(), "model": a.model,
		"choices": []any{map[string]any{"text": a.text, "index": 0, "logprobs": nil, "finish_reason": "stop"}},
		"usage":   a.usage()})
}

// completionsStream is a legacy completions stream: data: chunks whose
// choice carries text, a final one with finish_reason and usage, [DONE].
type completionsStream struct{ *openaiStream }

func (s *completionsStream) chunk(b []byte, _ int, piece string, _ bool) []byte {
	return s.event(b, map[string]any{"text": piece, "index": 0, "logprobs": nil, "finish_reason": nil}, nil)
}

func (s *completionsStream) end(b []byte) []byte {
	u := s.a.usage()
	b = s.event(b, map[string]any{"text": "", "index": 0, "logprobs": nil, "finish_reason": "stop"}, &u)
	return append(b, "data: [DONE]\n\n"...)
}

func (s *completionsStream) malformed(b []byte) []byte {
	return append(b, "data: {\"choices\":[{\"text\":\"x\n\n"...)
}

func (s *completionsStream) event(b []byte, choice map[string]any, usage *openaiUsage) []byte {
	ev := map[string]any{"id": s.ev.ID, "object": "text_completion", "created": s.ev.Created, "model": s.ev.Model,
		"choices": []any{choice}}
	if usage != nil {
		ev["usage"] = usage
	}
	b = append(b, "data: "...)
	b = appendJSON(b, ev)
	return append(b, "\n\n"...)
}

func (h *Handler) embedding(a answer, body []byte) []byte {
	e := embeddingList{
		Object: "list",
		Data:   embeddingsOf(body),
		Model:  a.model,
		Usage:  embeddingUsage{PromptTokens: a.prompt, TotalTokens: a.prompt},
	}
	return appendJSON(make([]byte, 0, 192), &e)
}

// openaiModels is the model list of the Models API.
func openaiModels(id string) []byte {
	return appendJSON(nil, &openaiModelList{
		Object: "list",
		Data:   [1]openaiModel{{ID: id, Object: "model", OwnedBy: "llm_mock"}},
	})
}

// errorBody is an OpenAI error object; an empty code is null.
func errorBody(msg, typ, code string) []byte {
	var e openaiErrorBody
	e.Error.Message = msg
	e.Error.Type = typ
	if code != "" {
		e.Error.Code = &code
	}
	return appendJSON(nil, &e)
}

func writeError(w http.ResponseWriter, status int, msg, typ, code string) {
	writeBody(w, status, errorBody(msg, typ, code))
}
