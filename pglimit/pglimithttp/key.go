package pglimithttp

import (
	"cmp"
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

// FromPathValue keys by the named wildcard of the request's ServeMux
// pattern, as FromPathValue("user") does for "GET /items/{user}".
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

// RemoteIPConfig configures [RemoteIP].
type RemoteIPConfig struct {
	// TrustedProxies are the networks of the reverse proxies in front of
	// the server. Only a request whose peer is inside one of them has its
	// forwarding header read. Defaults to none: the peer address is the
	// key and no header is read.
	TrustedProxies []netip.Prefix

	// Header names the header the trusted proxies write:
	// "X-Forwarded-For" or "Forwarded" (RFC 7239). Only that one is read:
	// a proxy that writes one usually passes the other through from the
	// client untouched. Defaults to "X-Forwarded-For".
	Header string

	// IPv6Prefix is how many leading bits of an IPv6 address make its key:
	// one end site usually holds a whole /64, so keying by address would
	// give one client 2^64 keys. 128 keys every address on its own.
	// Defaults to 64.
	IPv6Prefix int
}

// RemoteIP keys by the client's IP address.
//
// With no trusted proxies it is the peer address of the connection, and
// forwarding headers are ignored: any client can write them, and a limiter
// keyed by them is a limiter every client can dodge.
//
// When the peer is inside one of [RemoteIPConfig.TrustedProxies], the hops
// of the configured header are read from the right (the hop nearest this
// server) and the first one outside the trusted proxies is the key:
// everything to its left was written by the client or by proxies nobody
// vouches for. A malformed hop reached in that walk is an error. If every
// hop is trusted, the left-most one is the key.
//
// In a Forwarded header the hop is the for= parameter: an IPv4 address, a
// bracketed IPv6 address in quotes ("[2001:db8::1]:4711"), either with a
// port. A hop that hides its address (an obfuscated identifier such as
// "_gazonk", "unknown", or an element without for=) is never a key and
// ends the walk: its sender's trust cannot be checked, so nothing to its
// left can be believed, and the key is the nearest address known, the
// trusted proxy that wrote it.
//
// IPv6 addresses are keyed by their /64 ([RemoteIPConfig.IPv6Prefix]), as
// "2001:db8:1:2::/64"; IPv4-mapped IPv6 addresses are keyed as IPv4 and
// zones are dropped, so one client has one key.
//
// A request that came in over a Unix socket (its RemoteAddr is "@" or "")
// has a process on this host as its peer, usually a reverse proxy: the peer
// is taken to be 127.0.0.1, exactly as a proxy connecting over loopback
// TCP. List 127.0.0.0/8 in TrustedProxies to read the header from it.
//
// A nil cfg means the defaults. An invalid cfg is an error wrapping
// [ErrInvalidConfig] that names the field.
func RemoteIP(cfg *RemoteIPConfig) (KeyFunc, error) {
	var c RemoteIPConfig
	if cfg != nil {
		c = *cfg
	}
	trusted := make([]netip.Prefix, 0, len(c.TrustedProxies))
	for i, p := range c.TrustedProxies {
		if !p.IsValid() {
			return nil, fmt.Errorf("%w: TrustedProxies[%d]: not a valid prefix", ErrInvalidConfig, i)
		}
		trusted = append(trusted, p.Masked())
	}
	var hops func(r *http.Request, visit func(hop) bool) error
	switch http.CanonicalHeaderKey(cmp.Or(c.Header, "X-Forwarded-For")) {
	case "X-Forwarded-For":
		hops = forwardedForHops
	case "Forwarded":
		hops = forwardedHops
	default:
		return nil, fmt.Errorf("%w: Header: %q is neither X-Forwarded-For nor Forwarded", ErrInvalidConfig, c.Header)
	}
	bits := cmp.Or(c.IPv6Prefix, 64)
	if bits < 1 || bits > 128 {
		return nil, fmt.Errorf("%w: IPv6Prefix: %d is not between 1 and 128", ErrInvalidConfig, c.IPv6Prefix)
	}
	isTrusted := func(a netip.Addr) bool {
		for _, p := range trusted {
			if p.Contains(a) {
				return true
			}
		}
		return false
	}
	key := func(a netip.Addr) string {
		if a.Is6() && bits < 128 {
			return netip.PrefixFrom(a, bits).Masked().String()
		}
		return a.String()
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
			return key(peer), nil
		}
		client := peer
		err = hops(r, func(h hop) bool {
			if !h.addr.IsValid() { // hidden: stop at the proxy that wrote it
				return false
			}
			client = h.addr
			return isTrusted(h.addr)
		})
		if err != nil {
			return "", err
		}
		return key(client), nil
	}, nil
}

// hop is one entry of a forwarding header; addr is invalid for a hop that
// hides its address.
type hop struct{ addr netip.Addr }

// forwardedForHops calls visit with the X-Forwarded-For hops from the right
// until it returns false. Walking from the right without splitting keeps a
// huge header's cost to the hops actually read.
func forwardedForHops(r *http.Request, visit func(hop) bool) error {
	lines := r.Header.Values("X-Forwarded-For")
	for i := len(lines) - 1; i >= 0; i-- {
		rest := lines[i]
		for {
			entry := rest
			comma := strings.LastIndexByte(rest, ',')
			if comma >= 0 {
				entry, rest = rest[comma+1:], rest[:comma]
			}
			a, err := parseAddr(entry)
			if err != nil {
				return fmt.Errorf("header X-Forwarded-For: %q: %w", truncate(entry), err)
			}
			if !visit(hop{a}) {
				return nil
			}
			if comma < 0 {
				break
			}
		}
	}
	return nil
}

// forwardedHops calls visit with the Forwarded (RFC 7239) hops from the
// right until it returns false. A line is split into elements at commas
// outside quoted strings; an element is parsed only when the walk reaches
// it, so a malformed element written by the client to the left of a
// trusted one is never an error.
func forwardedHops(r *http.Request, visit func(hop) bool) error {
	lines := r.Header.Values("Forwarded")
	for i := len(lines) - 1; i >= 0; i-- {
		elems, err := splitElements(lines[i])
		if err != nil {
			return fmt.Errorf("header Forwarded: %w", err)
		}
		for j := len(elems) - 1; j >= 0; j-- {
			if strings.TrimSpace(elems[j]) == "" {
				continue // RFC 9110 §5.6.1: empty list elements are allowed
			}
			h, err := parseForwardedElement(elems[j])
			if err != nil {
				return fmt.Errorf("header Forwarded: %q: %w", truncate(elems[j]), err)
			}
			if !visit(h) {
				return nil
			}
		}
	}
	return nil
}

// splitElements splits a Forwarded line at the commas outside quoted
// strings.
func splitElements(line string) ([]string, error) {
	var elems []string
	start, quoted := 0, false
	for i := 0; i < len(line); i++ {
		switch c := line[i]; {
		case quoted && c == '\\':
			i++ // the escaped byte
		case c == '"':
			quoted = !quoted
		case !quoted && c == ',':
			elems = append(elems, line[start:i])
			start = i + 1
		}
	}
	if quoted {
		return nil, errors.New("unterminated quoted string")
	}
	return append(elems, line[start:]), nil
}

// parseForwardedElement reads the for= parameter of one element:
// pairs of token=value separated by ';', value a token or a quoted string.
func parseForwardedElement(elem string) (hop, error) {
	var (
		h      hop
		seen   = map[string]bool{}
		hasFor bool
	)
	for pair := range strings.SplitSeq(elem, ";") {
		// A ';' inside a quoted string would split a value: only for=
		// values matter here and none holds one, so such a pair fails to
		// parse below rather than being misread.
		pair = strings.TrimSpace(pair)
		name, value, ok := strings.Cut(pair, "=")
		if !ok || !isToken(name) {
			return hop{}, fmt.Errorf("%q is not a name=value pair", truncate(pair))
		}
		name = strings.ToLower(name)
		if seen[name] {
			return hop{}, fmt.Errorf("parameter %s appears twice", name)
		}
		seen[name] = true
		v, err := unquote(value)
		if err != nil {
			return hop{}, fmt.Errorf("parameter %s: %w", name, err)
		}
		if name != "for" {
			continue
		}
		hasFor = true
		if h.addr, err = parseNode(v); err != nil {
			return hop{}, fmt.Errorf("for=%q: %w", truncate(v), err)
		}
	}
	if !hasFor {
		return hop{}, nil // an element about proto or host only hides the address too
	}
	return h, nil
}

// unquote returns a token as it is and a quoted string's content.
func unquote(v string) (string, error) {
	if isToken(v) {
		return v, nil
	}
	if len(v) < 2 || v[0] != '"' || v[len(v)-1] != '"' {
		return "", errors.New("value is neither a token nor a quoted string")
	}
	var b strings.Builder
	for i := 1; i < len(v)-1; i++ {
		c := v[i]
		if c == '\\' {
			if i+1 >= len(v)-1 {
				return "", errors.New("quoted string ends in a backslash")
			}
			i++
			c = v[i]
		} else if c == '"' {
			return "", errors.New("unescaped quote inside a quoted string")
		}
		b.WriteByte(c)
	}
	return b.String(), nil
}

// parseNode reads a node (RFC 7239 §6): an address with an optional port,
// or an identifier that hides it, returned as the invalid address.
func parseNode(v string) (netip.Addr, error) {
	name, port := v, ""
	if strings.HasPrefix(v, "[") {
		end := strings.IndexByte(v, ']')
		if end < 0 {
			return netip.Addr{}, errors.New("unterminated [")
		}
		name, port = v[1:end], v[end+1:]
		a, err := netip.ParseAddr(name)
		if err != nil || !a.Is6() || a.Zone() != "" {
			return netip.Addr{}, errors.New("not an IPv6 address in brackets")
		}
		if err := checkPort(port); err != nil {
			return netip.Addr{}, err
		}
		return a.Unmap(), nil
	}
	if i := strings.IndexByte(v, ':'); i >= 0 {
		name, port = v[:i], v[i:]
	}
	if err := checkPort(port); err != nil {
		return netip.Addr{}, err
	}
	if strings.EqualFold(name, "unknown") || isObfuscated(name) {
		return netip.Addr{}, nil
	}
	a, err := netip.ParseAddr(name)
	if err != nil || !a.Is4() {
		return netip.Addr{}, errors.New("neither an IPv4 address, a bracketed IPv6 address, unknown nor an obfuscated identifier")
	}
	return a, nil
}

// checkPort accepts "", ":" followed by 1 to 5 digits, or an obfuscated
// port.
func checkPort(p string) error {
	if p == "" {
		return nil
	}
	digits := p[1:]
	if p[0] != ':' {
		return errors.New("junk after the address")
	}
	if isObfuscated(digits) {
		return nil
	}
	if len(digits) < 1 || len(digits) > 5 || strings.Trim(digits, "0123456789") != "" {
		return fmt.Errorf("port %q is not 1 to 5 digits", digits)
	}
	return nil
}

// isObfuscated reports an obfnode or obfport: "_" then letters, digits,
// '.', '_' or '-'.
func isObfuscated(s string) bool {
	if len(s) < 2 || s[0] != '_' {
		return false
	}
	for i := 1; i < len(s); i++ {
		c := s[i]
		if !isAlnum(c) && c != '.' && c != '_' && c != '-' {
			return false
		}
	}
	return true
}

func isAlnum(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9'
}

// isToken reports an RFC 9110 token.
func isToken(s string) bool {
	if s == "" {
		return false
	}
	for i := range len(s) {
		if c := s[i]; !isAlnum(c) && !strings.ContainsRune("!#$%&'*+-.^_`|~", rune(c)) {
			return false
		}
	}
	return true
}

// truncate keeps error messages short when a header is huge.
func truncate(s string) string {
	const max = 64
	if len(s) <= max {
		return s
	}
	return s[:max] + "..."
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
