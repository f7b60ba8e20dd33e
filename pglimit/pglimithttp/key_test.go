package pglimithttp

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

var testProxies = []netip.Prefix{
	netip.MustParsePrefix("10.0.0.0/8"),
	netip.MustParsePrefix("fd00::/8"),
}

func newRequest(remoteAddr string, xff ...string) *http.Request {
	r := httptest.NewRequest("GET", "/", nil)
	r.RemoteAddr = remoteAddr
	for _, v := range xff {
		r.Header.Add("X-Forwarded-For", v)
	}
	return r
}

func TestRemoteIP(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name    string
		trusted []netip.Prefix
		remote  string
		xff     []string
		want    string // "" means an error
	}{
		{"peer", nil, "192.0.2.1:1234", nil, "192.0.2.1"},
		{"spoofed header ignored without trusted proxies", nil, "192.0.2.1:1234", []string{"198.51.100.7"}, "192.0.2.1"},
		{"spoofed header ignored from an untrusted peer", testProxies, "192.0.2.1:1234", []string{"198.51.100.7"}, "192.0.2.1"},
		{"trusted proxy", testProxies, "10.1.2.3:80", []string{"198.51.100.7"}, "198.51.100.7"},
		{"right-most untrusted wins", testProxies, "10.1.2.3:80", []string{"203.0.113.9, 198.51.100.7, 10.9.9.9"}, "198.51.100.7"},
		{"client-written left part never reached", testProxies, "10.1.2.3:80", []string{"not-an-ip, 198.51.100.7"}, "198.51.100.7"},
		{"several header lines read as one list", testProxies, "10.1.2.3:80", []string{"203.0.113.9", "198.51.100.7, 10.0.0.2"}, "198.51.100.7"},
		{"all hops trusted: left-most", testProxies, "10.1.2.3:80", []string{"10.0.0.5, 10.0.0.6"}, "10.0.0.5"},
		{"trusted peer without header", testProxies, "10.1.2.3:80", nil, "10.1.2.3"},
		{"malformed hop reached", testProxies, "10.1.2.3:80", []string{"198.51.100.7, bogus"}, ""},
		{"empty hop reached", testProxies, "10.1.2.3:80", []string{"198.51.100.7,,"}, ""},
		{"hop with port", testProxies, "10.1.2.3:80", []string{"198.51.100.7:5555"}, "198.51.100.7"},
		{"ipv6 peer keyed by its /64", nil, "[2001:db8:1:2:3::1]:443", nil, "2001:db8:1:2::/64"},
		{"ipv6 zone dropped", nil, "[fe80::1%eth0]:443", nil, "fe80::/64"},
		{"ipv4-mapped peer keyed as ipv4", nil, "[::ffff:192.0.2.1]:443", nil, "192.0.2.1"},
		{"ipv6 hop behind ipv6 proxy", testProxies, "[fd00::1]:443", []string{"[2001:db8::2]:1"}, "2001:db8::/64"},
		{"peer without port", nil, "192.0.2.1", nil, "192.0.2.1"},
		{"unix socket peer", nil, "@", nil, ""},
		{"empty peer", nil, "", nil, ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got, err := mustRemoteIP(t, &RemoteIPConfig{TrustedProxies: tt.trusted})(newRequest(tt.remote, tt.xff...))
			if tt.want == "" {
				if err == nil {
					t.Fatalf("got key %q, want an error", got)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Fatalf("got %q, %v; want %q", got, err, tt.want)
			}
		})
	}
}

func TestFromHeader(t *testing.T) {
	t.Parallel()
	kf := FromHeader("x-user-id")
	for _, tt := range []struct {
		values []string
		want   string
	}{
		{[]string{"alice"}, "alice"},
		{[]string{"  bob \t"}, "bob"},
		{nil, ""},
		{[]string{"   "}, ""},
		{[]string{"alice", "mallory"}, ""},
	} {
		r := httptest.NewRequest("GET", "/", nil)
		for _, v := range tt.values {
			r.Header.Add("X-User-Id", v)
		}
		got, err := kf(r)
		if (err == nil) != (tt.want != "") || got != tt.want {
			t.Errorf("values %q: got %q, %v; want %q", tt.values, got, err, tt.want)
		}
	}
}

func TestFromPathValue(t *testing.T) {
	t.Parallel()
	r := httptest.NewRequest("GET", "/items/alice", nil)
	r.SetPathValue("user", "alice")
	if got, err := FromPathValue("user")(r); err != nil || got != "alice" {
		t.Fatalf("got %q, %v", got, err)
	}
	if got, err := FromPathValue("missing")(r); err == nil {
		t.Fatalf("missing path value: got %q, want an error", got)
	}
}

// FuzzRemoteIP checks that no header makes RemoteIP panic, that an
// untrusted peer's header never changes the key, and that a key always
// names the peer or an address the header holds.
func FuzzRemoteIP(f *testing.F) {
	f.Add("192.0.2.1:1234", "198.51.100.7")
	f.Add("10.1.2.3:80", "203.0.113.9, 198.51.100.7, 10.9.9.9")
	f.Add("10.1.2.3:80", "not-an-ip, 198.51.100.7")
	f.Add("[fd00::1]:443", "[2001:db8::2]:1, fd00::2")
	f.Add("10.0.0.1:1", ",,,")
	f.Add("[fe80::1%eth0]:443", "::ffff:10.0.0.1")
	f.Fuzz(func(t *testing.T, remote, xff string) {
		withHeader := newRequest(remote, xff)
		plain := newRequest(remote)

		trustedKey, trustedErr := mustRemoteIP(t, &RemoteIPConfig{TrustedProxies: testProxies, IPv6Prefix: 128})(withHeader)
		peerKey, peerErr := mustRemoteIP(t, &RemoteIPConfig{IPv6Prefix: 128})(withHeader)
		bareKey, bareErr := mustRemoteIP(t, &RemoteIPConfig{IPv6Prefix: 128})(plain)
		if peerKey != bareKey || (peerErr == nil) != (bareErr == nil) {
			t.Fatalf("X-Forwarded-For changed the key without trusted proxies: %q/%v vs %q/%v", peerKey, peerErr, bareKey, bareErr)
		}
		if peerErr != nil {
			return
		}
		peer := netip.MustParseAddr(peerKey)
		if !trusted(peer) {
			if trustedKey != peerKey || trustedErr != nil {
				t.Fatalf("untrusted peer %s: header changed the key to %q, %v", peerKey, trustedKey, trustedErr)
			}
			return
		}
		if trustedErr != nil {
			return
		}
		if trustedKey == peerKey {
			return
		}
		for entry := range strings.SplitSeq(xff, ",") {
			if a, err := parseAddr(entry); err == nil && a.String() == trustedKey {
				return
			}
		}
		t.Fatalf("key %q is neither the peer %s nor in X-Forwarded-For %q", trustedKey, peerKey, xff)
	})
}

func trusted(a netip.Addr) bool {
	for _, p := range testProxies {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// FuzzFromHeader checks that header keys are trimmed and never empty.
func FuzzFromHeader(f *testing.F) {
	f.Add("alice")
	f.Add("  \t ")
	f.Add("\xff")
	f.Fuzz(func(t *testing.T, v string) {
		r := httptest.NewRequest("GET", "/", nil)
		r.Header["X-User"] = []string{v}
		got, err := FromHeader("X-User")(r)
		if err != nil {
			return
		}
		if got == "" || got != strings.TrimSpace(got) {
			t.Fatalf("key %q from %q", got, v)
		}
	})
}

// Behind a proxy that talks to the server over a Unix socket, RemoteAddr
// is "@" or "": the peer is a process on this host, keyed and trusted as
// the loopback address 127.0.0.1 would be. A real server on a socket in a
// temporary directory.
func TestRemoteIPOverUnixSocket(t *testing.T) {
	t.Parallel()
	dir, err := os.MkdirTemp("", "pglimithttp") // short: socket paths are limited to 108 bytes
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	sock := filepath.Join(dir, "s")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	loopback := append([]netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}, testProxies...)
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		trusted := testProxies
		if r.URL.Query().Get("trust") == "loopback" {
			trusted = loopback
		}
		kf, err := RemoteIP(&RemoteIPConfig{TrustedProxies: trusted})
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		key, err := kf(r)
		if err != nil {
			http.Error(w, fmt.Sprintf("RemoteAddr %q: %v", r.RemoteAddr, err), http.StatusBadRequest)
			return
		}
		io.WriteString(w, key)
	})}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })

	client := &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", sock)
		},
	}}
	t.Cleanup(client.CloseIdleConnections)
	for _, tt := range []struct {
		name, query, xff, want string
	}{
		{"proxy on the socket trusted as loopback", "trust=loopback", "198.51.100.7", "198.51.100.7"},
		{"proxy chain through the socket", "trust=loopback", "198.51.100.7, 10.0.0.2", "198.51.100.7"},
		{"no header from a trusted socket peer", "trust=loopback", "", "127.0.0.1"},
		{"socket peer not trusted: header ignored", "", "198.51.100.7", "127.0.0.1"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			req, err := http.NewRequest("GET", "http://unix/?"+tt.query, nil)
			if err != nil {
				t.Fatal(err)
			}
			if tt.xff != "" {
				req.Header.Set("X-Forwarded-For", tt.xff)
			}
			resp, err := client.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			body, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != http.StatusOK || string(body) != tt.want {
				t.Fatalf("%d %q, want 200 %q", resp.StatusCode, body, tt.want)
			}
		})
	}
}

func mustRemoteIP(t testing.TB, cfg *RemoteIPConfig) KeyFunc {
	t.Helper()
	kf, err := RemoteIP(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return kf
}

func TestRemoteIPConfig(t *testing.T) {
	t.Parallel()
	for name, cfg := range map[string]RemoteIPConfig{
		"zero prefix":           {TrustedProxies: []netip.Prefix{{}}},
		"unknown header":        {Header: "X-Real-IP"},
		"ipv6 prefix too long":  {IPv6Prefix: 129},
		"negative ipv6 prefix":  {IPv6Prefix: -1},
		"header with a newline": {Header: "Forwarded\r\n"},
	} {
		if kf, err := RemoteIP(&cfg); !errors.Is(err, ErrInvalidConfig) || kf != nil {
			t.Errorf("%s: %v, want ErrInvalidConfig", name, err)
		}
	}
	for _, h := range []string{"", "x-forwarded-for", "forwarded", "Forwarded"} {
		if _, err := RemoteIP(&RemoteIPConfig{Header: h}); err != nil {
			t.Errorf("Header %q: %v", h, err)
		}
	}
}

func TestRemoteIPv6Prefix(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		bits   int
		remote string
		want   string
	}{
		{0, "[2001:db8:aa:bb:cc::1]:1", "2001:db8:aa:bb::/64"},
		{56, "[2001:db8:aa:bbff:cc::1]:1", "2001:db8:aa:bb00::/56"},
		{128, "[2001:db8:aa:bb:cc::1]:1", "2001:db8:aa:bb:cc::1"},
		{48, "192.0.2.1:1", "192.0.2.1"},              // IPv4 is keyed by address
		{48, "[::ffff:192.0.2.1]:1", "192.0.2.1"},     // mapped is IPv4
		{64, "[2001:db8::1%eth0]:1", "2001:db8::/64"}, // zone dropped
		{1, "[2001:db8::1]:1", "::/1"},
	} {
		got, err := mustRemoteIP(t, &RemoteIPConfig{IPv6Prefix: tt.bits})(newRequest(tt.remote))
		if err != nil || got != tt.want {
			t.Errorf("/%d %s: %q, %v; want %q", tt.bits, tt.remote, got, err, tt.want)
		}
	}
	// Two addresses of one /64 share a key, and the next /64 has another.
	kf := mustRemoteIP(t, nil)
	a, _ := kf(newRequest("[2001:db8:0:1::a]:1"))
	b, _ := kf(newRequest("[2001:db8:0:1:ffff::b]:1"))
	c, _ := kf(newRequest("[2001:db8:0:2::a]:1"))
	if a != b || a == c {
		t.Fatalf("keys %q %q %q: want the first two equal, the third different", a, b, c)
	}
}

func forwardedRequest(remote string, lines ...string) *http.Request {
	r := httptest.NewRequest("GET", "/", nil)
	r.RemoteAddr = remote
	for _, v := range lines {
		r.Header.Add("Forwarded", v)
	}
	return r
}

func TestRemoteIPForwarded(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name    string
		trusted []netip.Prefix
		remote  string
		lines   []string
		want    string // "" means an error
	}{
		{"ignored without trusted proxies", nil, "192.0.2.1:1", []string{"for=198.51.100.7"}, "192.0.2.1"},
		{"ignored from an untrusted peer", testProxies, "192.0.2.1:1", []string{"for=198.51.100.7"}, "192.0.2.1"},
		{"trusted proxy", testProxies, "10.1.2.3:80", []string{"for=198.51.100.7"}, "198.51.100.7"},
		{"other parameters", testProxies, "10.1.2.3:80", []string{"by=10.1.2.3;for=198.51.100.7;proto=https;host=example.com"}, "198.51.100.7"},
		{"parameter names are case-insensitive", testProxies, "10.1.2.3:80", []string{"For=198.51.100.7"}, "198.51.100.7"},
		{"quoted ipv4 with port", testProxies, "10.1.2.3:80", []string{`for="198.51.100.7:4711"`}, "198.51.100.7"},
		{"quoted ipv6 in brackets", testProxies, "10.1.2.3:80", []string{`for="[2001:db8:cafe::17]"`}, "2001:db8:cafe::/64"},
		{"quoted ipv6 with port", testProxies, "10.1.2.3:80", []string{`for="[2001:db8:cafe::17]:4711"`}, "2001:db8:cafe::/64"},
		{"obfuscated port", testProxies, "10.1.2.3:80", []string{`for="198.51.100.7:_p1"`}, "198.51.100.7"},
		{"right-most untrusted wins", testProxies, "10.1.2.3:80", []string{"for=203.0.113.9, for=198.51.100.7, for=10.9.9.9"}, "198.51.100.7"},
		{"several lines read as one list", testProxies, "10.1.2.3:80", []string{"for=203.0.113.9", "for=198.51.100.7, for=10.0.0.2"}, "198.51.100.7"},
		{"client-written left part never reached", testProxies, "10.1.2.3:80", []string{`for=nonsense;;=, for=198.51.100.7`}, "198.51.100.7"},
		{"comma inside a quoted string", testProxies, "10.1.2.3:80", []string{`for=203.0.113.9;host="a,b", for=198.51.100.7`}, "198.51.100.7"},
		{"escaped quote inside a quoted string", testProxies, "10.1.2.3:80", []string{`for=203.0.113.9;host="a\",b", for=198.51.100.7`}, "198.51.100.7"},
		{"empty elements skipped", testProxies, "10.1.2.3:80", []string{"for=198.51.100.7, ,"}, "198.51.100.7"},
		{"all hops trusted: left-most", testProxies, "10.1.2.3:80", []string{"for=10.0.0.5, for=10.0.0.6"}, "10.0.0.5"},
		{"trusted peer without header", testProxies, "10.1.2.3:80", nil, "10.1.2.3"},
		// A hop that hides its address ends the walk at the proxy that
		// wrote it: what lies left of it is the client's word.
		{"obfuscated hop keys the proxy", testProxies, "10.1.2.3:80", []string{"for=198.51.100.7, for=_hidden"}, "10.1.2.3"},
		{"obfuscated hop behind a trusted hop", testProxies, "10.1.2.3:80", []string{"for=198.51.100.7, for=_gazonk, for=10.0.0.2"}, "10.0.0.2"},
		{"unknown keys the proxy", testProxies, "10.1.2.3:80", []string{"for=198.51.100.7, for=unknown"}, "10.1.2.3"},
		{"element without for= keys the proxy", testProxies, "10.1.2.3:80", []string{"for=198.51.100.7, proto=https"}, "10.1.2.3"},
		{"unbracketed ipv6", testProxies, "10.1.2.3:80", []string{`for="2001:db8::1"`}, ""},
		{"unquoted port", testProxies, "10.1.2.3:80", []string{"for=198.51.100.7:80"}, ""},
		{"bad port", testProxies, "10.1.2.3:80", []string{`for="198.51.100.7:123456"`}, ""},
		{"junk after brackets", testProxies, "10.1.2.3:80", []string{`for="[2001:db8::1]x"`}, ""},
		{"ipv4 in brackets", testProxies, "10.1.2.3:80", []string{`for="[198.51.100.7]"`}, ""},
		{"host name", testProxies, "10.1.2.3:80", []string{"for=example.com"}, ""},
		{"duplicate for", testProxies, "10.1.2.3:80", []string{"for=198.51.100.7;for=203.0.113.9"}, ""},
		{"unterminated quote", testProxies, "10.1.2.3:80", []string{`for="198.51.100.7`}, ""},
		{"not a pair", testProxies, "10.1.2.3:80", []string{"198.51.100.7"}, ""},
		{"empty value", testProxies, "10.1.2.3:80", []string{"for="}, ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			kf := mustRemoteIP(t, &RemoteIPConfig{TrustedProxies: tt.trusted, Header: "Forwarded"})
			got, err := kf(forwardedRequest(tt.remote, tt.lines...))
			if tt.want == "" {
				if err == nil {
					t.Fatalf("got key %q, want an error", got)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Fatalf("got %q, %v; want %q", got, err, tt.want)
			}
		})
	}
}

// Each RemoteIP reads one header: X-Forwarded-For by default, Forwarded
// when configured. A proxy that writes one passes the other through from
// the client, so reading both would let a client choose its key.
func TestRemoteIPReadsOneHeader(t *testing.T) {
	t.Parallel()
	r := newRequest("10.1.2.3:80", "198.51.100.7")
	r.Header.Set("Forwarded", "for=203.0.113.9")
	if got, err := mustRemoteIP(t, &RemoteIPConfig{TrustedProxies: testProxies})(r); err != nil || got != "198.51.100.7" {
		t.Errorf("X-Forwarded-For: %q, %v", got, err)
	}
	if got, err := mustRemoteIP(t, &RemoteIPConfig{TrustedProxies: testProxies, Header: "Forwarded"})(r); err != nil || got != "203.0.113.9" {
		t.Errorf("Forwarded: %q, %v", got, err)
	}
}

// A huge header (a client filling the server's header limit) gives a key
// from the hops nearest the server, or a short error, never a key from
// the client's part.
func TestRemoteIPHugeHeaders(t *testing.T) {
	t.Parallel()
	junk := strings.Repeat("203.0.113.9, ", 60000) // ~780 KB, under net/http's 1 MB
	xff := mustRemoteIP(t, &RemoteIPConfig{TrustedProxies: testProxies})
	if got, err := xff(newRequest("10.1.2.3:80", junk+"198.51.100.7")); err != nil || got != "198.51.100.7" {
		t.Errorf("X-Forwarded-For: %q, %v", got, err)
	}
	fwd := mustRemoteIP(t, &RemoteIPConfig{TrustedProxies: testProxies, Header: "Forwarded"})
	fjunk := strings.Repeat("for=203.0.113.9, ", 50000)
	if got, err := fwd(forwardedRequest("10.1.2.3:80", fjunk+"for=198.51.100.7")); err != nil || got != "198.51.100.7" {
		t.Errorf("Forwarded: %q, %v", got, err)
	}
	huge := `for="` + strings.Repeat("x", 1<<19) + `"`
	_, err := fwd(forwardedRequest("10.1.2.3:80", huge))
	if err == nil || len(err.Error()) > 300 {
		t.Errorf("huge malformed Forwarded: error of %d bytes, want a short one: %.300v", len(fmt.Sprint(err)), err)
	}
	_, err = xff(newRequest("10.1.2.3:80", strings.Repeat("z", 1<<19)))
	if err == nil || len(err.Error()) > 300 {
		t.Errorf("huge malformed X-Forwarded-For: error of %d bytes, want a short one", len(fmt.Sprint(err)))
	}
}

// FuzzRemoteIPForwarded checks that no Forwarded header makes RemoteIP
// panic, that an untrusted peer's header never changes the key, and that a
// key is always the peer or an IPv4 or IPv6 /64 the header spells out.
func FuzzRemoteIPForwarded(f *testing.F) {
	f.Add("10.1.2.3:80", "for=198.51.100.7")
	f.Add("10.1.2.3:80", `for="[2001:db8:cafe::17]:4711", for=10.0.0.1`)
	f.Add("10.1.2.3:80", `for=_hidden;proto=https, for="198.51.100.7:_p"`)
	f.Add("192.0.2.1:1", `for="\"`)
	f.Add("[fd00::1]:443", `for=unknown;by="[fd00::1]", ,,`)
	f.Fuzz(func(t *testing.T, remote, fwd string) {
		r := forwardedRequest(remote, fwd)
		trustedKey, trustedErr := mustRemoteIP(t, &RemoteIPConfig{TrustedProxies: testProxies, Header: "Forwarded"})(r)
		peerKey, peerErr := mustRemoteIP(t, &RemoteIPConfig{Header: "Forwarded"})(r)
		bareKey, _ := mustRemoteIP(t, nil)(newRequest(remote))
		if peerErr != nil {
			return
		}
		if peerKey != bareKey {
			t.Fatalf("Forwarded changed the key without trusted proxies: %q vs %q", peerKey, bareKey)
		}
		peer, _ := parseAddr(remote)
		if !trusted(peer) {
			if trustedKey != peerKey || trustedErr != nil {
				t.Fatalf("untrusted peer %s: header changed the key to %q, %v", peer, trustedKey, trustedErr)
			}
			return
		}
		if trustedErr != nil || trustedKey == peerKey {
			return
		}
		if _, err := netip.ParsePrefix(trustedKey); err != nil {
			if a, err := netip.ParseAddr(trustedKey); err != nil || !a.Is4() || !strings.Contains(fwd, trustedKey) {
				t.Fatalf("key %q is neither the peer %s nor an address in %q", trustedKey, peerKey, fwd)
			}
		}
	})
}
