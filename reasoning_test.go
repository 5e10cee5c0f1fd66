package llmrouter

import (
	"bufio"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
)

// orgFake is an OpenAI Responses endpoint serving several organizations,
// told apart by their key, as OpenAI binds encrypted items: each answer
// carries a reasoning item whose encrypted_content only its organization
// can read; an input item minted by another organization (or by nobody it
// knows) is refused with OpenAI's 400 invalid_encrypted_content ("The
// encrypted content gAAA...DQ== could not be verified.":
// https://github.com/openai/codex/issues/8145). An organization set to
// limit answers 429 as OpenAI does (openai-429-rpm).
type orgFake struct {
	srv     *httptest.Server
	mu      sync.Mutex
	orgs    map[string]string // key -> organization
	limited map[string]bool   // organization -> answers 429
	calls   map[string]int    // organization -> requests
	n       atomic.Int64
	bodies  []string // the request bodies, in order
}

func newOrgFake(t *testing.T, orgs map[string]string) *orgFake {
	f := &orgFake{orgs: orgs, limited: map[string]bool{}, calls: map[string]int{}}
	f.srv = httptest.NewServer(http.HandlerFunc(f.serve))
	t.Cleanup(f.srv.Close)
	return f
}

func (f *orgFake) limit(org string, on bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.limited[org] = on
}

func (f *orgFake) count(org string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls[org]
}

// mint is an encrypted_content only org reads: as OpenAI's, it begins with gAAA.
func mint(org string, n int64) string {
	return "gAAAA" + base64.StdEncoding.EncodeToString([]byte(fmt.Sprintf("%s|reasoning %d", org, n)))
}

// minter is the organization that minted an encrypted_content, "" when
// none did.
func minter(enc string) string {
	raw, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(enc, "gAAAA"))
	if err != nil || !strings.HasPrefix(enc, "gAAAA") {
		return ""
	}
	org, _, _ := strings.Cut(string(raw), "|")
	return org
}

func (f *orgFake) serve(w http.ResponseWriter, r *http.Request) {
	if !strings.HasSuffix(r.URL.Path, "/responses") {
		http.NotFound(w, r)
		return
	}
	var body struct {
		Input  json.RawMessage `json:"input"`
		Stream bool            `json:"stream"`
	}
	raw := new(strings.Builder)
	_, _ = bufio.NewReader(r.Body).WriteTo(raw)
	_ = json.Unmarshal([]byte(raw.String()), &body)
	org := f.orgs[strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")]
	f.mu.Lock()
	f.calls[org]++
	f.bodies = append(f.bodies, raw.String())
	limited := f.limited[org]
	f.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	if limited {
		w.Header().Set("x-ratelimit-limit-requests", "3")
		w.Header().Set("x-ratelimit-remaining-requests", "0")
		w.Header().Set("x-ratelimit-reset-requests", "20s")
		w.WriteHeader(429)
		_, _ = fmt.Fprintf(w, `{"error":{"message":"Rate limit reached for gpt-5 in organization %s on requests per min (RPM): Limit 3, Used 3, Requested 1. Please try again in 20s.","type":"requests","param":null,"code":"rate_limit_exceeded"}}`, org)
		return
	}
	var items []map[string]any
	_ = json.Unmarshal(body.Input, &items)
	for _, it := range items {
		enc, _ := it["encrypted_content"].(string)
		if enc != "" && minter(enc) != org {
			w.WriteHeader(400)
			_, _ = fmt.Fprintf(w, `{"error":{"message":"The encrypted content %s...%s could not be verified. Reason: Encrypted content could not be decrypted or parsed.","type":"invalid_request_error","param":null,"code":"invalid_encrypted_content"}}`,
				enc[:4], enc[len(enc)-4:])
			return
		}
	}
	n := f.n.Add(1)
	id := fmt.Sprintf("resp_%s_%d", org, n)
	reasoning := fmt.Sprintf(`{"type":"reasoning","id":"rs_%s_%d","summary":[],"encrypted_content":%q}`, org, n, mint(org, n))
	message := fmt.Sprintf(`{"type":"message","id":"msg_%s_%d","status":"completed","role":"assistant","content":[{"type":"output_text","text":"hi from %s","annotations":[]}]}`, org, n, org)
	usage := `{"input_tokens":10,"input_tokens_details":{"cached_tokens":0},"output_tokens":5,"output_tokens_details":{"reasoning_tokens":3},"total_tokens":15}`
	response := func(status, output, usage string) string {
		return fmt.Sprintf(`{"id":%q,"object":"response","created_at":1,"status":%q,"model":"gpt-5","output":[%s],"usage":%s}`, id, status, output, usage)
	}
	if !body.Stream {
		_, _ = w.Write([]byte(response("completed", reasoning+","+message, usage)))
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	seq := 0
	event := func(typ, data string) {
		_, _ = fmt.Fprintf(w, "event: %s\ndata: {\"type\":%q,\"sequence_number\":%d,%s}\n\n", typ, typ, seq, data)
		seq++
	}
	event("response.created", `"response":`+response("in_progress", "", "null"))
	event("response.output_item.added", `"output_index":0,"item":{"type":"reasoning","id":"rs_x","summary":[]}`)
	event("response.output_item.done", `"output_index":0,"item":`+reasoning)
	event("response.output_item.added", `"output_index":1,"item":{"type":"message","id":"msg_x","status":"in_progress","role":"assistant","content":[]}`)
	event("response.output_text.delta", fmt.Sprintf(`"item_id":"msg_x","output_index":1,"content_index":0,"delta":"hi from %s"`, org))
	event("response.output_item.done", `"output_index":1,"item":`+message)
	event("response.completed", `"response":`+response("completed", reasoning+","+message, usage))
}

// reasoningRouter is a router of two OpenAI accounts of equal standing
// (two keys: two organizations) in one model group, both at the fake.
func reasoningRouter(t *testing.T, f *orgFake, extra string) *Handler {
	t.Helper()
	h := handlerFromCaddyfile(t, `llm_router {
		provider a {
			type openai
			base_url `+f.srv.URL+`/v1
			api_key sk-org-a
			responses native
		}
		provider b {
			type openai
			base_url `+f.srv.URL+`/v1
			api_key sk-org-b
			responses native
		}
		model gpt {
			deployment a gpt-5
			deployment b gpt-5
		}
		`+extra+`
	}`)
	t.Cleanup(func() { _ = h.Cleanup() })
	return h
}

// codexTurn is one store:false turn as Codex sends it: the whole
// conversation so far as input, reasoning items with their
// encrypted_content among it.
func codexTurn(input []json.RawMessage, stream bool) string {
	b, _ := json.Marshal(map[string]any{"model": "gpt", "store": false, "stream": stream,
		"include": []string{"reasoning.encrypted_content"}, "input": input})
	return string(b)
}

func userItem(text string) json.RawMessage {
	b, _ := json.Marshal(map[string]any{"type": "message", "role": "user", "content": []any{map[string]any{"type": "input_text", "text": text}}})
	return b
}

// outputOf reads the output items of an answer: a response object, or a
// stream's response.completed.
func outputOf(t *testing.T, body string, stream bool) []json.RawMessage {
	t.Helper()
	if stream {
		for line := range strings.Lines(body) {
			if data, ok := strings.CutPrefix(strings.TrimSpace(line), "data: "); ok && strings.Contains(data, `"response.completed"`) {
				var ev struct {
					Response struct {
						Output []json.RawMessage `json:"output"`
					} `json:"response"`
				}
				if err := json.Unmarshal([]byte(data), &ev); err != nil {
					t.Fatal(err)
				}
				return ev.Response.Output
			}
		}
		t.Fatalf("no response.completed in %s", body)
	}
	var r struct {
		Output []json.RawMessage `json:"output"`
	}
	if err := json.Unmarshal([]byte(body), &r); err != nil {
		t.Fatal(err)
	}
	return r.Output
}

// converse plays turns of a Codex conversation against h, each turn's
// input the whole conversation with the answers' items; it returns the
// statuses.
func converse(t *testing.T, h *Handler, input []json.RawMessage, turns int, stream bool) ([]json.RawMessage, []int) {
	t.Helper()
	var codes []int
	for i := range turns {
		input = append(input, userItem(fmt.Sprintf("turn %d", i)))
		w := httptest.NewRecorder()
		_ = h.ServeHTTP(w, postJSON("/v1/responses", codexTurn(input, stream)), nil)
		codes = append(codes, w.Code)
		if w.Code != 200 {
			t.Logf("turn %d: %d %s", i, w.Code, w.Body)
			continue
		}
		input = append(input, outputOf(t, w.Body.String(), stream)...)
	}
	return input, codes
}

func failed(codes []int) int {
	n := 0
	for _, c := range codes {
		if c != 200 {
			n++
		}
	}
	return n
}

// Issue 29 (1): Codex's store:false turns carry reasoning items that only
// the organization that minted them can read. With two equal accounts the
// router alternated, and every second turn got 400
// invalid_encrypted_content; each turn now goes to the minting
// organization: 20 turns, no error, streamed or not.
func TestReasoningGoesToItsOrganization(t *testing.T) {
	for _, stream := range []bool{true, false} {
		f := newOrgFake(t, map[string]string{"sk-org-a": "org-a", "sk-org-b": "org-b"})
		h := reasoningRouter(t, f, "")
		_, codes := converse(t, h, nil, 20, stream)
		if n := failed(codes); n != 0 {
			t.Errorf("stream %v: %d of 20 turns failed: %v", stream, n, codes)
		}
		if a, b := f.count("org-a"), f.count("org-b"); a+b != 20 {
			t.Errorf("stream %v: %d upstream requests (a %d, b %d), want 20: one a turn", stream, a+b, a, b)
		}
	}
}

// When the minting organization cannot serve the turn (429), the other
// serves it, sent the conversation without the encrypted reasoning it
// cannot read (and without the items' ids, which pair them): never a 400.
func TestReasoningStrippedWhenItsOrganizationIsLimited(t *testing.T) {
	f := newOrgFake(t, map[string]string{"sk-org-a": "org-a", "sk-org-b": "org-b"})
	h := reasoningRouter(t, f, "")
	input, codes := converse(t, h, nil, 3, true)
	if failed(codes) != 0 {
		t.Fatalf("the first turns failed: %v", codes)
	}
	owner := "org-a"
	if f.count("org-b") > 0 {
		owner = "org-b"
	}
	other := map[string]string{"org-a": "org-b", "org-b": "org-a"}[owner]
	f.limit(owner, true)
	before := f.count(other)
	_, codes = converse(t, h, input, 1, true)
	if codes[0] != 200 {
		t.Fatalf("with %s limited: %v", owner, codes)
	}
	if f.count(other) != before+1 {
		t.Errorf("expected one request to %s, got %d", other, f.count(other)-before)
	}
	last := f.bodies[len(f.bodies)-1]
	if strings.Contains(last, `"encrypted_content":`) || strings.Contains(last, `"rs_`) || strings.Contains(last, `"msg_`) {
		t.Errorf("%s was sent what it cannot read: %s", other, last)
	}
	if strings.Count(last, "turn ") != 4 || strings.Count(last, "hi from") != 3 {
		t.Errorf("expected the rest of the conversation kept: %s", last)
	}
}

// An encrypted item the router never saw minted (before a restart,
// through another router) that a deployment refuses with 400
// invalid_encrypted_content is sent once more, elsewhere, without the
// encrypted items: the turn is served.
func TestUnknownReasoningRefusedIsRetriedStripped(t *testing.T) {
	f := newOrgFake(t, map[string]string{"sk-org-a": "org-a", "sk-org-b": "org-b"})
	h := reasoningRouter(t, f, "")
	foreign := json.RawMessage(fmt.Sprintf(`{"type":"reasoning","id":"rs_z","summary":[],"encrypted_content":%q}`, mint("org-z", 1)))
	for _, stream := range []bool{true, false} {
		start := len(f.bodies)
		_, codes := converse(t, h, []json.RawMessage{userItem("earlier"), foreign}, 1, stream)
		if codes[0] != 200 {
			t.Fatalf("stream %v: %v", stream, codes)
		}
		if n := len(f.bodies) - start; n != 2 {
			t.Errorf("stream %v: %d upstream requests, want 2 (the refusal, then the stripped retry)", stream, n)
		}
		if last := f.bodies[len(f.bodies)-1]; strings.Contains(last, `"encrypted_content":`) || !strings.Contains(last, "earlier") {
			t.Errorf("stream %v: the retry: %s", stream, last)
		}
	}
}

// A provider's organization is its `organization` when set (JSON and
// Caddyfile alike), else its credentials': providers sharing a key are
// one; a server without credentials is one per base_url. A name with a
// space, too long, or missing is refused.
func TestOrganizationOfAProvider(t *testing.T) {
	h := handlerFromCaddyfile(t, `llm_router {
		provider a {
			type openai
			base_url http://a.invalid/v1
			api_key sk-shared
		}
		provider b {
			type openai
			base_url http://b.invalid/v1
			api_key sk-shared
		}
		provider c {
			type openai
			base_url http://a.invalid/v1
			api_key sk-other
		}
		provider d {
			type openai
			base_url http://a.invalid/v1
			api_key sk-other
			header OpenAI-Organization org-2
		}
		provider e {
			type openai
			base_url http://e.invalid/v1
			api_key sk-e
			organization acme
		}
		provider f {
			type openai
			base_url http://f.invalid/v1
			api_key sk-f
			organization acme
		}
		provider g {
			type openai
			base_url http://g.invalid/v1
			api_key none
		}
		provider h {
			type openai
			base_url http://h.invalid/v1
			api_key none
		}
		model m {
			deployment a x
			deployment b x
			deployment c x
			deployment d x
			deployment e x
			deployment f x
			deployment g x
			deployment h x
		}
	}`)
	defer h.Cleanup()
	org := map[string]string{}
	for d, m := range h.meta {
		org[strings.TrimSuffix(d.Name, "/x")] = m.org
		if strings.Contains(m.org, "sk-") {
			t.Errorf("%s: the organization %q shows the key", d.Name, m.org)
		}
	}
	for _, same := range [][2]string{{"a", "b"}, {"e", "f"}} {
		if org[same[0]] != org[same[1]] {
			t.Errorf("%s and %s: expected one organization, got %q and %q", same[0], same[1], org[same[0]], org[same[1]])
		}
	}
	for _, other := range [][2]string{{"a", "c"}, {"c", "d"}, {"a", "e"}, {"g", "h"}} {
		if org[other[0]] == org[other[1]] {
			t.Errorf("%s and %s: expected two organizations, got %q", other[0], other[1], org[other[0]])
		}
	}
	provider := func(org string) string {
		return `{"type": "openai", "base_url": "http://a.invalid/v1", "api_key": "k", "organization": ` + org + `}`
	}
	for _, tc := range []struct{ org, want string }{
		{`"acme corp"`, `organization "acme corp": must be at most 128 characters, without spaces or control characters`},
		{`"` + strings.Repeat("x", 129) + `"`, "must be at most 128 characters"},
	} {
		h := handlerFromJSON(t, `{"providers": {"p": `+provider(tc.org)+`}, "models": {"m": {"deployments": [{"provider": "p", "model": "x"}]}}}`)
		if err := h.Provision(newCaddyContext(t)); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("JSON organization %s: %v", tc.org, err)
		}
	}
	for _, tc := range []struct{ line, want string }{
		{`organization "acme corp"`, `organization "acme corp": must be at most`},
		{`organization`, "wrong argument count"},
		{`organization a b`, "wrong argument count"},
	} {
		var h Handler
		err := h.UnmarshalCaddyfile(caddyfile.NewTestDispenser("llm_router {\n provider p {\n type openai\n api_key k\n base_url http://h/v1\n " + tc.line + "\n }\n model m { deployment p x } }"))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Caddyfile %s: %v", tc.line, err)
		}
	}
}

// Two keys configured as one organization (`organization`) read each
// other's encrypted items: turns may go to either, and none fails.
func TestOneOrganizationOfTwoKeys(t *testing.T) {
	f := newOrgFake(t, map[string]string{"sk-org-a": "acme", "sk-org-b": "acme"})
	h := handlerFromCaddyfile(t, `llm_router {
		provider a {
			type openai
			base_url `+f.srv.URL+`/v1
			api_key sk-org-a
			organization acme
			responses native
		}
		provider b {
			type openai
			base_url `+f.srv.URL+`/v1
			api_key sk-org-b
			organization acme
			responses native
		}
		model gpt {
			deployment a gpt-5
			deployment b gpt-5
		}
	}`)
	defer h.Cleanup()
	_, codes := converse(t, h, nil, 10, true)
	if n := failed(codes); n != 0 || f.count("acme") != 10 {
		t.Errorf("%d of 10 turns failed, %d upstream requests: %v", n, f.count("acme"), codes)
	}
}
