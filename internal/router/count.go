package router

import (
	"context"
	"errors"
	"io"
	"net/http"

	"github.com/llmrouter/caddy-llm-router/internal/jsonbody"
	"github.com/llmrouter/caddy-llm-router/provider"
)

// servedBy reports whether d may take req at all: its provider serves
// req's format and, for a count of tokens (Request.CountTokens), counts
// them (provider.TokenCounter).
func (req *Request) servedBy(d *Deployment) bool {
	if req.CountTokens {
		_, ok := d.Provider.(provider.TokenCounter)
		return ok && d.Provider.Serves(provider.Messages)
	}
	return d.Provider.Serves(req.Format)
}

// servedByAny reports whether some deployment of group may take req
// (servedBy).
func (req *Request) servedByAny(group []*Deployment) bool {
	for _, d := range group {
		if req.servedBy(d) {
			return true
		}
	}
	return false
}

// servedByChain reports whether some deployment of g or of its fallback
// groups (those it may use) may take req (servedBy).
func (req *Request) servedByChain(g *Group) bool {
	for hop := range req.chain(g) {
		if req.servedByAny(hop.Deployments) {
			return true
		}
	}
	return false
}

// countsApart reports whether each deployment of group that counts tokens
// (provider.TokenCounter) has a capacity state of its counts' own
// (Deployment.CountState): its counts of tokens and its other requests
// then share no capacity.
func countsApart(group []*Deployment) bool {
	for _, d := range group {
		if _, ok := d.Provider.(provider.TokenCounter); ok && d.CountState == nil {
			return false
		}
	}
	return true
}

// planOn asks d's provider for the plan of one attempt of req: a count's
// (countPlan) when req counts tokens, else Provider.Plan's of the request
// as d is sent it.
func (req *Request) planOn(ctx context.Context, d *Deployment) (provider.Plan, error) {
	if !req.CountTokens {
		return d.Provider.Plan(ctx, d.Model, req.forDeployment(d))
	}
	tc, ok := d.Provider.(provider.TokenCounter)
	if !ok {
		return nil, errors.New("the provider does not count tokens")
	}
	up, err := tc.CountTokensRequest(ctx, d.Model, req.Body, req.Header)
	if err != nil {
		return nil, err
	}
	return countPlan{up}, nil
}

// countPlan is one attempt of a count of tokens: the provider's request
// (provider.TokenCounter.CountTokensRequest), its answer passed on in the
// Messages format as the provider sent it.
type countPlan struct{ req *http.Request }

func (p countPlan) Request() *http.Request         { return p.req }
func (countPlan) Format() provider.Format          { return provider.Messages }
func (countPlan) Native() bool                     { return true }
func (countPlan) Stream(io.Reader) provider.Stream { return nil }

// Answer implements provider.Plan: a count is a JSON object whose
// input_tokens is a number (Anthropic's {"input_tokens": n}); anything
// else is no answer, and the attempt fails over.
func (countPlan) Answer(body []byte) ([]byte, error) {
	start, _, err := jsonbody.FindMember(body, "input_tokens")
	if err != nil || start < 0 || body[start] < '0' || body[start] > '9' {
		return nil, errors.New("a count of tokens without input_tokens")
	}
	return body, nil
}
