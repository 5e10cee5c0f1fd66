// Package sim is the deterministic simulation of the routing core (make
// sim): the real router (internal/router: queue, tiers, fallback groups,
// capacity, hedging, stream relay and resume) behind the real Chat client
// API (internal/api) and the real provider adapters (internal/adapters),
// against simulated providers and clients, in the virtual time of
// testing/synctest, every random choice drawn from one seed. All of it is
// in the package's tests (sim_test.go and the files beside it, one per
// concern: providers, windows, clients, invariants, the ideal scheduler,
// scenarios); TESTING.md says how to run and replay it.
package sim
