package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
)

// The affinity run: what keeping a conversation on one deployment saves in
// a provider's prompt cache. Two deployments of equal rank on llm_mocks,
// which report cached input tokens for a conversation prefix they saw
// before (as providers' prompt caches do); 20 conversations of 6 turns
// each about a document of their own, every turn resending the
// conversation so far plus a new question.
// Run with `affinity none` (the router spreads near-ties by weight), with
// the default (prompt-cache affinity: the conversation's first 1,024 bytes
// of prompt name it) and with `affinity body` (the body's "user" names the
// conversation).

// Ports of the affinity run, all on 127.0.0.1.
const (
	affMockBase  = 18620 // two llm_mock sites: 18620, 18621
	affMockAdm   = 18628
	affRouter    = 18630
	affRouterAdm = 18638
)

const (
	affConversations = 20
	affTurns         = 6
)

type affinityRow struct {
	Mode        string  `json:"mode"`
	Requests    int     `json:"requests"`
	Served      int     `json:"served"`
	InputTokens int     `json:"input_tokens"`
	Cached      int     `json:"cached_input_tokens"`
	CachedPct   float64 `json:"cached_pct"`
	Switches    int     `json:"deployment_switches"`
}

func (b *bench) affinity() error {
	dir := filepath.Join(b.o.out, "affinity")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	for _, mode := range []string{"none", "default", "body"} {
		row, err := b.affinityRun(dir, mode)
		if err != nil {
			return fmt.Errorf("affinity %s: %w", mode, err)
		}
		b.res.Affinity = append(b.res.Affinity, row)
		b.logf("affinity %-7s served %d of %d, cached input tokens %d of %d (%.0f%%), %d switches of deployment within a conversation",
			row.Mode, row.Served, row.Requests, row.Cached, row.InputTokens, row.CachedPct, row.Switches)
	}
	return nil
}

func (b *bench) affinityRun(dir, mode string) (affinityRow, error) {
	row := affinityRow{Mode: mode, Requests: affConversations * affTurns}
	var mocks strings.Builder
	fmt.Fprintf(&mocks, "{\n\tadmin 127.0.0.1:%d\n\tauto_https off\n\tpersist_config off\n\tgrace_period 1ns\n}\n", affMockAdm)
	for i := range 2 {
		fmt.Fprintf(&mocks, "\nhttp://127.0.0.1:%d {\n\tllm_mock {\n\t\treply \"Noted.\"\n\t}\n}\n", affMockBase+i)
	}
	mocksPath := filepath.Join(dir, mode+"-mocks.Caddyfile")
	if err := os.WriteFile(mocksPath, []byte(mocks.String()), 0o644); err != nil {
		return row, err
	}
	m, err := start("affinity mocks", []string{b.o.caddy, "run", "--config", mocksPath, "--adapter", "caddyfile"}, nil, "",
		filepath.Join(b.o.out, "logs", "affinity-"+mode+"-mocks.log"), fmt.Sprintf("127.0.0.1:%d", affMockBase+1))
	if err != nil {
		return row, err
	}
	defer m.stop()
	affinity := ""
	if mode != "default" {
		affinity = "\t\taffinity " + mode + "\n"
	}
	var cfg strings.Builder
	fmt.Fprintf(&cfg, "{\n\tadmin 127.0.0.1:%d\n\tauto_https off\n\tpersist_config off\n\tgrace_period 1ns\n}\n", affRouterAdm)
	fmt.Fprintf(&cfg, "\nhttp://127.0.0.1:%d {\n\tllm_router /v1/* {\n%s", affRouter, affinity)
	for i := range 2 {
		fmt.Fprintf(&cfg, "\t\tprovider p%d {\n\t\t\ttype openai\n\t\t\tbase_url http://127.0.0.1:%d/v1\n\t\t\tapi_key sk-bench\n\t\t}\n", i, affMockBase+i)
	}
	cfg.WriteString("\t\tmodel chat {\n\t\t\tdeployment p0 model-a\n\t\t\tdeployment p1 model-b\n\t\t}\n\t}\n}\n")
	cfgPath := filepath.Join(dir, mode+"-router.Caddyfile")
	if err := os.WriteFile(cfgPath, []byte(cfg.String()), 0o644); err != nil {
		return row, err
	}
	r, err := start("affinity router", []string{b.o.caddy, "run", "--config", cfgPath, "--adapter", "caddyfile"}, nil, b.o.caddyCPUs,
		filepath.Join(b.o.out, "logs", "affinity-"+mode+"-router.log"), fmt.Sprintf("127.0.0.1:%d", affRouter))
	if err != nil {
		return row, err
	}
	defer r.stop()

	client := newClient()
	defer client.CloseIdleConnections()
	url := fmt.Sprintf("http://127.0.0.1:%d/v1/chat/completions", affRouter)
	var mu sync.Mutex
	var wg sync.WaitGroup
	var firstErr error
	for c := range affConversations {
		wg.Go(func() {
			// A short shared system prompt, then the conversation's own
			// document, which dominates its prompt.
			messages := []map[string]string{{"role": "system", "content": "You answer questions about the document."},
				{"role": "user", "content": fmt.Sprintf("Document %d: %s", c, strings.Repeat(fmt.Sprintf("clause %d applies; ", c), 150))},
				{"role": "assistant", "content": "Noted."}}
			last := ""
			for turn := range affTurns {
				messages = append(messages, map[string]string{"role": "user", "content": fmt.Sprintf("Question %d of conversation %d.", turn, c)})
				body, _ := json.Marshal(map[string]any{"model": "chat", "user": fmt.Sprintf("conversation-%d", c), "messages": messages})
				served, deployment, input, cached, err := postCached(client, url, body)
				mu.Lock()
				if err != nil && firstErr == nil {
					firstErr = err
				}
				if served {
					row.Served++
					row.InputTokens += input
					row.Cached += cached
					if last != "" && deployment != last {
						row.Switches++
					}
					last = deployment
				}
				mu.Unlock()
				messages = append(messages, map[string]string{"role": "assistant", "content": "Noted."})
			}
		})
	}
	wg.Wait()
	if firstErr != nil {
		return row, firstErr
	}
	if row.InputTokens > 0 {
		row.CachedPct = 100 * float64(row.Cached) / float64(row.InputTokens)
	}
	return row, nil
}

// postCached sends a chat request; it returns whether it was served, by
// which deployment, and the usage's prompt and cached prompt tokens.
func postCached(client *http.Client, url string, body []byte) (bool, string, int, int, error) {
	resp, err := client.Post(url, "application/json", strings.NewReader(string(body)))
	if err != nil {
		return false, "", 0, 0, err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		return false, "", 0, 0, err
	}
	var a struct {
		Usage struct {
			Prompt  int `json:"prompt_tokens"`
			Details struct {
				Cached int `json:"cached_tokens"`
			} `json:"prompt_tokens_details"`
		} `json:"usage"`
	}
	_ = json.Unmarshal(raw, &a)
	return true, resp.Header.Get("X-LLM-Router-Deployment"), a.Usage.Prompt, a.Usage.Details.Cached, nil
}

// affinityTable renders the rows for the report.
func affinityTable(rows []affinityRow) string {
	var out [][]string
	for _, r := range rows {
		out = append(out, []string{r.Mode, fmt.Sprintf("%d / %d", r.Served, r.Requests), fmt.Sprint(r.InputTokens),
			fmt.Sprint(r.Cached), f0(r.CachedPct), fmt.Sprint(r.Switches)})
	}
	return table([]string{"affinity", "served", "input tokens", "cached input tokens", "% cached", "switches of deployment"}, out)
}
