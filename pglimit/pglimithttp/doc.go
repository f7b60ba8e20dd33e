// Package pglimithttp puts a [pglimit.Limiter] in front of an HTTP handler:
// one decision per request, keyed by a [KeyFunc], with the standard headers
// that tell a client when to come back.
//
// # Usage
//
//	lim, err := pglimit.New(pool, &pglimit.Config{
//		Namespace: "create-item",
//		Limits: []pglimit.Limit{
//			{Name: "per-minute", Rate: 5, Period: time.Minute, Burst: 3},
//			{Name: "per-day", Rate: 20, Period: 24 * time.Hour, Algorithm: pglimit.FixedWindow},
//		},
//	})
//	mw, err := pglimithttp.Middleware(lim, &pglimithttp.Config{
//		KeyFunc: pglimithttp.FromPathValue("user"),
//	})
//	mux.Handle("POST /items/{user}", mw(createItem))
//
// The middleware asks the limiter what it enforces ([pglimit.Limiter.Policy]):
// the limits are given once, to the limiter. A [CostFunc] makes a request
// count for more than one unit.
//
// # Responses
//
// An admitted request reaches the handler with RateLimit-Policy and RateLimit
// headers set. A refused one gets 429 Too Many Requests with Retry-After (whole
// seconds, rounded up, at least 1), the same RateLimit headers and an RFC 9457
// problem+json body of the quota-exceeded type, whose violated-policies
// member names the limits that refused, and whose namespaces member the
// namespaces of their limiters (none for [Concurrency]): the application's
// own names for its limiters, never a key, which lead the person on call
// to the limiter's recorded policy ([pglimit.RecordedPolicies]). A key that cannot be extracted or is
// not a valid pglimit key, and a cost that [CostFunc] cannot compute or that
// no limit could admit, get 400 and never reach the database.
//
// The RateLimit fields follow draft-ietf-httpapi-ratelimit-headers-11 (May
// 2026). RateLimit-Policy lists every limit, Rate per Period; RateLimit
// reports the binding one ([pglimit.Decision.Limit]): its remaining units
// and the seconds, rounded up, until it is back to full (one item per
// middleware, when several are stacked: see below):
//
//	RateLimit-Policy: "per-minute";q=5;w=60, "per-day";q=20;w=86400
//	RateLimit: "per-minute";r=2;t=12
//
// Retry-After is the decision's RetryAfter, the longest wait among the
// limits that refused. The draft has no parameter for a burst, so a GCRA
// limit's burst is not advertised. A cooldown is the limit "cooldown" of one
// request per window.
//
// [Concurrency] holds a [pglimitsem.Semaphore] slot while the handler runs.
// A request that finds every slot held gets the same 429, violating the
// policy "concurrency" (RateLimit-Policy: "concurrency";q=<slots>;
// qu="concurrent-requests"), with Retry-After the semaphore's hint: how
// long its slots are typically held, at most until the first held lease
// ends.
//
// The handler finds the decision in the request's context ([DecisionFrom]).
// [Config.OnRefused] replaces the 429 body with one of the application's,
// the headers already set. [Config.Exempt] and [Config.ExemptKeys] let
// health checks, internal callers or known keys through unlimited.
//
// # Stacking middlewares
//
// Limits that one decision cannot hold together, such as counts of
// requests beside a budget of bytes settled at the real size, are
// combined by wrapping one middleware of this package in another:
//
//	counts, err := pglimithttp.Levels(levels, nil) // a cooldown, a daily count: 1 a request
//	size, err := pglimithttp.Middleware(bytes, &pglimithttp.Config{
//		KeyFunc:  pglimithttp.FromPathValue("user"),
//		CostFunc: estimate, // settled at the size the handler reports
//		Settle:   true,
//	})
//	mux.Handle("POST /uploads/{user}", counts(size(upload)))
//
// A request refused anywhere is charged nowhere. The middlewares of one
// request find each other in its context, never by its status, so an
// application's own 429 counts as any answer does. When one answers a
// request itself (429, fail-closed 429, 400 for its key or cost, 503,
// 499), the handler never runs, and every middleware outside it that
// admitted the request gives back the units it took
// ([pglimit.Limiter.Refund] of the decision's Granted, at every level)
// instead of settling them. Their [Config.OnDecision] saw the request
// admitted; the refund is not an event.
//
// RateLimit-Policy lists the policies of every middleware the request
// met, outermost first. RateLimit has one item per middleware that
// admitted the request, each its binding limit, since the units of
// different middlewares (requests, bytes) cannot be compared; a 429 from
// inside carries the refusing middleware's item alone, with its
// Retry-After and violated-policies, the outer counts being given back.
// Limit names must differ across the stack, as across levels: nothing
// checks it.
//
// Put outermost the limits that refuse most often and are not settled (a
// cooldown, a daily count): a request they refuse costs the others
// nothing. Put innermost the one middleware with [Config.Settle]:
// [SetCost] reaches only the innermost settling middleware, and one
// outside it keeps its estimate.
//
// A refund is one statement per level of each middleware outside (about
// one more decision), run after the inner answer is written and before
// the response is finished, within its limiter's Timeout (a Levels'
// levels at once), so a refusal from inside may wait that long. A refund
// that fails (the database, the Range strategy, units served from a
// lease) keeps the units charged and is logged as a limiter failure, at
// most one line per [Config.LogInterval], each counting those left out. A
// limit may also keep them without an error: GCRA takes them back only if
// no admission of the key came since, a window only within its window.
// A handler in between that runs the inner middleware on another
// goroutine and returns first ([http.TimeoutHandler]) can hide its answer:
// the outer charge then stays.
//
// # When the database fails
//
// [Config.OnError] chooses between answering 503 ([Unavailable], the
// default), letting the request through ([FailOpen]) and refusing it with
// 429 ([FailClosed]). Every choice is bounded by the limiter's own timeout:
// a dead database yields an answer, never a hang. The 503 carries
// Retry-After set to the shortest interval between two units of any limit
// (an outage is not the client's quota); the fail-closed 429, the longest
// wait the limits can impose ([pglimit.Policy.LongestWait]).
//
// Failures are logged as warnings to [Config.Logger] (slog.Default unless
// set), at most one line per [Config.LogInterval], each counting the
// failures left out since the previous one. [Config.OnDecision] sees every
// one, for metrics.
//
// # Client addresses
//
// [RemoteIP] keys by the peer address and ignores X-Forwarded-For and
// Forwarded, which any client can write, unless the peer is one of the
// configured trusted proxies; then it reads the one header those proxies
// write ([RemoteIPConfig.Header]). IPv6 clients are keyed by their /64
// ([RemoteIPConfig.IPv6Prefix]), since one end site holds a whole /64.
package pglimithttp
