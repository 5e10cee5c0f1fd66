package llmrouter

import (
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"net/http/httptest"
	"testing"

	"github.com/llmrouter/caddy-llm-router/mockllm"
)

// An embeddings request as the OpenAI Node SDK sends it by default
// (encoding_format base64, which it decodes as little-endian float32s)
// with two inputs gets two base64 vectors through the router: an openai
// type serves embeddings natively and its answer is passed on as the
// provider sent it (no provider type translates embeddings).
func TestEmbeddingsBase64OfTwoInputs(t *testing.T) {
	mock := &mockllm.Handler{}
	if err := mock.Setup(); err != nil {
		t.Fatal(err)
	}
	defer mock.Close()
	upstream := httptest.NewServer(mock.HTTPHandler())
	defer upstream.Close()
	h := handlerFromCaddyfile(t, `llm_router {
		provider oa {
			type openai
			base_url `+upstream.URL+`/v1
			api_key sk-oa
		}
		model emb {
			deployment oa text-embedding-3-small
		}
	}`)
	defer h.Cleanup()
	w := httptest.NewRecorder()
	_ = h.ServeHTTP(w, postJSON("/v1/embeddings", `{"model":"emb","input":["a","b"],"encoding_format":"base64"}`), nil)
	var got struct {
		Data []struct {
			Index     int    `json:"index"`
			Embedding string `json:"embedding"`
		} `json:"data"`
	}
	if err := json.Unmarshal(w.Body.Bytes(), &got); w.Code != 200 || err != nil || len(got.Data) != 2 {
		t.Fatalf("expected 200 with two embeddings, got %d %s (%v)", w.Code, w.Body, err)
	}
	for i, d := range got.Data {
		raw, err := base64.StdEncoding.DecodeString(d.Embedding)
		if err != nil || len(raw) != 12 {
			t.Fatalf("item %d: expected 3 float32s in base64, got %q (%v)", i, d.Embedding, err)
		}
		var v []float32
		for j := 0; j < len(raw); j += 4 {
			v = append(v, math.Float32frombits(binary.LittleEndian.Uint32(raw[j:])))
		}
		if d.Index != i || fmt.Sprint(v) != "[0.1 0.2 0.3]" {
			t.Errorf("item %d: expected index %d and [0.1 0.2 0.3], got %d %v", i, i, d.Index, v)
		}
	}
}
