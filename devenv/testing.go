package devenv

import (
	"context"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/kafkaonce/kafkaonce/internal/devenv"
	"github.com/kafkaonce/kafkaonce/internal/schema"
)

// shared is the Env of a test binary whose TestMain calls Main.
var shared struct {
	sync.Mutex
	inMain bool
	opts   []Option
	env    *Env
	err    error
}

// Main runs a test binary's tests with one Env for all of them, started
// with opts by the first ForTest and stopped once the tests are done. Call
// it from TestMain:
//
//	func TestMain(m *testing.M) { devenv.Main(m) }
//
// Without it, ForTest starts an Env for each test, which with a throwaway
// cluster costs a second or two per test.
func Main(m *testing.M, opts ...Option) {
	shared.Lock()
	shared.inMain = true
	shared.opts = opts
	shared.Unlock()
	code := m.Run()
	shared.Lock()
	if shared.env != nil {
		_ = shared.env.Close()
	}
	shared.Unlock()
	os.Exit(code)
}

// TestEnv is one test's share of an Env.
type TestEnv struct {
	*Env
	// Schema is a schema of the test's own, with kafkaonce's tables
	// migrated in it: set it as the consumer's Config.Schema. It is
	// dropped, with anything the test created in it, when the test passes;
	// a test that failed keeps it, and logs its name, for you to look at.
	Schema string

	tb testing.TB
}

// ForTest returns the test binary's Env (see Main), or one started for
// this test, with a fresh kafkaonce schema. The test fails at once when
// no Postgres or Kafka can be found or started, saying why.
func ForTest(tb testing.TB) *TestEnv {
	tb.Helper()
	env := envForTest(tb)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	name := devenv.UniqueName("t", tb.Name())
	if _, err := schema.Migrate(ctx, env.Pool, name); err != nil {
		tb.Fatalf("devenv: migrate schema %s: %v", name, err)
	}
	tb.Cleanup(func() {
		if tb.Failed() {
			tb.Logf("devenv: the test failed, so schema %s is kept for you to look at (%s); drop it with DROP SCHEMA %s CASCADE", name, keptUntil(env), pgx.Identifier{name}.Sanitize())
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if _, err := env.Pool.Exec(ctx, `DROP SCHEMA IF EXISTS `+pgx.Identifier{name}.Sanitize()+` CASCADE`); err != nil {
			tb.Errorf("devenv: drop the test's schema %s: %v", name, err)
		}
	})
	return &TestEnv{Env: env, Schema: name, tb: tb}
}

// keptUntil says how long a kept schema lasts: a server devenv started goes
// with the test binary (or the test), one named by DATABASE_URL stays.
func keptUntil(env *Env) string {
	if env.PostgresSource == "DATABASE_URL" {
		return "in DATABASE_URL's database"
	}
	return "until the tests end, since the server is devenv's own: set DATABASE_URL to keep it longer"
}

func envForTest(tb testing.TB) *Env {
	tb.Helper()
	shared.Lock()
	defer shared.Unlock()
	if shared.inMain {
		if shared.env == nil && shared.err == nil {
			shared.env, shared.err = startForTest(shared.opts...)
		}
		if shared.err != nil {
			tb.Fatalf("%v", shared.err)
		}
		return shared.env
	}
	env, err := startForTest()
	if err != nil {
		tb.Fatalf("%v", err)
	}
	tb.Cleanup(func() {
		if err := env.Close(); err != nil {
			tb.Errorf("devenv: stop: %v", err)
		}
	})
	return env
}

func startForTest(opts ...Option) (*Env, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	return Start(ctx, opts...)
}

// Topic creates a topic with the given number of partitions, named after
// the test and unique to this call, and deletes it when the test ends.
func (e *TestEnv) Topic(partitions int) string {
	e.tb.Helper()
	topic := e.Name("topic")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := e.CreateTopic(ctx, topic, partitions); err != nil {
		e.tb.Fatalf("%v", err)
	}
	e.tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		_ = devenv.DeleteTopic(ctx, e.Brokers, topic) // best effort: a broker that is gone has no topic to keep
	})
	return topic
}

// Name returns a name made of prefix and the test's name, unique to this
// call: for a consumer's Name, a group or a table, so that tests sharing a
// database and a broker never see each other's claims or offsets.
func (e *TestEnv) Name(prefix string) string { return devenv.UniqueName(prefix, e.tb.Name()) }
