package llmrouter

import (
	"fmt"

	"github.com/llmrouter/caddy-llm-router/internal/router"
	"github.com/llmrouter/caddy-llm-router/provider"
)

// setPrices sets d's prices of prompt-cache reads and writes (USD per 1M
// tokens): dc's own, else dc's input price times the multiples its
// provider type states for its model (provider.CachePricer: the built-in
// types' in internal/adapters/facts.go, with their sources), else the
// input price.
func setPrices(d *router.Deployment, p provider.Provider, dc *Deployment) {
	read, write, write1h := 1.0, 1.0, 1.0
	if cp, ok := p.(provider.CachePricer); ok {
		read, write, write1h = cp.CachePrices(dc.Model)
	}
	price := func(set *float64, times float64) float64 {
		if set != nil {
			return *set
		}
		return dc.CostInput * times
	}
	d.CostCached = price(dc.CostCachedInput, read)
	d.CostCacheWrite = price(dc.CostCacheWrite, write)
	d.CostCacheWrite1h = price(dc.CostCacheWrite1h, write1h)
}

// cachePricesError tells a deployment's prompt-cache write price that is
// no price: each must be a finite number from 0 to maxPrice USD per 1M
// tokens.
func (d *Deployment) cachePricesError() error {
	for _, p := range []struct {
		name string
		v    *float64
	}{{"cost_cache_write", d.CostCacheWrite}, {"cost_cache_write_1h", d.CostCacheWrite1h}} {
		if p.v != nil && (!finite(*p.v) || *p.v < 0 || *p.v > maxPrice) {
			return fmt.Errorf("%s must be from 0 to %g USD per 1M tokens", p.name, float64(maxPrice))
		}
	}
	return nil
}
