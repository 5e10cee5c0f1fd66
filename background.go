package llmrouter

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/llmrouter/caddy-llm-router/internal/api"
	"github.com/llmrouter/caddy-llm-router/internal/redact"
	"github.com/llmrouter/caddy-llm-router/internal/router"
	"github.com/llmrouter/caddy-llm-router/provider"
)

// Background responses and the other requests on a response a provider
// keeps (OpenAI's Responses API: a create with background: true answers
// "queued" at once, and the job runs at the provider account:
// https://platform.openai.com/docs/guides/background). Each of these goes
// to the deployment that made the response (the owners of responses.go,
// in fleet mode through Redis), never to another:
//
//	GET    .../responses/{id}                            a poll
//	GET    .../responses/{id}?stream=true&starting_after=N  its events after N, again
//	POST   .../responses/{id}/cancel                     (idempotent at OpenAI)
//	DELETE .../responses/{id}
//	GET    .../responses/{id}/input_items
//
// The answers are passed on as the provider gave them, its secrets
// redacted, but a 2xx no SDK can read (unreadableStored: a 502). A background response's usage is counted once, when it is
// done: at the first poll (or stream, the create's own included) that
// finds it completed, failed, incomplete or cancelled, whichever client
// (or instance of the fleet) made it; the router polls a response no
// client polls itself, BackgroundPollFirst after the create, then at
// doubling intervals up to BackgroundPollMaxEvery (a client's poll defers
// it), and gives up BackgroundPollFor after the create. A create is not
// hedged and has no Chat Completions form (api.ErrBackground); it fails
// over as any request until a provider accepts it.
const (
	// BackgroundPollFirst is when the router first polls a background
	// response no client has found done.
	BackgroundPollFirst = 5 * time.Second
	// BackgroundPollMaxEvery bounds the interval of the router's polls.
	BackgroundPollMaxEvery = time.Minute
	// BackgroundPollFor is how long after its create the router polls a
	// background response; past it, its usage is counted only if a
	// client's poll finds it done (in fleet mode, at any instance).
	BackgroundPollFor = time.Hour
	// BackgroundJobsMax bounds the background responses each config polls;
	// past it, a new one is not polled by the router (its usage is counted
	// when a client's poll finds it done).
	BackgroundJobsMax = 10_000
)

// maxStoredAnswer bounds the answer read of a request on a stored
// response (a response object, an input items list).
const maxStoredAnswer = 32 << 20

// storedResponses is a provider type that serves requests on the
// responses it keeps (adapters.OpenAI, adapters.Azure): path is "{id}",
// "{id}/cancel" or "{id}/input_items".
type storedResponses interface {
	ResponseRequest(ctx context.Context, method, path string, query url.Values) (*http.Request, error)
}

// followUpMethods are the methods of each operation on a stored response
// ("", "cancel", "input_items"): the endpoints under api.ResponsePath.
var followUpMethods = func() map[string][]string {
	ops := map[string][]string{}
	for _, e := range api.Endpoints {
		if op, ok := strings.CutPrefix(e.Path, api.ResponsePath); ok {
			ops[strings.TrimPrefix(op, "/")] = e.Methods
		}
	}
	return ops
}()

// responseFollowUp reads a path on a stored response (.../responses/{id},
// .../responses/{id}/cancel, .../responses/{id}/input_items): the id
// (1 to 256 of A-Z, a-z, 0-9, _ and -) and the operation ("", "cancel",
// "input_items"); ok false for any other path.
func responseFollowUp(path string) (id, op string, ok bool) {
	path = strings.TrimSuffix(path, "/")
	under := strings.TrimSuffix(api.ResponsePath, "{id}") // "/responses/"
	i := strings.LastIndex(path, under)
	if i < 0 {
		return "", "", false
	}
	id, op, _ = strings.Cut(path[i+len(under):], "/")
	if _, known := followUpMethods[op]; !known || id == "" || len(id) > 256 ||
		strings.IndexFunc(id, func(c rune) bool {
			return !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-')
		}) >= 0 {
		return "", "", false
	}
	return id, op, true
}

// serveFollowUp sends a request on the stored response id to the
// deployment that made it, and passes its answer on; a poll or cancel
// that finds it done counts its usage (settle). Errors in OpenAI's format.
func (h *Handler) serveFollowUp(w http.ResponseWriter, r *http.Request, who, id, op string) {
	a := api.Responses{}
	if allow := followUpMethods[op]; !slices.Contains(allow, r.Method) {
		w.Header().Set("Allow", strings.Join(allow, ", "))
		a.WriteError(w, api.Errorf(http.StatusMethodNotAllowed, api.MethodNotAllowed, "", "use %s", strings.Join(allow, " or ")))
		return
	}
	d, e := h.ownerDeployment(id, who)
	if e != nil {
		a.WriteError(w, e)
		return
	}
	path := id
	if op != "" {
		path += "/" + op
	}
	resp, e := h.sendStored(r.Context(), d, r.Method, path, r.URL.Query())
	if e != nil {
		a.WriteError(w, e)
		return
	}
	defer resp.Body.Close()
	w.Header().Set(HeaderDeployment, d.Name)
	if resp.StatusCode == http.StatusOK && strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		h.relayStored(w, resp.Body, id, d)
		return
	}
	body, _ := io.ReadAll(io.LimitReader(resp.Body, maxStoredAnswer))
	if e := unreadableStored(d, r.Method, resp.StatusCode, body); e != nil {
		a.WriteError(w, e)
		return
	}
	body = redact.JSON(body, d.Secrets)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(resp.StatusCode)
	_, _ = w.Write(body)
	switch {
	case resp.StatusCode != http.StatusOK || op == "input_items":
	case r.Method == http.MethodDelete:
		h.jobs.take(id).done(0) // nothing left to poll
	default:
		h.settle(id, d, body)
	}
}

// unreadableStored is the 502 (no x-should-retry) for d's answer of status with body to a
// method on a stored response that the client's SDK cannot read: a 2xx
// whose body is not a JSON object (empty, where openai-node's retrieve
// and cancel give undefined; HTML; cut at maxStoredAnswer or by the
// provider), but a delete's (the SDKs read nothing of it); nil otherwise.
func unreadableStored(d *router.Deployment, method string, status int, body []byte) *api.Error {
	if status < 200 || status >= 300 || method == http.MethodDelete || jsonObject(body) {
		return nil
	}
	what := "an empty body"
	if len(bytes.TrimSpace(body)) > 0 {
		what = strconv.Itoa(len(body)) + " bytes that are not a JSON object"
	}
	e := api.Errorf(http.StatusBadGateway, api.Unavailable, "", "deployment %s answered %d with %s, which the client's SDK cannot read: not passed on", d.Name, status, what)
	e.Retryable = true // one attempt, as sendStored's: the client's retry is the only one
	return e
}

// jsonObject reports whether b is one valid JSON object.
func jsonObject(b []byte) bool {
	b = bytes.TrimSpace(b)
	return len(b) > 0 && b[0] == '{' && json.Valid(b)
}

// ownerDeployment is the deployment that made the response id for
// consumer who: a 404 as OpenAI's, saying why, when the router does not
// know it, made it through Chat Completions (no provider keeps it), or no
// longer has that deployment; with consumers configured, one made for
// another consumer is the 404 of an id the router does not know.
func (h *Handler) ownerDeployment(id, who string) (*router.Deployment, *api.Error) {
	o, fromFleet, ok, _ := h.ownerFor(id, who)
	switch {
	case !ok:
		where := "in memory, since no fleet store is configured"
		if h.store != nil {
			where = "in the fleet store"
		}
		return nil, api.Errorf(http.StatusNotFound, api.ResponseNotFound, "",
			"Response with id %s not found: llm_router does not know which provider account made it (it remembers each response it gave for 30 days, %s); it was made elsewhere, or before a restart", strconv.Quote(id), where)
	case o.identity == "":
		return nil, api.Errorf(http.StatusNotFound, api.ResponseNotFound, "",
			"Response with id %s not found: deployment %s made it through Chat Completions, and no provider keeps it", strconv.Quote(id), o.name)
	}
	for _, name := range h.names {
		if d := h.deploymentOf(h.groups[name], o.identity, fromFleet); d != nil {
			return d, nil
		}
	}
	return nil, api.Errorf(http.StatusNotFound, api.ResponseNotFound, "",
		"Response with id %s not found: deployment %s made it, which this configuration no longer has; it stays with that provider account", strconv.Quote(id), o.name)
}

// sendStored sends method on the stored response path to d, its response
// headers within the router's deadline (its body, a stream, is not cut):
// a 502 or 504 when d cannot be reached, a 404 when d keeps no response.
func (h *Handler) sendStored(ctx context.Context, d *router.Deployment, method, path string, query url.Values) (*http.Response, *api.Error) {
	sp, ok := d.Provider.(storedResponses)
	if !ok {
		return nil, api.Errorf(http.StatusNotFound, api.ResponseNotFound, "", "deployment %s keeps no response: its provider type does not serve the Responses API", d.Name)
	}
	req, err := sp.ResponseRequest(ctx, method, path, query)
	if err != nil {
		return nil, api.Errorf(http.StatusNotFound, api.ResponseNotFound, "", "deployment %s: %v", d.Name, err)
	}
	resp, err := headerDeadline{rt: d.Transport, d: h.router.Deadline}.RoundTrip(req)
	switch {
	case err == errHeaderDeadline:
		return nil, api.Errorf(http.StatusGatewayTimeout, api.Deadline, "", "deployment %s did not answer within the deadline", d.Name)
	case err != nil:
		e := api.Errorf(http.StatusBadGateway, api.Unavailable, "", "deployment %s could not be reached", d.Name)
		e.Retryable = true
		return nil, e
	}
	return resp, nil
}

// relayStored passes a stored response's events on as they come, and
// settles it at its last; the stream ends when the provider is silent for
// the deployment's idle timeout.
func (h *Handler) relayStored(w http.ResponseWriter, body io.ReadCloser, id string, d *router.Deployment) {
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	idle := d.IdleTimeout
	if idle <= 0 {
		idle = router.DefaultIdleTimeout
	}
	cut := time.AfterFunc(idle, func() { body.Close() })
	defer cut.Stop()
	rd := provider.NewSSEReader(body)
	for {
		ev, err := rd.Next()
		if err != nil {
			return
		}
		cut.Reset(idle)
		if ev.Comment {
			continue
		}
		if provider.WriteEvent(w, ev.Name, ev.Data) != nil {
			return
		}
		_ = rc.Flush()
		if response, ok := api.TerminalResponse(ev.Data); ok {
			h.settle(id, d, response)
		}
	}
}

// settle counts, once, the usage of the background response id that
// answer (a response object of d's) shows done, and reports whether it
// is; one not done defers the router's own poll.
func (h *Handler) settle(id string, d *router.Deployment, answer []byte) bool {
	if !api.ResponseDone(answer) {
		h.jobs.deferPoll(id)
		return false
	}
	group, j, ok := h.claim(id) // j: its consumer, when this config made it
	defer j.done(0)             // its hold ends with it (once: spendConsumer ends it first)
	if !ok {
		return true
	}
	if u, stated := provider.UsageOf(provider.Responses, answer); stated {
		h.router.Spend(d, h.groups[group], u)
		if h.metrics != nil {
			h.metrics.usage(group, d.Name, u, d.Cost(u))
		}
		if j != nil {
			h.spendConsumer(j, u, d.Cost(u)) // consumers.go
		}
	}
	return true
}

// claim takes the background response id's uncounted usage: true for the
// one caller that takes it (in fleet mode, the fleet store decides, else
// this config's own record), with its model group's name; and the job
// this config polled it by, which the caller ends (nil: none, or another
// caller took it).
func (h *Handler) claim(id string) (string, *backgroundJob, bool) {
	j := h.jobs.take(id)
	if h.store != nil {
		if group, ok, err := h.store.ClaimPending(id); err == nil {
			return group, j, ok
		}
	}
	if j == nil {
		return "", nil, false
	}
	return j.group, j, true
}

// trackBackground follows the background response c.made that c's
// request created, when its answer (res) did not count its usage (a
// stream that reached response.completed did): recorded as pending (in
// the fleet too), and polled by the router (pollBackground). The job
// holds its consumer's limits (c.admitted's ticket: a place in flight,
// its worst case of the budget) until it ends, not until its create is
// answered: it runs, and spends, at the provider until then.
func (h *Handler) trackBackground(c *apiCall, res *router.Result, group string) {
	req, id := c.req, c.made
	if id == "" || res.Deployment == nil || res.Format != provider.Responses || !api.IsBackground(req) {
		return
	}
	if res.Stream != nil {
		if _, ok := res.Stream.Usage(); ok {
			return
		}
	} else if res.Err != nil || res.UsageStated {
		return
	}
	if res.Group != nil {
		group = res.Group.Name
	}
	if h.store != nil {
		h.store.MarkPending(id, group, ResponseOwnersTTL)
	}
	if !h.jobs.add(id, res.Deployment, group, req.Consumer, h.router.Clock, h.pollBackground, c.admitted.hold(c.cost)) {
		h.logger.Warn("background responses: too many to poll; this one's usage is counted when a client's poll finds it done",
			zap.String("deployment", res.Deployment.Name), zap.Int("max", BackgroundJobsMax))
		return
	}
	c.admitted.kept() // the job's now: its end, not the create's, ends the hold
}

// pollBackground is the router's own poll of the background response id:
// done, it is settled; gone (404: deleted, expired), forgotten; else
// polled again later, within BackgroundPollFor.
func (h *Handler) pollBackground(id string) {
	j := h.jobs.get(id)
	if j == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), h.router.Deadline)
	defer cancel()
	if resp, e := h.sendStored(ctx, j.d, http.MethodGet, id, nil); e == nil {
		body, _ := io.ReadAll(io.LimitReader(resp.Body, maxStoredAnswer))
		resp.Body.Close()
		switch {
		case resp.StatusCode == http.StatusOK && h.settle(id, j.d, body):
			return
		case resp.StatusCode == http.StatusNotFound:
			h.jobs.take(id).done(0)
			return
		}
	}
	if !h.jobs.again(id, h.router.Clock) {
		h.logger.Warn("background response not done within the bound: its usage is counted only if a client's poll finds it done",
			zap.String("deployment", j.d.Name), zap.Duration("bound", BackgroundPollFor))
	}
}

// backgroundJob is a background response the router polls.
type backgroundJob struct {
	d       *router.Deployment
	group   string
	who     string // the consumer that created it (consumers.go)
	started time.Time
	every   time.Duration
	timer   router.Timer
	// hold ends its consumer's hold on its limits (admission.hold), its
	// answer having cost usd (0: unknown); nil: none.
	hold func(usd float64)
}

// done ends j's hold on its consumer's limits, its answer having cost usd
// (0: unknown), and reports whether it held them; once (a nil job: none).
func (j *backgroundJob) done(usd float64) bool {
	if j == nil || j.hold == nil {
		return false
	}
	j.hold(usd)
	return true
}

// backgroundJobs are a config's background responses whose usage is not
// counted yet, BackgroundJobsMax at most; the zero value is ready.
type backgroundJobs struct {
	mu     sync.Mutex
	m      map[string]*backgroundJob
	closed bool
}

// add polls id with poll from BackgroundPollFirst on clock, its consumer's
// hold ended by hold (nil: none); false when there are BackgroundJobsMax
// already (or the config is gone).
func (b *backgroundJobs) add(id string, d *router.Deployment, group, who string, clock router.Clock, poll func(string), hold func(float64)) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed || len(b.m) >= BackgroundJobsMax {
		return false
	}
	if b.m == nil {
		b.m = map[string]*backgroundJob{}
	}
	j := &backgroundJob{d: d, group: group, who: who, started: clock.Now(), every: BackgroundPollFirst, hold: hold}
	j.timer = clock.AfterFunc(j.every, func() { poll(id) })
	b.m[id] = j
	return true
}

func (b *backgroundJobs) get(id string) *backgroundJob {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.m[id]
}

// take forgets id and stops its polls: its job, nil when none.
func (b *backgroundJobs) take(id string) *backgroundJob {
	b.mu.Lock()
	defer b.mu.Unlock()
	j := b.m[id]
	if j != nil {
		j.timer.Stop()
		delete(b.m, id)
	}
	return j
}

// deferPoll puts id's next poll off by its interval: a client polls it.
func (b *backgroundJobs) deferPoll(id string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if j := b.m[id]; j != nil {
		j.timer.Reset(j.every)
	}
}

// again schedules id's next poll at twice the interval
// (BackgroundPollMaxEvery at most); false, and id forgotten (its hold
// ended), once BackgroundPollFor has passed since its create.
func (b *backgroundJobs) again(id string, clock router.Clock) bool {
	b.mu.Lock()
	j := b.m[id]
	switch {
	case j == nil:
	case clock.Now().Sub(j.started) >= BackgroundPollFor:
		delete(b.m, id)
		b.mu.Unlock()
		j.done(0)
		return false
	default:
		j.every = min(2*j.every, BackgroundPollMaxEvery)
		j.timer.Reset(j.every)
	}
	b.mu.Unlock()
	return true
}

// stop stops every poll and ends the jobs' holds: the config is gone.
func (b *backgroundJobs) stop() {
	b.mu.Lock()
	b.closed = true
	jobs := b.m
	b.m = nil
	b.mu.Unlock()
	for _, j := range jobs {
		j.timer.Stop()
		j.done(0)
	}
}
