// Package pglimitgrpc rate-limits a gRPC server with a [pglimit.Limiter]:
// a unary and a stream server interceptor decide each call, or each stream
// when it opens, before its handler runs.
//
// A refused call ends with codes.ResourceExhausted and two details: a
// RetryInfo with how long to wait ([RetryDelay] reads it), and a
// QuotaFailure naming the limits that refused it. The same delay goes in
// the trailer grpc-retry-pushback-ms, so a client whose gRPC retry policy
// retries RESOURCE_EXHAUSTED waits for it. When the limiter cannot decide
// (the database is down), [Config.OnError] says what the call gets:
// codes.Unavailable by default.
//
// A call's key comes from [Config.Key]: the peer's address by default
// ([PeerAddress], which no metadata a client sends can change), the
// identity in its verified TLS client certificate ([PeerCertificate]), a
// metadata entry ([Metadata]), the method ([Method]), or any function of
// the call's context. Methods can have limiters
// of their own ([Config.Methods]) or none ([Config.Exempt]).
//
// [UnaryServerConcurrency] and [StreamServerConcurrency] hold a slot of a
// pglimitsem.Semaphore per call or stream instead: at most N in flight
// per key, fleet-wide, with the call's flow ([Config.Flow]) or priority
// level ([Config.Level]) taken from the call.
//
// # Chaining interceptors
//
// Limits that one decision cannot hold together, such as a daily count
// per organisation and user beside a cooldown per API key, are
// interceptors of this package chained around each other:
//
//	counts, err := pglimitgrpc.UnaryServerLevels(levels, nil) // org and user, 1 a call
//	keyed, err := pglimitgrpc.UnaryServerInterceptor(cooldown, &pglimitgrpc.Config{Key: pglimitgrpc.Metadata("x-api-key")})
//	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(counts, keyed))
//
// and the same with grpc.ChainStreamInterceptor for streams. A call
// refused anywhere is charged nowhere. The interceptors of one call find
// each other in its context, never by its status, so a handler's own
// ResourceExhausted counts as any answer does. When one fails a call
// itself (ResourceExhausted, fail-closed or not, or a concurrency
// interceptor's refused slot; InvalidArgument for its key, flow or level;
// Unavailable; the client gone while it decided), the handler never
// runs, and every interceptor outside it that took units gives them back
// ([pglimit.Limiter.Refund] of the decision's Granted, at every level)
// before the call's status is sent. Their [Config.OnDecision] saw the
// call admitted; the refund is not an event. An interceptor of another
// package that fails a call is not seen: the units stay charged.
//
// The status names the limits of the interceptor that refused, alone: the
// others gave their units back. An admitted call carries no metadata of
// these interceptors, and a refused one the trailer
// grpc-retry-pushback-ms once, so no interceptor overwrites another's.
// Put outermost the limits that refuse most often: a call they refuse
// costs the others nothing.
//
// A refund is one statement per level of each interceptor outside (about
// one more decision), within its limiter's Timeout (a Levels
// interceptor's levels at once), so a status from inside may wait that
// long. A refund that
// fails (the database, the Range strategy, units served from a lease)
// keeps the units charged and is logged as a limiter failure, at most one
// line per [Config.LogInterval], each counting those left out. A limit
// may also keep them without an error: GCRA takes them back only if no
// admission of the key came since, a window only within its window. An
// interceptor in between that runs the rest of the chain on another
// goroutine and returns first can hide its failure: the outer charge then
// stays.
//
// The package is a module of its own, so that importers of pglimit who do
// not use gRPC never download it.
package pglimitgrpc
