package api

import (
	"net/http"
	"slices"
	"testing"

	"github.com/llmrouter/caddy-llm-router/internal/router"
	"github.com/llmrouter/caddy-llm-router/provider"
)

// Parse reads the affinity keys a request names: the cache key is
// prompt_cache_key alone; the conversation's key prompt_cache_key, else
// user, else metadata.user_id; a key that is no string is none.
func TestAffinityKeysOfARequest(t *testing.T) {
	for _, c := range []struct {
		api                 API
		body                string
		cache, conversation string
	}{
		{Chat{}, `{"model":"m","messages":[{"role":"user","content":"hi"}],"user":"u1","prompt_cache_key":"k1"}`, "k1", "k1"},
		{Chat{}, `{"model":"m","messages":[{"role":"user","content":"hi"}],"user":"u1"}`, "", "u1"},
		{Chat{}, `{"model":"m","messages":[{"role":"user","content":"hi"}],"user":7}`, "", ""},
		{Messages{}, `{"model":"m","max_tokens":5,"messages":[{"role":"user","content":"hi"}],"metadata":{"user_id":"u2"}}`, "", "u2"},
		{Responses{}, `{"model":"m","input":"hi","prompt_cache_key":"k3"}`, "k3", "k3"},
		{Embeddings{}, `{"model":"m","input":"hi"}`, "", ""},
		{Completions{}, `{"model":"m","prompt":"hi","prompt_cache_key":"k6"}`, "k6", "k6"},
		{Messages{}, `{"model":"m","max_tokens":5,"messages":[{"role":"user","content":"hi"}],"metadata":"u7","user":7}`, "", ""},
	} {
		req, _, e := c.api.Parse([]byte(c.body), http.Header{})
		if e != nil {
			t.Fatalf("%s: %v", c.body, e)
		}
		if got := req.Keys.Cache; got != c.cache {
			t.Errorf("%s: cache key %q, want %q", c.body, got, c.cache)
		}
		if got := req.Keys.Conversation; got != c.conversation {
			t.Errorf("%s: conversation key %q, want %q", c.body, got, c.conversation)
		}
	}
}

// A Responses request continues a previous response, else a conversation
// (an id or an object's id); no other format continues any.
func TestContinuationOfARequest(t *testing.T) {
	for body, want := range map[string]Continuation{
		`{"model":"m","input":"hi","previous_response_id":"resp_1","conversation":"conv_1"}`: {"previous_response_id", "resp_1"},
		`{"model":"m","input":"hi","conversation":"conv_1"}`:                                 {"conversation", "conv_1"},
		`{"model":"m","input":"hi","conversation":{"id":"conv_2"}}`:                          {"conversation", "conv_2"},
		`{"model":"m","input":"hi"}`:                                                         {},
	} {
		req, _, e := Responses{}.Parse([]byte(body), http.Header{})
		if e != nil {
			t.Fatalf("%s: %v", body, e)
		}
		if got, ok := ContinuationOf(req); got != want || ok != (want.ID != "") {
			t.Errorf("%s: %+v %v, want %+v", body, got, ok, want)
		}
	}
	chat, _, _ := Chat{}.Parse([]byte(`{"model":"m","messages":[{"role":"user","content":"hi"}],"conversation":"conv_1"}`), http.Header{})
	if _, ok := ContinuationOf(chat); ok || ConversationID(chat) != "" {
		t.Errorf("a Chat request continues no Responses state")
	}
}

// What a Messages request loses in its Chat form: thinking and
// cache_control, only when a deployment took that form.
func TestDroppedInChat(t *testing.T) {
	req, _, e := Messages{}.Parse([]byte(`{"model":"m","max_tokens":5,"messages":[{"role":"user","content":[`+
		`{"type":"text","text":"hi","cache_control":{"type":"ephemeral"}}]},{"role":"assistant","content":[{"type":"thinking","thinking":"x","signature":"s"}]}]}`), http.Header{})
	if e != nil {
		t.Fatal(e)
	}
	d := &router.Deployment{Name: "oa/gpt"}
	if got := DroppedInChat(req, &router.Result{Deployment: d, Format: provider.Chat}); !slices.Equal(got, []string{"thinking", "cache_control"}) {
		t.Errorf("translated: %v", got)
	}
	if got := DroppedInChat(req, &router.Result{Deployment: d, Format: provider.Messages}); got != nil {
		t.Errorf("native: %v", got)
	}
}

// A Responses request in background mode is never hedged (its provider
// runs it to its end: a twin would be a second job) and is told apart
// for the handler's polling; no other request is.
func TestBackgroundIsNotHedged(t *testing.T) {
	bg, _, e := Responses{}.Parse([]byte(`{"model":"m","input":"hi","background":true}`), http.Header{})
	if e != nil {
		t.Fatal(e)
	}
	fg, _, _ := Responses{}.Parse([]byte(`{"model":"m","input":"hi","background":false}`), http.Header{})
	chat, _, _ := Chat{}.Parse([]byte(`{"model":"m","messages":[{"role":"user","content":"hi"}],"background":true}`), http.Header{})
	if !bg.NoHedge || !IsBackground(bg) || fg.NoHedge || IsBackground(fg) || chat.NoHedge || IsBackground(chat) {
		t.Errorf("background %v %v, foreground %v %v, chat %v %v", bg.NoHedge, IsBackground(bg), fg.NoHedge, IsBackground(fg), chat.NoHedge, IsBackground(chat))
	}
}
