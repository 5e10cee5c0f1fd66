// Package fleet shares deployments' capacity state between router instances
// (processes) through Redis: fleet mode.
//
// What is shared, per deployment: its circuit (open until, why, consecutive
// failures) and the provider-stated rate-limit windows (limit, remaining,
// reset), the newest learning of each winning; the budget of those windows,
// one for the fleet, spent atomically by every attempt and full again at
// its reset; the half-open circuit's single probe, claimed fleet-wide; and
// the operator's declared rpm/tpm, counted over one fleet-wide sliding
// minute, atomically. Per model group, the requests waiting for capacity on
// every instance, in one queue that counts each one's place (Queue).
//
// Local state stays the fast path. Ranking never waits on Redis: what other
// instances learn arrives in the background, by pub/sub as it happens and
// by polling every PollInterval to resynchronize. A deployment's stated
// windows (its budget) and declared rpm/tpm are leased: each instance
// spends slices of them in memory and renews them in the background
// (lease.go, declared.go); only a half-open probe, a spent slice, the
// fleet's queue, budgets in USD, a Responses follow-up's owner and a
// background response's claim ask Redis on the request path, bounded
// by Timeout. When Redis is slow or down, the store says so once in the log,
// counts it (Observer), stops asking on the request path (the instance
// routes on local state alone), and resynchronizes when Redis answers again.
//
// Keys hold no secrets: a deployment is named by a hash of its identity,
// which holds only a fingerprint of the provider key.
//
// It imports neither Caddy nor the root package.
package fleet

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"net"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"
	"go.uber.org/zap"

	"github.com/llmrouter/caddy-llm-router/internal/capacity"
)

// Defaults of Options.
const (
	DefaultKeyPrefix    = "llm_router:"
	DefaultTimeout      = 50 * time.Millisecond
	DefaultPollInterval = time.Second
	// DefaultPoolSize is the least number of connections to Redis (per
	// node), unless the URL says pool_size=.
	DefaultPoolSize = 64
)

// probeTTL bounds how long a half-open probe's claim outlives an instance
// that died holding it; the owner frees it as soon as the probe ends.
const probeTTL = 30 * time.Second

// ErrUnavailable is returned on the request path while the store is known
// to be unreachable: the caller decides on local state.
var ErrUnavailable = errors.New("fleet store unavailable")

// Options configure a Store.
type Options struct {
	// URL is the Redis URL (see ParseStoreURL): one server, a Redis
	// Cluster or a Sentinel-watched primary; Valkey alike.
	URL string
	// KeyPrefix starts every key and the notification channel.
	// Default: "llm_router:".
	KeyPrefix string
	// Timeout bounds each Redis call on the request path (budgets, declared
	// rpm/tpm, probes, the fleet's queue, owners, background claims), pool
	// wait, dial and redirects included (no retries). One that times out
	// with no answer from Redis since it began turns the store to local
	// state until the poller reaches Redis again. Default: 50ms.
	Timeout time.Duration
	// PollInterval is how often the store reads every deployment's shared
	// state to resynchronize (and, while Redis is unreachable, how often it
	// tries it again). Default: 1s.
	PollInterval time.Duration
	// Logger logs the store going unreachable and coming back, once each.
	Logger *zap.Logger
	// Observer counts failures and local fallbacks (metrics); may be nil.
	Observer Observer
}

// Observer is told about the store's health. Calls must be cheap and safe
// for concurrent use.
type Observer interface {
	// Error reports a failed or timed-out Redis operation: op is one of
	// reserve, spend, probe, publish, sync, subscribe, queue, owner.
	Error(op string)
	// Fallback reports a request-path decision made on local state alone
	// because the store could not answer: op is reserve, spend or probe.
	Fallback(op string)
	// Up reports the store becoming reachable (true) or not.
	Up(up bool)
}

type nopObserver struct{}

func (nopObserver) Error(string)    {}
func (nopObserver) Fallback(string) {}
func (nopObserver) Up(bool)         {}

// Health of the store as last seen.
const (
	healthUnknown int32 = iota
	healthUp
	healthDown
)

// Store is a Redis fleet store. New starts its background work (a
// subscriber, a writer and a poller); Close stops it.
type Store struct {
	client             redis.UniversalClient
	addr               string // for logs: host:port, never the URL (it may hold a password)
	prefix, channel    string
	timeout, bgTimeout time.Duration
	poll, keep         time.Duration
	lease              time.Duration // of its queues (queueLease)
	origin             string        // this instance, in notifications and claims
	log                *zap.Logger
	obs                Observer
	health             atomic.Int32
	lastAnswer         atomic.Int64 // Unix ns of the request path's last answer from Redis (busy)
	peers              atomic.Int64 // the instances the fleet's census last counted (census.go)
	seq                atomic.Uint64
	ctx                context.Context
	cancel             context.CancelFunc
	wg                 sync.WaitGroup
	wake, pollNow      chan struct{}
	leaseNow           chan struct{} // a slice ran low (lease.go)
	mu                 sync.Mutex
	bindings           map[string]*binding // by deployment id
	queues             map[string]*Queue   // by key
	pending            map[*binding]*pending
	releases           []release
	owners             []ownerWrite    // Responses API owners for the writer (owners.go)
	logged             map[string]bool // keys logged as malformed (malformed)
	ps                 *redis.PubSub
	closed             bool

	consumers      map[string]*consumerLimits  // consumers' fleet-wide minutes, by consumerID (consumers.go), under mu
	budgets        map[string]*consumerBudget  // consumers' fleet-wide budgets, by key (consumers.go), under mu
	spendings      map[*capacity.Spending]bool // the budgets that leased a slice (TrackSpending), under mu
	consumerWindow time.Duration               // their span: 0, capacity.DeclaredWindow (tests set it shorter)
}

// pending is what the writer has yet to write for one deployment.
type pending struct {
	sh     capacity.Shared
	notify bool
}

// fold takes into p the parts of newer that are newer than p's.
func (p *pending) fold(newer *pending) {
	if newer.sh.Circuit.At.After(p.sh.Circuit.At) {
		p.sh.Circuit = newer.sh.Circuit
	}
	if newer.sh.Drain.At.After(p.sh.Drain.At) {
		p.sh.Drain = newer.sh.Drain
	}
	if newer.sh.Requests.At.After(p.sh.Requests.At) {
		p.sh.Requests = newer.sh.Requests
	}
	if newer.sh.Tokens.At.After(p.sh.Tokens.At) {
		p.sh.Tokens = newer.sh.Tokens
	}
	p.notify = p.notify || newer.notify
}

type release struct{ key, token string }

// New checks the options and starts the store. It does not wait for Redis:
// a store that cannot reach it serves local state until it can.
func New(o Options) (*Store, error) {
	opt, err := ParseStoreURL(o.URL)
	if err != nil {
		return nil, err
	}
	if o.KeyPrefix == "" {
		o.KeyPrefix = DefaultKeyPrefix
	}
	if o.Timeout <= 0 {
		o.Timeout = DefaultTimeout
	}
	if o.PollInterval <= 0 {
		o.PollInterval = DefaultPollInterval
	}
	if o.Logger == nil {
		o.Logger = zap.NewNop()
	}
	if o.Observer == nil {
		o.Observer = nopObserver{}
	}
	bg := max(4*o.Timeout, 500*time.Millisecond)
	// No retries, no waiting for a pool connection beyond the bound: the
	// request path gives up at Timeout and routes on local state.
	opt.Protocol = 2
	opt.DisableIdentity = true
	opt.MaintNotificationsConfig = &maintnotifications.Config{Mode: maintnotifications.ModeDisabled}
	if opt.PoolSize == 0 {
		// A burst makes each waiting request ask Redis (its place, its
		// budget): go-redis' 10 per CPU would time out on the pool.
		opt.PoolSize = max(DefaultPoolSize, 10*runtime.GOMAXPROCS(0))
	}
	opt.MaxRetries = -1
	opt.MaxRedirects = 3  // a cluster's MOVED and ASK answers
	opt.DialerRetries = 1 // the poller tries again every PollInterval
	opt.DialTimeout = o.Timeout
	opt.PoolTimeout = o.Timeout
	opt.ReadTimeout = bg
	opt.WriteTimeout = bg
	opt.ContextTimeoutEnabled = true

	routeRedisLogs(o.Logger)
	var id [8]byte
	_, _ = rand.Read(id[:])
	s := &Store{
		client:    redis.NewUniversalClient(opt),
		addr:      strings.Join(opt.Addrs, ","),
		prefix:    o.KeyPrefix,
		channel:   o.KeyPrefix + "events",
		timeout:   o.Timeout,
		bgTimeout: bg,
		poll:      o.PollInterval,
		keep:      min(max(3*o.PollInterval, 3*time.Second), time.Minute),
		lease:     queueLease,
		origin:    hex.EncodeToString(id[:]),
		log:       o.Logger,
		obs:       o.Observer,
		wake:      make(chan struct{}, 1),
		pollNow:   make(chan struct{}, 1),
		leaseNow:  make(chan struct{}, 1),
		bindings:  map[string]*binding{},
		queues:    map[string]*Queue{},
		pending:   map[*binding]*pending{},
	}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	s.wg.Add(5)
	go s.leaseLoop()
	go s.subscribeLoop()
	go s.writeLoop()
	go s.pollLoop()
	go s.renewLoop()
	return s, nil
}

// DeploymentID names a deployment in keys: a hash of its identity, so that
// no key shows a base URL or a key fingerprint.
func DeploymentID(identity string) string {
	sum := sha256.Sum256([]byte("llm_router deployment\x00" + identity))
	return hex.EncodeToString(sum[:16])
}

// Bind shares st as the deployment of the given identity (see DeploymentID)
// through the store, until Unbind or Close. A state bound twice (one
// deployment in two model groups, or in the next config that uses the same
// store) is bound once; a new state for a bound identity (the deployment
// left the config and came back) takes the old one's place.
func (s *Store) Bind(identity string, st *capacity.State) {
	id := DeploymentID(identity)
	s.mu.Lock()
	old := s.bindings[id]
	if s.closed || old != nil && old.st == st {
		s.mu.Unlock()
		return
	}
	// Hash tags keep one deployment's keys in one Redis Cluster slot.
	base := s.prefix + "{" + id + "}:"
	b := &binding{s: s, id: id, st: st,
		stateKey: base + "state", logKey: base + "declared", tokensKey: base + "declared_tokens", probeKey: base + "probe",
		budgetKey: base + "budget"}
	s.bindings[id] = b
	s.mu.Unlock()
	if old != nil {
		old.st.ClearFleet(old)
		old.ReleaseProbe()
	}
	st.SetFleet(b)
}

// Unbind stops sharing st, the deployment of identity, whose last config
// is gone: the store no longer polls or merges into it, and frees the probe
// claim it holds. A newer state bound to the identity stays bound.
func (s *Store) Unbind(identity string, st *capacity.State) {
	id := DeploymentID(identity)
	s.mu.Lock()
	b := s.bindings[id]
	if b == nil || b.st != st {
		s.mu.Unlock()
		return
	}
	delete(s.bindings, id)
	s.mu.Unlock()
	st.ClearFleet(b)
	b.ReleaseProbe()
}

// Up reports whether the store answered its last operation.
func (s *Store) Up() bool { return s.health.Load() == healthUp }

// maxCloseWait bounds how long Close lets requests still waiting in a
// queue of this store keep it open.
const maxCloseWait = 10 * time.Minute

// Close stops the background work, unbinds the states (unless a newer
// store has bound them), frees the probe claims this instance holds and
// closes the connections. The states keep working on local knowledge.
// While requests still wait in one of its queues (a config reload does not
// wait for the old config's requests), the store goes on serving them in
// the background and closes once they are gone (maxCloseWait at most).
func (s *Store) Close() error {
	if s.queued() {
		go func() {
			for end := time.Now().Add(maxCloseWait); s.queued() && time.Now().Before(end); {
				time.Sleep(50 * time.Millisecond)
			}
			_ = s.close()
		}()
		return nil
	}
	return s.close()
}

func (s *Store) close() error {
	s.cancel()
	s.mu.Lock()
	s.closed = true
	ps := s.ps
	bindings := make([]*binding, 0, len(s.bindings))
	for _, b := range s.bindings {
		bindings = append(bindings, b)
	}
	spendings := make([]*capacity.Spending, 0, len(s.spendings))
	for sp := range s.spendings {
		spendings = append(spendings, sp)
	}
	s.mu.Unlock()
	if ps != nil {
		_ = ps.Close()
	}
	s.wg.Wait()
	for _, b := range bindings {
		b.st.ClearFleet(b)
		b.ReleaseProbe()
	}
	if s.health.Load() != healthDown {
		for _, b := range bindings {
			b.upkeep(time.Now(), true) // what the slices and grants hold goes back to the fleet
			b.upkeepPlaces(time.Now(), true)
		}
		for _, b := range s.snapshotConsumers() {
			b.upkeepPlaces(time.Now(), true)
		}
		s.upkeepFlights(time.Now(), true)
		for _, sp := range spendings {
			sp.Release(time.Now()) // what a budget's slice holds goes back too
		}
		s.mu.Lock()
		batch := s.pending
		s.pending = map[*binding]*pending{}
		s.mu.Unlock()
		_ = s.flushWrites(context.Background(), batch, s.takeReleases(), s.takeOwners()) // a paced write still pending goes out
		ctx, cancel := context.WithTimeout(context.Background(), s.bgTimeout)
		s.closeQueues(ctx)
		cancel()
		s.leaveCensus()
	}
	return s.client.Close()
}

// answered records an answer from Redis on the request path.
func (s *Store) answered() { s.lastAnswer.Store(time.Now().UnixNano()) }

// late reports whether a call begun at start was answered late: after
// half the store's timeout. The request path then waits on Redis for that
// state (a deployment's slices, a queue's places) no more until a call
// answers sooner.
func (s *Store) late(start time.Time) bool { return time.Since(start) > s.timeout/2 }

// busy reports whether err, a failed budget call begun at start, is a
// timeout while Redis answered another call after start: a burst that
// queues on Redis or on the pool, not an outage. The call is then refused
// for a moment (the request tries again) rather than decided on local
// state, which would let each instance spend the whole budget again: under
// a burst of 2000 that drew a hundred upstream 429s. A stalled Redis
// (paused, not answering, gone) answers nothing after start: the call then
// fails (fail), so that no request waits on it past Timeout again.
func (s *Store) busy(err error, start time.Time) bool {
	var ne net.Error
	timeout := errors.Is(err, context.DeadlineExceeded) || errors.Is(err, redis.ErrPoolTimeout) ||
		errors.As(err, &ne) && ne.Timeout()
	return timeout && s.health.Load() == healthUp && s.lastAnswer.Load() > start.UnixNano()
}

// callFailed records a failed request-path call op begun at start: under
// load (busy) or for an answer, Redis' error reply or one malformed
// (errBadReply), an error only; otherwise (a stall, a lost connection) the store turns to local state (fail), so
// that the next requests do not wait on it again.
func (s *Store) callFailed(op string, err error, start time.Time) {
	var reply redis.Error
	if s.busy(err, start) || errors.As(err, &reply) || errors.Is(err, errBadReply) {
		s.obs.Error(op)
		return
	}
	s.fail(op, err)
}

// available reports whether the request path may ask Redis.
func (s *Store) available() bool { return s.health.Load() != healthDown }

// fail records a failed operation; the first failure after success logs
// once and turns the request path to local state until the poller gets an
// answer again.
func (s *Store) fail(op string, err error) {
	if s.ctx.Err() != nil {
		return // closing: not a failure of the store
	}
	s.obs.Error(op)
	if s.health.Swap(healthDown) != healthDown {
		s.obs.Up(false)
		s.log.Warn("fleet store unreachable: routing on local state until it answers again",
			zap.String("redis", s.addr), zap.String("op", op), zap.Error(err))
	}
}

// succeeded records an answer after a resynchronization.
func (s *Store) succeeded() {
	switch s.health.Swap(healthUp) {
	case healthDown:
		s.obs.Up(true)
		s.log.Info("fleet store reachable again: resynchronized", zap.String("redis", s.addr))
		select {
		case s.wake <- struct{}{}: // what was kept during the outage
		default:
		}
	case healthUnknown:
		s.obs.Up(true)
		s.log.Debug("fleet store connected", zap.String("redis", s.addr))
	}
}

// current reports whether b is still its deployment's binding (Bind may
// have replaced it, Unbind let it go).
func (s *Store) current(b *binding) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.bindings[b.id] == b
}

func (s *Store) snapshotBindings() []*binding {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]*binding, 0, len(s.bindings))
	for _, b := range s.bindings {
		out = append(out, b)
	}
	return out
}

// pollLoop resynchronizes at start and after every outage (publishing what
// this instance knows, then reading what the fleet knows), and reads the
// fleet's state every PollInterval in between.
func (s *Store) pollLoop() {
	defer s.wg.Done()
	t := time.NewTicker(s.poll)
	defer t.Stop()
	for {
		// A state a newer store took over and let go of (a reload to
		// another store that failed) comes back to this one.
		for _, b := range s.snapshotBindings() {
			if b.st.AdoptFleet(b) && !s.current(b) {
				b.st.ClearFleet(b) // replaced meanwhile (Bind): its state is no longer this store's to share
			}
		}
		if s.health.Load() != healthUp {
			if err := s.resync(); err != nil {
				s.fail("sync", err)
			} else {
				s.succeeded()
			}
		} else if err := s.pollOnce(); err != nil {
			s.fail("sync", err)
		}
		if s.health.Load() == healthUp {
			s.census()
		}
		select {
		case <-s.ctx.Done():
			return
		case <-t.C:
		case <-s.pollNow:
		}
	}
}

// resync publishes every bound state's knowledge (the store keeps the newest
// of each part) and reads the fleet's back.
func (s *Store) resync() error {
	ctx, cancel := context.WithTimeout(s.ctx, s.bgTimeout)
	defer cancel()
	if err := s.client.Ping(ctx).Err(); err != nil {
		return err
	}
	batch := map[*binding]*pending{}
	for _, b := range s.snapshotBindings() {
		batch[b] = &pending{sh: b.st.Shared(), notify: true}
	}
	if err := s.write(ctx, batch); err != nil {
		return err
	}
	return s.pollOnce()
}

// pollOnce reads every bound deployment's shared state and merges it.
func (s *Store) pollOnce() error {
	bindings := s.snapshotBindings()
	if len(bindings) == 0 {
		return nil
	}
	ctx, cancel := context.WithTimeout(s.ctx, s.bgTimeout)
	defer cancel()
	pipe := s.client.Pipeline()
	cmds := make([]*redis.SliceCmd, len(bindings))
	for i, b := range bindings {
		cmds[i] = pipe.HMGet(ctx, b.stateKey, partCircuit, partRequests, partTokens, partDrain)
	}
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) && !redis.HasErrorPrefix(err, "WRONGTYPE") {
		return err
	}
	for i, b := range bindings {
		if err := cmds[i].Err(); err != nil && !errors.Is(err, redis.Nil) {
			if !redis.HasErrorPrefix(err, "WRONGTYPE") {
				return err
			}
			// Not a hash the router wrote: dropped (the next write makes
			// it again), not taken for an outage.
			s.replaceMalformed(ctx, b.stateKey, "a key of the wrong type")
			continue
		}
		var sh capacity.Shared
		for k, v := range cmds[i].Val() {
			if str, ok := v.(string); ok {
				decodePart(&sh, []string{partCircuit, partRequests, partTokens, partDrain}[k], str)
			}
		}
		b.st.Merge(trusted(sh, time.Now()))
	}
	return nil
}

// malformed logs, once per key, that key held what the router cannot have
// written (what), and that it was replaced.
func (s *Store) malformed(key, what string) {
	s.mu.Lock()
	seen := s.logged[key]
	if s.logged == nil {
		s.logged = map[string]bool{}
	}
	s.logged[key] = true
	s.mu.Unlock()
	if !seen {
		s.log.Warn("fleet store: malformed key replaced (not written by this router)", zap.String("key", key), zap.String("held", what))
	}
}

// subscribeLoop receives the fleet's notifications and merges them. A
// connection that breaks is replaced after PollInterval; one that goes
// silent and does not answer a ping is replaced too.
func (s *Store) subscribeLoop() {
	defer s.wg.Done()
	idle := max(10*s.poll, 10*time.Second)
	for s.ctx.Err() == nil {
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			return
		}
		ps := s.client.Subscribe(s.ctx, s.channel)
		s.ps = ps
		s.mu.Unlock()
		s.receive(ps, idle)
		_ = ps.Close()
		select {
		case <-s.ctx.Done():
			return
		case <-time.After(s.poll):
		}
	}
}

func (s *Store) receive(ps *redis.PubSub, idle time.Duration) {
	pinged := false
	for {
		msg, err := ps.ReceiveTimeout(s.ctx, idle)
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() && !pinged && s.ctx.Err() == nil {
				pinged = true
				if err := ps.Ping(s.ctx); err == nil {
					continue
				}
			}
			s.fail("subscribe", err)
			return
		}
		pinged = false
		switch m := msg.(type) {
		case *redis.Subscription:
			// (Re)subscribed: what was published meanwhile is read by a poll.
			select {
			case s.pollNow <- struct{}{}:
			default:
			}
		case *redis.Message:
			s.handle(m.Payload)
		}
	}
}

// handle merges one notification from another instance.
func (s *Store) handle(payload string) {
	origin, id, sh, ok := decodeMessage(payload)
	if !ok || origin == s.origin {
		return
	}
	s.mu.Lock()
	b := s.bindings[id]
	s.mu.Unlock()
	if b != nil {
		b.st.Merge(trusted(sh, time.Now()))
	}
}

// writeLoop writes what the states published, coalesced: what changes
// routing (a circuit, a drain, a window running out or coming back, a
// probe claim freed, a response's owner) at once, the rest (a remaining
// count going down) at most once per PollInterval, as the others poll it:
// at 2,000 answers a second, each answer's write made the state hash
// 99.7% of Redis' key accesses.
func (s *Store) writeLoop() {
	defer s.wg.Done()
	var last time.Time
	for {
		select {
		case <-s.ctx.Done():
			return
		case <-s.wake:
		}
		if !s.paceWrites(last) {
			return
		}
		last = time.Now()
		s.mu.Lock()
		batch := s.pending
		s.pending = map[*binding]*pending{}
		s.mu.Unlock()
		releases := s.takeReleases()
		owners := s.takeOwners()
		if s.health.Load() == healthDown {
			// Kept: written once Redis answers again (succeeded wakes the
			// writer), after the resynchronization.
			s.requeue(batch, releases, owners)
			continue
		}
		if err := s.flushWrites(s.ctx, batch, releases, owners); err != nil {
			s.fail("publish", err)
		}
	}
}

// flushWrites writes batch, then releases and owners, within the
// background timeout of parent; what it could not write is kept for the
// next write.
func (s *Store) flushWrites(parent context.Context, batch map[*binding]*pending, releases []release, owners []ownerWrite) error {
	ctx, cancel := context.WithTimeout(parent, s.bgTimeout)
	defer cancel()
	if err := s.write(ctx, batch); err != nil {
		s.requeue(batch, releases, owners)
		return err
	}
	s.writeReleases(ctx, releases)
	if err := s.writeOwners(ctx, owners); err != nil {
		s.requeue(nil, nil, owners)
		return err
	}
	return nil
}

// requeue puts writes that were not written back before those queued
// since (a part published since is newer and stays), the owners within
// maxOwnerWrites.
func (s *Store) requeue(batch map[*binding]*pending, releases []release, owners []ownerWrite) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for b, p := range batch {
		if q := s.pending[b]; q != nil {
			p.fold(q)
		}
		s.pending[b] = p
	}
	s.releases = append(releases, s.releases...)
	o := append(owners, s.owners...)
	s.owners = o[max(len(o)-maxOwnerWrites, 0):]
}

// paceWrites waits, when nothing pending changes routing, until a poll
// interval has passed since the last write (or something urgent comes);
// false when the store closes.
func (s *Store) paceWrites(last time.Time) bool {
	for !s.urgent() {
		d := time.Until(last.Add(s.poll))
		if d <= 0 {
			return true
		}
		t := time.NewTimer(d)
		select {
		case <-s.ctx.Done():
			t.Stop()
			return false
		case <-s.wake:
		case <-t.C:
		}
		t.Stop()
	}
	return true
}

// urgent reports whether something pending for the writer changes routing.
func (s *Store) urgent() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.releases) > 0 || len(s.owners) > 0 {
		return true
	}
	for _, p := range s.pending {
		if p.notify {
			return true
		}
	}
	return false
}

func (s *Store) takeReleases() []release {
	s.mu.Lock()
	defer s.mu.Unlock()
	r := s.releases
	s.releases = nil
	return r
}

func (s *Store) writeReleases(ctx context.Context, releases []release) {
	for _, r := range releases {
		if err := releaseScript.Run(ctx, s.client, []string{r.key}, r.token).Err(); err != nil && !errors.Is(err, redis.Nil) {
			s.fail("publish", err)
			return
		}
	}
}

// write runs publishScript for each deployment of batch, in one pipeline.
func (s *Store) write(ctx context.Context, batch map[*binding]*pending) error {
	if len(batch) == 0 {
		return nil
	}
	run := func(evalsha bool) error {
		pipe := s.client.Pipeline()
		for b, p := range batch {
			parts := encode(p.sh, s.keep)
			if len(parts) == 0 {
				continue
			}
			channel := ""
			if p.notify {
				channel = s.channel
			}
			args := make([]any, 0, 2+4*len(parts))
			args = append(args, channel, s.origin+"\n"+b.id)
			for _, pt := range parts {
				args = append(args, pt.name, pt.at, pt.until, pt.value)
			}
			if evalsha {
				publishScript.EvalSha(ctx, pipe, []string{b.stateKey}, args...)
			} else {
				publishScript.Eval(ctx, pipe, []string{b.stateKey}, args...)
			}
		}
		_, err := pipe.Exec(ctx)
		if errors.Is(err, redis.Nil) {
			err = nil
		}
		return err
	}
	err := run(true)
	if err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
		err = run(false) // a restarted Redis forgot the script: send it whole, once
	}
	return err
}

// nextToken returns an id unique to this instance and call.
func (s *Store) nextToken() string {
	return s.origin + "-" + strconv.FormatUint(s.seq.Add(1), 36)
}

var errBadReply = errors.New("unexpected reply from the reserve script")
