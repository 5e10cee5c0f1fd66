package llmrouter

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"

	"github.com/llmrouter/caddy-llm-router/internal/jsonbody"
	"github.com/llmrouter/caddy-llm-router/internal/router"
)

// bgAccount is one OpenAI account that serves background responses as
// OpenAI does (testdata/background): a create answers "queued"; the
// response stays queued or in_progress until the test finishes it
// (completed, with usage); cancel makes an unfinished one "cancelled"
// and returns the final object when it is done; delete forgets it;
// a response created with stream: true streams again from
// starting_after. It knows only the ids it made: any other is its 404,
// as another organization's would be.
type bgAccount struct {
	t      *testing.T
	key    string
	prefix string
	srv    *httptest.Server

	hold chan struct{} // when set, creates wait until it is closed

	mu    sync.Mutex
	n     int
	resps map[string]*bgResponse
	hits  map[string]int // "METHOD op" (op: create, get, cancel, delete, input_items, stream)
}

type bgResponse struct {
	status string
	stream bool
}

func newBGAccount(t *testing.T, key, prefix string) *bgAccount {
	a := &bgAccount{t: t, key: key, prefix: prefix, resps: map[string]*bgResponse{}, hits: map[string]int{}}
	a.srv = httptest.NewServer(http.HandlerFunc(a.serve))
	t.Cleanup(a.srv.Close)
	return a
}

func bgFixture(t *testing.T, name string) []byte {
	t.Helper()
	b, err := os.ReadFile("testdata/background/" + name)
	if err != nil {
		t.Fatal(err)
	}
	return bytes.TrimSpace(b)
}

// object is the response object of id in its current status.
func (a *bgAccount) object(id string, r *bgResponse) []byte {
	body := bgFixture(a.t, "response.json")
	set := func(key, raw string) {
		var err error
		if body, err = jsonbody.SetRaw(body, key, []byte(raw)); err != nil {
			a.t.Fatal(err)
		}
	}
	set("id", strconv.Quote(id))
	set("status", strconv.Quote(r.status))
	if r.status != "completed" {
		set("output", "[]")
		set("usage", "null")
	}
	return body
}

func (a *bgAccount) serve(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	if r.Header.Get("Authorization") != "Bearer "+a.key {
		w.WriteHeader(http.StatusUnauthorized)
		_, _ = w.Write([]byte(`{"error":{"message":"Incorrect API key provided.","type":"invalid_request_error","param":null,"code":"invalid_api_key"}}`))
		return
	}
	rest, ok := strings.CutPrefix(r.URL.Path, "/v1/responses")
	if !ok {
		a.mu.Lock()
		a.hits[r.Method+" chat"]++ // a Chat Completions request: not served
		a.mu.Unlock()
		http.NotFound(w, r)
		return
	}
	if rest == "" && r.Method == http.MethodPost {
		a.create(w, r)
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	id, op, _ := strings.Cut(strings.TrimPrefix(rest, "/"), "/")
	if op == "" {
		op = map[string]string{http.MethodGet: "get", http.MethodDelete: "delete"}[r.Method]
		if r.URL.Query().Get("stream") == "true" {
			op = "stream"
		}
	}
	a.hits[r.Method+" "+op]++
	resp, ok := a.resps[id]
	if !ok {
		w.WriteHeader(http.StatusNotFound)
		_, _ = w.Write(bytes.Replace(bgFixture(a.t, "not_found.json"), []byte("resp_6786a1bec27481909a17d673315b29f6"), []byte(id), 1))
		return
	}
	switch op {
	case "get":
		_, _ = w.Write(a.object(id, resp))
	case "cancel":
		if resp.status == "queued" || resp.status == "in_progress" {
			resp.status = "cancelled"
		}
		_, _ = w.Write(a.object(id, resp))
	case "delete":
		delete(a.resps, id)
		_, _ = w.Write(bytes.Replace(bgFixture(a.t, "deleted.json"), []byte("resp_6786a1bec27481909a17d673315b29f6"), []byte(id), 1))
	case "input_items":
		_, _ = w.Write(bgFixture(a.t, "input_items.json"))
	case "stream":
		after, _ := strconv.Atoi(r.URL.Query().Get("starting_after"))
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = w.Write(bgEvents(a.t, id, after))
	default:
		w.WriteHeader(http.StatusMethodNotAllowed)
	}
}

func (a *bgAccount) create(w http.ResponseWriter, r *http.Request) {
	a.mu.Lock()
	a.hits["POST create"]++
	a.mu.Unlock()
	if a.hold != nil {
		select {
		case <-a.hold:
		case <-r.Context().Done():
			return
		}
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	var body struct {
		Background, Stream bool
		Previous           string `json:"previous_response_id"`
	}
	_ = json.NewDecoder(r.Body).Decode(&body)
	if _, ok := a.resps[body.Previous]; body.Previous != "" && !ok { // OpenAI's answer for an id it does not have
		w.WriteHeader(http.StatusBadRequest)
		_, _ = fmt.Fprintf(w, `{"error":{"message":"Previous response with id '%s' not found.","type":"invalid_request_error","param":"previous_response_id","code":"previous_response_not_found"}}`, body.Previous)
		return
	}
	a.n++
	id := fmt.Sprintf("resp_%s%d", a.prefix, a.n)
	resp := &bgResponse{status: "queued", stream: body.Stream}
	if !body.Background {
		resp.status = "completed"
	}
	a.resps[id] = resp
	if body.Stream {
		// The whole stream: the job finishes while the client listens.
		resp.status = "completed"
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = w.Write(bgEvents(a.t, id, -1))
		return
	}
	_, _ = w.Write(a.object(id, resp))
}

// bgEvents are the stream's events of sequence_number greater than after.
func bgEvents(t *testing.T, id string, after int) []byte {
	var out []byte
	for _, ev := range bytes.Split(bgFixture(t, "stream.sse"), []byte("\n\n")) {
		data := ev[bytes.Index(ev, []byte("data: "))+6:]
		n, _ := strconv.Atoi(string(data[bytes.Index(data, []byte(`"sequence_number":`))+18:][:1]))
		if n > after {
			out = append(out, bytes.ReplaceAll(ev, []byte("resp_x"), []byte(id))...)
			out = append(out, "\n\n"...)
		}
	}
	return out
}

// finish completes the account's response id, as its job ending does.
func (a *bgAccount) finish(id string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.resps[id].status = "completed"
}

func (a *bgAccount) count(op string) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.hits[op]
}

// bgClock is a manual router.Clock: timers fire when Advance passes them.
type bgClock struct {
	mu     sync.Mutex
	now    time.Time
	timers []*bgTimer
}

type bgTimer struct {
	c  *bgClock
	at time.Time
	f  func()
	on bool
}

func newBGClock() *bgClock { return &bgClock{now: time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)} }

func (c *bgClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Sleep passes d at once (the router's waits take no real time).
func (c *bgClock) Sleep(ctx context.Context, d time.Duration) error {
	c.Advance(d)
	return ctx.Err()
}

func (c *bgClock) AfterFunc(d time.Duration, f func()) router.Timer {
	c.mu.Lock()
	defer c.mu.Unlock()
	t := &bgTimer{c: c, at: c.now.Add(d), f: f, on: true}
	c.timers = append(c.timers, t)
	return t
}

func (t *bgTimer) Stop() bool {
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	was := t.on
	t.on = false
	return was
}

func (t *bgTimer) Reset(d time.Duration) bool {
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	was := t.on
	t.on, t.at = true, t.c.now.Add(d)
	return was
}

// Advance moves the time on by d, calling each timer that falls due (in
// order, one at a time).
func (c *bgClock) Advance(d time.Duration) {
	c.mu.Lock()
	end := c.now.Add(d)
	c.mu.Unlock()
	for {
		c.mu.Lock()
		var next *bgTimer
		for _, t := range c.timers {
			if t.on && !t.at.After(end) && (next == nil || t.at.Before(next.at)) {
				next = t
			}
		}
		if next == nil {
			c.now = end
			c.mu.Unlock()
			return
		}
		next.on = false
		c.now = next.at
		c.mu.Unlock()
		next.f()
	}
}

// bgRouter is a router over accounts a and b (model groups ga and gb,
// one each, gab both), and c, account a's Chat Completions (gc, and gca
// before a), with the manual clock; store is its further directives (a
// store, pass_through, hedge_after).
func bgRouter(t *testing.T, a, b *bgAccount, store string) (*Handler, *bgClock) {
	t.Helper()
	h := handlerFromCaddyfile(t, `llm_router {
		`+store+`
		provider a {
			type openai
			base_url `+a.srv.URL+`/v1
			api_key `+a.key+`
			responses native
		}
		provider b {
			type openai
			base_url `+b.srv.URL+`/v1
			api_key `+b.key+`
			responses native
		}
		provider c {
			type openai
			base_url `+a.srv.URL+`/v1
			api_key `+a.key+`
			responses chat
		}
		model ga {
			deployment a gpt-x
		}
		model gb {
			deployment b gpt-x
		}
		model gab {
			deployment a gpt-x
			deployment b gpt-x
		}
		model gc {
			deployment c gpt-c
		}
		model gca {
			deployment c gpt-c
			deployment a gpt-x
		}
	}`)
	t.Cleanup(func() { _ = h.Cleanup() })
	clock := newBGClock()
	h.router.Clock = clock
	return h, clock
}

// call sends one request to h: its status and body.
func call(t *testing.T, h *Handler, method, path, body string) (int, []byte, http.Header) {
	t.Helper()
	r := httptest.NewRequest(method, path, strings.NewReader(body))
	if body != "" {
		r.Header.Set("Content-Type", "application/json")
	}
	w := httptest.NewRecorder()
	_ = h.ServeHTTP(w, r, nil)
	return w.Code, w.Body.Bytes(), w.Header()
}

// createBG creates a background response through group, and returns its id.
func createBG(t *testing.T, h *Handler, group string) string {
	t.Helper()
	code, body, _ := call(t, h, http.MethodPost, "/v1/responses",
		`{"model":"`+group+`","input":"Write a very long novel about otters in space.","background":true}`)
	status, _ := jsonbody.GetString(body, "status")
	id, _ := jsonbody.GetString(body, "id")
	if code != 200 || status != "queued" || id == "" {
		t.Fatalf("create: expected 200 queued with an id, got %d %s", code, body)
	}
	return id
}

// answers is how many answers' usage the deployment of group recorded, and
// their input tokens.
func answers(h *Handler, group string) (int64, int64) {
	d := h.groups[group].Deployments[0]
	u := d.State.Usage(h.router.Clock.Now()).Total
	return u.Answers, u.InputTokens
}

// Every follow-up of a background response (poll, input items, stream
// resume, cancel, delete) reaches the account that made it, whichever
// account made it; the other account never sees it.
func TestBackgroundFollowUpsReachTheOwner(t *testing.T) {
	a, b := newBGAccount(t, "sk-bg-a", "fa"), newBGAccount(t, "sk-bg-b", "fb")
	h, _ := bgRouter(t, a, b, "")
	for _, tc := range []struct {
		group        string
		owner, other *bgAccount
	}{{"ga", a, b}, {"gb", b, a}} {
		before := tc.other.count("GET get") + tc.other.count("POST cancel") + tc.other.count("DELETE delete")
		id := createBG(t, h, tc.group)
		for _, f := range []struct {
			method, path, op, want string
		}{
			{http.MethodGet, "/v1/responses/" + id, "GET get", `"status":"queued"`},
			{http.MethodGet, "/v1/responses/" + id + "/input_items", "GET input_items", `"object":"list"`},
			{http.MethodPost, "/v1/responses/" + id + "/cancel", "POST cancel", `"status":"cancelled"`},
			{http.MethodPost, "/v1/responses/" + id + "/cancel", "POST cancel", `"status":"cancelled"`}, // idempotent
			{http.MethodGet, "/v1/responses/" + id + "?stream=true&starting_after=1", "GET stream", `"sequence_number":2`},
			{http.MethodDelete, "/v1/responses/" + id, "DELETE delete", `"deleted":true`},
		} {
			code, body, hdr := call(t, h, f.method, f.path, "")
			if code != 200 || !bytes.Contains(body, []byte(f.want)) {
				t.Errorf("%s %s: expected 200 with %s, got %d %s", f.method, f.path, f.want, code, body)
			}
			if want := tc.owner.prefix[1:2] + "/gpt-x"; hdr.Get(HeaderDeployment) != want {
				t.Errorf("%s %s: expected deployment %s, got %q", f.method, f.path, want, hdr.Get(HeaderDeployment))
			}
		}
		if n := tc.other.count("GET get") + tc.other.count("POST cancel") + tc.other.count("DELETE delete") - before; n != 0 {
			t.Errorf("%s: %d follow-ups reached the other account", id, n)
		}
		if got := tc.owner.count("POST cancel"); got != 2 {
			t.Errorf("%s: expected 2 cancels at the owner, got %d", id, got)
		}
	}
	// A resumed stream passes the owner's events on from starting_after.
	code, body, _ := call(t, h, http.MethodPost, "/v1/responses", `{"model":"ga","input":"hi","background":true,"stream":true}`)
	if code != 200 || !bytes.Contains(body, []byte("response.completed")) {
		t.Fatalf("stream create: %d %s", code, body)
	}
	const id = "resp_fa2" // the account's second response
	_, body, _ = call(t, h, http.MethodGet, "/v1/responses/"+id+"?stream=true&starting_after=1", "")
	if bytes.Contains(body, []byte(`"sequence_number":1`)) || !bytes.Contains(body, []byte(`"sequence_number":2`)) || !bytes.Contains(body, []byte(`"sequence_number":3`)) {
		t.Errorf("expected the events after sequence number 1, got %s", body)
	}
}

// A response id the router does not know (made before a restart, with no
// fleet store) is OpenAI's 404, saying so, and reaches no account; a
// method the path does not take is a 405 in OpenAI's format.
func TestBackgroundUnknownResponse(t *testing.T) {
	a, b := newBGAccount(t, "sk-bg-a", "ua"), newBGAccount(t, "sk-bg-b", "ub")
	h, _ := bgRouter(t, a, b, "")
	code, body, _ := call(t, h, http.MethodGet, "/v1/responses/resp_unknown42", "")
	var e struct {
		Error struct {
			Message, Type string
			Code          *string
		}
	}
	_ = json.Unmarshal(body, &e)
	if code != 404 || e.Error.Type != "invalid_request_error" || e.Error.Code != nil || !strings.Contains(e.Error.Message, "resp_unknown42") ||
		!strings.Contains(e.Error.Message, "does not know") {
		t.Errorf("expected a 404 saying the router does not know the response, got %d %s", code, body)
	}
	if a.count("GET get")+b.count("GET get") != 0 {
		t.Error("an unknown response reached an account")
	}
	id := createBG(t, h, "ga")
	if code, body, hdr := call(t, h, http.MethodPut, "/v1/responses/"+id, ""); code != 405 || hdr.Get("Allow") == "" || !bytes.Contains(body, []byte(`"error"`)) {
		t.Errorf("PUT: expected a 405 with Allow, got %d %s", code, body)
	}
}

// The usage of a background response is counted once: at the poll that
// sees it completed (not at a second poll), and for a response no client
// polls, at the router's own poll within the bound.
func TestBackgroundUsageCountedOnce(t *testing.T) {
	a, b := newBGAccount(t, "sk-bg-a", "ca"), newBGAccount(t, "sk-bg-b", "cb")
	h, clock := bgRouter(t, a, b, "")
	polled, abandoned := createBG(t, h, "ga"), createBG(t, h, "ga")
	if n, _ := answers(h, "ga"); n != 0 {
		t.Fatalf("expected nothing counted for queued responses, got %d answers", n)
	}
	a.finish(polled)
	for range 2 {
		if code, body, _ := call(t, h, http.MethodGet, "/v1/responses/"+polled, ""); code != 200 || !bytes.Contains(body, []byte(`"completed"`)) {
			t.Fatalf("poll: %d %s", code, body)
		}
	}
	if n, in := answers(h, "ga"); n != 1 || in != 36 {
		t.Errorf("after two polls of a completed response: expected 1 answer of 36 input tokens, got %d of %d", n, in)
	}
	gets := a.count("GET get")
	clock.Advance(BackgroundPollFirst)
	if got := a.count("GET get") - gets; got != 1 {
		t.Errorf("expected the router to poll the abandoned response once after %v (and not the counted one), got %d polls", BackgroundPollFirst, got)
	}
	a.finish(abandoned)
	clock.Advance(BackgroundPollMaxEvery)
	if n, in := answers(h, "ga"); n != 2 || in != 72 {
		t.Errorf("after the router's poll of the abandoned response: expected 2 answers of 72 input tokens, got %d of %d", n, in)
	}
	gets = a.count("GET get")
	clock.Advance(BackgroundPollFor)
	if got := a.count("GET get") - gets; got != 0 {
		t.Errorf("expected no poll once both are counted, got %d", got)
	}
	call(t, h, http.MethodGet, "/v1/responses/"+abandoned, "")
	if n, _ := answers(h, "ga"); n != 2 {
		t.Errorf("a client's poll after the router's counted again: %d answers", n)
	}
	// A background stream's usage is counted at its response.completed,
	// and not again when it is streamed anew.
	call(t, h, http.MethodPost, "/v1/responses", `{"model":"gb","input":"hi","background":true,"stream":true}`)
	call(t, h, http.MethodGet, "/v1/responses/resp_cb1?stream=true&starting_after=1", "")
	call(t, h, http.MethodGet, "/v1/responses/resp_cb1", "")
	if n, _ := answers(h, "gb"); n != 1 {
		t.Errorf("a background stream: expected 1 answer counted, got %d", n)
	}
}

// A response the router gives up on (still queued past the bound) stops
// being polled.
func TestBackgroundPollBound(t *testing.T) {
	a, b := newBGAccount(t, "sk-bg-a", "ba"), newBGAccount(t, "sk-bg-b", "bb")
	h, clock := bgRouter(t, a, b, "")
	createBG(t, h, "ga")
	clock.Advance(BackgroundPollFor + time.Minute)
	polls := a.count("GET get")
	if max := int(BackgroundPollFor/BackgroundPollFirst) + 1; polls == 0 || polls > max {
		t.Errorf("expected between 1 and %d polls within %v, got %d", max, BackgroundPollFor, polls)
	}
	clock.Advance(BackgroundPollFor)
	if got := a.count("GET get"); got != polls {
		t.Errorf("expected no poll past the bound, got %d more", got-polls)
	}
}

// Fleet mode: a poll made at another instance (which never saw the
// response) reaches the owner through Redis, and the usage is counted
// once in the fleet: by the instance whose poll saw it completed, not
// again by the creating instance's own poll.
func TestBackgroundFleetPoll(t *testing.T) {
	m := miniredis.RunT(t)
	a, b := newBGAccount(t, "sk-bg-a", "ra"), newBGAccount(t, "sk-bg-b", "rb")
	// Two store URLs to one Redis: two instances, not one pooled store.
	h1, clock1 := bgRouter(t, a, b, "store redis redis://"+m.Addr()+"/0 {\n poll_interval 20ms\n}")
	h2, _ := bgRouter(t, a, b, "store redis redis://"+m.Addr()+" {\n poll_interval 20ms\n}")
	if h1.store == h2.store {
		t.Fatal("expected two stores")
	}
	id := createBG(t, h1, "gb")
	responseOwners().Remove(id) // h2 is another process: it knows only what Redis knows
	waitForKey(t, m, "resp:")
	waitForKey(t, m, "bg:")
	b.finish(id)
	code, body, hdr := call(t, h2, http.MethodGet, "/v1/responses/"+id, "")
	if code != 200 || hdr.Get(HeaderDeployment) != "b/gpt-x" || !bytes.Contains(body, []byte(`"completed"`)) {
		t.Fatalf("poll at the other instance: expected 200 completed from b, got %d %s %s", code, hdr.Get(HeaderDeployment), body)
	}
	if a.count("GET get") != 0 {
		t.Error("the poll reached the wrong account")
	}
	clock1.Advance(BackgroundPollFor)
	n1, _ := answers(h1, "gb")
	n2, _ := answers(h2, "gb")
	// The two instances share one capacity state per deployment (one
	// process): the fleet's count is the state's.
	if h1.groups["gb"].Deployments[0].State == h2.groups["gb"].Deployments[0].State {
		n1 = 0
	}
	if n1+n2 != 1 {
		t.Errorf("expected the usage counted once in the fleet, got %d at the creator and %d at the poller", n1, n2)
	}
}

// waitForKey waits (5 s at most) until Redis holds a key containing part:
// the fleet's writes are in the background.
func waitForKey(t *testing.T, m *miniredis.Miniredis, part string) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		for _, k := range m.Keys() {
			if strings.Contains(k, part) {
				return
			}
		}
	}
	t.Fatalf("no key containing %q in Redis", part)
}

// A background create is not hedged: a second attempt would start a
// second job at another account, billed too, that no client polls.
func TestBackgroundCreateNotHedged(t *testing.T) {
	a, b := newBGAccount(t, "sk-bg-a", "ha"), newBGAccount(t, "sk-bg-b", "hb")
	a.hold, b.hold = make(chan struct{}), make(chan struct{})
	h, clock := bgRouter(t, a, b, "hedge_after 1s")
	done := make(chan int)
	go func() {
		code, _, _ := call(t, h, http.MethodPost, "/v1/responses", `{"model":"gab","input":"hi","background":true}`)
		done <- code
	}()
	creates := func() int { return a.count("POST create") + b.count("POST create") }
	for deadline := time.Now().Add(5 * time.Second); creates() == 0 && time.Now().Before(deadline); {
		time.Sleep(time.Millisecond)
	}
	clock.Advance(2 * time.Second)
	time.Sleep(100 * time.Millisecond) // a hedge's request would arrive now
	close(a.hold)
	close(b.hold)
	if code := <-done; code != 200 {
		t.Errorf("expected the create answered, got %d", code)
	}
	if n := creates(); n != 1 {
		t.Errorf("expected one create upstream, got %d", n)
	}
}

// With pass_through, a follow-up still goes to the owner, not to the
// pass_through provider.
func TestBackgroundFollowUpsNotPassedThrough(t *testing.T) {
	a, b := newBGAccount(t, "sk-bg-a", "pa"), newBGAccount(t, "sk-bg-b", "pb")
	h, _ := bgRouter(t, a, b, "pass_through a")
	id := createBG(t, h, "gb")
	for _, path := range []string{"/v1/responses/" + id, "/v1/responses/" + id + "/input_items"} {
		if code, body, _ := call(t, h, http.MethodGet, path, ""); code != 200 {
			t.Errorf("GET %s: expected 200 from the owner, got %d %s", path, code, body)
		}
	}
	if n := a.count("GET get") + a.count("GET input_items"); n != 0 {
		t.Errorf("%d follow-ups reached the pass_through account", n)
	}
}

// A background create has no Chat Completions form: a deployment that
// would translate it is passed over for one that serves the Responses
// API, and a group with none answers 400 saying why, sending nothing.
func TestBackgroundCreateNeedsTheResponsesAPI(t *testing.T) {
	a, b := newBGAccount(t, "sk-bg-a", "na"), newBGAccount(t, "sk-bg-b", "nb")
	h, _ := bgRouter(t, a, b, "")
	const body = `{"model":"gca","input":"hi","background":true}`
	code, answer, hdr := call(t, h, http.MethodPost, "/v1/responses", body)
	if code != 200 || hdr.Get(HeaderDeployment) != "a/gpt-x" {
		t.Errorf("expected a/gpt-x to take it, got %d %s %s", code, hdr.Get(HeaderDeployment), answer)
	}
	code, answer, _ = call(t, h, http.MethodPost, "/v1/responses", strings.Replace(body, "gca", "gc", 1))
	if code != 400 || !bytes.Contains(answer, []byte("background")) {
		t.Errorf("expected a 400 about background, got %d %s", code, answer)
	}
	if n := a.count("POST chat"); n != 0 {
		t.Errorf("%d translated creates reached the account", n)
	}
}
