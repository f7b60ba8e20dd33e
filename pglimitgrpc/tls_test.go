package pglimitgrpc_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"math/big"
	"net"
	"net/url"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"

	"github.com/pglimit/cooldown/internal/onpglimit/testdb"
	"github.com/pglimit/cooldown/pglimit"
	"github.com/pglimit/cooldown/pglimitgrpc"
)

// testCA issues certificates for one test.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pool *x509.CertPool
}

func newCA(t *testing.T) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return &testCA{cert, key, pool}
}

// issue returns a certificate for 127.0.0.1 (a server's) or for a client
// named cn and uri (either may be empty).
func (ca *testCA) issue(t *testing.T, serial int64, cn, uri string, usage x509.ExtKeyUsage) tls.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: cn},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage},
	}
	if usage == x509.ExtKeyUsageServerAuth {
		tmpl.IPAddresses = []net.IP{net.IPv4(127, 0, 0, 1)}
	}
	if uri != "" {
		u, err := url.Parse(uri)
		if err != nil {
			t.Fatal(err)
		}
		tmpl.URIs = []*url.URL{u}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

// PeerCertificate keys by the verified client certificate's URI, else its
// common name; metadata claiming another identity changes nothing, and a
// client without a certificate has no key.
func TestPeerCertificateKey(t *testing.T) {
	t.Parallel()
	ca := newCA(t)
	server := credentials.NewTLS(&tls.Config{
		Certificates: []tls.Certificate{ca.issue(t, 2, "", "", x509.ExtKeyUsageServerAuth)},
		ClientCAs:    ca.pool,
		ClientAuth:   tls.VerifyClientCertIfGiven,
		MinVersion:   tls.VersionTLS13,
	})
	lim := newLimiter(t, testdb.Schema(t), pglimit.Config{Cooldown: time.Hour})
	clientAs := func(certs ...tls.Certificate) healthpb.HealthClient {
		return serveWith(t, lim, &pglimitgrpc.Config{Key: pglimitgrpc.PeerCertificate}, []grpc.ServerOption{grpc.Creds(server)},
			grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: ca.pool, Certificates: certs, MinVersion: tls.VersionTLS13})))
	}
	call := func(c healthpb.HealthClient, kv ...string) error {
		_, err := c.Check(metadata.AppendToOutgoingContext(t.Context(), kv...), &healthpb.HealthCheckRequest{})
		return err
	}

	alice := ca.issue(t, 3, "alice", "spiffe://example.test/alice", x509.ExtKeyUsageClientAuth)
	bob := ca.issue(t, 4, "bob", "", x509.ExtKeyUsageClientAuth)
	client := clientAs(alice)
	if err := call(client); err != nil {
		t.Fatal(err)
	}
	wantCode(t, "alice again, claiming to be bob", call(client, "x-client", "bob"), codes.ResourceExhausted)
	if err := call(clientAs(bob)); err != nil {
		t.Fatalf("bob's first call: %v", err)
	}
	wantCode(t, "no client certificate", call(clientAs()), codes.InvalidArgument)

	for key, want := range map[string]bool{"spiffe://example.test/alice": false, "bob": false, "alice": true} {
		d, err := lim.Peek(t.Context(), key, 1)
		if err != nil || d.Allowed != want {
			t.Errorf("key %q: %+v, %v; want allowed %t", key, d, err, want)
		}
	}
}
