// Package testdb is the repository's own test harness: it gives every test
// of every module a real PostgreSQL, and a server of its own to the tests
// that restart or crash one. Package pglimittest hands users the part
// their tests need ([Main], [URL], [ServerURL], [Pool], [Schema]) by
// calling this package.
//
// # Where the server comes from
//
// The shared server is, in order: an explicit URL ([EnvURL]), a
// testcontainers-go PostgreSQL container when a Docker engine answers, or a
// throwaway cluster from local PostgreSQL binaries (initdb and postgres, run
// as an unprivileged user when the process is root). With none of these it
// fails with a message saying how to provide one; it never skips. [EnvPrefer]
// forces a source, [EnvPGBin] picks the local binaries (another major) and
// [EnvDockerImage] the image. The log names the version and source used.
//
// The container is started by a small command of its own module
// (internal/pgcontainer in the repository, run with go run), so that this
// package, and every module that imports pglimit, needs no testcontainers.
// That command removes the container when the tests end, with or without
// testcontainers' reaper (TESTCONTAINERS_RYUK_DISABLED=true where the reaper
// image cannot be pulled). On an engine that cannot program bridge networks,
// set [EnvDockerNetwork] to "host": the container then shares the host's
// network, listens on 127.0.0.1 on a free port, and the daemon host is taken
// to be 127.0.0.1 (TESTCONTAINERS_HOST_OVERRIDE). A laptop's Docker needs
// none of this.
//
// # Tests
//
// Every test package calls [Main] from TestMain. [Schema] gives each test
// its own migrated schema and [Pool] its own pool, so tests run in
// parallel; [PgBouncerPool] reaches the shared server through PgBouncer.
// A fault test takes a server of its own with [OwnServer] and connects
// with [ServerPool]; [Server.Freeze] stops it answering, and
// [NewStallProxy] silences the connections to the shared server. A test that needs a component the machine lacks
// (pgbouncer, say) stops through [Missing], which fails under CI:
//
//	func TestMain(m *testing.M) { testdb.Main(m) }
//
//	func TestRestart(t *testing.T) {
//		srv := testdb.OwnServer(t)
//		pool := testdb.ServerPool(t, srv, 4)
//		...
//	}
package testdb
