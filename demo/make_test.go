package main

import (
	"net/url"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pglimit/cooldown/internal/onpglimit/testdb"
)

// `make demo`, stopped with Ctrl-C as a terminal sends it (SIGINT to the
// whole foreground process group: make, the recipe, the demo), ends with
// no make error: the demo stops cleanly and exits 0. Over a database given by DATABASE_URL, which
// the demo names loudly at start, password left out.
func TestMakeDemoCtrlC(t *testing.T) {
	t.Parallel()
	if signal.Ignored(os.Interrupt) {
		// A shell starts a background job with SIGINT ignored, and every
		// process under it inherits that: make would not take the Ctrl-C
		// this test plays, whatever the Makefile does.
		testdb.Missing(t, "SIGINT is ignored in this process, as in a background job (make test &, or a script without job control), and make would inherit that, so Ctrl-C cannot be tested here: run the tests in the foreground")
	}
	makeBin, err := exec.LookPath("make")
	if err != nil {
		testdb.Missing(t, "make not found on PATH: apt-get install make")
	}
	goBin := goCommand(t)
	u, err := url.Parse(testdb.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	// The test server trusts local connections: the password is never
	// asked for, only checked for in the logs.
	u.User = url.UserPassword(u.User.Username(), "s3cret-pw")
	cmd := exec.Command(makeBin, "-C", "..", "demo", "GO="+goBin, "DEMO_BIN="+filepath.Join(t.TempDir(), "demo"))
	cmd.Env = append(os.Environ(),
		"DATABASE_URL="+u.String(),
		"PGLIMIT_SCHEMA="+testdb.Schema(t),
		"PGLIMIT_DEMO_ADDR=127.0.0.1:0",
		"PGLIMIT_CLEANUP=false",
	)
	// A process group of its own, as a shell gives a foreground job.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	listening := make(chan struct{})
	p := startProcess(t, "make demo", cmd, func(line string) {
		if listeningRE.MatchString(line) {
			close(listening)
		}
	})
	// startProcess kills make if the test fails; this, the demo under it.
	t.Cleanup(func() { _ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) })
	select {
	case <-listening:
	case <-p.exited:
		t.Fatalf("make demo exited before listening:\n%s", p.log())
	case <-time.After(4 * time.Minute): // a cold build of the demo is slow on CI
		t.Fatalf("not listening after 4 minutes:\n%s", p.log())
	}
	if err := syscall.Kill(-cmd.Process.Pid, syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	select {
	case <-p.exited:
	case <-time.After(30 * time.Second):
		t.Fatalf("make demo still running 30s after Ctrl-C:\n%s", p.log())
	}
	// A recipe that fails is reported "make: *** [Makefile:N: demo] Error
	// 1" whatever the signal. GNU make itself always ends by the SIGINT it
	// received once its recipe is done (the shell shows nothing, $? is
	// 130), so that is as clean as it gets.
	out := p.log()
	ws := cmd.ProcessState.Sys().(syscall.WaitStatus)
	switch {
	case strings.Contains(out, "*** wait: No child processes"):
		// GNU make's own race, not the demo's: when the demo exits before
		// make has run its SIGINT handler, make's main loop reaps it, and
		// the handler, waiting for the same child, finds none and stops
		// with this message. The demo's exit status is then unreported;
		// its last log line below says whether it stopped cleanly.
		t.Logf("make lost its own race between reaping the demo and handling SIGINT:\n%s", out)
	case strings.Contains(out, "make: ***") || !(ws.Exited() && ws.ExitStatus() == 0 || ws.Signaled() && ws.Signal() == syscall.SIGINT):
		t.Fatalf("make demo ended with %v after Ctrl-C:\n%s", cmd.ProcessState, out)
	}
	if !strings.Contains(out, "msg=\"shutting down\"") || !strings.Contains(out, "msg=stopped") {
		t.Errorf("the demo did not shut down cleanly:\n%s", out)
	}
	if !strings.Contains(out, "level=WARN msg=\"using the database postgres on 127.0.0.1:"+u.Port()+", from DATABASE_URL") {
		t.Errorf("the demo does not name the database it uses:\n%s", out)
	}
	if strings.Contains(out, "s3cret-pw") {
		t.Errorf("the password is in the output:\n%s", out)
	}
}
