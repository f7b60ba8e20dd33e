package testdb

import (
	"context"
	"net"
	"strconv"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
)

// StallProxy forwards TCP connections to the shared test server on
// loopback and can stall them: while stalled, bytes are read but not
// passed on, as when a backend hangs or the network between goes silent.
// It works with any server, where stopping the backend process
// ([Server.Freeze]) needs a local one.
type StallProxy struct {
	ln       net.Listener
	upstream string

	mu      sync.Mutex
	stalled bool
	resume  chan struct{} // closed when the stall ends
	conns   []net.Conn
	held    chan struct{} // gets a value when bytes are held back

	wg sync.WaitGroup
}

// NewStallProxy starts a proxy to the shared test server and returns a
// pool configuration that dials through it. The proxy closes when the test
// ends.
func NewStallProxy(tb testing.TB) (*StallProxy, *pgxpool.Config) {
	tb.Helper()
	cfg, err := pgxpool.ParseConfig(URL(tb))
	if err != nil {
		tb.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	p := &StallProxy{
		ln:       ln,
		upstream: net.JoinHostPort(cfg.ConnConfig.Host, strconv.Itoa(int(cfg.ConnConfig.Port))),
		held:     make(chan struct{}, 1),
	}
	p.wg.Go(p.accept)
	tb.Cleanup(p.close)
	addr := ln.Addr().(*net.TCPAddr)
	cfg.ConnConfig.Host, cfg.ConnConfig.Port = "127.0.0.1", uint16(addr.Port)
	cfg.ConnConfig.Fallbacks = nil
	return p, cfg
}

// StallPool starts a proxy as NewStallProxy does and returns it with a
// pool that dials through it, both closed when the test ends.
func StallPool(tb testing.TB) (*StallProxy, *pgxpool.Pool) {
	tb.Helper()
	p, cfg := NewStallProxy(tb)
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(pool.Close)
	return p, pool
}

func (p *StallProxy) accept() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		var d net.Dialer
		u, err := d.DialContext(context.Background(), "tcp", p.upstream)
		if err != nil {
			c.Close()
			continue
		}
		p.mu.Lock()
		p.conns = append(p.conns, c, u)
		p.mu.Unlock()
		p.wg.Go(func() { p.pipe(u, c) })
		p.wg.Go(func() { p.pipe(c, u) })
	}
}

func (p *StallProxy) pipe(dst, src net.Conn) {
	defer dst.Close()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			p.mu.Lock()
			stalled, resume := p.stalled, p.resume
			p.mu.Unlock()
			if stalled {
				select {
				case p.held <- struct{}{}:
				default:
				}
				<-resume
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// Stall holds back every byte from now on, until Unstall.
func (p *StallProxy) Stall() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.stalled {
		p.stalled, p.resume = true, make(chan struct{})
		select {
		case <-p.held: // forget bytes held by an earlier stall
		default:
		}
	}
}

// Unstall passes on what was held back, and every byte from now on.
func (p *StallProxy) Unstall() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stalled {
		p.stalled = false
		close(p.resume)
	}
}

// Held is signalled when bytes in either direction are held back: a
// round trip is stuck.
func (p *StallProxy) Held() <-chan struct{} { return p.held }

func (p *StallProxy) close() {
	_ = p.ln.Close()
	p.Unstall()
	p.mu.Lock()
	for _, c := range p.conns {
		_ = c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}
