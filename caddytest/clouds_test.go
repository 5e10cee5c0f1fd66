package integration

import (
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2"
	aoption "github.com/anthropics/anthropic-sdk-go/v2/option"
	"github.com/openai/openai-go/v3"
)

// Claude on three clouds: one model group over Anthropic's API (:9081),
// Amazon Bedrock (:9082, SigV4 checked by the mock with the AWS SDK) and
// Google Vertex AI (:9083, access tokens from the mock's own OAuth token
// endpoint, fetched by Google's auth library from a service account whose
// token_uri points there).

const (
	cloudAKID   = "AKIDCLOUDTEST0000001"
	cloudSecret = "cloud/test/secret/0000000000000000000000"
)

// cloudCredentials sets up the credentials both cloud types find in the
// environment, away from the machine's own: static AWS keys, and a
// service account's JSON key whose token_uri is the vertex mock's.
func cloudCredentials(t *testing.T, secret string) {
	t.Helper()
	dir := t.TempDir()
	for _, k := range []string{"AWS_SESSION_TOKEN", "AWS_PROFILE", "AWS_BEARER_TOKEN_BEDROCK", "AWS_ROLE_ARN", "AWS_WEB_IDENTITY_TOKEN_FILE"} {
		t.Setenv(k, "")
		os.Unsetenv(k)
	}
	t.Setenv("AWS_CONFIG_FILE", filepath.Join(dir, "config"))
	t.Setenv("AWS_SHARED_CREDENTIALS_FILE", filepath.Join(dir, "credentials"))
	t.Setenv("AWS_EC2_METADATA_DISABLED", "true")
	t.Setenv("AWS_ACCESS_KEY_ID", cloudAKID)
	t.Setenv("AWS_SECRET_ACCESS_KEY", secret)

	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	der, _ := x509.MarshalPKCS8PrivateKey(key)
	sa, _ := json.Marshal(map[string]string{
		"type": "service_account", "project_id": "router-test", "private_key_id": "k1",
		"private_key":  string(pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der})),
		"client_email": "router@router-test.iam.gserviceaccount.com", "client_id": "1",
		"token_uri": "http://localhost:9083/token",
	})
	path := filepath.Join(dir, "sa.json")
	if err := os.WriteFile(path, sa, 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("GOOGLE_APPLICATION_CREDENTIALS", path)
}

// threeClouds is the router and its three mocks, each mock with its own
// extra settings. Groups: claude (anthropic, then bedrock, then vertex, by
// quality), claude-<cloud> (one deployment each), nova (Bedrock's Converse)
// and gemini (Vertex's generateContent). prefix keeps each test's
// deployments (and what the router learned of them) apart.
func threeClouds(prefix, an, br, vx string) string {
	return fmt.Sprintf(`
http://localhost:9080 {
	llm_router /v1/* {
		provider an {
			type anthropic
			base_url http://localhost:9081/v1
			api_key sk-ant
		}
		provider br {
			type bedrock
			region us-east-1
			base_url http://localhost:9082
		}
		provider vx {
			type vertex
			project router-test
			region us-east5
			base_url http://localhost:9083/v1
		}
		model claude {
			deployment an claude-sonnet-4-5-%[1]s {
				quality 0.9
			}
			deployment br us.anthropic.claude-sonnet-4-5-%[1]s-v1:0 {
				quality 0.6
			}
			deployment vx claude-sonnet-4-5-%[1]s@20250929 {
				quality 0.3
			}
		}
		model claude-anthropic {
			deployment an claude-sonnet-4-5-%[1]s
		}
		model claude-bedrock {
			deployment br us.anthropic.claude-sonnet-4-5-%[1]s-v1:0
		}
		model claude-vertex {
			deployment vx claude-sonnet-4-5-%[1]s@20250929
		}
		model nova {
			deployment br amazon.nova-pro-%[1]s-v1:0
		}
		model gemini {
			deployment vx gemini-2.5-flash-%[1]s
		}
	}
}
http://localhost:9081 {
	llm_mock {
		dialect anthropic
		api_key sk-ant
		reply "Hello from anthropic."
		%[2]s
	}
}
http://localhost:9082 {
	llm_mock {
		dialect bedrock
		aws_credentials %[5]s %[6]s
		reply "Hello from bedrock."
		%[3]s
	}
}
http://localhost:9083 {
	llm_mock {
		dialect vertex
		reply "Hello from vertex."
		%[4]s
	}
}
`, prefix, an, br, vx, cloudAKID, cloudSecret)
}

// extendedStats reads the credential counters of an llm_mock site.
type extendedStats struct {
	Requests      int64             `json:"requests"`
	AuthAccepted  int64             `json:"auth_accepted"`
	AuthRefused   int64             `json:"auth_refused"`
	TokensIssued  int64             `json:"tokens_issued"`
	LastPrincipal string            `json:"last_principal"`
	LastModel     string            `json:"last_model"`
	LastBody      string            `json:"last_body"`
	LastHeaders   map[string]string `json:"last_headers"`
}

func cloudStats(t *testing.T, port int) extendedStats {
	t.Helper()
	resp, err := http.Get(fmt.Sprintf("http://localhost:%d/llm_mock/stats", port))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var s extendedStats
	if err := json.NewDecoder(resp.Body).Decode(&s); err != nil {
		t.Fatal(err)
	}
	return s
}

// An Anthropic client keeps its native features on all three clouds: the
// same Messages request (tools, prompt caching, a beta) reaches Anthropic
// as it is, Bedrock through InvokeModel (signed) and Vertex through
// rawPredict (with a token), each in the form its cloud wants, streamed and
// not; the answer comes back as Anthropic's.
func TestClaudeOnThreeCloudsForAnAnthropicClient(t *testing.T) {
	cloudCredentials(t, cloudSecret)
	load(t, threeClouds("native", "", "", ""))
	var last *http.Response
	client := anthropic.NewClient(aoption.WithBaseURL(routerURL+"/"), aoption.WithAPIKey("client-key"),
		aoption.WithMaxRetries(0), aoption.WithResponseInto(&last), aoption.WithHeader("anthropic-beta", "context-1m-2025-08-07"))
	params := func(model string) anthropic.MessageNewParams {
		return anthropic.MessageNewParams{Model: anthropic.Model(model), MaxTokens: 256,
			System: []anthropic.TextBlockParam{{Text: "Be brief.", CacheControl: anthropic.NewCacheControlEphemeralParam()}},
			Tools: []anthropic.ToolUnionParam{{OfTool: &anthropic.ToolParam{Name: "lookup", Description: anthropic.String("Look it up."),
				InputSchema: anthropic.ToolInputSchemaParam{Properties: map[string]any{"q": map[string]any{"type": "string"}}}}}},
			Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("Say hello."))}}
	}
	for _, c := range []struct {
		group, reply, deployment string
		port                     int
		check                    func(s extendedStats) string
	}{
		{"claude-anthropic", "Hello from anthropic.", "an/claude-sonnet-4-5-native", 9081, func(s extendedStats) string {
			if !strings.Contains(s.LastBody, `"model":"claude-sonnet-4-5-native"`) || !strings.Contains(s.LastBody, `"cache_control"`) {
				return "anthropic body " + s.LastBody
			}
			return ""
		}},
		{"claude-bedrock", "Hello from bedrock.", "br/us.anthropic.claude-sonnet-4-5-native-v1:0", 9082, func(s extendedStats) string {
			if s.AuthAccepted == 0 || s.AuthRefused != 0 || s.LastPrincipal != cloudAKID || s.LastModel != "us.anthropic.claude-sonnet-4-5-native-v1:0" ||
				strings.Contains(s.LastBody, `"model"`) || !strings.Contains(s.LastBody, `"anthropic_version":"bedrock-2023-05-31"`) ||
				!strings.Contains(s.LastBody, `"anthropic_beta":["context-1m-2025-08-07"]`) || !strings.Contains(s.LastBody, `"cache_control"`) ||
				!strings.Contains(s.LastBody, `"tools"`) {
				return fmt.Sprintf("bedrock saw %+v", s)
			}
			return ""
		}},
		{"claude-vertex", "Hello from vertex.", "vx/claude-sonnet-4-5-native@20250929", 9083, func(s extendedStats) string {
			if s.AuthAccepted == 0 || s.AuthRefused != 0 || s.TokensIssued == 0 || s.LastPrincipal != "router@router-test.iam.gserviceaccount.com" ||
				strings.Contains(s.LastBody, `"model"`) || !strings.Contains(s.LastBody, `"anthropic_version":"vertex-2023-10-16"`) ||
				!strings.Contains(s.LastBody, `"cache_control"`) || !strings.Contains(s.LastHeaders["Anthropic-Beta"], "context-1m-2025-08-07") {
				return fmt.Sprintf("vertex saw %+v", s)
			}
			return ""
		}},
	} {
		msg, err := client.Messages.New(context.Background(), params(c.group))
		if err != nil {
			t.Fatalf("%s: %v", c.group, err)
		}
		if len(msg.Content) == 0 || msg.Content[0].Text != c.reply || last.Header.Get("X-LLM-Router-Deployment") != c.deployment {
			t.Errorf("%s: %+v via %s", c.group, msg.Content, last.Header.Get("X-LLM-Router-Deployment"))
		}
		if problem := c.check(cloudStats(t, c.port)); problem != "" {
			t.Errorf("%s: %s", c.group, problem)
		}

		s := client.Messages.NewStreaming(context.Background(), params(c.group))
		var acc anthropic.Message
		for s.Next() {
			if err := acc.Accumulate(s.Current()); err != nil {
				t.Fatal(err)
			}
		}
		if err := s.Err(); err != nil {
			t.Fatalf("%s stream: %v", c.group, err)
		}
		if len(acc.Content) == 0 || acc.Content[0].Text != c.reply || acc.StopReason != anthropic.StopReasonEndTurn {
			t.Errorf("%s stream: %+v stop %q", c.group, acc.Content, acc.StopReason)
		}
		if problem := c.check(cloudStats(t, c.port)); problem != "" {
			t.Errorf("%s stream: %s", c.group, problem)
		}
	}
}

// An OpenAI client reaches every cloud model through translation: Claude
// on Bedrock and Vertex, Nova through Bedrock's Converse, Gemini through
// Vertex's generateContent; streamed and not.
func TestCloudsForAnOpenAIClient(t *testing.T) {
	cloudCredentials(t, cloudSecret)
	load(t, threeClouds("chat", "", "chunks 3", "chunks 3"))
	var last *http.Response
	client := openAIClient(&last)
	for _, c := range []struct{ group, reply string }{
		{"claude-bedrock", "Hello from bedrock."}, {"nova", "Hello from bedrock."},
		{"claude-vertex", "Hello from vertex."}, {"gemini", "Hello from vertex."},
	} {
		params := openai.ChatCompletionNewParams{Model: c.group,
			Messages: []openai.ChatCompletionMessageParamUnion{openai.SystemMessage("Be brief."), openai.UserMessage("Say hello.")}}
		r, err := client.Chat.Completions.New(context.Background(), params)
		if err != nil {
			t.Fatalf("%s: %v", c.group, err)
		}
		if r.Choices[0].Message.Content != c.reply || r.Choices[0].FinishReason != "stop" || r.Usage.TotalTokens == 0 {
			t.Errorf("%s: %+v", c.group, r)
		}
		params.StreamOptions = openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)}
		s := client.Chat.Completions.NewStreaming(context.Background(), params)
		acc := openai.ChatCompletionAccumulator{}
		chunks := 0
		for s.Next() {
			acc.AddChunk(s.Current())
			chunks++
		}
		if err := s.Err(); err != nil {
			t.Fatalf("%s stream: %v", c.group, err)
		}
		if len(acc.Choices) == 0 || acc.Choices[0].Message.Content != c.reply || acc.Choices[0].FinishReason != "stop" || chunks < 3 || acc.Usage.TotalTokens == 0 {
			t.Errorf("%s stream: %d chunks %+v usage %+v", c.group, chunks, acc.Choices, acc.Usage)
		}
	}
	if s := cloudStats(t, 9082); s.AuthRefused != 0 || s.AuthAccepted < 4 {
		t.Errorf("bedrock auth: %+v", s)
	}
}

// One Claude group fails over across clouds with one client format:
// Anthropic's API is rate-limited, Bedrock throttles (ThrottlingException),
// Vertex answers; streamed and not. Each deployment is asked once.
func TestClaudeFailsOverAcrossClouds(t *testing.T) {
	cloudCredentials(t, cloudSecret)
	for _, stream := range []bool{false, true} {
		t.Run(fmt.Sprintf("stream=%v", stream), func(t *testing.T) {
			load(t, threeClouds(fmt.Sprintf("fo%v", stream),
				"fault rate_limit {\n header Retry-After 30\n }",
				"fault rate_limit {\n quota tokens\n }", "chunks 3"))
			var last *http.Response
			client := anthropic.NewClient(aoption.WithBaseURL(routerURL+"/"), aoption.WithAPIKey("client-key"),
				aoption.WithMaxRetries(0), aoption.WithResponseInto(&last))
			params := anthropic.MessageNewParams{Model: "claude", MaxTokens: 64,
				Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("Say hello."))}}
			var text string
			if stream {
				s := client.Messages.NewStreaming(context.Background(), params)
				var acc anthropic.Message
				for s.Next() {
					if err := acc.Accumulate(s.Current()); err != nil {
						t.Fatal(err)
					}
				}
				if err := s.Err(); err != nil {
					t.Fatal(err)
				}
				text = acc.Content[0].Text
			} else {
				msg, err := client.Messages.New(context.Background(), params)
				if err != nil {
					t.Fatal(err)
				}
				text = msg.Content[0].Text
			}
			dep := last.Header.Get("X-LLM-Router-Deployment")
			if text != "Hello from vertex." || !strings.HasPrefix(dep, "vx/") || last.Header.Get("X-LLM-Router-Attempts") != "3" {
				t.Errorf("%q from %s after %s attempts", text, dep, last.Header.Get("X-LLM-Router-Attempts"))
			}
			for port, want := range map[int]int64{9081: 1, 9082: 1, 9083: 1} {
				if n := cloudStats(t, port).Requests; n != want {
					t.Errorf(":%d asked %d times, want %d", port, n, want)
				}
			}
		})
	}
}

// A signature Bedrock does not accept (the wrong secret) is that
// deployment's auth failure: the request fails over, and no credential
// reaches the client.
func TestBedrockBadSignatureFailsOver(t *testing.T) {
	cloudCredentials(t, "not/the/secret/000000000000000000000000")
	load(t, threeClouds("badsig", "fault rate_limit {\n header Retry-After 30\n }", "", ""))
	var last *http.Response
	client := openAIClient(&last)
	r, err := client.Chat.Completions.New(context.Background(), openai.ChatCompletionNewParams{Model: "claude",
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Say hello.")}})
	if err != nil {
		t.Fatal(err)
	}
	if r.Choices[0].Message.Content != "Hello from vertex." {
		t.Errorf("answer %+v", r.Choices[0].Message)
	}
	if s := cloudStats(t, 9082); s.AuthRefused != 1 || s.AuthAccepted != 0 {
		t.Errorf("bedrock: %+v", s)
	}
	raw, _ := json.Marshal(r)
	if strings.Contains(string(raw), "not/the/secret") || strings.Contains(string(raw), cloudAKID) {
		t.Errorf("a credential in the answer: %s", raw)
	}
}

// Vertex access tokens that expire during a long run are refreshed by
// Google's auth library before the mock would refuse them: every request
// of several seconds' traffic is served, with tokens issued again and
// again and none refused.
func TestVertexTokenRefreshDuringALongRun(t *testing.T) {
	cloudCredentials(t, cloudSecret)
	load(t, threeClouds("refresh", "", "", "token_lifetime 2s"))
	var last *http.Response
	client := openAIClient(&last)
	served := 0
	for end := time.Now().Add(6 * time.Second); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		r, err := client.Chat.Completions.New(context.Background(), openai.ChatCompletionNewParams{Model: "gemini",
			Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Say hello.")}})
		if err != nil {
			t.Fatalf("after %d served: %v", served, err)
		}
		if r.Choices[0].Message.Content != "Hello from vertex." {
			t.Fatalf("answer %+v", r.Choices[0].Message)
		}
		served++
	}
	s := cloudStats(t, 9083)
	if s.AuthRefused != 0 || s.TokensIssued < 3 || s.AuthAccepted != int64(served) {
		t.Errorf("%d served; vertex %+v: want tokens issued again as they expire (at least 3 in 6 s of 2 s tokens), none refused", served, s)
	}
}
