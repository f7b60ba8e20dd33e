// Package pglimithttp puts a [pglimit.Limiter] in front of an HTTP handler:
// one decision per request, keyed by a [KeyFunc], with the standard headers
// that tell a client when to come back.
//
// # Usage
//
//	mw, err := pglimithttp.Middleware(lim, &pglimithttp.Config{
//		Cooldown: 2 * time.Second, // the limiter's cooldown, advertised to clients
//		KeyFunc:  pglimithttp.FromPathValue("user"),
//	})
//	mux.Handle("GET /items/{user}", mw(listItems))
//
// # Responses
//
// An admitted request reaches the handler with RateLimit-Policy and RateLimit
// headers set. A refused one gets 429 Too Many Requests with Retry-After (whole
// seconds, rounded up, at least 1), the same RateLimit headers and an RFC 9457
// problem+json body. A key that cannot be extracted or is not a valid
// pglimit key gets 400 and never reaches the database.
//
// The RateLimit fields follow draft-ietf-httpapi-ratelimit-headers-11 (May
// 2026): a cooldown is a policy of one request per window,
//
//	RateLimit-Policy: "cooldown";q=1;w=2
//	RateLimit: "cooldown";r=0;t=2
//
// where t is the time, in seconds rounded up, until the key may pass again.
//
// # When the database fails
//
// [Config.OnError] chooses between answering 503 ([Unavailable], the
// default), letting the request through ([FailOpen]) and refusing it with
// 429 ([FailClosed]). Every choice is bounded by the limiter's own timeout:
// a dead database yields an answer, never a hang.
//
// # Client addresses
//
// [RemoteIP] keys by the peer address and ignores X-Forwarded-For, which any
// client can write, unless the peer is one of the configured trusted proxies.
package pglimithttp
