package pgserver

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
)

// Standby starts a streaming standby of s, which must be a local cluster:
// a base backup of s (pg_basebackup -R, its WAL streamed), started on a
// port of its own. It follows s read-only, asynchronously unless s lists
// it in synchronous_standby_names (its application_name is "walreceiver"),
// until it is promoted (SELECT pg_promote()). Close stops it and removes
// its files; Restart restarts it, still a standby unless promoted.
func (s *Server) Standby(ctx context.Context) (*Server, error) {
	if s.standby == nil {
		return nil, fmt.Errorf("pgserver: a %s server has no standby; only local clusters do (Config.Prefer \"local\")", s.kind)
	}
	return s.standby(ctx)
}

// startStandby starts a standby of the cluster primary, in a temp dir
// under base.
func startStandby(ctx context.Context, primary *localCluster, base string) (*Server, error) {
	_, runAs, err := serverCredential()
	if err != nil {
		return nil, err
	}
	dir, err := makeClusterDir(base, "pglimittest-standby-", primary.cred, runAs)
	if err != nil {
		return nil, err
	}
	ok := false
	defer func() {
		if !ok {
			_ = os.RemoveAll(dir)
		}
	}()
	backup := exec.CommandContext(ctx, filepath.Join(primary.bin.dir, "pg_basebackup"),
		"-D", filepath.Join(dir, "data"), "-R", "-X", "stream", "-c", "fast",
		"-h", "127.0.0.1", "-p", strconv.Itoa(primary.port), "-U", "postgres")
	backup.Dir = dir
	backup.SysProcAttr = serverSysProcAttr(primary.cred)
	if out, err := backup.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("pgserver: pg_basebackup: %w\n%s", err, serverTail(out))
	}
	c := &localCluster{bin: primary.bin, cred: primary.cred, dir: dir, durable: primary.durable, logf: primary.logf}
	proc, err := c.startOnFreePort(ctx)
	if err != nil {
		return nil, fmt.Errorf("pgserver: standby: %w", err)
	}
	ok = true
	primary.logf("standby of 127.0.0.1:%d ready on 127.0.0.1:%d", primary.port, c.port)
	return c.server(proc, fmt.Sprintf("a standby of 127.0.0.1:%d", primary.port)), nil
}
