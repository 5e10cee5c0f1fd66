package router

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/llmrouter/caddy-llm-router/provider"
)

// A hedge's loser, cut while its provider worked, is charged its prompt
// and max_tokens on its deployment (chargeLeft), and the request's
// Result says so (Charged), so that what the request cost its consumer
// is what it cost the deployments: the answer's usage and the loser's.
func TestAHedgesLoserIsChargedToTheRequest(t *testing.T) {
	c := newFakeClock()
	slow := newGate(reply(200, okBody))
	a := &script{replies: []func(*http.Request) (*http.Response, error){slow.reply}}
	b := &script{replies: []func(*http.Request) (*http.Response, error){reply(200, strings.Replace(okBody, `"hi"`, `"from b"`, 1))}}
	da, db := deployment("a", a), deployment("b", b)
	da.Quality = 1
	r, _ := hedgeRouter(c)
	req := Request{Request: chatReq.Request, Tokens: chatReq.Tokens, PromptTokens: 100, OutputTokens: 50}
	done := make(chan *Result, 1)
	go func() { done <- r.Serve(context.Background(), []*Deployment{da, db}, &req) }()
	eventually(t, "a's attempt", func() bool { return a.calls.Load() == 1 })
	c.Advance(2 * time.Second)
	res := <-done
	if res.Err != nil || res.Deployment != db || res.Hedge != HedgeWon {
		t.Fatalf("expected b's answer, hedge won; got %v %v %q", res.Err, res.Deployment, res.Hedge)
	}
	got := res.Charged()
	if len(got) != 1 || got[0].Deployment != da || got[0].Usage != (provider.Usage{InputTokens: 100, OutputTokens: 50}) {
		t.Errorf("expected the loser a charged its prompt and max_tokens (100 and 50 tokens), got %+v", got)
	}
}
