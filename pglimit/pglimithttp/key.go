package pglimithttp

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strings"
)

// KeyFunc extracts the limiter key from a request. An error, like a key
// that [pglimit.ValidateKey] rejects, makes the middleware answer 400.
type KeyFunc func(r *http.Request) (string, error)

// FromPathValue keys by the named wildcard of the request's ServeMux pattern,
// e.g. FromPathValue("user") for "GET /items/{user}".
func FromPathValue(name string) KeyFunc {
	return func(r *http.Request) (string, error) {
		v := r.PathValue(name)
		if v == "" {
			return "", fmt.Errorf("path value %q is empty", name)
		}
		return v, nil
	}
}

// FromHeader keys by a request header set by something the server trusts,
// such as an authenticating proxy or an earlier middleware. Surrounding
// spaces are trimmed; several values of the header are an error, since a
// client could add one of its own.
func FromHeader(name string) KeyFunc {
	name = http.CanonicalHeaderKey(name)
	return func(r *http.Request) (string, error) {
		vs := r.Header.Values(name)
		switch len(vs) {
		case 0:
			return "", fmt.Errorf("header %s is missing", name)
		case 1:
		default:
			return "", fmt.Errorf("header %s appears %d times", name, len(vs))
		}
		v := strings.TrimSpace(vs[0])
		if v == "" {
			return "", fmt.Errorf("header %s is empty", name)
		}
		return v, nil
	}
}

// RemoteIP keys by the client's IP address.
//
// With no trusted proxies it is the peer address of the connection, and
// X-Forwarded-For is ignored: any client can write that header, and a
// limiter keyed by it is a limiter every client can dodge.
//
// When the peer is inside one of trustedProxies, the addresses in
// X-Forwarded-For are read from the right (the hop nearest this server) and
// the first one outside trustedProxies is the key: everything to its left was
// written by the client or by proxies nobody vouches for. A malformed entry
// reached in that walk is an error. If every hop is trusted, the left-most
// one is the key.
//
// IPv4-mapped IPv6 addresses are keyed as IPv4 and zones are dropped, so one
// client has one key.
//
// A request that came in over a Unix socket (its RemoteAddr is "@" or "")
// has a process on this host as its peer, usually a reverse proxy: the peer
// is taken to be 127.0.0.1, exactly as a proxy connecting over loopback
// TCP. List 127.0.0.0/8 in trustedProxies to read X-Forwarded-For from it.
func RemoteIP(trustedProxies []netip.Prefix) KeyFunc {
	trusted := make([]netip.Prefix, 0, len(trustedProxies))
	for _, p := range trustedProxies {
		if p.IsValid() {
			trusted = append(trusted, p.Masked())
		}
	}
	isTrusted := func(a netip.Addr) bool {
		for _, p := range trusted {
			if p.Contains(a) {
				return true
			}
		}
		return false
	}
	return func(r *http.Request) (string, error) {
		peer, err := parseAddr(r.RemoteAddr)
		if err != nil && overUnixSocket(r) {
			peer, err = unixPeer, nil
		}
		if err != nil {
			return "", fmt.Errorf("remote address: %w", err)
		}
		if !isTrusted(peer) {
			return peer.String(), nil
		}
		client := peer
		hops := r.Header.Values("X-Forwarded-For")
		for i := len(hops) - 1; i >= 0; i-- {
			entries := strings.Split(hops[i], ",")
			for j := len(entries) - 1; j >= 0; j-- {
				a, err := parseAddr(entries[j])
				if err != nil {
					return "", fmt.Errorf("X-Forwarded-For: %w", err)
				}
				client = a
				if !isTrusted(a) {
					return a.String(), nil
				}
			}
		}
		return client.String(), nil
	}
}

var errNoAddr = errors.New("not an IP address")

// unixPeer stands for the peer of a Unix socket: a process on this host.
var unixPeer = netip.AddrFrom4([4]byte{127, 0, 0, 1})

// overUnixSocket reports whether the server received r on a Unix socket.
func overUnixSocket(r *http.Request) bool {
	local, ok := r.Context().Value(http.LocalAddrContextKey).(net.Addr)
	return ok && strings.HasPrefix(local.Network(), "unix")
}

// parseAddr reads "ip", "ip:port" or "[ipv6]:port", as found in RemoteAddr
// and in X-Forwarded-For entries written by various proxies.
func parseAddr(s string) (netip.Addr, error) {
	s = strings.TrimSpace(s)
	a, err := netip.ParseAddr(s)
	if err != nil {
		ap, err2 := netip.ParseAddrPort(s)
		if err2 != nil {
			return netip.Addr{}, errNoAddr
		}
		a = ap.Addr()
	}
	return a.Unmap().WithZone(""), nil
}
