package llmrouter

import (
	"math"

	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
)

// planKeys are the subdirectives of a plan block (the handler's own,
// consumer, keys, plan and consumers, are in handlerKeys).
var planKeys = []string{"weight", "rpm", "tpm", "concurrent", "budget", "groups"}

// parseConsumers reads one of the consumers' subdirectives (key, the
// dispenser at it) into h.Consumers:
//
//	consumer  <placeholder>
//	keys      <file>
//	plan <name> {
//	    weight     <n>
//	    rpm        <requests per minute>
//	    tpm        <tokens per minute>
//	    concurrent <n>
//	    budget     <USD> per <duration>
//	    groups     <model group>...
//	}
//	consumers <plan> <consumer>...
//
// consumer and keys once; plan once per name; a consumer on one plan.
// Errors give the file and line. References to model groups and plans
// defined further down are checked by validateConsumers.
func (h *Handler) parseConsumers(d *caddyfile.Dispenser, key string) error {
	c := &h.Consumers
	switch key {
	case "consumer", "keys":
		args := d.RemainingArgs()
		if len(args) != 1 {
			return d.ArgErr()
		}
		if key == "consumer" {
			c.Consumer = args[0]
		} else {
			c.Keys = args[0]
		}
	case "plan":
		return h.parsePlan(d)
	case "consumers":
		args := d.RemainingArgs()
		if len(args) < 2 {
			return d.Err("consumers takes <plan> <consumer>..., such as: consumers team-a alice bob")
		}
		for _, who := range args[1:] {
			for plan, members := range c.ConsumersOf {
				for _, m := range members {
					if m == who {
						return d.Errf("consumer %s is on two plans: %s and %s", who, plan, args[0])
					}
				}
			}
		}
		if c.ConsumersOf == nil {
			c.ConsumersOf = map[string][]string{}
		}
		c.ConsumersOf[args[0]] = append(c.ConsumersOf[args[0]], args[1:]...)
	}
	if key == "consumer" {
		if err := checkConsumer(c.Consumer); err != nil {
			return d.Err(err.Error())
		}
	}
	return nil
}

// parsePlan reads `plan <name> { ... }`.
func (h *Handler) parsePlan(d *caddyfile.Dispenser) error {
	c := &h.Consumers
	if !d.NextArg() {
		return d.ArgErr()
	}
	name := d.Val()
	if d.NextArg() {
		return d.ArgErr()
	}
	if _, dup := c.Plans[name]; dup {
		return d.Errf("duplicate plan %s", name)
	}
	p := new(ConsumerPlan)
	seen := map[string]bool{}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		key := d.Val()
		if seen[key] {
			return d.Errf("duplicate subdirective %s in plan %s", key, name)
		}
		seen[key] = true
		if err := parsePlanKey(d, key, name, p); err != nil {
			return err
		}
	}
	if c.Plans == nil {
		c.Plans = map[string]*ConsumerPlan{}
	}
	c.Plans[name] = p
	cp := c.plan(name)
	if err := cp.Validate(); err != nil {
		delete(c.Plans, name)
		return d.Err(err.Error())
	}
	return nil
}

// parsePlanKey reads one subdirective of plan name into p.
func parsePlanKey(d *caddyfile.Dispenser, key, name string, p *ConsumerPlan) error {
	var err error
	var n int64
	switch key {
	case "weight":
		err = parseFloat(d, &p.Weight)
	case "rpm":
		err = parseInt(d, &p.RPM)
	case "tpm":
		err = parseInt(d, &p.TPM)
	case "concurrent":
		if err = parseInt(d, &n); err == nil && n > math.MaxInt32 {
			err = d.Errf("concurrent must be at most %d", math.MaxInt32)
		}
		p.Concurrent = int(n)
	case "budget":
		p.Budget, err = parseBudget(d)
	case "groups":
		if p.Groups = d.RemainingArgs(); len(p.Groups) == 0 {
			err = d.ArgErr()
		}
	default:
		err = d.Errf("unknown subdirective %s in plan %s%s", key, name, suggest(key, planKeys))
	}
	return err
}
