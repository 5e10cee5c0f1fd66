package llmrouter

import (
	"context"
	"io"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/llmrouter/caddy-llm-router/internal/adapters"
	"github.com/llmrouter/caddy-llm-router/internal/router"
	"github.com/llmrouter/caddy-llm-router/internal/wire/messages"
	"github.com/llmrouter/caddy-llm-router/provider"
)

// The bills below are each provider's own arithmetic on the tokens its
// usage block states (USD per 1M tokens), written out here rather than
// taken from the router's defaults:
//
//   - Anthropic, and Claude on Bedrock and Vertex: uncached input at the
//     input price, 5-minute cache writes at 1.25x it, 1-hour writes at 2x,
//     cache reads at 0.1x, output at the output price
//     (https://docs.anthropic.com/en/docs/build-with-claude/prompt-caching#pricing).
//   - OpenAI and Azure: cached_tokens (part of prompt_tokens) at the
//     model's cached-input price, the rest of the prompt at the input
//     price (https://platform.openai.com/docs/pricing).
//   - Gemini: cachedContentTokenCount (part of promptTokenCount) at the
//     context-caching price, 0.1x input for Gemini 2.5
//     (https://ai.google.dev/gemini-api/docs/pricing); thoughts are output.
//   - Bedrock Converse (Amazon Nova): cache reads at the model's cached
//     price, writes at the input price
//     (https://aws.amazon.com/bedrock/pricing/).

// claudeBill is Anthropic's bill at Sonnet's prices ($3 in, $15 out).
func claudeBill(input, write5m, write1h, read, output float64) float64 {
	const in, out = 3.0, 15.0
	return (input*in + write5m*1.25*in + write1h*2*in + read*0.1*in + output*out) / 1e6
}

// openAIBill is OpenAI's bill at gpt-4o's prices ($2.50 in, $1.25 cached,
// $10 out): prompt counts the cached tokens too.
func openAIBill(prompt, cached, completion float64) float64 {
	return ((prompt-cached)*2.5 + cached*1.25 + completion*10) / 1e6
}

// geminiBill is Gemini's bill at 2.5 Pro's prices ($1.25 in, $0.125
// cached, $10 out): prompt counts the cached tokens too.
func geminiBill(prompt, cached, candidates, thoughts float64) float64 {
	return ((prompt-cached)*1.25 + cached*0.125 + (candidates+thoughts)*10) / 1e6
}

const (
	chatBody     = `{"model":"m","max_tokens":100,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"hi"}]}`
	messagesBody = `{"model":"m","max_tokens":100,"messages":[{"role":"user","content":"hi"}]}`
)

func TestBillAsProviderBills(t *testing.T) {
	sonnet := Deployment{CostInput: 3, CostOutput: 15}
	gpt4o := Deployment{CostInput: 2.5, CostOutput: 10, CostCachedInput: ptr(1.25)}
	gemini := Deployment{CostInput: 1.25, CostOutput: 10}
	nova := Deployment{CostInput: 0.8, CostOutput: 3.2, CostCachedInput: ptr(0.2)}
	mixed := claudeBill(25, 2000, 1000, 4409, 300)
	cases := []struct {
		name, typ, model string
		prices           Deployment
		client           provider.Format
		file             string // in testdata/bills; .sse: a stream
		want             float64
	}{
		// The figures: a 5-minute write of 12,304 tokens, a 1-hour one of 10,000.
		{"anthropic 5m write", "anthropic", "claude-sonnet-4-5", sonnet, provider.Messages, "anthropic-5m.json", 0.054399},
		{"anthropic 1h write", "anthropic", "claude-sonnet-4-5", sonnet, provider.Messages, "anthropic-1h.json", 0.06165},
		{"anthropic mixed", "anthropic", "claude-sonnet-4-5", sonnet, provider.Messages, "anthropic-mixed.json", mixed},
		{"anthropic mixed stream", "anthropic", "claude-sonnet-4-5", sonnet, provider.Messages, "anthropic-mixed.sse", mixed},
		{"anthropic mixed, chat client", "anthropic", "claude-sonnet-4-5", sonnet, provider.Chat, "anthropic-mixed.json", mixed},
		{"anthropic mixed stream, chat client", "anthropic", "claude-sonnet-4-5", sonnet, provider.Chat, "anthropic-mixed.sse", mixed},
		{"bedrock claude", "bedrock", "us.anthropic.claude-sonnet-4-5-20250929-v1:0", sonnet, provider.Messages, "anthropic-mixed.json", mixed},
		{"bedrock claude, chat client", "bedrock", "us.anthropic.claude-sonnet-4-5-20250929-v1:0", sonnet, provider.Chat, "anthropic-1h.json", claudeBill(50, 0, 10000, 0, 100)},
		{"bedrock converse", "bedrock", "amazon.nova-pro-v1:0", nova, provider.Chat, "converse-cached.json", (100*0.8 + 2000*0.2 + 1500*0.8 + 50*3.2) / 1e6},
		{"vertex claude", "vertex", "claude-sonnet-4-5@20250929", sonnet, provider.Messages, "anthropic-mixed.json", mixed},
		{"vertex claude, chat client", "vertex", "claude-sonnet-4-5@20250929", sonnet, provider.Chat, "anthropic-5m.json", 0.054399},
		{"vertex gemini", "vertex", "gemini-2.5-pro", gemini, provider.Chat, "gemini-cached.json", geminiBill(11500, 10000, 1000, 500)},
		{"gemini", "gemini", "gemini-2.5-pro", gemini, provider.Chat, "gemini-cached.json", geminiBill(11500, 10000, 1000, 500)},
		{"gemini stream", "gemini", "gemini-2.5-pro", gemini, provider.Chat, "gemini-cached.sse", geminiBill(11500, 10000, 1000, 500)},
		{"openai", "openai", "gpt-4o", gpt4o, provider.Chat, "openai-cached.json", openAIBill(2006, 1920, 300)},
		{"openai stream", "openai", "gpt-4o", gpt4o, provider.Chat, "openai-cached.sse", openAIBill(2006, 1920, 300)},
		{"azure", "azure", "gpt-4o", gpt4o, provider.Chat, "openai-cached.json", openAIBill(2006, 1920, 300)},
		{"azure stream", "azure", "gpt-4o", gpt4o, provider.Chat, "openai-cached.sse", openAIBill(2006, 1920, 300)},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			u := decodeUsage(t, c.typ, c.model, c.client, c.file)
			dc := c.prices
			dc.Model = c.model
			d := &router.Deployment{CostInput: dc.CostInput, CostOutput: dc.CostOutput}
			setPrices(d, billProvider(c.typ), &dc)
			if got := d.Cost(u); math.Abs(got-c.want) > 1e-9 {
				t.Errorf("cost %.9f USD, the provider bills %.9f (usage %+v)", got, c.want, u)
			}
		})
	}
}

// decodeUsage reads the answer or stream in testdata/bills/file as the
// router does for a client of format client on a deployment of the
// provider type typ: the adapter's plan decodes it into the plan's
// format, and provider.UsageOf or a provider.UsageCounter reads its usage.
func decodeUsage(t *testing.T, typ, model string, client provider.Format, file string) provider.Usage {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join("testdata", "bills", file))
	if err != nil {
		t.Fatal(err)
	}
	stream := strings.HasSuffix(file, ".sse")
	body := chatBody
	if client == provider.Messages {
		body = messagesBody
	}
	req := &provider.Request{Format: client, Body: []byte(body), Stream: stream, Choices: 1, IncludeUsage: true}
	if client == provider.Messages {
		req.ToChat = messages.ToChat
	}
	plan, err := billProvider(typ).Plan(context.Background(), model, req)
	if err != nil {
		t.Fatal(err)
	}
	if !stream {
		out, err := plan.Answer(raw)
		if err != nil {
			t.Fatal(err)
		}
		u, ok := provider.UsageOf(plan.Format(), out)
		if !ok {
			t.Fatalf("no usage in %s", out)
		}
		return u
	}
	counter := provider.NewUsageCounter(plan.Format(), false)
	in := plan.Stream(strings.NewReader(string(raw)))
	for {
		ev, kind, _, err := in.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		counter.Add(ev)
		if kind == provider.EventDone {
			break
		}
	}
	u, ok := counter.Usage()
	if !ok {
		t.Fatal("no usage in the stream")
	}
	return u
}

func ptr(f float64) *float64 { return &f }

// billProvider is the built-in provider type typ on a made-up account.
func billProvider(typ string) provider.Provider {
	ep := provider.Endpoint{BaseURL: "https://provider.invalid/v1"}
	switch typ {
	case "openai":
		return &adapters.OpenAI{Endpoint: ep}
	case "azure":
		return &adapters.Azure{Endpoint: ep}
	case "anthropic":
		return &adapters.Anthropic{Endpoint: ep}
	case "gemini":
		return &adapters.Gemini{Endpoint: ep}
	case "bedrock":
		return &adapters.Bedrock{Endpoint: ep}
	case "vertex":
		return &adapters.Vertex{Endpoint: ep, Project: "p", Location: "us-east5"}
	}
	panic("no provider type " + typ)
}
