// Package testenv is the test harness of kafkaonce's own tests: one Postgres
// server and one Kafka broker per test binary, and for each test its own
// schema, topics and consumer group, so tests run in parallel without
// seeing each other.
//
// The servers are DATABASE_URL's and KAFKA_BROKERS's when set, else a
// throwaway cluster from the local binaries and the in-process broker.
// testenv runs no container: the library's module would need a Docker
// client for it. To run the same tests against containers (a real Apache
// Kafka), start them with kafkaonce dev, which sets both variables for the
// command it runs:
//
//	go run ./cmd/kafkaonce dev --postgres-container --kafka-container -- go test github.com/kafkaonce/kafkaonce/...
//
// Every package that uses it has
//
//	func TestMain(m *testing.M) { testenv.Main(m) }
//
// which stops what was started and then checks for leaked goroutines; a
// test that asks for a server in a package without it fails, saying so.
package testenv

import (
	"context"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/kafkaonce/kafkaonce/internal/devenv"
)

var cleanups struct {
	sync.Mutex
	fns []func()
	// main is set while Main runs the tests: without it, nothing would stop
	// what atExit is given (a throwaway cluster would outlive the test
	// binary), and no one would look for leaked goroutines.
	main bool
}

// atExit registers fn to run when Main finishes, after all tests.
func atExit(fn func()) {
	cleanups.Lock()
	defer cleanups.Unlock()
	cleanups.fns = append(cleanups.fns, fn)
}

// requireMain fails the test when its package has no TestMain calling
// Main: the servers it is about to get would never be stopped.
func requireMain(tb testing.TB) {
	tb.Helper()
	cleanups.Lock()
	defer cleanups.Unlock()
	if !cleanups.main {
		tb.Fatalf("testenv: this package's tests need func TestMain(m *testing.M) { testenv.Main(m) }, which stops the servers they start and checks for leaked goroutines")
	}
}

// Main runs the tests, stops the servers the tests started and fails when
// goroutines outlive the tests.
func Main(m *testing.M) {
	cleanups.Lock()
	cleanups.main = true
	cleanups.Unlock()
	code := m.Run()
	cleanups.Lock()
	for i := len(cleanups.fns) - 1; i >= 0; i-- {
		cleanups.fns[i]()
	}
	cleanups.Unlock()
	if code == 0 {
		if err := goleak.Find(leakOptions()...); err != nil {
			fmt.Fprintf(os.Stderr, "goleak: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}

func leakOptions() []goleak.Option {
	return []goleak.Option{
		// pgx closes idle connections from a background goroutine that ends
		// a moment after Pool.Close returns.
		goleak.IgnoreAnyFunction("github.com/jackc/pgx/v5/pgxpool.(*Pool).backgroundHealthCheck"),
		// kafka-go's default transport keeps idle broker connections in a
		// package-level pool shared by every Writer and Client.
		goleak.IgnoreAnyFunction("github.com/segmentio/kafka-go.(*connGroup).grabConnOrConnect.func1"),
		goleak.IgnoreAnyFunction("github.com/segmentio/kafka-go.(*conn).run"),
		goleak.IgnoreAnyFunction("github.com/segmentio/kafka-go.(*connPool).discover"),
		goleak.IgnoreAnyFunction("internal/poll.runtime_pollWait"),
	}
}

// Name returns a name unique to this test run, built from the test's name
// and usable as a Postgres identifier, topic or group: lower case letters,
// digits and underscores, at most 63 bytes.
func Name(tb testing.TB, prefix string) string { return devenv.UniqueName(prefix, tb.Name()) }

// Context returns a context that ends with the test, bounded by d.
func Context(tb testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	tb.Cleanup(cancel)
	return ctx
}

// KafkaClient names the Kafka client the tests' consumers read with:
// KAFKAONCE_KAFKA_CLIENT, "franz-go" (the default) or "kafka-go". The
// suite runs once with each (see .ci/run).
func KafkaClient() string {
	switch v := os.Getenv("KAFKAONCE_KAFKA_CLIENT"); v {
	case "", "franz-go":
		return "franz-go"
	case "kafka-go":
		return v
	default:
		panic("testenv: KAFKAONCE_KAFKA_CLIENT must be franz-go or kafka-go, not " + v)
	}
}
