package testenv

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// PKI is a certificate authority of a test's own, with the PEM files of
// what it signed in a directory of the test's.
type PKI struct {
	Dir string
	// CAFile holds the CA's certificate.
	CAFile string
	ca     *x509.Certificate
	caKey  *ecdsa.PrivateKey
}

// NewPKI makes a CA valid for an hour.
func NewPKI(tb testing.TB) *PKI {
	tb.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		tb.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "kafkaonce test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		tb.Fatal(err)
	}
	ca, err := x509.ParseCertificate(der)
	if err != nil {
		tb.Fatal(err)
	}
	p := &PKI{Dir: tb.TempDir(), ca: ca, caKey: key}
	p.CAFile = p.write(tb, "ca.pem", "CERTIFICATE", der)
	return p
}

func (p *PKI) write(tb testing.TB, name, kind string, der []byte) string {
	tb.Helper()
	path := filepath.Join(p.Dir, name)
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: kind, Bytes: der}), 0o600); err != nil {
		tb.Fatal(err)
	}
	return path
}

// Issue makes a certificate for 127.0.0.1 and localhost, for a server or
// a client (usage), and returns its certificate and key files.
func (p *PKI) Issue(tb testing.TB, name string, usage x509.ExtKeyUsage) (certFile, keyFile string) {
	tb.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		tb.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IPAddresses: []net.IP{net.ParseIP("127.0.0.1")},
		DNSNames: []string{"localhost"}, KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, p.ca, &key.PublicKey, p.caKey)
	if err != nil {
		tb.Fatal(err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		tb.Fatal(err)
	}
	return p.write(tb, name+".pem", "CERTIFICATE", der), p.write(tb, name+"-key.pem", "PRIVATE KEY", keyDER)
}

// ServerTLS is the TLS configuration of a broker that presents a
// certificate of p's and requires a client certificate of p's (mTLS).
func (p *PKI) ServerTLS(tb testing.TB) *tls.Config {
	tb.Helper()
	certFile, keyFile := p.Issue(tb, "broker", x509.ExtKeyUsageServerAuth)
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		tb.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(p.ca)
	return &tls.Config{Certificates: []tls.Certificate{cert}, ClientCAs: pool, ClientAuth: tls.RequireAndVerifyClientCert, MinVersion: tls.VersionTLS12}
}
