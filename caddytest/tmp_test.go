package integration

import (
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestPriorityOffTmp(t *testing.T) {
	const window = 2 * time.Second
	load(t, fmt.Sprintf(`
http://localhost:9080 {
	llm_router /v1/* {
		deadline 3s
		provider a {
			type openai
			base_url http://localhost:9081/v1
			api_key sk-provider-a
		}
		model limited {
			deployment a gpt-4o-mini
		}
	}
}
