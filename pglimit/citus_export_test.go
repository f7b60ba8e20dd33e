package pglimit

// DecisionStatement returns the statement lim (of a strategy with one
// statement) sends to decide a request of one unit for key, general or
// fast, in its own transaction or a caller's, with its arguments.
func DecisionStatement(lim Limiter, key string, general, inTx bool) (string, []any) {
	l := lim.(*limiter)
	q := l.allowQuery(key, 1)
	if general {
		q = l.generalQuery(key, 1, modeAllow, 0)
	}
	return l.sql(q, inTx), l.params(q)
}
