package fleet

import (
	"fmt"
	"strings"

	"github.com/redis/go-redis/v9"
)

// ParseStoreURL reads the URL of a fleet store into go-redis' universal
// options, by its scheme:
//
//	redis://[[user]:password@]host[:port][/db]        one server (rediss:// for TLS)
//	redis+cluster://[[user]:password@]host:port?addr=host2:port&addr=host3:port
//	                                                  a Redis Cluster: any of its nodes
//	redis+sentinel://[[user]:password@]host:port?master_name=<name>&addr=host2:port
//	                                                  a primary watched by Sentinels (their addresses)
//
// rediss+cluster:// and rediss+sentinel:// use TLS. Valkey speaks the same
// protocol. The query takes go-redis' own parameters (ParseURL,
// ParseClusterURL, ParseFailoverURL). Its errors quote no part of the URL,
// which may hold a password.
func ParseStoreURL(u string) (*redis.UniversalOptions, error) {
	scheme, rest, ok := strings.Cut(u, "://")
	if !ok {
		return nil, fmt.Errorf("redis url: expected redis://, rediss://, redis+cluster:// or redis+sentinel://")
	}
	base, mode, _ := strings.Cut(scheme, "+")
	if base != "redis" && base != "rediss" {
		return nil, fmt.Errorf("redis url: unknown scheme %q (expected redis, rediss, redis+cluster or redis+sentinel)", truncateScheme(scheme))
	}
	plain := base + "://" + rest
	o, err := parseStoreURL(plain, mode)
	if err != nil && hasUserinfo(rest) {
		// An error may quote any part of the URL, the password included.
		return nil, fmt.Errorf("redis url: cannot be read (check the host, the port, and that the user and password are URL-escaped)")
	}
	return o, err
}

// hasUserinfo reports whether the URL after its scheme may hold
// credentials (an unescaped password may hold any character but '@').
func hasUserinfo(rest string) bool {
	return strings.Contains(rest, "@") || strings.Contains(rest, "password=")
}

func parseStoreURL(plain, mode string) (*redis.UniversalOptions, error) {
	switch mode {
	case "":
		o, err := redis.ParseURL(plain)
		if err != nil {
			return nil, fmt.Errorf("redis url: %v", err)
		}
		return &redis.UniversalOptions{Addrs: []string{o.Addr}, DB: o.DB, Username: o.Username, Password: o.Password,
			TLSConfig: o.TLSConfig}, nil
	case "cluster":
		o, err := redis.ParseClusterURL(plain)
		if err != nil {
			return nil, fmt.Errorf("redis cluster url: %v", err)
		}
		return &redis.UniversalOptions{Addrs: o.Addrs, Username: o.Username, Password: o.Password,
			TLSConfig: o.TLSConfig, IsClusterMode: true}, nil
	case "sentinel":
		o, err := redis.ParseFailoverURL(plain)
		if err != nil {
			return nil, fmt.Errorf("redis sentinel url: %v", err)
		}
		if o.MasterName == "" {
			return nil, fmt.Errorf("redis sentinel url: master_name=<name> is required")
		}
		return &redis.UniversalOptions{Addrs: o.SentinelAddrs, MasterName: o.MasterName, DB: o.DB,
			Username: o.Username, Password: o.Password, SentinelUsername: o.SentinelUsername,
			SentinelPassword: o.SentinelPassword, TLSConfig: o.TLSConfig}, nil
	}
	return nil, fmt.Errorf("redis url: unknown scheme %q (expected redis, rediss, redis+cluster or redis+sentinel)", "+"+mode)
}

func truncateScheme(s string) string {
	if len(s) > 20 {
		return s[:20] + "..."
	}
	return s
}
