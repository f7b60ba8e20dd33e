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
// The package is a module of its own, so that importers of pglimit who do
// not use gRPC never download it.
package pglimitgrpc
