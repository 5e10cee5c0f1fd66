package integration

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/openai/openai-go/v3"
)

// usageConfig is a router whose group "paid" (prefix names its
// deployments) is deployment a (:9081, OpenAI's format), then b (:9082,
// tier 2: only when a cannot serve),
// and whose group "claude" is one Anthropic deployment (:9083); each with
// prices, and the extra deployment and group settings given.
func usageConfig(prefix, groupExtra, aExtra string) string {
	return fmt.Sprintf(`
http://localhost:9080 {
	llm_router /v1/* {
		provider a {
			type openai
			base_url http://localhost:9081/v1
			api_key none
		}
		provider b {
			type openai
			base_url http://localhost:9082/v1
			api_key none
		}
		provider an {
			type anthropic
			base_url http://localhost:9083/v1
			api_key sk-ant
		}
		model paid {
			%[2]s
			deployment a %[1]s-a {
				quality 0.9
				cost_input 2
				cost_output 8
				%[3]s
			}
			deployment b %[1]s-b {
				tier 2
				cost_input 1
				cost_output 1
			}
		}
		model claude {
			deployment an %[1]s-claude {
				cost_input 3
				cost_output 15
			}
		}
	}
}
http://localhost:9081 {
	llm_mock {
		reply "From a."
	}
}
http://localhost:9082 {
	llm_mock {
		reply "From b."
	}
}
http://localhost:9083 {
	llm_mock {
		dialect anthropic
		api_key sk-ant
		reply "From claude."
	}
}
`, prefix, groupExtra, aExtra)
}

// deploymentUsage reads a deployment's usage from the admin endpoint.
func deploymentUsage(t *testing.T, name string) (total struct {
	Answers           int64   `json:"answers"`
	InputTokens       int64   `json:"input_tokens"`
	OutputTokens      int64   `json:"output_tokens"`
	CachedInputTokens int64   `json:"cached_input_tokens"`
	CostUSD           float64 `json:"cost_usd"`
}) {
	t.Helper()
	resp, err := http.Get("http://localhost:2999/llm_router/deployments")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var st struct {
		Deployments []struct {
			Name  string          `json:"name"`
			Usage json.RawMessage `json:"usage"`
		} `json:"deployments"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		t.Fatal(err)
	}
	for _, d := range st.Deployments {
		if d.Name == name {
			var u struct {
				Total json.RawMessage `json:"total"`
			}
			_ = json.Unmarshal(d.Usage, &u)
			_ = json.Unmarshal(u.Total, &total)
			return total
		}
	}
	t.Fatalf("no deployment %s in the admin endpoint", name)
	return total
}

// Every answer's usage, as the provider stated it, is counted per
// deployment (admin endpoint, metrics) with its cost at the deployment's
// prices, streamed or not, for Chat and Messages clients; a Chat client
// that did not ask for the usage of its stream sees none, one that asked
// gets it.
func TestUsageAndCostAreCounted(t *testing.T) {
	load(t, usageConfig("use", "", ""))
	// The metrics count since the process began (go test -count=N runs
	// this again in the same process): what this test adds is compared.
	series := []string{`llm_router_tokens_total{deployment="a/use-a",kind="input",model_group="paid"}`,
		`llm_router_tokens_total{deployment="a/use-a",kind="output",model_group="paid"}`,
		`llm_router_tokens_total{deployment="an/use-claude",kind="output",model_group="claude"}`}
	before := metricValues(t, series)
	a0, c0 := deploymentUsage(t, "a/use-a"), deploymentUsage(t, "an/use-claude")
	var last *http.Response
	client := openAIClient(&last)
	params := openai.ChatCompletionNewParams{Model: "paid", Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Say hello.")}}
	c, err := client.Chat.Completions.New(context.Background(), params)
	if err != nil {
		t.Fatal(err)
	}
	one := c.Usage
	if one.PromptTokens == 0 || one.CompletionTokens == 0 {
		t.Fatalf("the mock states usage: %+v", one)
	}
	// Streamed without include_usage: no usage reaches the client.
	s := client.Chat.Completions.NewStreaming(context.Background(), params)
	chunks := 0
	for s.Next() {
		chunks++
		if s.Current().JSON.Usage.Valid() && s.Current().Usage.TotalTokens > 0 {
			t.Errorf("a chunk with usage the client did not ask for: %s", s.Current().RawJSON())
		}
	}
	if err := s.Err(); err != nil || chunks == 0 {
		t.Fatalf("%d chunks, %v", chunks, err)
	}
	// Streamed with it: the usage comes.
	params.StreamOptions = openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)}
	s = client.Chat.Completions.NewStreaming(context.Background(), params)
	var streamed openai.CompletionUsage
	for s.Next() {
		if s.Current().Usage.TotalTokens > 0 {
			streamed = s.Current().Usage
		}
	}
	if err := s.Err(); err != nil || streamed.CompletionTokens != one.CompletionTokens {
		t.Fatalf("asked for usage: %+v %v", streamed, err)
	}
	// A stream's usage is recorded when it ends, just after the client
	// read its end. The router asked for the usage of the first stream
	// with the stream_options the client sent in the second: same size,
	// so the mock (which counts a prompt's bytes) counts the same.
	var u = deploymentUsage(t, "a/use-a")
	for i := 0; i < 100 && u.Answers < a0.Answers+3; i++ {
		time.Sleep(10 * time.Millisecond)
		u = deploymentUsage(t, "a/use-a")
	}
	in, out := one.PromptTokens+2*streamed.PromptTokens, one.CompletionTokens+2*streamed.CompletionTokens
	cost := (float64(in)*2 + float64(out)*8) / 1e6
	if u.Answers-a0.Answers != 3 || u.InputTokens-a0.InputTokens != in || u.OutputTokens-a0.OutputTokens != out ||
		math.Abs(u.CostUSD-a0.CostUSD-cost) > 1e-12 {
		t.Errorf("deployment a: %+v, want 3 answers, %d in, %d out, $%g", u, in, out, cost)
	}

	// A Messages client, streamed.
	ac := anthropicClient(&last)
	ms := ac.Messages.NewStreaming(context.Background(), anthropic.MessageNewParams{Model: "claude", MaxTokens: 64,
		Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("Say hello."))}})
	var msg anthropic.Message
	for ms.Next() {
		if err := msg.Accumulate(ms.Current()); err != nil {
			t.Fatal(err)
		}
	}
	if err := ms.Err(); err != nil {
		t.Fatal(err)
	}
	cu := deploymentUsage(t, "an/use-claude")
	for i := 0; i < 100 && cu.Answers < c0.Answers+1; i++ {
		time.Sleep(10 * time.Millisecond)
		cu = deploymentUsage(t, "an/use-claude")
	}
	if cu.Answers-c0.Answers != 1 || cu.InputTokens-c0.InputTokens != msg.Usage.InputTokens+msg.Usage.CacheReadInputTokens+msg.Usage.CacheCreationInputTokens ||
		cu.OutputTokens-c0.OutputTokens != msg.Usage.OutputTokens || msg.Usage.OutputTokens == 0 {
		t.Errorf("claude: %+v, the client saw %+v", cu, msg.Usage)
	}

	after := metricValues(t, series)
	for i, want := range []int64{in, out, msg.Usage.OutputTokens} {
		if got := after[i] - before[i]; got != float64(want) {
			t.Errorf("metrics: expected %s to grow by %d, it grew by %v", series[i], want, got)
		}
	}
	if !strings.Contains(metricsBody(t), `llm_router_cost_usd_total{deployment="a/use-a",model_group="paid"} `) {
		t.Error("metrics: expected the cost of a/use-a")
	}
}

func metricsBody(t *testing.T) string {
	t.Helper()
	resp, err := http.Get("http://localhost:2999/metrics")
	if err != nil {
		t.Fatal(err)
	}
	return readBody(t, resp)
}

// metricValues reads the values of the given series (0 when absent).
func metricValues(t *testing.T, series []string) []float64 {
	t.Helper()
	body := metricsBody(t)
	out := make([]float64, len(series))
	for i, s := range series {
		for _, line := range strings.Split(body, "\n") {
			if v, ok := strings.CutPrefix(line, s+" "); ok {
				if _, err := fmt.Sscan(v, &out[i]); err != nil {
					t.Fatalf("%s: %v", line, err)
				}
			}
		}
	}
	return out
}

// Budgets: deployment a's budget holds its first request's worst case
// (max_tokens 5) and is then too spent to hold another, so the next
// request goes to b at once; the group's budget, spent after that,
// answers 429 with Retry-After and no attempt.
func TestBudgetsSpend(t *testing.T) {
	// An answer of a costs about $0.00008, of b $0.00002 (the mock's 18
	// prompt and 5 output tokens at their prices).
	load(t, usageConfig("bud", "budget 0.0002 per 1h", "budget 0.0001 per 1h"))
	var last *http.Response
	client := openAIClient(&last)
	params := openai.ChatCompletionNewParams{Model: "paid", MaxTokens: openai.Int(5),
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Say hello.")}}
	for i, want := range []string{"a/bud-a", "b/bud-b"} {
		if _, err := client.Chat.Completions.New(context.Background(), params); err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		if got := last.Header.Get("X-LLM-Router-Deployment"); got != want || last.Header.Get("X-LLM-Router-Attempts") != "1" {
			t.Errorf("request %d: %s after %s attempts, want %s at once", i, got, last.Header.Get("X-LLM-Router-Attempts"), want)
		}
	}
	// Spend the group's budget with b's answers.
	var err error
	for i := 0; i < 40 && err == nil; i++ {
		_, err = client.Chat.Completions.New(context.Background(), params)
	}
	var apiErr *openai.Error
	if err == nil || !errors.As(err, &apiErr) || apiErr.StatusCode != 429 || !strings.Contains(apiErr.Message, "model group paid: budget of $0.0002 per 1h") ||
		last.Header.Get("Retry-After") == "" || last.Header.Get("X-LLM-Router-Attempts") != "0" {
		t.Errorf("the group's budget: %v (Retry-After %q, attempts %q)", err, last.Header.Get("Retry-After"), last.Header.Get("X-LLM-Router-Attempts"))
	}
	resp, err := http.Get("http://localhost:2999/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body := readBody(t, resp)
	for _, want := range []string{`llm_router_budget_usd{name="paid",scope="model_group"} 0.0002`, `llm_router_budget_spent_usd{name="a/bud-a",scope="deployment"}`} {
		if !strings.Contains(body, want) {
			t.Errorf("metrics: expected %s", want)
		}
	}
}
