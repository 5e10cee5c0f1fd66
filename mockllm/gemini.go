package mockllm

import (
	"net/http"
	"strconv"
	"strings"
	"time"
)

// The gemini dialect: the Gemini API's generateContent and
// streamGenerateContent (POST .../models/{model}:method), its
// google.rpc errors and quota failures. Gemini sends no rate-limit
// headers.

// Gemini quota metrics and ids, as its free tier reports them.
const (
	geminiRequestsMetric    = "generativelanguage.googleapis.com/generate_content_free_tier_requests"
	geminiTokensMetric      = "generativelanguage.googleapis.com/generate_content_free_tier_input_token_count"
	geminiRequestsPerMinute = "GenerateRequestsPerMinutePerProjectPerModel-FreeTier"
	geminiTokensPerMinute   = "GenerateContentInputTokensPerModelPerMinute-FreeTier"

	// geminiOverloadedEvent is the payload of a gemini error_event.
	geminiOverloadedEvent = `{"error":{"code":503,"status":"UNAVAILABLE","message":"The model is overloaded."}}`
)

// geminiRoute matches .../models/{model}:generateContent and
// .../models/{model}:streamGenerateContent.
func geminiRoute(r *http.Request) (call, bool) {
	p := r.URL.Path
	i := strings.LastIndex(p, "/models/")
	if i < 0 {
		return call{}, false
	}
	model, method, ok := strings.Cut(p[i+len("/models/"):], ":")
	if !ok || model == "" || strings.Contains(model, "/") {
		return call{}, false
	}
	switch method {
	case "generateContent":
		return call{ep: epGenerate, wire: wireGemini, model: model}, true
	case "streamGenerateContent":
		return call{ep: epStreamGenerate, wire: wireGemini, model: model, array: r.URL.Query().Get("alt") != "sse"}, true
	}
	return call{}, false
}

// geminiResponse is the answer of generateContent.
func (h *Handler) geminiResponse(a answer) []byte {
	return appendGeminiChunk(make([]byte, 0, 256+len(a.text)), a, a.text, true)
}

// generateContentResponse is a GenerateContentResponse with one
// candidate.
type generateContentResponse struct {
	Candidates    [1]geminiCandidate   `json:"candidates"`
	UsageMetadata *geminiUsageMetadata `json:"usageMetadata,omitempty"` // last chunk only
	ModelVersion  string               `json:"modelVersion"`
}

type geminiCandidate struct {
	Content struct {
		Role  string `json:"role"`
		Parts [1]struct {
			Text string `json:"text"`
		} `json:"parts"`
	} `json:"content"`
	FinishReason string `json:"finishReason,omitempty"` // last chunk only
	Index        int    `json:"index"`
}

type geminiUsageMetadata struct {
	PromptTokenCount     int `json:"promptTokenCount"`
	CandidatesTokenCount int `json:"candidatesTokenCount"`
	TotalTokenCount      int `json:"totalTokenCount"`
}

// appendGeminiChunk appends a GenerateContentResponse holding text;
// last adds finishReason and usageMetadata.
func appendGeminiChunk(b []byte, a answer, text string, last bool) []byte {
	r := generateContentResponse{ModelVersion: a.model}
	c := &r.Candidates[0]
	c.Content.Role = "model"
	c.Content.Parts[0].Text = text
	if last {
		c.FinishReason = "STOP"
		r.UsageMetadata = &geminiUsageMetadata{
			PromptTokenCount:     a.prompt,
			CandidatesTokenCount: a.completion,
			TotalTokenCount:      a.prompt + a.completion,
		}
	}
	return appendJSON(b, &r)
}

// geminiStream is a streamGenerateContent answer: with ?alt=sse one
// "data: <GenerateContentResponse>" event per chunk and no end marker;
// without, the same responses as a JSON array written piece by piece.
// The last chunk carries finishReason STOP and usageMetadata.
type geminiStream struct {
	a      answer
	array  bool
	opened bool // array: "[" written
}

func (s *geminiStream) contentType() string {
	if s.array {
		return "application/json"
	}
	return "text/event-stream"
}

func (s *geminiStream) head(b []byte) []byte { return b }

func (s *geminiStream) keepAlive() []byte {
	if s.array {
		return nil
	}
	return keepAliveComment
}

// open starts an array element: "[" first, then ",\r\n" as Gemini
// separates them.
func (s *geminiStream) open(b []byte) []byte {
	if s.opened {
		return append(b, ",\r\n"...)
	}
	s.opened = true
	return append(b, '[')
}

func (s *geminiStream) chunk(b []byte, _ int, piece string, last bool) []byte {
	if s.array {
		return appendGeminiChunk(s.open(b), s.a, piece, last)
	}
	b = append(b, "data: "...)
	b = appendGeminiChunk(b, s.a, piece, last)
	return append(b, "\n\n"...)
}

func (s *geminiStream) end(b []byte) []byte {
	if s.array {
		if !s.opened {
			b = append(b, '[')
		}
		return append(b, ']')
	}
	return b
}

func (s *geminiStream) errorEvent(b, payload []byte) []byte {
	if s.array {
		b = append(s.open(b), payload...)
		return append(b, ']')
	}
	b = append(b, "data: "...)
	b = append(b, payload...)
	return append(b, "\n\n"...)
}

// malformedGemini is a GenerateContentResponse cut short.
const malformedGemini = `{"candidates":[{"content":{"role":"model","parts":[{"text":"x`

func (s *geminiStream) malformed(b []byte) []byte {
	if s.array {
		return append(s.open(b), malformedGemini...)
	}
	b = append(b, "data: "...)
	b = append(b, malformedGemini...)
	return append(b, "\n\n"...)
}

// googleStatus is a google.rpc.Status in a JSON error body.
type googleStatus struct {
	Code    int    `json:"code"`
	Status  string `json:"status"`
	Message string `json:"message"`
	Details []any  `json:"details,omitempty"`
}

type quotaFailure struct {
	Type       string           `json:"@type"`
	Violations []quotaViolation `json:"violations"`
}

type quotaViolation struct {
	QuotaMetric     string            `json:"quotaMetric"`
	QuotaID         string            `json:"quotaId"`
	QuotaDimensions map[string]string `json:"quotaDimensions"`
	QuotaValue      string            `json:"quotaValue,omitempty"`
}

type retryInfo struct {
	Type       string `json:"@type"`
	RetryDelay string `json:"retryDelay"`
}

type errorInfo struct {
	Type     string            `json:"@type"`
	Reason   string            `json:"reason"`
	Domain   string            `json:"domain"`
	Metadata map[string]string `json:"metadata"`
}

func marshalGoogleError(st googleStatus) []byte {
	return appendJSON(nil, &struct {
		Error googleStatus `json:"error"`
	}{st})
}

// googleError is a google.rpc error body for an HTTP status.
func googleError(code int, msg string) []byte {
	return marshalGoogleError(googleStatus{Code: code, Status: googleStatusName(code), Message: msg})
}

// googleAPIKeyInvalid is the body of a request with a wrong key.
func googleAPIKeyInvalid() []byte {
	return marshalGoogleError(googleStatus{
		Code:    http.StatusUnauthorized,
		Status:  googleStatusName(http.StatusUnauthorized),
		Message: "API key not valid. Please pass a valid API key.",
		Details: []any{errorInfo{
			Type:     "type.googleapis.com/google.rpc.ErrorInfo",
			Reason:   "API_KEY_INVALID",
			Domain:   "googleapis.com",
			Metadata: map[string]string{"service": "generativelanguage.googleapis.com"},
		}},
	})
}

// googleStatusName is the google.rpc code name Google maps an HTTP
// status to.
func googleStatusName(code int) string {
	switch code {
	case http.StatusBadRequest:
		return "INVALID_ARGUMENT"
	case http.StatusUnauthorized:
		return "UNAUTHENTICATED"
	case http.StatusForbidden:
		return "PERMISSION_DENIED"
	case http.StatusNotFound:
		return "NOT_FOUND"
	case http.StatusConflict:
		return "ABORTED"
	case http.StatusTooManyRequests:
		return "RESOURCE_EXHAUSTED"
	case 499:
		return "CANCELLED"
	case http.StatusInternalServerError:
		return "INTERNAL"
	case http.StatusNotImplemented:
		return "UNIMPLEMENTED"
	case http.StatusServiceUnavailable:
		return "UNAVAILABLE"
	case http.StatusGatewayTimeout:
		return "DEADLINE_EXCEEDED"
	}
	if code >= 400 && code < 500 {
		return "FAILED_PRECONDITION"
	}
	return "UNKNOWN"
}

// geminiStatusMessage is the message of a status fault.
func geminiStatusMessage(code int) string {
	if code == http.StatusServiceUnavailable {
		return "The model is overloaded. Please try again later."
	}
	return "mock status " + strconv.Itoa(code)
}

// geminiQuotaError is a RESOURCE_EXHAUSTED body as Gemini sends for a
// spent quota: a QuotaFailure naming quotaID and a RetryInfo of retry
// in whole seconds, rounded up. limit 0 leaves the quota value out.
func geminiQuotaError(code int, model, metric, quotaID string, limit int, retry time.Duration) []byte {
	var msg strings.Builder
	msg.WriteString("You exceeded your current quota, please check your plan and billing details.\n* Quota exceeded for metric: ")
	msg.WriteString(metric)
	v := quotaViolation{
		QuotaMetric:     metric,
		QuotaID:         quotaID,
		QuotaDimensions: map[string]string{"location": "global", "model": model},
	}
	if limit > 0 {
		v.QuotaValue = strconv.Itoa(limit)
		msg.WriteString(", limit: " + v.QuotaValue)
	}
	msg.WriteString(", model: " + model + "\nPlease retry in " + strconv.FormatFloat(retry.Seconds(), 'f', -1, 64) + "s.")
	return marshalGoogleError(googleStatus{
		Code:    code,
		Status:  "RESOURCE_EXHAUSTED",
		Message: msg.String(),
		Details: []any{
			quotaFailure{Type: "type.googleapis.com/google.rpc.QuotaFailure", Violations: []quotaViolation{v}},
			retryInfo{Type: "type.googleapis.com/google.rpc.RetryInfo", RetryDelay: strconv.FormatInt(retryAfterSeconds(retry), 10) + "s"},
		},
	})
}

// geminiWindowQuotaError is the 429 body of a request over the
// RateLimit window: a per-minute requests or input tokens quota.
func geminiWindowQuotaError(ls limitState, model string) []byte {
	if ls.exceeded == "tokens" {
		return geminiQuotaError(http.StatusTooManyRequests, model, geminiTokensMetric, geminiTokensPerMinute, ls.tokens, ls.reset)
	}
	return geminiQuotaError(http.StatusTooManyRequests, model, geminiRequestsMetric, geminiRequestsPerMinute, ls.requests, ls.reset)
}

// geminiModels is the model list of the Gemini API.
func geminiModels(id string) []byte {
	type model struct {
		Name                       string    `json:"name"`
		DisplayName                string    `json:"displayName"`
		SupportedGenerationMethods [2]string `json:"supportedGenerationMethods"`
	}
	return appendJSON(nil, &struct {
		Models [1]model `json:"models"`
	}{[1]model{{
		Name:                       "models/" + id,
		DisplayName:                id,
		SupportedGenerationMethods: [2]string{"generateContent", "streamGenerateContent"},
	}}})
}
