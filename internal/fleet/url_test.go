package fleet

import (
	"slices"
	"strings"
	"testing"
)

func TestParseStoreURL(t *testing.T) {
	o, err := ParseStoreURL("redis://user:secret@10.0.0.1:6380/2")
	if err != nil || !slices.Equal(o.Addrs, []string{"10.0.0.1:6380"}) || o.DB != 2 || o.Password != "secret" || o.IsClusterMode || o.MasterName != "" {
		t.Errorf("one server: got %+v %v", o, err)
	}
	o, err = ParseStoreURL("rediss+cluster://:secret@n1:7000?addr=n2:7000&addr=n3:7000")
	if err != nil || !slices.Equal(o.Addrs, []string{"n1:7000", "n2:7000", "n3:7000"}) || !o.IsClusterMode || o.TLSConfig == nil {
		t.Errorf("cluster: got %+v %v", o, err)
	}
	o, err = ParseStoreURL("redis+sentinel://s1:26379?addr=s2:26379&master_name=mymaster")
	if err != nil || !slices.Equal(o.Addrs, []string{"s1:26379", "s2:26379"}) || o.MasterName != "mymaster" || o.IsClusterMode {
		t.Errorf("sentinel: got %+v %v", o, err)
	}
	for _, bad := range []string{
		"http://user:secret@h:6379",
		"redis+sentinel://:secret@s1:26379",
		"redis+ring://:secret@h:6379",
		"redis://:secret@h:6379/notadb",
		"redis+cluster://:secret@h:6379?colour=red",
		"no scheme secret",
		"redis://:S3cr%t!secret@h:6379",
		"redis://:pa/secret@h:6379",
		"redis://:secret @h:6379",
		"redis://:secret@[h:6379",
		"redis://:secret@h:port",
		"redis+cluster://:S3cr%tsecret@h:1?addr=x:1",
	} {
		if _, err := ParseStoreURL(bad); err == nil || strings.Contains(err.Error(), "secret") {
			t.Errorf("%q: expected an error that does not quote the password, got %v", bad, err)
		}
	}
}
