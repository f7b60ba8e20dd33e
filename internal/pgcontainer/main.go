// Command pgcontainer starts a PostgreSQL container through testcontainers-go
// for the throwaway-server launcher (internal/pgserver), which runs it with
// go run from this directory. It is a module of its own so that the library's
// module, which its importers see, never requires testcontainers.
//
// It prints "url <connection URL>" on stdout once the server is ready, then
// reads commands from stdin, one a line: "restart" (fast shutdown, start)
// and "crash" (SIGKILL, start), each answered by a new "url" line or by
// "error <message>". When stdin closes, or on SIGINT or SIGTERM, it removes
// the container and exits, so that nothing is left behind even where
// testcontainers' reaper cannot run.
//
// With -network host the container shares the host's network, as engines
// that cannot program bridge networks need: postgres then listens on
// 127.0.0.1 only, on the port given by -port, and the daemon host is taken
// to be 127.0.0.1 (TESTCONTAINERS_HOST_OVERRIDE, unless already set).
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/moby/moby/api/types/container"
	"github.com/testcontainers/testcontainers-go"
	tcpostgres "github.com/testcontainers/testcontainers-go/modules/postgres"
	"github.com/testcontainers/testcontainers-go/wait"
)

const (
	startTimeout = 2 * time.Minute // a first image pull is slow
	stopTimeout  = 10 * time.Second
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "pgcontainer:", err)
		os.Exit(1)
	}
}

func run() error {
	image := flag.String("image", "postgres:16-alpine", "PostgreSQL image (the official image's environment variables are used)")
	network := flag.String("network", "", `"host" for host networking; "" publishes the port as usual`)
	port := flag.Int("port", 0, "port postgres listens on with -network host")
	durable := flag.Bool("durable", false, "keep fsync and full_page_writes on")
	flag.Parse()

	host := false
	switch *network {
	case "":
	case "host":
		if *port <= 0 || *port > 65535 {
			return fmt.Errorf("-network host needs -port in 1..65535, got %d", *port)
		}
		host = true
		if os.Getenv("TESTCONTAINERS_HOST_OVERRIDE") == "" {
			// Otherwise testcontainers may resolve the daemon host to the
			// bridge gateway, a non-loopback address, and dial it.
			os.Setenv("TESTCONTAINERS_HOST_OVERRIDE", "127.0.0.1")
		}
	default:
		return fmt.Errorf(`-network must be "" or "host", got %q`, *network)
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	cmd := []string{"postgres", "-c", "max_connections=300"}
	if !*durable {
		cmd = append(cmd, "-c", "fsync=off", "-c", "full_page_writes=off")
	}
	opts := []testcontainers.ContainerCustomizer{
		testcontainers.WithLogger(logger{}),
	}
	if host {
		p := strconv.Itoa(*port)
		cmd = append(cmd, "-p", p, "-c", "listen_addresses=127.0.0.1")
		opts = append(opts,
			testcontainers.WithHostConfigModifier(func(hc *container.HostConfig) { hc.NetworkMode = "host" }),
			// The module's own strategy waits on 5432 and probes it from
			// inside the container with a shell tool an image may lack; the
			// port is on the host's loopback, so dialling it is the check.
			testcontainers.WithWaitStrategy(
				wait.ForLog("database system is ready to accept connections").WithOccurrence(2),
				wait.ForListeningPort(p+"/tcp").SkipInternalCheck(),
			),
		)
	} else {
		opts = append(opts, tcpostgres.BasicWaitStrategies())
	}
	// Replaces the module's default command, which forces fsync=off.
	opts = append(opts, testcontainers.WithCmd(cmd...))

	startCtx, cancel := context.WithTimeout(ctx, startTimeout)
	ctr, err := tcpostgres.Run(startCtx, *image, opts...)
	cancel()
	if err != nil {
		_ = testcontainers.TerminateContainer(ctr)
		return fmt.Errorf("start container from image %s: %w", *image, err)
	}
	defer func() {
		if err := testcontainers.TerminateContainer(ctr); err != nil {
			fmt.Fprintln(os.Stderr, "pgcontainer: remove container:", err)
		}
	}()
	fmt.Fprintf(os.Stderr, "container %.12s from image %s is ready\n", ctr.GetContainerID(), *image)

	url := func() (string, error) {
		if host {
			// No port is published on the host network; MappedPort would
			// answer 5432 whatever postgres listens on.
			return fmt.Sprintf("postgres://postgres:postgres@127.0.0.1:%d/postgres?sslmode=disable", *port), nil
		}
		return ctr.ConnectionString(ctx, "sslmode=disable")
	}
	if err := answer(url()); err != nil {
		return err
	}

	lines := make(chan string)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(os.Stdin)
		for sc.Scan() {
			lines <- sc.Text()
		}
	}()
	for {
		select {
		case <-ctx.Done():
			return nil
		case line, ok := <-lines:
			if !ok {
				return nil // stdin closed: our user is gone
			}
			var err error
			switch line {
			case "restart", "crash":
				err = restart(ctx, ctr, line == "crash")
			default:
				err = fmt.Errorf("unknown command %q", line)
			}
			if err != nil {
				fmt.Printf("error %s\n", strings.ReplaceAll(err.Error(), "\n", "; "))
				continue
			}
			if err := answer(url()); err != nil {
				return err
			}
		}
	}
}

// restart stops the container and starts it again on the same data. The
// image stops postgres with SIGINT, a fast shutdown; a zero timeout is
// SIGKILL, a crash that leaves recovery to the next start.
func restart(ctx context.Context, ctr *tcpostgres.PostgresContainer, crash bool) error {
	timeout := stopTimeout
	if crash {
		timeout = 0
	}
	if err := ctr.Stop(ctx, &timeout); err != nil {
		return fmt.Errorf("stop container: %w", err)
	}
	if err := ctr.Start(ctx); err != nil {
		return fmt.Errorf("start container: %w", err)
	}
	return nil
}

func answer(url string, err error) error {
	if err != nil {
		fmt.Printf("error %s\n", strings.ReplaceAll(err.Error(), "\n", "; "))
		return errors.New("no connection URL")
	}
	fmt.Printf("url %s\n", url)
	return nil
}

// logger sends testcontainers' progress lines to stderr, which the launcher
// passes on to its log.
type logger struct{}

func (logger) Printf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, strings.TrimSuffix(format, "\n")+"\n", args...)
}
