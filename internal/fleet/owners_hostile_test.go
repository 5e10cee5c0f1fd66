package fleet

import (
	"context"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"go.uber.org/zap"
)

// A response's owner key and a background mark of the wrong type (a hash
// where the router writes strings), and an owner value without the
// router's "<id>\n<name>" shape and without expiry: each read finds no
// owner or mark, counts no error, replaces the key (deletes it: the next
// write makes it again) and logs it once as malformed.
func TestMalformedOwnerAndPendingKeysReplaced(t *testing.T) {
	backends(t, func(t *testing.T, url string, m *miniredis.Miniredis) {
		a := newInstance(t, url, time.Hour, 0, 0)
		eventually(t, 5*time.Second, "the store up", func() bool { return a.store.Up() })
		ctx, c := context.Background(), a.store.client
		owner, pending, shapeless := a.store.ownerKey("resp_1"), a.store.pendingKey("resp_1"), a.store.ownerKey("resp_2")
		c.HSet(ctx, owner, "x", "1")
		c.HSet(ctx, pending, "x", "1")
		c.Set(ctx, shapeless, "no newline here", 0)
		for range 2 {
			if _, _, _, ok := a.store.Owner("resp_1"); ok {
				t.Error("expected no owner from a key of the wrong type")
			}
			if _, ok, err := a.store.ClaimPending("resp_1"); ok || err != nil {
				t.Errorf("expected no mark and no error from a key of the wrong type, got %v, %v", ok, err)
			}
			if _, _, _, ok := a.store.Owner("resp_2"); ok {
				t.Error("expected no owner from a value without the router's shape")
			}
		}
		if n := a.obs.count(a.obs.errors); n != 0 {
			t.Errorf("expected no error counted, got %v", a.obs.errors)
		}
		for _, k := range []string{owner, pending, shapeless} {
			if n := c.Exists(ctx, k).Val(); n != 0 {
				t.Errorf("%s: expected the malformed key replaced", k[len(keyPrefix(t)):])
			}
			if n := a.logs.FilterMessageSnippet("malformed key replaced").FilterField(zap.String("key", k)).Len(); n != 1 {
				t.Errorf("%s: expected it logged once as malformed, logged %d times", k[len(keyPrefix(t)):], n)
			}
		}
		if !a.store.Up() {
			t.Error("expected the store up")
		}
	})
}
