package integration

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/anthropics/anthropic-sdk-go/v2"
	aoption "github.com/anthropics/anthropic-sdk-go/v2/option"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
)

// alicePassword's bcrypt hash (cost 4), for basic_auth.
const (
	alicePassword = "alice-pass"
	aliceHash     = "$2a$04$Pq9ioj8pCKUbQyq/aHZ.6eVvsLk/AImwejBXcHqjhGf./LJIgZHvG"
)

// consumersConfig is docs/consumers.md's two teams: team-a's alice signs
// in with basic_auth, team-b's bob with an API key of the keys file.
func consumersConfig(keys string) string {
	return fmt.Sprintf(`
http://localhost:9080 {
	@basic header Authorization "Basic *"
	basic_auth @basic {
		alice %s
	}
	llm_router /v1/* {
		consumer {http.auth.user.id}
		keys %s
		plan team-a {
			weight 3
			groups fast
		}
		plan team-b {
			rpm 1
		}
		consumers team-a alice
		consumers team-b bob
		provider a {
			type openai
			base_url http://localhost:9081/v1
			api_key sk-provider-a
		}
		model fast {
			deployment a fast-1
		}
		model smart {
			deployment a smart-1
		}
	}
}
http://localhost:9081 {
	llm_mock {
		reply "Hello."
	}
}
`, aliceHash, keys)
}

// The official SDKs see the consumers' refusals as typed errors in their
// API's format: 401 without a known key, 403 for a group outside the
// plan, 429 over the plan's rpm with Retry-After and X-LLM-Router-Limit:
// consumer; the provider never sees a client's credentials.
func TestConsumersWithTheSDKs(t *testing.T) {
	keys := filepath.Join(t.TempDir(), "llm-keys")
	sum := sha256.Sum256([]byte("sk-client-bob"))
	if err := os.WriteFile(keys, []byte("bob "+hex.EncodeToString(sum[:])+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	load(t, consumersConfig(keys))
	ctx := context.Background()
	chatParams := func(model string) openai.ChatCompletionNewParams {
		return openai.ChatCompletionNewParams{Model: model, Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")}}
	}
	var last *http.Response
	oa := func(key string) openai.Client {
		return openai.NewClient(option.WithBaseURL(routerURL+"/v1/"), option.WithAPIKey(key), option.WithMaxRetries(0), option.WithResponseInto(&last))
	}

	mallory, bob := oa("sk-client-mallory"), oa("sk-client-bob")
	_, err := mallory.Chat.Completions.New(ctx, chatParams("fast"))
	var oe *openai.Error
	if !errors.As(err, &oe) || oe.StatusCode != 401 || oe.Code != "invalid_api_key" || strings.Contains(oe.RawJSON(), "mallory") {
		t.Errorf("unknown key: expected a 401 invalid_api_key *openai.Error, got %v", err)
	}
	ac := anthropic.NewClient(aoption.WithBaseURL(routerURL+"/"), aoption.WithAPIKey("sk-client-mallory"), aoption.WithMaxRetries(0))
	_, err = ac.Messages.New(ctx, anthropic.MessageNewParams{Model: "fast", MaxTokens: 10,
		Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("hi"))}})
	var ae *anthropic.Error
	if !errors.As(err, &ae) || ae.StatusCode != 401 || !strings.Contains(ae.RawJSON(), `"type":"authentication_error"`) {
		t.Errorf("unknown x-api-key: expected a 401 authentication_error *anthropic.Error, got %v", err)
	}

	// bob: his key, plan team-b's rpm 1.
	if c, err := bob.Chat.Completions.New(ctx, chatParams("smart")); err != nil || c.Choices[0].Message.Content != "Hello." {
		t.Fatalf("bob's first request: %v", err)
	}
	_, err = bob.Chat.Completions.New(ctx, chatParams("smart"))
	if !errors.As(err, &oe) || oe.StatusCode != 429 || oe.Code != "rate_limit_exceeded" || !strings.Contains(oe.Message, "consumer bob is over its rpm") {
		t.Errorf("bob over his rpm: expected a 429 rate_limit_exceeded, got %v", err)
	}
	if ra := last.Header.Get("Retry-After"); ra == "" || ra > "60" || last.Header.Get("X-LLM-Router-Limit") != "consumer" || last.Header.Get("X-LLM-Router-Consumer-Limit") != "rpm" {
		t.Errorf("bob's 429: expected Retry-After up to 60 and X-LLM-Router-Limit consumer, got %v", last.Header)
	}

	// alice: basic_auth, plan team-a's groups: fast only.
	basic := "Basic " + base64.StdEncoding.EncodeToString([]byte("alice:"+alicePassword))
	var alast *http.Response
	alice := anthropic.NewClient(aoption.WithBaseURL(routerURL+"/"), aoption.WithAPIKey("unused"),
		aoption.WithHeader("Authorization", basic), aoption.WithMaxRetries(0), aoption.WithResponseInto(&alast))
	msg, err := alice.Messages.New(ctx, anthropic.MessageNewParams{Model: "fast", MaxTokens: 10,
		Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("hi"))}})
	if err != nil || len(msg.Content) != 1 || msg.Content[0].Text != "Hello." {
		t.Fatalf("alice on fast: %v", err)
	}
	_, err = alice.Messages.New(ctx, anthropic.MessageNewParams{Model: "smart", MaxTokens: 10,
		Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("hi"))}})
	if !errors.As(err, &ae) || ae.StatusCode != 403 || !strings.Contains(ae.RawJSON(), `"type":"permission_error"`) || !strings.Contains(ae.RawJSON(), "may not use model smart") {
		t.Errorf("alice on smart: expected a 403 permission_error, got %v", err)
	}

	s := stats(t, 9081)
	if s.Requests != 2 || s.LastAuthorization != "Bearer sk-provider-a" || strings.Contains(s.LastAPIKey, "client") {
		t.Errorf("expected 2 requests at the provider with its own key only, got %d, %q, %q", s.Requests, s.LastAuthorization, s.LastAPIKey)
	}
}
