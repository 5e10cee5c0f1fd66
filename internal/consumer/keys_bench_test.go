package consumer

import (
	"fmt"
	"strings"
	"testing"
)

// BenchmarkKeysLookup is one request's key lookup in keys files of 10 and
// 100,000 keys, of a known and of an unknown key: the time must not grow
// with the file (100,000 keys took 3.5 ms a lookup when each line's hash
// was compared).
func BenchmarkKeysLookup(b *testing.B) {
	for _, n := range []int{10, 100000} {
		var sb strings.Builder
		for i := range n {
			fmt.Fprintf(&sb, "c%d %s\n", i, hashOf(fmt.Sprint("sk-", i)))
		}
		k, err := ParseKeys(strings.NewReader(sb.String()), "llm-keys")
		if err != nil {
			b.Fatal(err)
		}
		for _, key := range []string{"sk-5", "sk-unknown"} {
			b.Run(fmt.Sprintf("keys=%d/%s", n, key), func(b *testing.B) {
				b.ReportAllocs()
				for b.Loop() {
					k.Lookup(key)
				}
			})
		}
	}
}
