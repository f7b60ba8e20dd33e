package pgserver

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// PgBouncer is a PgBouncer process in transaction pooling mode in front of
// a test server: the set-up where prepared statements break.
type PgBouncer struct {
	url  string
	proc *serverProc
	dir  string
}

// StartPgBouncer starts PgBouncer (transaction pooling) in front of the
// server at upstream, which must accept the user postgres without a
// password from 127.0.0.1, as the servers of [Start] do. It needs the
// pgbouncer binary (Debian: apt-get install pgbouncer).
func StartPgBouncer(ctx context.Context, upstream string) (*PgBouncer, error) {
	bin, err := exec.LookPath("pgbouncer")
	if err != nil {
		bin = "/usr/sbin/pgbouncer"
		if _, statErr := os.Stat(bin); statErr != nil {
			return nil, fmt.Errorf("pgserver: pgbouncer not found on PATH or in /usr/sbin: install it (Debian/Ubuntu: apt-get install pgbouncer)")
		}
	}
	up, err := url.Parse(upstream)
	if err != nil {
		return nil, fmt.Errorf("pgserver: upstream URL: %w", err)
	}
	cred, runAs, err := serverCredential() // pgbouncer refuses to run as root
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("/tmp", "pglimittest-pgbouncer-")
	if err != nil {
		return nil, err
	}
	ok := false
	defer func() {
		if !ok {
			_ = os.RemoveAll(dir)
		}
	}()
	port, err := serverFreePort()
	if err != nil {
		return nil, err
	}
	// auth_type any: every client logs in as the user named per database.
	// search_path is a startup parameter PgBouncer cannot pass on; the
	// tests' pools set it, so it is ignored rather than refused.
	// A container's server wants the password of its URL; a local cluster
	// trusts 127.0.0.1 and has none.
	password := ""
	if p, ok := up.User.Password(); ok {
		password = " password=" + pgbouncerQuote(p)
	}
	ini := fmt.Sprintf(`[databases]
* = host=%s port=%s user=postgres%s

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = %d
unix_socket_dir =
auth_type = any
pool_mode = transaction
max_client_conn = 1000
default_pool_size = 100
ignore_startup_parameters = extra_float_digits,search_path
logfile = %s
`, up.Hostname(), cmp.Or(up.Port(), "5432"), password, port, filepath.Join(dir, "pgbouncer.log"))
	iniPath := filepath.Join(dir, "pgbouncer.ini")
	if err := os.WriteFile(iniPath, []byte(ini), 0o600); err != nil {
		return nil, err
	}
	if err := serverChown(dir, cred); err != nil {
		return nil, fmt.Errorf("pgserver: chown %s to %s: %w", dir, runAs, err)
	}

	cmd := exec.Command(bin, iniPath)
	cmd.Dir = dir
	cmd.SysProcAttr = serverSysProcAttr(cred)
	logPath := filepath.Join(dir, "pgbouncer.out")
	out, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	defer out.Close()
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("pgserver: start pgbouncer: %w", err)
	}
	p := &serverProc{cmd: cmd, exited: make(chan struct{}), logPath: logPath}
	go func() {
		p.waitErr = cmd.Wait()
		close(p.exited)
	}()
	u := fmt.Sprintf("postgres://postgres@127.0.0.1:%d%s?sslmode=disable", port, up.Path)
	if err := p.waitReady(ctx, u+"&default_query_exec_mode=exec", 0); err != nil {
		_ = p.stop(func(string, ...any) {})
		return nil, fmt.Errorf("pgserver: pgbouncer: %w", err)
	}
	ok = true
	return &PgBouncer{url: u, proc: p, dir: dir}, nil
}

// URL is the address of the bouncer. Pools through it must not use
// prepared statements: set pgx's DefaultQueryExecMode to
// pgx.QueryExecModeExec (or add default_query_exec_mode=exec to the URL).
func (b *PgBouncer) URL() string { return b.url }

// Close stops PgBouncer and removes its directory.
func (b *PgBouncer) Close() error {
	err := b.proc.stop(func(string, ...any) {})
	return errors.Join(err, os.RemoveAll(b.dir))
}

// pgbouncerQuote quotes a connection-string value the way libpq reads it.
func pgbouncerQuote(v string) string {
	return "'" + strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(v) + "'"
}
