// Package pglimittest gives tests, examples, the demo and the load test a
// real PostgreSQL, and holds the conformance suite every strategy passes.
//
// # Where the server comes from
//
// [StartServer] uses, in order: an explicit URL ([EnvURL] for tests), a
// testcontainers-go PostgreSQL container when a Docker engine answers, or a
// throwaway cluster from local PostgreSQL binaries (initdb and postgres, run
// as an unprivileged user when the process is root). With none of these it
// fails with a message saying how to provide one; it never skips.
//
// # Tests
//
// Call [Main] from TestMain. [Schema] gives each test its own migrated
// schema and [Pool] its own pool, so tests run in parallel. [Exercise] is the
// conformance suite:
//
//	func TestMyStrategy(t *testing.T) {
//		pglimittest.Exercise(t, func(db pglimit.DB, cfg *pglimit.Config) (pglimit.Limiter, error) {
//			cfg.Strategy = pglimit.Upsert
//			return pglimit.New(db, cfg)
//		})
//	}
package pglimittest
