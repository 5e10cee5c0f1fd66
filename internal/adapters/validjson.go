package adapters

import "github.com/llmrouter/caddy-llm-router/internal/jsonbody"

// scanJSON reports whether data is one valid JSON value, as
// encoding/json.Valid does (jsonbody.Valid), and notes in m what the
// looks of a stream's chunk for its keys would find (chunkMarks), in the
// same pass: a stream relays every event through it (chatStream.Decode).
func scanJSON(data []byte, m *chunkMarks) bool { return jsonbody.Scan(data, m.note) }

// chunkMarks is what a chunk's bytes hold, as byte searches of the chunk
// would find it, noted string by string as scanJSON reads the chunk:
//   - err: `"error"` (indexKey), a key or a value;
//   - finish: `"finish_reason"` with a non-null value (valueStart);
//   - usage: the first byte of the first non-null value of `"usage"` (valueStart), 0 if none;
//   - sage: `sage"`, which every spelling of a usage key holds
//     (provider.UsageCounter's look for usage);
//   - reason: `_reason":"`, a finish or stop reason's key with a string
//     value (the counter's look for a reason).
type chunkMarks struct {
	err, finish, sage, reason bool
	usage                     byte
}

// note notes the string b[start:end-1] (end is after its closing quote),
// which may be a key: what follows it (b[end:]) says what its value is.
func (m *chunkMarks) note(b []byte, start, end int) {
	s := b[start : end-1]
	quoted := func(key string) bool { // `"key"` ends at end: the string is key, or ends with an escaped quote and key
		n := len(key)
		return len(s) >= n && string(s[len(s)-n:]) == key && (len(s) == n || s[len(s)-n-1] == '"')
	}
	m.err = m.err || quoted("error")
	m.sage = m.sage || len(s) >= 4 && string(s[len(s)-4:]) == "sage"
	if len(s) < 5 || (s[len(s)-1] != 'n' && s[len(s)-1] != 'e') {
		return // none of the keys below: the common case
	}
	m.reason = m.reason || len(s) >= 7 && string(s[len(s)-7:]) == "_reason" && end+1 < len(b) && b[end] == ':' && b[end+1] == '"'
	if first := valueAfter(b, end); first != 0 && first != 'n' {
		m.finish = m.finish || quoted("finish_reason")
		if m.usage == 0 && quoted("usage") {
			m.usage = first
		}
	}
}

// valueAfter returns the first byte of the value after the key that ends
// before b[i] (its ':' and whitespace skipped), 0 when no ':' follows.
func valueAfter(b []byte, i int) byte {
	i = jsonbody.SkipSpace(b, i)
	if i >= len(b) || b[i] != ':' {
		return 0
	}
	if i = jsonbody.SkipSpace(b, i+1); i < len(b) {
		return b[i]
	}
	return 0
}
