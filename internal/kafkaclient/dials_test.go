package kafkaclient_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/kafkaonce/kafkaonce/internal/devenv"
	"github.com/kafkaonce/kafkaonce/internal/kafkaclient"
	"github.com/kafkaonce/kafkaonce/internal/kafkaclient/franz"
	"github.com/kafkaonce/kafkaonce/internal/kafkaclient/kafkago"
	"github.com/kafkaonce/kafkaonce/internal/testenv"
	"github.com/kafkaonce/kafkaonce/kafkaconn"
)

// A connection that fails is told apart by its cause, with real brokers
// and listeners on loopback, under either client: the TLS mismatches both
// ways, a port nothing listens on, a name that does not resolve, refused
// credentials. The cause is logged at WARN once however often the client
// dials again, and Failing reports it until a connection works.
func TestDialFailuresAreToldApartAndLoggedOnce(t *testing.T) {
	pki := testenv.NewPKI(t)
	serverTLS := serverOnlyTLS(t, pki)
	clientTLS, err := kafkaconn.TLSConfig(kafkaconn.TLSFiles{CAFile: pki.CAFile})
	require.NoError(t, err)
	plaintextBroker := fakeKafka(t)
	tlsBroker := fakeKafka(t, kfake.TLS(serverTLS))
	scramBroker := fakeKafka(t, kfake.EnableSASL(), kfake.Superuser("SCRAM-SHA-256", "u", "right"))
	wrong, err := kafkaclient.Mechanism(&kafkaconn.SASL{Mechanism: kafkaconn.ScramSHA256, Username: "u", Password: "wrong"})
	require.NoError(t, err)

	for _, tc := range []struct {
		name    string
		brokers []string
		tls     *tls.Config
		sasl    bool
		want    kafkaclient.DialCause
		text    string
	}{
		{name: "TLS client, plaintext broker", brokers: plaintextBroker, tls: clientTLS, want: kafkaclient.DialHandshakeTimedOut, text: "TLS handshake failed: is the broker's listener TLS?"},
		{name: "plaintext client, TLS broker", brokers: tlsBroker, want: kafkaclient.DialPlaintextToTLS, text: "is its listener TLS (set TLS)"},
		{name: "plaintext client, TLS listener", brokers: []string{tlsListener(t, serverTLS)}, want: kafkaclient.DialPlaintextToTLS, text: "is its listener TLS (set TLS)"},
		{name: "TLS client, a CA that did not sign the broker", brokers: tlsBroker, tls: &tls.Config{MinVersion: tls.VersionTLS12}, want: kafkaclient.DialUntrustedCert, text: "the broker's certificate is not trusted"},
		{name: "nothing listening", brokers: []string{closedPort(t)}, want: kafkaclient.DialRefused, text: "connection refused"},
		{name: "a name that does not resolve", brokers: []string{"kafkaonce-no-such-host.invalid:9092"}, want: kafkaclient.DialNoSuchHost, text: "does not resolve"},
		{name: "a wrong password", brokers: scramBroker, sasl: true, want: kafkaclient.DialSASLFailed, text: "SASL authentication failed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			eachClient(t, func(t *testing.T, client string) {
				if tc.sasl && client == "kafka-go" {
					// kafka-go authenticates after the dial, and hands
					// the failure to the caller alone.
					t.Skip("kafka-go reports SASL failures to the caller, not to Dials")
				}
				logs := &lines{}
				cfg := kafkaclient.Config{Brokers: tc.brokers, TLS: tc.tls, MaxBatch: 100, FetchMaxBytes: 1 << 20, Logger: slog.New(slog.NewTextHandler(logs, nil))}
				if tc.sasl {
					cfg.SASL = wrong
				}
				dials := kafkaclient.NewDials(cfg.Logger, tc.tls != nil)
				cfg.Dials = dials
				c := clientOf(t, client, cfg)
				// Ask until the client has dialed more than once: each
				// attempt is reported, one is logged.
				waitUntil(t, "two failed dials", func() bool {
					ctx, cancel := context.WithTimeout(context.Background(), time.Second)
					defer cancel()
					_, _ = c.TopicBounds(ctx, "t")
					f := dials.Failing()
					return f != nil && f.Attempts >= 2
				})
				f := dials.Failing()
				require.Equal(t, tc.want, f.Cause, "%v", f.Err)
				require.Contains(t, f.String(), tc.text)
				require.Contains(t, f.String(), f.Broker)
				warned := logs.matching("level=WARN", "cannot connect to the broker")
				require.Len(t, warned, 1, "one WARN for %d attempts:\n%s", f.Attempts, logs)
				require.Contains(t, warned[0], tc.text)
			})
		})
	}
}

// A broker that comes back clears the failure, says so at INFO, and a
// new failure is logged again.
func TestADialThatWorksClearsTheFailure(t *testing.T) {
	eachClient(t, func(t *testing.T, client string) {
		k := fakeKafka(t)
		logs := &lines{}
		log := slog.New(slog.NewTextHandler(logs, nil))
		dials := kafkaclient.NewDials(log, false)
		// A failure reported before the client's first connection.
		dials.Report(k[0], &net.OpError{Op: "dial", Net: "tcp", Err: &net.DNSError{Err: "no such host", Name: "x"}})
		require.NotNil(t, dials.Failing())
		c := clientOf(t, client, kafkaclient.Config{Brokers: k, MaxBatch: 100, FetchMaxBytes: 1 << 20, Logger: log, Dials: dials})
		waitUntil(t, "a connection that works", func() bool {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			_, _ = c.TopicBounds(ctx, "t")
			return dials.Failing() == nil
		})
		require.Len(t, logs.matching("level=INFO", "connected to the broker again", "failed_attempts=1"), 1, logs.String())
		dials.Report(k[0], &net.OpError{Op: "dial", Net: "tcp", Err: &net.DNSError{Err: "no such host", Name: "x"}})
		require.Len(t, logs.matching("level=WARN"), 2, "a failure after a recovery is logged again:\n%s", logs)
	})
}

func clientOf(t *testing.T, name string, cfg kafkaclient.Config) kafkaclient.Client {
	t.Helper()
	var c kafkaclient.Client
	var err error
	if name == "kafka-go" {
		c, err = kafkago.New(cfg, nil)
	} else {
		c, err = franz.New(cfg)
	}
	require.NoError(t, err)
	t.Cleanup(c.Close)
	return c
}

// fakeKafka is an in-process broker of the test's own, whatever
// KAFKA_BROKERS says: the tests need its listener as they set it.
func fakeKafka(t *testing.T, opts ...kfake.Opt) []string {
	t.Helper()
	k, err := devenv.StartFakeKafka(opts...)
	require.NoError(t, err)
	t.Cleanup(func() { _ = k.Close() })
	return k.Brokers
}

// serverOnlyTLS is a broker's TLS: a certificate of pki's, no client
// certificate asked for.
func serverOnlyTLS(t *testing.T, pki *testenv.PKI) *tls.Config {
	certFile, keyFile := pki.Issue(t, "broker", x509.ExtKeyUsageServerAuth)
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	require.NoError(t, err)
	return &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
}

// tlsListener is a TLS server on loopback that does its handshake and
// hangs up: what a plaintext client meets at any TLS listener.
func tlsListener(t *testing.T, cfg *tls.Config) string {
	ln, err := tls.Listen("tcp", "127.0.0.1:0", cfg)
	require.NoError(t, err)
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer conn.Close()
				_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
				_ = conn.(*tls.Conn).Handshake()
			}()
		}
	}()
	return ln.Addr().String()
}

// closedPort is a loopback address nothing listens on.
func closedPort(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())
	return addr
}

// lines is a log sink safe for concurrent writers.
type lines struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lines) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lines) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// matching returns the lines holding every one of subs.
func (l *lines) matching(subs ...string) []string {
	var out []string
next:
	for _, line := range strings.Split(l.String(), "\n") {
		for _, s := range subs {
			if !strings.Contains(line, s) {
				continue next
			}
		}
		out = append(out, line)
	}
	return out
}

// A broker that goes away and comes back on the same listener clears the
// dial failure once the client is connected to it again, whatever name the
// brokers list gives it: here the seed "localhost:P", which the broker
// advertises as "127.0.0.1:P" (a bootstrap name that is not the advertised
// one is the common case: a load balancer, a DNS alias, a cloud bootstrap
// address). Failing reports a failure "while one lasts", and the health
// report's last_dial_error holds it "until a connection to it works again".
func TestAnOutageThatEndedLeavesNoDialFailure(t *testing.T) {
	eachClient(t, func(t *testing.T, client string) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		port := ln.Addr().(*net.TCPAddr).Port
		require.NoError(t, ln.Close())
		start := func() *devenv.Kafka {
			k, err := devenv.StartFakeKafka(kfake.Ports(port), kfake.SeedTopics(1, "t"))
			require.NoError(t, err)
			return k
		}
		k := start()
		logs := &lines{}
		log := slog.New(slog.NewTextHandler(logs, nil))
		dials := kafkaclient.NewDials(log, false)
		c := clientOf(t, client, kafkaclient.Config{Brokers: []string{"localhost:" + strconv.Itoa(port)}, MaxBatch: 100, FetchMaxBytes: 1 << 20, Logger: log, Dials: dials})
		bounds := func() error {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			_, err := c.TopicBounds(ctx, "t")
			return err
		}
		waitUntil(t, "the broker answering", func() bool { return bounds() == nil })
		require.Nil(t, dials.Failing())

		// The outage: every dial is refused for a few seconds.
		_ = k.Close()
		for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); {
			_ = bounds()
		}
		require.NotNil(t, dials.Failing())

		// The broker is back, on the same port, and answers the client.
		k = start()
		t.Cleanup(func() { _ = k.Close() })
		waitUntil(t, "the broker answering again", func() bool { return bounds() == nil })
		back := time.Now()
		for time.Now().Before(back.Add(30*time.Second)) && dials.Failing() != nil {
			require.NoError(t, bounds(), "the broker answers")
			time.Sleep(100 * time.Millisecond)
		}
		require.Nil(t, dials.Failing(), "%s after the broker answered again, still failing: %v\n%s", time.Since(back).Round(time.Second), dials.Failing(), logs)
	})
}

// A TLS broker that does not answer in time (hung, overloaded: its TCP
// connection is accepted, nothing more comes) is "no answer in time", not
// "is the broker's listener TLS?": docs/operations.md tells the two causes
// apart, and the advice of the second sends the operator to the client's
// TLS settings, which are right. The listener here accepts connections
// and never says a word, as a stalled broker does.
func TestAHungTLSBrokerIsNotCalledPlaintext(t *testing.T) {
	eachClient(t, func(t *testing.T, client string) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		var mu sync.Mutex
		var held []net.Conn
		t.Cleanup(func() {
			ln.Close()
			mu.Lock()
			defer mu.Unlock()
			for _, c := range held {
				c.Close()
			}
		})
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				mu.Lock()
				held = append(held, c)
				mu.Unlock()
			}
		}()
		pki := testenv.NewPKI(t).CAFile
		clientTLS, err := kafkaconn.TLSConfig(kafkaconn.TLSFiles{CAFile: pki})
		require.NoError(t, err)
		logs := &lines{}
		log := slog.New(slog.NewTextHandler(logs, nil))
		dials := kafkaclient.NewDials(log, true)
		c := clientOf(t, client, kafkaclient.Config{Brokers: []string{ln.Addr().String()}, TLS: clientTLS, MaxBatch: 100, FetchMaxBytes: 1 << 20, Logger: log, Dials: dials})
		waitUntil(t, "a failed dial", func() bool {
			ctx, cancel := context.WithTimeout(context.Background(), 12*time.Second)
			defer cancel()
			_, _ = c.TopicBounds(ctx, "t")
			return dials.Failing() != nil
		})
		f := dials.Failing()
		require.Equal(t, kafkaclient.DialHandshakeTimedOut, f.Cause, "%s", f)
		require.Contains(t, f.String(), "a hung broker does not answer either", "the cause names both readings of a handshake without an answer")
	})
}
