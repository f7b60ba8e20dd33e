package pglimittest

import (
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglimit/cooldown/internal/onpglimit/testdb"
)

// Main runs a package's tests with a shared PostgreSQL server, and fails
// the run if a goroutine was left behind.
//
// The server is started on first use and stopped afterwards. Call Main
// from TestMain:
//
//	func TestMain(m *testing.M) { pglimittest.Main(m) }
func Main(m *testing.M) { testdb.Main(m) }

// URL returns the connection URL of the shared test server, starting it on
// first use. The test fails with instructions when no server can be had.
func URL(tb testing.TB) string {
	tb.Helper()
	return testdb.URL(tb)
}

// ServerURL is [URL] for code that has no testing.TB, such as examples: it
// returns the error instead of failing a test.
func ServerURL() (string, error) { return testdb.ServerURL() }

// Pool returns a new pool to the shared server, closed when the test ends.
// Its search_path is empty, so SQL that forgets to qualify a table fails.
func Pool(tb testing.TB) *pgxpool.Pool {
	tb.Helper()
	return testdb.Pool(tb)
}

// Schema creates a schema with pglimit's migrations applied, dropped when
// the test ends, and returns its name. Tests that each use their own schema
// can run in parallel.
func Schema(tb testing.TB) string {
	tb.Helper()
	return testdb.Schema(tb)
}
