package adapters

import (
	"bytes"
	"encoding/json"

	"github.com/llmrouter/caddy-llm-router/provider"
)

// decodeEvent unmarshals a JSON event's data into v for a stream decoder.
// When it returns false, the decoder answers with kind and obs: provider.EventSkip
// for a comment or an empty event, provider.EventError for data that is not JSON.
func decodeEvent(ev *provider.Event, v any) (provider.EventKind, provider.Observation, bool) {
	if ev.Comment {
		return provider.EventSkip, provider.Observation{}, false
	}
	data := bytes.TrimSpace(ev.Data)
	if len(data) == 0 {
		return provider.EventSkip, provider.Observation{}, false
	}
	if err := json.Unmarshal(data, v); err != nil {
		return provider.EventError, streamBroken("invalid JSON event in stream"), false
	}
	return provider.EventData, provider.Observation{}, true
}
