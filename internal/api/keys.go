package api

import (
	"bytes"

	"github.com/llmrouter/caddy-llm-router/internal/jsonbody"
	"github.com/llmrouter/caddy-llm-router/internal/router"
	"github.com/llmrouter/caddy-llm-router/provider"
)

// What a request, as its client API reads it, says of the state the
// handler keeps between requests, besides the keys of its affinity (which
// Parse reads: router.Request.Keys): the Responses API's state it
// continues, and what a translation drops of it. Each is read from the
// body Parse took (req.Body), by its format's field names; "" or nil when
// the request says nothing.

// Continuation is the state at one provider account that a Responses
// request continues (https://platform.openai.com/docs/guides/conversation-state).
type Continuation struct {
	// Param is the field that names it: "previous_response_id" or
	// "conversation".
	Param string
	// ID is the response's id, or the conversation's.
	ID string
}

// ContinuationOf is the state a Responses request continues: its
// previous_response_id, else its conversation (an id, or an object's
// id); ok is false for any other request, or one that continues none.
func ContinuationOf(req *router.Request) (c Continuation, ok bool) {
	if req.Format != provider.Responses {
		return Continuation{}, false
	}
	if id, _ := jsonbody.GetString(req.Body, "previous_response_id"); id != "" {
		return Continuation{Param: "previous_response_id", ID: id}, true
	}
	if id := ConversationID(req); id != "" {
		return Continuation{Param: "conversation", ID: id}, true
	}
	return Continuation{}, false
}

// ConversationID is a Responses request's conversation (the Conversations
// API's, which lives at one provider account): a string, or an object's
// id; "" when none, or for another format.
func ConversationID(req *router.Request) string {
	if req.Format != provider.Responses {
		return ""
	}
	body := req.Body
	start, end, _ := jsonbody.FindMember(body, "conversation")
	switch {
	case start < 0:
		return ""
	case body[start] == '"':
		s, _ := jsonbody.String(body[start:end])
		return s
	case body[start] == '{':
		id, _ := jsonbody.GetString(body[start:end], "id")
		return id
	}
	return ""
}

// DroppedInChat lists what a Messages request loses when a deployment
// takes its Chat Completions form (res.Format is not Messages): thinking
// blocks ("thinking"), and cache_control markers ("cache_control"),
// hints to Anthropic's models and caches that other providers cannot
// take; nil for any other request or answer.
func DroppedInChat(req *router.Request, res *router.Result) []string {
	if req.Format != provider.Messages || res.Deployment == nil || res.Format == provider.Messages {
		return nil
	}
	var dropped []string
	if bytes.Contains(req.Body, []byte(`"thinking"`)) || bytes.Contains(req.Body, []byte(`"redacted_thinking"`)) {
		dropped = append(dropped, "thinking")
	}
	if bytes.Contains(req.Body, []byte(`"cache_control"`)) {
		dropped = append(dropped, "cache_control")
	}
	return dropped
}

// IsBackground reports whether req is a Responses request in background
// mode (background: true): its response stays with the provider account
// that runs it, polled by its id.
func IsBackground(req *router.Request) bool {
	if req.Format != provider.Responses {
		return false
	}
	start, end, _ := jsonbody.FindMember(req.Body, "background")
	return start >= 0 && string(req.Body[start:end]) == "true"
}
