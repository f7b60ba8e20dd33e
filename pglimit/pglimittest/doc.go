// Package pglimittest gives tests and examples a real PostgreSQL, and holds
// the conformance suite every strategy passes.
//
// # Tests
//
// Call [Main] from TestMain. [Schema] gives each test its own migrated
// schema and [Pool] its own pool, so tests run in parallel; [URL] and
// [ServerURL] name the server. [Exercise] is the conformance suite:
//
//	func TestMyStrategy(t *testing.T) {
//		pglimittest.Exercise(t, func(db pglimit.DB, cfg *pglimit.Config) (pglimit.Limiter, error) {
//			cfg.Strategy = pglimit.Upsert
//			return pglimit.New(db, cfg)
//		})
//	}
//
// [WithPool] runs it over pools of the test's choosing, and [OnServer]
// against another server.
//
// # A clock the test moves
//
// NewClock gives a test a database clock that stands still until the test
// sets or advances it; a limiter made on one of its pools (Clock.Pool)
// decides at its time, so that a test of tomorrow's quota waits for
// nothing:
//
//	clock := pglimittest.NewClock(t)
//	lim, err := pglimit.New(clock.Pool(t), &cfg)
//	...
//	clock.Advance(24 * time.Hour)
//
// # Where the server comes from
//
// The server is, in order: the one PGLIMIT_TEST_DATABASE_URL names (tests
// create and drop their own schemas in its database), a testcontainers-go
// PostgreSQL container when a Docker engine answers, or a throwaway cluster
// from local PostgreSQL binaries. With none of these the tests fail with a
// message saying how to provide one; they never skip.
// PGLIMIT_TEST_POSTGRES set to "docker" or "local" forces a source,
// PGLIMIT_TEST_PGBIN names a directory holding initdb and postgres (another
// major), PGLIMIT_TEST_DOCKER_IMAGE an image that behaves like the official
// postgres image, and PGLIMIT_TEST_DOCKER_NETWORK set to "host" runs the
// container on the host's network, for engines that cannot program bridge
// networks. The log names the version and source used.
package pglimittest
