package llmrouter

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/llmrouter/caddy-llm-router/internal/fleet"
	"github.com/llmrouter/caddy-llm-router/internal/router"
)

// StoreConfig says where deployments' capacity state lives: in this
// process only ("memory", the default), or shared by a fleet of router
// instances through Redis ("redis": fleet mode, see package fleet).
//
// In fleet mode the instances share each deployment's circuit (open until,
// why; the half-open probe is claimed by one instance of the fleet) and the
// rate-limit windows its provider stated, spend each stated window as one
// budget for the whole fleet (atomically, full again at its reset), and
// count the declared rpm/tpm over one fleet-wide sliding minute. Routing stays on local state: no
// request waits on Redis longer than Timeout, and when Redis is slow or
// down each instance routes on what it knows, logs it once, counts it in
// llm_router_store_errors_total and llm_router_store_fallbacks_total, and
// resynchronizes when Redis answers again. A Redis outage fails no request.
type StoreConfig struct {
	// Type is "memory" (default) or "redis".
	Type string `json:"type"`

	// URL is the Redis URL (redis only), by scheme (rediss for TLS):
	//
	//	redis://[[user]:password@]host[:port][/db]                 one server
	//	redis+cluster://[[user]:password@]host:port?addr=host2:port&addr=...
	//	                                                           a Redis Cluster (any of its nodes)
	//	redis+sentinel://host:port?addr=host2:port&master_name=<name>
	//	                                                           a primary its Sentinels watch
	//
	// Valkey alike. Placeholders such as {env.REDIS_URL} are replaced at
	// load; use one when the URL holds a password.
	URL string `json:"url,omitempty"`

	// KeyPrefix starts every key and the notification channel, so that
	// several fleets can share one Redis. Default: "llm_router:".
	KeyPrefix string `json:"key_prefix,omitempty"`

	// Timeout bounds each Redis call on the request path (claiming a
	// half-open probe, spending a stated window's budget, counting a
	// declared rpm/tpm, holding and settling a budget's cost, a place in
	// the fleet's queue, a Responses follow-up's owner, a background
	// response's claim), from its first byte to its answer. Default: 50ms
	// (fleet.DefaultTimeout).
	Timeout caddy.Duration `json:"timeout,omitempty"`

	// PollInterval is how often each instance rereads the fleet's state (what
	// pub/sub notifications missed) and, while Redis is unreachable, how
	// often it tries again. Default: 1s.
	PollInterval caddy.Duration `json:"poll_interval,omitempty"`
}

// parseStore reads the store subdirective. Syntax:
//
//	store memory
//	store redis <url> {
//	    key_prefix    <prefix>
//	    timeout       <duration>
//	    poll_interval <duration>
//	}
func parseStore(d *caddyfile.Dispenser) (*StoreConfig, error) {
	if !d.NextArg() {
		return nil, d.ArgErr()
	}
	sc := &StoreConfig{Type: d.Val()}
	switch sc.Type {
	case "memory":
		if d.NextArg() {
			return nil, d.ArgErr()
		}
		if d.NextBlock(d.Nesting()) {
			return nil, d.Err("store memory takes no options")
		}
		return sc, nil
	case "redis":
	default:
		return nil, d.Errf("unknown store %q (memory or redis)", sc.Type)
	}
	if !d.NextArg() {
		return nil, d.Err("store redis needs a URL: store redis redis://host:6379")
	}
	sc.URL = d.Val()
	if d.NextArg() {
		return nil, d.ArgErr()
	}
	check := once(" in store")
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		key := d.Val()
		if err := check(d); err != nil {
			return nil, err
		}
		switch key {
		case "key_prefix":
			if !d.NextArg() {
				return nil, d.ArgErr()
			}
			sc.KeyPrefix = d.Val()
			if d.NextArg() {
				return nil, d.ArgErr()
			}
		case "timeout":
			if err := parseDuration(d, &sc.Timeout); err != nil {
				return nil, err
			}
		case "poll_interval":
			if err := parseDuration(d, &sc.PollInterval); err != nil {
				return nil, err
			}
		default:
			return nil, d.Errf("unknown subdirective %s in store%s", key, suggest(key, storeKeys))
		}
	}
	return sc, nil
}

// validate checks what can be checked before the store is taken: its
// type, a url only for redis, timeouts not negative.
func (sc *StoreConfig) validate() error {
	switch {
	case sc == nil:
		return nil
	case sc.Type != "" && sc.Type != "memory" && sc.Type != "redis":
		return fmt.Errorf("store: unknown type %q (memory or redis)", sc.Type)
	case sc.Type != "redis" && sc.URL != "":
		return errors.New("store: a url needs type redis")
	case sc.Timeout < 0 || sc.PollInterval < 0:
		return errors.New("store: timeout and poll_interval must not be negative")
	}
	return nil
}

// stores keeps fleet stores across config reloads and across llm_router
// handlers, keyed by their options: one Redis connection (and one set of
// background goroutines) per store, however many configs and handlers
// use it.
var stores = caddy.NewUsagePool()

// fleetStore is a pooled fleet store.
type fleetStore struct {
	*fleet.Store
	key string
}

// Destruct implements caddy.Destructor: the last user is gone.
func (s *fleetStore) Destruct() error { return s.Close() }

// provisionStore takes the configured fleet store, if any, from the pool
// and binds every deployment's capacity state to it. It runs at the end of
// Provision; Cleanup gives the store back (cleanupStore). A reload that
// keeps the store keeps its connection and its bindings.
func (h *Handler) provisionStore(ctx caddy.Context) error {
	sc := h.Store
	if sc == nil || sc.Type == "" || sc.Type == "memory" {
		return nil // validated
	}
	url := caddy.NewReplacer().ReplaceKnown(sc.URL, "")
	if url == "" {
		return errors.New("store: redis needs a url (is its environment variable set?)")
	}
	m := getStoreMetrics()
	if err := m.register(ctx.GetMetricsRegistry()); err != nil {
		return fmt.Errorf("registering metrics: %v", err)
	}
	opts := fleet.Options{
		URL:          url,
		KeyPrefix:    sc.KeyPrefix,
		Timeout:      time.Duration(sc.Timeout),
		PollInterval: time.Duration(sc.PollInterval),
		Logger:       h.logger,
		Observer:     m,
	}
	// The key holds the URL's fingerprint only: it may hold a password.
	sum := sha256.Sum256([]byte(url))
	key := strings.Join([]string{hex.EncodeToString(sum[:]), sc.KeyPrefix, opts.Timeout.String(), opts.PollInterval.String()}, "|")
	v, _, err := stores.LoadOrNew(key, func() (caddy.Destructor, error) {
		st, err := fleet.New(opts)
		if err != nil {
			return nil, err
		}
		return &fleetStore{Store: st, key: key}, nil
	})
	if err != nil {
		return fmt.Errorf("store: %w", err)
	}
	h.store = v.(*fleetStore)
	h.Consumers.registry.SetFleet(h.store.Store) // consumers' rpm and tpm count fleet-wide
	for d, m := range h.meta {
		h.store.Bind(m.identity, d.State)
	}
	// Each group's places count fleet-wide (fleet.Queue).
	for name, g := range h.groups {
		ids := make([]string, len(g.Deployments))
		for i, d := range g.Deployments {
			ids[i] = h.meta[d].identity
		}
		g.Fleet = fleetQueue{h.store.Queue(name, ids)}
	}
	return nil
}

// fleetQueue is a group's fleet.Queue as the router asks it
// (router.FleetQueue): JoinAll's requests in the router's terms.
type fleetQueue struct{ *fleet.Queue }

func (q fleetQueue) JoinAll(joins []router.FleetJoin) {
	js := make([]fleet.Joining, len(joins))
	for i, j := range joins {
		js[i] = fleet.Joining(j)
	}
	q.Queue.JoinAll(js)
	for i, j := range js {
		joins[i] = router.FleetJoin(j)
	}
}

// cleanupStore gives the fleet store back to the pool, which closes it
// once no config uses it; the capacity states keep working on local
// knowledge.
func (h *Handler) cleanupStore() {
	if h.store != nil {
		_, _ = stores.Delete(h.store.key)
		h.store = nil
	}
}

// storeMetrics count the fleet store's health, across reloads:
//
//	llm_router_store_errors_total{op}     Redis operations that failed or timed out (spend, reserve, probe, publish, sync, subscribe, queue, owner, pending, consumer, concurrent, census)
//	llm_router_store_fallbacks_total{op}  request-path decisions made on local state alone, Redis unavailable (spend, reserve, probe; consumer, concurrent: a consumer decided on the instance's share)
//	llm_router_store_up                   1 while the store answers, 0 while it does not
type storeMetrics struct {
	errors, fallbacks *prometheus.CounterVec
	up                prometheus.Gauge
}

var (
	storeMetricsOnce sync.Once
	theStoreMetrics  *storeMetrics
)

func getStoreMetrics() *storeMetrics {
	storeMetricsOnce.Do(func() {
		const ns, sub = "llm", "router"
		theStoreMetrics = &storeMetrics{
			errors: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub,
				Name: "store_errors_total", Help: "Fleet store (Redis) operations that failed or timed out, by operation."},
				[]string{"op"}),
			fallbacks: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub,
				Name: "store_fallbacks_total", Help: "Request-path decisions made on local state alone because the fleet store could not answer, by operation."},
				[]string{"op"}),
			up: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub,
				Name: "store_up", Help: "1 while the fleet store answers, 0 while it does not."}),
		}
	})
	return theStoreMetrics
}

// register adds the collectors to a config's registry; a registry that has
// them already (a reload) is fine.
func (m *storeMetrics) register(reg prometheus.Registerer) error {
	for _, c := range []prometheus.Collector{m.errors, m.fallbacks, m.up} {
		if err := reg.Register(c); err != nil {
			var are prometheus.AlreadyRegisteredError
			if !errors.As(err, &are) {
				return err
			}
		}
	}
	return nil
}

// Error implements fleet.Observer.
func (m *storeMetrics) Error(op string) { m.errors.WithLabelValues(op).Inc() }

// Fallback implements fleet.Observer.
func (m *storeMetrics) Fallback(op string) { m.fallbacks.WithLabelValues(op).Inc() }

// Up implements fleet.Observer.
func (m *storeMetrics) Up(up bool) {
	if up {
		m.up.Set(1)
	} else {
		m.up.Set(0)
	}
}

// Interface guards
var _ fleet.Observer = (*storeMetrics)(nil)
