// Package messagestest assembles Messages streams for tests: what an
// Anthropic SDK builds from the events, checking their grammar.
package messagestest

import (
	"encoding/json"
	"errors"
	"io"
	"strings"
	"testing"

	"github.com/llmrouter/caddy-llm-router/internal/wire/messages"
	"github.com/llmrouter/caddy-llm-router/provider"
)

// Message is what an Anthropic SDK builds from a Messages stream.
type Message struct {
	ID, Model, StopReason   string
	Blocks                  []Block
	InputTokens, OutputToks int64
	Events                  []string
}

// Block is one content block of a Message.
type Block struct {
	Type, Text, ID, Name, Input string
}

// Assemble reads a Messages SSE stream as an SDK would, failing t where
// its grammar is broken.
func Assemble(t testing.TB, sse []byte) Message {
	t.Helper()
	var m Message
	open := -1
	r := provider.NewSSEReader(strings.NewReader(string(sse)))
	for {
		ev, err := r.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("reading frames: %v\n%s", err, sse)
		}
		var e struct {
			Type    string `json:"type"`
			Message *struct {
				ID    string         `json:"id"`
				Model string         `json:"model"`
				Usage messages.Usage `json:"usage"`
			} `json:"message"`
			Index        *int `json:"index"`
			ContentBlock *struct {
				Type string `json:"type"`
				Text string `json:"text"`
				ID   string `json:"id"`
				Name string `json:"name"`
			} `json:"content_block"`
			Delta *struct {
				Type        string `json:"type"`
				Text        string `json:"text"`
				PartialJSON string `json:"partial_json"`
				StopReason  string `json:"stop_reason"`
			} `json:"delta"`
			Usage *messages.Usage `json:"usage"`
		}
		if err := json.Unmarshal(ev.Data, &e); err != nil {
			t.Fatalf("frame data is not JSON: %s", ev.Data)
		}
		if e.Type != ev.Name {
			t.Errorf("event name %q but data type %q", ev.Name, e.Type)
		}
		m.Events = append(m.Events, e.Type)
		switch e.Type {
		case "message_start":
			if len(m.Events) != 1 || e.Message == nil {
				t.Errorf("message_start must come first, with the message")
				continue
			}
			m.ID, m.Model, m.InputTokens = e.Message.ID, e.Message.Model, e.Message.Usage.InputTokens
		case "content_block_start":
			if open >= 0 || e.Index == nil || *e.Index != len(m.Blocks) || e.ContentBlock == nil {
				t.Errorf("content_block_start out of order: %s", ev.Data)
				continue
			}
			cb := e.ContentBlock
			m.Blocks = append(m.Blocks, Block{Type: cb.Type, Text: cb.Text, ID: cb.ID, Name: cb.Name})
			open = *e.Index
		case "content_block_delta":
			if e.Index == nil || *e.Index != open || e.Delta == nil {
				t.Errorf("delta for a block that is not open: %s", ev.Data)
				continue
			}
			b := &m.Blocks[open]
			b.Text += e.Delta.Text
			b.Input += e.Delta.PartialJSON
		case "content_block_stop":
			if e.Index == nil || *e.Index != open {
				t.Errorf("content_block_stop for a block that is not open: %s", ev.Data)
			}
			open = -1
		case "message_delta":
			if open >= 0 || e.Delta == nil || e.Usage == nil {
				t.Errorf("message_delta with a block open or without delta and usage: %s", ev.Data)
				continue
			}
			m.StopReason, m.OutputToks = e.Delta.StopReason, e.Usage.OutputTokens
			m.InputTokens = max(m.InputTokens, e.Usage.InputTokens)
		}
	}
	for i := range m.Blocks {
		if in := m.Blocks[i].Input; in != "" {
			var v any
			if err := json.Unmarshal([]byte(in), &v); err != nil {
				t.Errorf("tool input %q is not JSON", in)
			}
			norm, _ := json.Marshal(v)
			m.Blocks[i].Input = string(norm)
		}
	}
	return m
}
