package provider

import "testing"

// Cache writes by lifetime, as each format states them: Anthropic's
// split beside (or without) its total, a Chat usage's cache_write_tokens
// and the split the router's translations keep beside it, and a
// provider's garbage bounded (a lifetime's share never above the whole).
func TestUsageCacheWritesByLifetime(t *testing.T) {
	for _, tc := range []struct {
		name string
		f    Format
		body string
		want Usage
	}{
		{"messages", Messages, `{"usage":{"input_tokens":25,"cache_creation_input_tokens":3000,"cache_read_input_tokens":4409,"cache_creation":{"ephemeral_5m_input_tokens":2000,"ephemeral_1h_input_tokens":1000},"output_tokens":300}}`,
			Usage{InputTokens: 7434, CachedInputTokens: 4409, CacheWriteTokens: 3000, CacheWrite1hTokens: 1000, OutputTokens: 300}},
		{"messages, the split alone", Messages, `{"usage":{"input_tokens":5,"cache_creation":{"ephemeral_5m_input_tokens":0,"ephemeral_1h_input_tokens":700},"output_tokens":1}}`,
			Usage{InputTokens: 705, CacheWriteTokens: 700, CacheWrite1hTokens: 700, OutputTokens: 1}},
		{"messages, no split", Messages, `{"usage":{"input_tokens":8,"cache_creation_input_tokens":12304,"output_tokens":549}}`,
			Usage{InputTokens: 12312, CacheWriteTokens: 12304, OutputTokens: 549}},
		{"chat", Chat, `{"usage":{"prompt_tokens":7434,"completion_tokens":300,"prompt_tokens_details":{"cached_tokens":4409,"cache_write_tokens":3000},"cache_creation":{"ephemeral_5m_input_tokens":2000,"ephemeral_1h_input_tokens":1000}}}`,
			Usage{InputTokens: 7434, CachedInputTokens: 4409, CacheWriteTokens: 3000, CacheWrite1hTokens: 1000, OutputTokens: 300}},
		{"chat, OpenRouter's", Chat, `{"usage":{"prompt_tokens":194,"completion_tokens":2,"prompt_tokens_details":{"cached_tokens":0,"cache_write_tokens":100}}}`,
			Usage{InputTokens: 194, CacheWriteTokens: 100, OutputTokens: 2}},
		{"garbage: negative and oversized shares", Messages, `{"usage":{"input_tokens":1,"cache_creation_input_tokens":-5,"cache_creation":{"ephemeral_5m_input_tokens":-3,"ephemeral_1h_input_tokens":99999999999999999},"output_tokens":1}}`,
			Usage{InputTokens: 1 + MaxTokens, CacheWriteTokens: MaxTokens, CacheWrite1hTokens: MaxTokens, OutputTokens: 1}},
	} {
		got, ok := UsageOf(tc.f, []byte(tc.body))
		if !ok || got != tc.want {
			t.Errorf("%s: %+v (%v), want %+v", tc.name, got, ok, tc.want)
		}
	}
	// A stream: message_start states the split, message_delta the output.
	c := NewUsageCounter(Messages, false)
	c.Add(Event{Data: []byte(`{"type":"message_start","message":{"usage":{"input_tokens":50,"cache_creation_input_tokens":10000,"cache_creation":{"ephemeral_5m_input_tokens":0,"ephemeral_1h_input_tokens":10000},"output_tokens":1}}}`)})
	c.Add(Event{Data: []byte(`{"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"output_tokens":100}}`)})
	if got, _ := c.Usage(); got != (Usage{InputTokens: 10050, CacheWriteTokens: 10000, CacheWrite1hTokens: 10000, OutputTokens: 100}) {
		t.Errorf("stream: %+v", got)
	}
}
