package router

import (
	"slices"
	"strings"
	"testing"

	"github.com/llmrouter/caddy-llm-router/provider"
)

// A request's cache prefix hashes its prompt's parts as the client wrote
// them, without their markers: the same whatever else of the body changes
// (max_tokens, stream, metadata), the next turn finds the turn before
// where the marker moved on, other content hashes otherwise, and a prompt
// without a marker has none; the head names a prompt of 1,024 bytes or
// more, with or without a marker.
func TestCachePrefixesAreStable(t *testing.T) {
	doc := strings.Repeat("Clause 1 applies. ", 100)
	req := func(format provider.Format, body string) *Request {
		return &Request{Request: &provider.Request{Format: format, Body: []byte(body)}}
	}
	mark := `,"cache_control":{"type":"ephemeral"}`
	sys := `"system":[{"type":"text","text":"` + doc + `"` + mark + `}]`
	turn1 := req(provider.Messages, `{"model":"c","max_tokens":100,`+sys+`,"messages":[{"role":"user","content":[{"type":"text","text":"q1"`+mark+`}]}]}`)
	turn1b := req(provider.Messages, `{"stream":true,"model":"c",`+sys+`,"max_tokens":900,"metadata":{"user_id":"u"},"messages":[{"role":"user","content":[{"type":"text","text":"q1"`+mark+`}]}]}`)
	turn2 := req(provider.Messages, `{"model":"c","max_tokens":100,`+sys+`,"messages":[{"role":"user","content":[{"type":"text","text":"q1"}]},`+
		`{"role":"assistant","content":[{"type":"text","text":"a1"}]},{"role":"user","content":[{"type":"text","text":"q2"`+mark+`}]}]}`)
	other := req(provider.Messages, `{"model":"c","max_tokens":100,"system":[{"type":"text","text":"other`+doc+`"`+mark+`}],"messages":[{"role":"user","content":"q1"}]}`)
	unmarked := req(provider.Chat, `{"model":"c","messages":[{"role":"system","content":"`+doc+`"},{"role":"user","content":"q1"}]}`)
	short := req(provider.Chat, `{"model":"c","messages":[{"role":"user","content":"hi"}]}`)

	p1, p2 := turn1.CachePrefixes(), turn2.CachePrefixes()
	if len(p1) != 2 || !slices.Equal(p1, turn1b.CachePrefixes()) {
		t.Errorf("the same prompt in another body: %x and %x", p1, turn1b.CachePrefixes())
	}
	if !slices.Contains(p2, p1[len(p1)-1]) || p2[len(p2)-1] == p1[len(p1)-1] {
		t.Errorf("the next turn's prefixes %x should hold the turn before's %x, and end beyond it", p2, p1[len(p1)-1])
	}
	if slices.Contains(other.CachePrefixes(), p1[0]) {
		t.Error("another system prompt hashed alike")
	}
	if unmarked.CachePrefixes() != nil || short.CachePrefixes() != nil {
		t.Error("a prompt without a marker has no cache prefix")
	}
	if unmarked.HeadKey() == 0 || turn1.HeadKey() == 0 || turn1.HeadKey() != turn2.HeadKey() || short.HeadKey() != 0 {
		t.Errorf("heads: unmarked %x, turns %x %x, short %x", unmarked.HeadKey(), turn1.HeadKey(), turn2.HeadKey(), short.HeadKey())
	}
}
