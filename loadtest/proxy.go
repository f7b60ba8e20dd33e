package main

import (
	"net"
	"sync"
)

// faultProxy forwards TCP connections from a port of its own on 127.0.0.1
// to upstream, and can stall them (bytes held back both ways, as when the
// network between goes silent) or drop them (every connection closed at
// once, as when a middlebox resets them).
type faultProxy struct {
	ln       net.Listener
	upstream string

	mu      sync.Mutex
	stalled chan struct{} // closed when a stall ends; nil when not stalled
	conns   map[net.Conn]struct{}
	wg      sync.WaitGroup
}

func newFaultProxy(upstream string) (*faultProxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &faultProxy{ln: ln, upstream: upstream, conns: map[net.Conn]struct{}{}}
	p.wg.Go(p.accept)
	return p, nil
}

// addr is where clients connect.
func (p *faultProxy) addr() string { return p.ln.Addr().String() }

func (p *faultProxy) accept() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		u, err := net.Dial("tcp", p.upstream)
		if err != nil {
			_ = c.Close()
			continue
		}
		p.mu.Lock()
		p.conns[c], p.conns[u] = struct{}{}, struct{}{}
		p.mu.Unlock()
		p.wg.Go(func() { p.pipe(u, c) })
		p.wg.Go(func() { p.pipe(c, u) })
	}
}

// pipe copies src to dst, waiting out stalls, until either side closes.
func (p *faultProxy) pipe(dst, src net.Conn) {
	defer func() {
		_ = dst.Close()
		_ = src.Close()
		p.mu.Lock()
		delete(p.conns, dst)
		delete(p.conns, src)
		p.mu.Unlock()
	}()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			p.mu.Lock()
			stalled := p.stalled
			p.mu.Unlock()
			if stalled != nil {
				<-stalled
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return // EOF or a closed connection: both sides close
		}
	}
}

// stall holds every byte back until unstall.
func (p *faultProxy) stall() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stalled == nil {
		p.stalled = make(chan struct{})
	}
}

func (p *faultProxy) unstall() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stalled != nil {
		close(p.stalled)
		p.stalled = nil
	}
}

// drop closes every connection through the proxy.
func (p *faultProxy) drop() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for c := range p.conns {
		_ = c.Close()
	}
}

func (p *faultProxy) close() {
	_ = p.ln.Close()
	p.unstall()
	p.drop()
	p.wg.Wait()
}
