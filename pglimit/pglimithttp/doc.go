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
// member names the limits that refused. A key that cannot be extracted or is
// not a valid pglimit key, and a cost that [CostFunc] cannot compute or that
// no limit could admit, get 400 and never reach the database.
//
// The RateLimit fields follow draft-ietf-httpapi-ratelimit-headers-11 (May
// 2026). RateLimit-Policy lists every limit, Rate per Period; RateLimit
// reports the binding one ([pglimit.Decision.Limit]): its remaining units
// and the seconds, rounded up, until it is back to full:
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
