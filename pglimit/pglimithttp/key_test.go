package pglimithttp

import (
	"context"
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
		{"ipv6 peer", nil, "[2001:db8::1]:443", nil, "2001:db8::1"},
		{"ipv6 zone dropped", nil, "[fe80::1%eth0]:443", nil, "fe80::1"},
		{"ipv4-mapped peer keyed as ipv4", nil, "[::ffff:192.0.2.1]:443", nil, "192.0.2.1"},
		{"ipv6 hop behind ipv6 proxy", testProxies, "[fd00::1]:443", []string{"[2001:db8::2]:1"}, "2001:db8::2"},
		{"peer without port", nil, "192.0.2.1", nil, "192.0.2.1"},
		{"unix socket peer", nil, "@", nil, ""},
		{"empty peer", nil, "", nil, ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got, err := RemoteIP(tt.trusted)(newRequest(tt.remote, tt.xff...))
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

		trustedKey, trustedErr := RemoteIP(testProxies)(withHeader)
		peerKey, peerErr := RemoteIP(nil)(withHeader)
		bareKey, bareErr := RemoteIP(nil)(plain)
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
		key, err := RemoteIP(trusted)(r)
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
