package pglimit

import "github.com/pglimit/cooldown/pglimit/internal/engine"

// capsOf is what the capability table (internal/engine) reads of a
// limiter of c on table, its deployment not looked up yet.
func capsOf(c Config, table string) engine.Shape {
	limits := make([]engine.Limit, len(c.Limits))
	for i, lim := range c.Limits {
		limits[i] = engine.Limit{Name: lim.Name, Algorithm: lim.Algorithm.String(), GCRA: lim.Algorithm == GCRA, Calendar: lim.Calendar != "", Debt: lim.Debt > 0}
	}
	return engine.Shape{Strategy: engine.Strategy(c.Strategy), Limits: limits, Overrides: c.Overrides,
		Shadow: c.Shadow, Schema: c.Schema, Table: table}
}

// specOf is what the statements (internal/engine) read of a limiter of c.
func specOf(c Config) engine.Spec {
	limits := make([]engine.LimitSpec, len(c.Limits))
	for i, lim := range c.Limits {
		limits[i] = engine.LimitSpec{Limit: lim.spec(), Name: lim.Name, Burst: int64(lim.Burst)}
	}
	return engine.Spec{Strategy: engine.Strategy(c.Strategy), Schema: c.Schema, Table: c.Table, Limits: limits,
		Overrides: c.Overrides, AsyncCommit: c.AsyncCommit, Shadow: c.Shadow,
		IDRetention: c.IDRetention, Timeout: c.Timeout, MaxPeriod: maxPeriod.Microseconds()}
}

// shape is the limiter's facets, on a table the database made dep.
func (l *limiter) shape(dep engine.Deployment) engine.Shape {
	s := l.caps
	s.Deployment = dep
	return s
}

// deployment is what check has found the table to be: Distributed once
// it found the table distributed, else OneServer once it passed, else
// Unchecked.
func (l *limiter) deployment() engine.Deployment {
	switch {
	case l.dist.Load() != nil:
		return engine.Distributed
	case l.verified.Load():
		return engine.OneServer
	}
	return engine.Unchecked
}
