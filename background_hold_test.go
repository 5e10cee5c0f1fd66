package llmrouter

import (
	"net/http"
	"testing"

	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"

	"github.com/llmrouter/caddy-llm-router/internal/jsonbody"
)

// bgConsumerRouter is a router of consumers named by X-Team, on plan
// default's limits (plan, its Caddyfile body), over account a (model group
// ga, at 1000 USD per million tokens in and out), with the manual clock.
func bgConsumerRouter(t *testing.T, a *bgAccount, plan string) (*Handler, *bgClock) {
	t.Helper()
	var h Handler
	if err := h.UnmarshalCaddyfile(caddyfile.NewTestDispenser(`llm_router {
		consumer {http.request.header.X-Team}
		plan default {
			` + plan + `
		}
		provider a {
			type openai
			base_url ` + a.srv.URL + `/v1
			api_key ` + a.key + `
			responses native
		}
		model ga {
			deployment a gpt-x {
				cost_input 1000
				cost_output 1000
			}
		}
	}`)); err != nil {
		t.Fatal(err)
	}
	if err := h.Provision(newCaddyContext(t)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = h.Cleanup() })
	clock := newBGClock()
	h.router.Clock = clock
	return &h, clock
}

// createAs sends a background create of max_output_tokens 1000 (a worst
// case of about 1.01 USD at 1000 USD per million) for team alice: its
// status, the response's id and the limit a 429 names.
func createAs(t *testing.T, h *Handler) (int, string, string) {
	t.Helper()
	w, _, _ := askAs(h, "/v1/responses", `{"model":"ga","input":"Write a very long novel about otters in space.","background":true,"max_output_tokens":1000}`,
		http.Header{"X-Team": {"alice"}})
	id, _ := jsonbody.GetString(w.Body.Bytes(), "id")
	return w.Code, id, w.Header().Get(HeaderConsumerLimit)
}

// A background job holds its consumer's limits until it ends, not until
// its create is answered ("queued"): the job runs, and spends, at the
// provider until then. With concurrent 1 a second job is refused 429
// concurrent while the first runs (200 before: the hold ended with the
// create); with a budget of 1.5 USD that holds one job's worst case
// (about 1.01 USD) and a part of another's, 2 jobs start and the third
// is refused 429 budget (all 3 started before). Once the router's poll
// finds a job done, its hold is settled at its real cost (a few cents)
// and the consumer may start another.
func TestABackgroundJobHoldsItsConsumersLimitsUntilItEnds(t *testing.T) {
	for _, c := range []struct {
		name, plan, limit string
		started           int
	}{{"concurrent", "concurrent 1", "concurrent", 1}, {"budget", "budget 1.5 per 24h", "budget", 2}} {
		a := newBGAccount(t, "sk-bg-a", "h"+c.name)
		h, clock := bgConsumerRouter(t, a, c.plan)
		var ids []string
		for i := range c.started + 1 {
			code, id, limit := createAs(t, h)
			if i < c.started {
				if code != 200 || id == "" {
					t.Fatalf("%s: job %d: expected 200 queued, got %d", c.name, i+1, code)
				}
				ids = append(ids, id)
				continue
			}
			if code != http.StatusTooManyRequests || limit != c.limit {
				t.Errorf("%s: job %d while %d run: expected 429 %s, got %d (limit %q)", c.name, i+1, len(ids), c.limit, code, limit)
			}
		}
		if a.count("POST create") != c.started {
			t.Errorf("%s: expected %d creates at the provider, got %d", c.name, c.started, a.count("POST create"))
		}
		a.finish(ids[0])
		clock.Advance(BackgroundPollFirst) // the router's poll finds it done: its hold settles
		if code, _, limit := createAs(t, h); code != 200 {
			t.Errorf("%s: once a job is done: expected another admitted, got %d (limit %q)", c.name, code, limit)
		}
	}
}
