package adapters

import (
	"bufio"
	"bytes"
	"encoding/json"
	"io"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/llmrouter/caddy-llm-router/internal/capacity"
	"github.com/llmrouter/caddy-llm-router/provider"
)

// fixtureCase is one entry of testdata/cases.json (copied byte-identical from
// the project's shared fixtures): what a provider response must decode to.
type fixtureCase struct {
	Provider          string   `json:"provider"`
	Class             string   `json:"class"`
	File              string   `json:"file"`
	LimitRequests     *int64   `json:"limit_requests"`
	RemainingRequests *int64   `json:"remaining_requests"`
	ResetRequestsIn   *float64 `json:"reset_requests_in_s"`
	LimitTokens       *int64   `json:"limit_tokens"`
	RemainingTokens   *int64   `json:"remaining_tokens"`
	ResetTokensIn     *float64 `json:"reset_tokens_in_s"`
	WaitMin           *float64 `json:"wait_min_s"`
	WaitMax           *float64 `json:"wait_max_s"`
	Message           string   `json:"message"` // a substring of the decoded message (dialects.json)
}

// loadCases reads testdata/cases.json (the shared fixtures) and, with
// dialects too, testdata/dialects.json (variants collected since, each
// with its source) and testdata/clouds.json (Bedrock's and Vertex AI's).
func loadCases(t testing.TB, dialects bool) []fixtureCase {
	t.Helper()
	files := []string{"cases.json"}
	if dialects {
		files = append(files, "dialects.json", "clouds.json")
	}
	var all []fixtureCase
	for _, f := range files {
		raw, err := os.ReadFile(filepath.Join("testdata", f))
		if err != nil {
			t.Fatal(err)
		}
		var doc struct {
			Cases []fixtureCase `json:"cases"`
		}
		if err := json.Unmarshal(raw, &doc); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		all = append(all, doc.Cases...)
	}
	return all
}

// readFixture parses a whole HTTP response from testdata.
func readFixture(t testing.TB, name string) (*http.Response, []byte) {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(bytes.NewReader(raw)), nil)
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return resp, body
}

// adapterFor returns the adapter that decodes a fixture's provider family.
func adapterFor(name string) (provider.Provider, bool) {
	switch name {
	case "openai", "azure", "anthropic", "gemini", "bedrock", "vertex":
		return byName(name, provider.Endpoint{}), true
	}
	return nil, false
}

func TestFixtures(t *testing.T) {
	cases := loadCases(t, true)
	decoded := 0
	for _, c := range cases {
		a, ok := adapterFor(c.Provider)
		if !ok {
			// Decoded by an adapter of a later wire family; nothing to check yet.
			continue
		}
		decoded++
		t.Run(c.File, func(t *testing.T) {
			resp, body := readFixture(t, c.File)
			now, err := http.ParseTime(resp.Header.Get("Date"))
			if err != nil {
				t.Fatalf("fixture without Date: %v", err)
			}
			errBody := body
			if resp.StatusCode < 300 {
				errBody = nil
			}
			// Decode with a local clock 3 s off the provider's: absolute
			// times must be read against the Date header.
			o := a.Observe(resp.StatusCode, resp.Header, errBody, now.Add(3*time.Second))
			if o.Class.String() != c.Class {
				t.Errorf("class: expected %s, got %s (message %q)", c.Class, o.Class, o.Message)
			}
			if !strings.Contains(o.Message, c.Message) {
				t.Errorf("message: expected it to hold %q, got %q", c.Message, o.Message)
			}
			checkCount(t, "limit_requests", c.LimitRequests, o.Requests.Limit)
			checkCount(t, "remaining_requests", c.RemainingRequests, o.Requests.Remaining)
			checkCount(t, "limit_tokens", c.LimitTokens, o.Tokens.Limit)
			checkCount(t, "remaining_tokens", c.RemainingTokens, o.Tokens.Remaining)
			checkReset(t, "reset_requests_in_s", c.ResetRequestsIn, o.Requests.Reset)
			checkReset(t, "reset_tokens_in_s", c.ResetTokensIn, o.Tokens.Reset)

			if !hasRateLimitHeaders(resp.Header) {
				// Unknown is not zero: nothing stated, nothing known.
				// (A 429 that names its window spent, with no header, states
				// that window's remaining count, and one too large for the
				// window its limit: the case says so.)
				for name, v := range map[string]int64{
					"limit_requests": o.Requests.Limit, "remaining_requests": o.Requests.Remaining,
					"limit_tokens": o.Tokens.Limit, "remaining_tokens": o.Tokens.Remaining,
				} {
					stated := name == "remaining_requests" && c.RemainingRequests != nil || name == "remaining_tokens" && c.RemainingTokens != nil ||
						name == "limit_tokens" && c.LimitTokens != nil && c.Class == provider.TooLarge.String()
					if v != provider.Unknown && !stated {
						t.Errorf("%s: no rate-limit header, expected unknown, got %d", name, v)
					}
				}
			}

			wait := capacity.DefaultPolicy.Cooldown(o, 1).Seconds()
			if c.WaitMin != nil && wait < *c.WaitMin {
				t.Errorf("wait: expected at least %gs, got %gs", *c.WaitMin, wait)
			}
			if c.WaitMax != nil && wait > *c.WaitMax {
				t.Errorf("wait: expected at most %gs, got %gs", *c.WaitMax, wait)
			}
		})
	}
	if len(cases) < 25 || decoded != len(cases) {
		t.Errorf("expected every fixture (%d, at least 25) decoded by its adapter, got %d", len(cases), decoded)
	}
}

func checkCount(t *testing.T, name string, want *int64, got int64) {
	t.Helper()
	if want != nil && got != *want {
		t.Errorf("%s: expected %d, got %d", name, *want, got)
	}
}

func checkReset(t *testing.T, name string, want *float64, got time.Duration) {
	t.Helper()
	if want == nil {
		return
	}
	if got < 0 {
		t.Errorf("%s: expected %gs, got unknown", name, *want)
		return
	}
	if math.Abs(got.Seconds()-*want) > *want*0.01 {
		t.Errorf("%s: expected %gs (within 1%%), got %gs", name, *want, got.Seconds())
	}
}

func hasRateLimitHeaders(h http.Header) bool {
	for k := range h {
		if strings.Contains(strings.ToLower(k), "ratelimit") || strings.Contains(strings.ToLower(k), "tokenlimit") {
			return true
		}
	}
	return false
}
