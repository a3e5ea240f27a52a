package kafkaclient

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"net"
	"os"
	"strings"
	"syscall"

	"github.com/twmb/franz-go/pkg/kerr"
)

// DialCause is what a failed connection to a broker most likely means: a
// Kafka client says "EOF" or "context deadline exceeded", and an operator
// needs "the listener is not TLS".
type DialCause int

// The causes ClassifyDial tells apart.
const (
	// DialFailed is none of the others: the error says what it can.
	DialFailed DialCause = iota
	// DialTLSToPlaintext is a TLS handshake the broker hung up on, or
	// answered in something other than TLS: a plaintext listener.
	DialTLSToPlaintext
	// DialPlaintextToTLS is a plaintext connection the broker closed at
	// once, or answered with a TLS alert: a TLS listener (or, for a
	// close, one that wants SASL).
	DialPlaintextToTLS
	// DialUntrustedCert is a broker certificate the client does not trust.
	DialUntrustedCert
	// DialClientCertRefused is a handshake the broker refused for the
	// client's certificate (none, or one it does not trust).
	DialClientCertRefused
	DialRefused
	DialNoSuchHost
	DialTimedOut
	DialSASLFailed
	// DialHandshakeTimedOut is a TLS handshake the broker accepted the
	// connection for and never answered: a plaintext listener that waits
	// for the rest of what it takes for a request's size, or a TLS broker
	// that is hung. The client cannot tell them apart, so it names both.
	DialHandshakeTimedOut
)

// Explain says what c means, and what to check.
func (c DialCause) Explain() string {
	switch c {
	case DialTLSToPlaintext:
		return "TLS handshake failed: is the broker's listener TLS?"
	case DialPlaintextToTLS:
		return "the broker closed the connection at once, or answered in TLS: is its listener TLS (set TLS), or does it require SASL?"
	case DialUntrustedCert:
		return "TLS handshake failed: the broker's certificate is not trusted (check the CA and the server name)"
	case DialClientCertRefused:
		return "TLS handshake failed: the broker refused the client certificate, or wants one (mTLS)"
	case DialRefused:
		return "connection refused: is the broker running, and listening on that port?"
	case DialNoSuchHost:
		return "the broker's host name does not resolve: is the address right?"
	case DialTimedOut:
		return "the broker did not answer in time: is the address right, or a firewall in the way?"
	case DialSASLFailed:
		return "SASL authentication failed: check the mechanism, the user and the password"
	case DialHandshakeTimedOut:
		return "TLS handshake failed: is the broker's listener TLS? It sent no TLS answer in time: a plaintext listener waits for the rest of a request, and a hung broker does not answer either"
	}
	return "cannot connect"
}

// ErrSASLHungUp is wrapped by a client's error for a broker that closed
// the connection in the middle of SASL authentication, as some do for a
// wrong password instead of answering with an error.
var ErrSASLHungUp = errors.New("the broker closed the connection during SASL authentication")

// ClassifyDial says what err, from opening a connection to a broker and
// setting it up (TLS handshake, API versions, SASL), means; tlsOn says
// whether the client speaks TLS. The order matters: a handshake's own
// failure is looked at before what it wraps (an EOF in a handshake is a
// plaintext listener, an EOF after a plaintext request a TLS one).
func ClassifyDial(err error, tlsOn bool) DialCause {
	if err == nil {
		return DialFailed
	}
	var dns *net.DNSError
	if errors.As(err, &dns) && !dns.IsTimeout {
		return DialNoSuchHost
	}
	if errors.Is(err, syscall.ECONNREFUSED) {
		return DialRefused
	}
	if errors.Is(err, ErrSASLHungUp) || errors.Is(err, kerr.SaslAuthenticationFailed) || errors.Is(err, kerr.UnsupportedSaslMechanism) || errors.Is(err, kerr.IllegalSaslState) {
		return DialSASLFailed
	}
	var hs *HandshakeError
	if errors.As(err, &hs) {
		return classifyHandshake(hs.Err)
	}
	if tlsOn {
		// A handshake made by the Kafka client itself (a user's kafka-go
		// Dialer): only its record error is sure to be the handshake's.
		var rec tls.RecordHeaderError
		if errors.As(err, &rec) {
			return DialTLSToPlaintext
		}
		// Under TLS 1.3 the client's handshake ends before the broker
		// checks its certificate: the refusal comes with the first read.
		if refusedCert(err) {
			return DialClientCertRefused
		}
	} else if hungUp(err) || strings.Contains(err.Error(), "tls alert record") {
		// franz-go reads a TLS alert's first bytes as a response size,
		// and says so.
		return DialPlaintextToTLS
	}
	if timedOut(err) {
		return DialTimedOut
	}
	return DialFailed
}

// classifyHandshake says what a failed TLS handshake means.
func classifyHandshake(err error) DialCause {
	var rec tls.RecordHeaderError
	var unknownCA x509.UnknownAuthorityError
	var host x509.HostnameError
	var invalid x509.CertificateInvalidError
	var verify *tls.CertificateVerificationError
	switch {
	case errors.As(err, &rec) || hungUp(err):
		return DialTLSToPlaintext
	case errors.As(err, &unknownCA) || errors.As(err, &host) || errors.As(err, &invalid) || errors.As(err, &verify):
		return DialUntrustedCert
	case refusedCert(err):
		return DialClientCertRefused
	case timedOut(err):
		// A plaintext broker that waits for more of what it takes for a
		// request's size, or a hung one: the handshake never gets an
		// answer either way.
		return DialHandshakeTimedOut
	}
	return DialFailed
}

// refusedCert is the broker's alert refusing the client's certificate:
// crypto/tls keeps the alert's type unexported.
func refusedCert(err error) bool {
	return strings.Contains(err.Error(), "remote error: tls:") && strings.Contains(err.Error(), "certificate")
}

// hungUp is a connection the other end closed or reset.
func hungUp(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}

func timedOut(err error) bool {
	var ne net.Error
	return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, os.ErrDeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout())
}
