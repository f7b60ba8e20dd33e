package pgserver

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// Without an engine, the Docker probe gives up within its timeout, so that
// a server starts from local binaries at once.
func TestServerDockerProbeIsQuick(t *testing.T) {
	t.Parallel()
	start := time.Now()
	err := dockerEngineAnswers(t.Context())
	elapsed := time.Since(start)
	t.Logf("docker probe: %v after %s", err, elapsed)
	if elapsed > serverDockerProbeTimeout+time.Second {
		t.Fatalf("docker probe took %s, want at most about %s", elapsed, serverDockerProbeTimeout)
	}
}

// TestServerDocker runs where a Docker engine answers, or wherever
// PGLIMIT_TEST_POSTGRES=docker asks for the container path, with the image
// and network that the harness's variables give.
func TestServerDocker(t *testing.T) {
	t.Parallel()
	if os.Getenv("PGLIMIT_TEST_POSTGRES") != KindDocker {
		if err := dockerEngineAnswers(t.Context()); err != nil {
			t.Skipf("no Docker engine answers (%v); PGLIMIT_TEST_POSTGRES=docker makes this test run and fail", err)
		}
	}
	s := startTestServer(t, &Config{
		Prefer:      KindDocker,
		Image:       os.Getenv("PGLIMIT_TEST_DOCKER_IMAGE"),
		HostNetwork: os.Getenv("PGLIMIT_TEST_DOCKER_NETWORK") == "host",
		Logf:        t.Logf,
	})
	if s.Kind() != KindDocker || !strings.Contains(s.Source(), "testcontainers") {
		t.Fatalf("Kind() = %q, Source() = %q; want a container", s.Kind(), s.Source())
	}
	checkTestServer(t, s, "off")

	// A restart keeps the data, whichever way the server stopped.
	ctx := t.Context()
	exec := func(sql string) {
		t.Helper()
		conn, err := pgx.Connect(ctx, s.URL())
		if err != nil {
			t.Fatalf("connect: %v", err)
		}
		defer conn.Close(context.Background())
		if _, err := conn.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	exec("CREATE TABLE kept (x int)")
	for _, immediate := range []bool{false, true} {
		if err := s.Restart(ctx, immediate); err != nil {
			t.Fatalf("Restart(immediate=%v): %v", immediate, err)
		}
		exec("INSERT INTO kept VALUES (1)")
	}
	closeAndCheckGone(t, s)
}
