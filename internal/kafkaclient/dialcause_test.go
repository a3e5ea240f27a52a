package kafkaclient_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kerr"

	"github.com/kafkaonce/kafkaonce/internal/kafkaclient"
)

// What each error a dial meets means, with TLS on or off. The real
// brokers behind the common ones are in dials_test.go.
func TestClassifyDial(t *testing.T) {
	t.Parallel()
	handshake := func(err error) error {
		return fmt.Errorf("unable to dial: %w", &kafkaclient.HandshakeError{Addr: "b:9093", Err: err})
	}
	opErr := func(err error) error { return &net.OpError{Op: "dial", Net: "tcp", Err: err} }
	for _, tc := range []struct {
		name  string
		err   error
		tlsOn bool
		want  kafkaclient.DialCause
	}{
		{"handshake EOF", handshake(io.EOF), true, kafkaclient.DialTLSToPlaintext},
		{"handshake reset", handshake(opErr(syscall.ECONNRESET)), true, kafkaclient.DialTLSToPlaintext},
		{"handshake answered in plaintext", handshake(tls.RecordHeaderError{Msg: "first record does not look like a TLS handshake"}), true, kafkaclient.DialTLSToPlaintext},
		{"handshake without an answer", handshake(context.DeadlineExceeded), true, kafkaclient.DialHandshakeTimedOut},
		{"a Dialer's own handshake answered in plaintext", tls.RecordHeaderError{Msg: "first record does not look like a TLS handshake"}, true, kafkaclient.DialTLSToPlaintext},
		{"unknown CA", handshake(&tls.CertificateVerificationError{Err: x509.UnknownAuthorityError{}}), true, kafkaclient.DialUntrustedCert},
		{"wrong host name", handshake(x509.HostnameError{Host: "b"}), true, kafkaclient.DialUntrustedCert},
		{"client certificate refused", handshake(opErr(errors.New("remote error: tls: certificate required"))), true, kafkaclient.DialClientCertRefused},
		{"client certificate refused after a TLS 1.3 handshake", opErr(errors.New("remote error: tls: certificate required")), true, kafkaclient.DialClientCertRefused},
		{"plaintext, broker hung up", fmt.Errorf("broker closed the connection: %w", io.EOF), false, kafkaclient.DialPlaintextToTLS},
		{"plaintext, reset", opErr(syscall.ECONNRESET), false, kafkaclient.DialPlaintextToTLS},
		{"plaintext, answered with a TLS alert", errors.New("invalid large response size 352518912 > limit 104857600; the first three bytes received appear to be a tls alert record for TLS v1.2; is this a plaintext connection speaking to a tls endpoint?"), false, kafkaclient.DialPlaintextToTLS},
		{"TLS, hung up after the handshake", io.EOF, true, kafkaclient.DialFailed},
		{"refused", opErr(syscall.ECONNREFUSED), false, kafkaclient.DialRefused},
		{"refused, under TLS", opErr(syscall.ECONNREFUSED), true, kafkaclient.DialRefused},
		{"no such host", opErr(&net.DNSError{Err: "no such host", Name: "kafka-1", IsNotFound: true}), false, kafkaclient.DialNoSuchHost},
		{"DNS timing out", opErr(&net.DNSError{Err: "i/o timeout", Name: "kafka-1", IsTimeout: true}), false, kafkaclient.DialTimedOut},
		{"dial timeout", opErr(os.ErrDeadlineExceeded), false, kafkaclient.DialTimedOut},
		{"SASL refused", fmt.Errorf("sasl: %w", kerr.SaslAuthenticationFailed), true, kafkaclient.DialSASLFailed},
		{"SASL mechanism not offered", kerr.UnsupportedSaslMechanism, false, kafkaclient.DialSASLFailed},
		{"SASL hung up", fmt.Errorf("%w: %w", kafkaclient.ErrSASLHungUp, io.EOF), false, kafkaclient.DialSASLFailed},
		{"something else", errors.New("broker said no"), false, kafkaclient.DialFailed},
		{"nil", nil, false, kafkaclient.DialFailed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.Equal(t, tc.want, kafkaclient.ClassifyDial(tc.err, tc.tlsOn), tc.want.Explain())
		})
	}
}
