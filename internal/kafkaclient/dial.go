package kafkaclient

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"time"
)

// DialTimeout bounds opening a connection to a broker: TCP and the TLS
// handshake together.
const DialTimeout = 10 * time.Second

// DialFunc opens a connection with dial (nil: a net.Dialer), and when
// tlsCfg is set does the TLS handshake here, before the Kafka client sees
// the connection: a handshake that fails is then a *HandshakeError, told
// apart from a connection that could not be opened and from a broker that
// hung up later (see ClassifyDial). Both clients dial through it.
func DialFunc(dial func(ctx context.Context, network, addr string) (net.Conn, error), tlsCfg *tls.Config) func(ctx context.Context, network, addr string) (net.Conn, error) {
	if dial == nil {
		dial = (&net.Dialer{Timeout: DialTimeout, KeepAlive: 30 * time.Second}).DialContext
	}
	if tlsCfg == nil {
		return dial
	}
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		ctx, cancel := context.WithTimeout(ctx, DialTimeout)
		defer cancel()
		conn, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		cfg := tlsCfg
		if cfg.ServerName == "" {
			// As crypto/tls's own Dial does: the certificate is checked
			// against the host dialed.
			host, _, err := net.SplitHostPort(addr)
			if err != nil {
				host = addr
			}
			cfg = cfg.Clone()
			cfg.ServerName = host
		}
		tc := tls.Client(conn, cfg)
		if err := tc.HandshakeContext(ctx); err != nil {
			conn.Close()
			return nil, &HandshakeError{Addr: addr, Err: err}
		}
		return tc, nil
	}
}

// HandshakeError is a TLS handshake with a broker that failed: the TCP
// connection was open.
type HandshakeError struct {
	Addr string
	Err  error
}

func (e *HandshakeError) Error() string {
	return fmt.Sprintf("TLS handshake with %s: %v", e.Addr, e.Err)
}

func (e *HandshakeError) Unwrap() error { return e.Err }
