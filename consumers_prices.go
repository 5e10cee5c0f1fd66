package llmrouter

import "go.uber.org/zap"

// warnUnpricedBudgets warns, at load, of each plan with a budget whose
// model groups (its groups, or all) have a deployment with neither
// cost_input nor cost_output: a budget counts what answers cost at the
// deployments' prices, so such a deployment's answers cost 0 and spend
// none of it. The warning names the plan and the deployments
// (provider/model), in the groups' order.
func (h *Handler) warnUnpricedBudgets() {
	for _, name := range sortedKeys(h.Consumers.Plans) {
		p := h.Consumers.Plans[name]
		if p == nil || p.Budget == nil {
			continue
		}
		groups := p.Groups
		if len(groups) == 0 {
			groups = sortedKeys(h.Models)
		}
		if free := h.unpriced(groups); len(free) > 0 {
			h.logger.Warn("plan has a budget, but deployments it may use have no cost_input or cost_output: their answers cost 0 and spend none of the budget; set their prices (USD per 1M tokens)",
				zap.String("plan", name), zap.Strings("deployments", free))
		}
	}
}

// unpriced lists the deployments of groups without a price, each once.
func (h *Handler) unpriced(groups []string) []string {
	var out []string
	seen := map[string]bool{}
	for _, g := range groups {
		mg := h.Models[g]
		if mg == nil {
			continue
		}
		for _, d := range mg.Deployments {
			id := d.Provider + "/" + d.Model
			if d.CostInput == 0 && d.CostOutput == 0 && !seen[id] {
				seen[id] = true
				out = append(out, id)
			}
		}
	}
	return out
}
