package api

import "github.com/llmrouter/caddy-llm-router/internal/jsonbody"

// What the Responses API says of a response a provider keeps (a
// background response: https://platform.openai.com/docs/guides/background),
// read by the root's follow-ups (background.go) without knowing the format.

// terminalEvents are the stream events that end a response, carrying it.
var terminalEvents = map[string]bool{"response.completed": true, "response.failed": true, "response.incomplete": true, "response.cancelled": true}

// TerminalResponse is the response object a stream event's JSON data
// carries when the event ends the response (response.completed, .failed,
// .incomplete, .cancelled); ok is false for any other event.
func TerminalResponse(data []byte) (response []byte, ok bool) {
	if typ, _ := jsonbody.GetString(data, "type"); !terminalEvents[typ] {
		return nil, false
	}
	start, end, _ := jsonbody.FindMember(data, "response")
	if start < 0 {
		return nil, false
	}
	return data[start:end], true
}

// ResponseDone reports whether a response object's status is final
// (completed, failed, incomplete, cancelled); queued and in_progress, or
// no status, are not.
func ResponseDone(response []byte) bool {
	switch status, _ := jsonbody.GetString(response, "status"); status {
	case "completed", "failed", "incomplete", "cancelled":
		return true
	}
	return false
}
