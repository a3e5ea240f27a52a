package consumer_test

import (
	"context"
	"crypto/tls"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/require"

	"github.com/kafkaonce/kafkaonce/consumer"
	"github.com/kafkaonce/kafkaonce/deadletter"
	"github.com/kafkaonce/kafkaonce/kafkaconn"
	"github.com/kafkaonce/kafkaonce/kafkaoncetype"
)

// unusedPool is a real pool that is never dialled: New does not connect.
func unusedPool(t *testing.T) *pgxpool.Pool {
	p, err := pgxpool.New(context.Background(), "postgres://nobody@127.0.0.1:1/none")
	require.NoError(t, err)
	t.Cleanup(p.Close)
	return p
}

// keysPruner stands for a feature's Pruner: the consumer only checks it.
var keysPruner = consumer.Pruner{Table: "expired keys", Step: func(context.Context, kafkaoncetype.Querier, int) (int64, error) { return 0, nil }}

func validConfig() *consumer.Config {
	return &consumer.Config{
		Name:    "ledger",
		Brokers: []string{"localhost:9092"},
		Topics:  []string{"transfers"},
		Handler: consumer.HandlerFunc(func(context.Context, pgx.Tx, *consumer.Message) error { return nil }),
	}
}

func TestNewAcceptsTheMinimalConfig(t *testing.T) {
	t.Parallel()
	c, err := consumer.New(unusedPool(t), validConfig())
	require.NoError(t, err)
	require.NotNil(t, c)
}

// Retries later bounded by time alone need no count: MaxRetries then
// stays unbounded, and a count set as well is checked as ever.
func TestNewAcceptsRetriesLaterBoundedByTime(t *testing.T) {
	t.Parallel()
	cfg := validConfig()
	cfg.RetryLater.MaxElapsed = 24 * time.Hour
	_, err := consumer.New(unusedPool(t), cfg)
	require.NoError(t, err)
	cfg.RetryLater.MaxRetries = 5000
	_, err = consumer.New(unusedPool(t), cfg)
	require.ErrorContains(t, err, "RetryLater.MaxRetries must be between 1 and 1000 (got 5000)")
}

func TestNewRejectsBadConfigNamingTheField(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name   string
		mutate func(*consumer.Config)
		want   []string // each must appear in the error
	}{
		{"no name", func(c *consumer.Config) { c.Name = "" }, []string{"Name must be set", "dedupe scope"}},
		{"name with newline", func(c *consumer.Config) { c.Name = "led\nger" }, []string{"Name must be printable"}},
		{"name too long", func(c *consumer.Config) { c.Name = strings.Repeat("n", 201) }, []string{"Name must be at most 200 bytes"}},
		{"name not utf8", func(c *consumer.Config) { c.Name = "\xff" }, []string{"Name must be valid UTF-8"}},
		{"bad group", func(c *consumer.Config) { c.GroupID = " padded " }, []string{"GroupID must not start or end with spaces"}},
		{"no brokers", func(c *consumer.Config) { c.Brokers = nil }, []string{"Brokers must list at least one broker", "localhost:9092"}},
		{"broker without port", func(c *consumer.Config) { c.Brokers = []string{"kafka"} }, []string{`Brokers[0] must be host:port (got "kafka")`}},
		{"no topics", func(c *consumer.Config) { c.Topics = nil }, []string{"Topics must name at least one topic"}},
		{"bad topic", func(c *consumer.Config) { c.Topics = []string{"a b"} }, []string{"Topics[0] must use only letters"}},
		{"repeated topic", func(c *consumer.Config) { c.Topics = []string{"t", "t"} }, []string{`Topics[1] repeats "t"`}},
		{"no handler", func(c *consumer.Config) { c.Handler = nil }, []string{"Handler must be set"}},
		{"batch too big", func(c *consumer.Config) { c.MaxBatch = 20000 }, []string{"MaxBatch must be between 1 and 10000 (got 20000)"}},
		{"negative batch", func(c *consumer.Config) { c.MaxBatch = -1 }, []string{"MaxBatch must be between 1 and 10000 (got -1)"}},
		{"negative wait", func(c *consumer.Config) { c.MaxWait = -time.Second }, []string{"MaxWait must be between 0 and 10s"}},
		{"bad start", func(c *consumer.Config) { c.StartOffset = 7 }, []string{"StartOffset must be StartEarliest or StartLatest"}},
		{"bad schema", func(c *consumer.Config) { c.Schema = `x"; DROP TABLE y; --` }, []string{"Schema must match"}},
		{"tiny fetch", func(c *consumer.Config) { c.FetchMaxBytes = 10 }, []string{"FetchMaxBytes must be between"}},
		{"bad statement timeout", func(c *consumer.Config) { c.StatementTimeout = time.Microsecond }, []string{"StatementTimeout must be at least 1ms", "LeaveUnset"}},
		{"bad lock timeout", func(c *consumer.Config) { c.LockTimeout = -5 * time.Second }, []string{"LockTimeout must be at least 1ms"}},
		{"session too short", func(c *consumer.Config) { c.SessionTimeout = time.Millisecond }, []string{"SessionTimeout must be at least 1s"}},
		{"heartbeat too slow", func(c *consumer.Config) { c.HeartbeatInterval = 20 * time.Second }, []string{"HeartbeatInterval must be positive and at most a third of SessionTimeout"}},
		{"retry inverted", func(c *consumer.Config) { c.Retry.InitialInterval = time.Minute }, []string{"Retry.InitialInterval must be positive and at most Retry.MaxInterval"}},
		{"too many attempts", func(c *consumer.Config) { c.Retry.MaxAttempts = 5000 }, []string{"Retry.MaxAttempts must be between 1 and 1000 (got 5000)"}},
		{"negative retry elapsed", func(c *consumer.Config) { c.Retry.MaxElapsed = -time.Second }, []string{"Retry.MaxElapsed must not be negative"}},
		{"negative prune interval", func(c *consumer.Config) { c.Prune.Interval = -time.Second }, []string{"Prune.Interval must not be negative"}},
		// Checked whether or not the consumer prunes: its defaults do not
		// depend on Prune.Interval, so neither does its validity.
		{"prune retention too short", func(c *consumer.Config) { c.Prune.Retention = time.Minute }, []string{"Prune.Retention must be at least 24h0m0s"}},
		{"prune batch too big", func(c *consumer.Config) { c.Prune.Interval, c.Prune.Batch = time.Hour, 1<<20 }, []string{"Prune.Batch must be between 1 and 100000"}},
		{"pruners without an interval", func(c *consumer.Config) { c.Pruners = []consumer.Pruner{keysPruner} }, []string{"Pruners are set but Prune.Interval is 0"}},
		{"a pruner without a step", func(c *consumer.Config) {
			c.Prune.Interval, c.Pruners = time.Hour, []consumer.Pruner{keysPruner, {Table: "mine"}}
		}, []string{`Pruners[1] ("mine") has no Step`}},
		{"hook of no kind", func(c *consumer.Config) { c.Hooks = []consumer.Hook{42} }, []string{"Hooks[0] (int) implements no hook interface"}},
		{"json id without a field", func(c *consumer.Config) { c.MessageID = consumer.IDFromJSONField("") }, []string{`MessageID JSON field path "" has an empty field name`}},
		{"json id with an empty name", func(c *consumer.Config) { c.MessageID = consumer.IDFromJSONField("meta..id") }, []string{`MessageID JSON field path "meta..id" has an empty field name`, `"meta.id"`}},
		{"zero id rule", func(c *consumer.Config) { c.MessageID = consumer.MessageIDRule{} }, []string{"MessageID is the zero MessageIDRule", "IDFromHeader"}},
		{"negative shutdown", func(c *consumer.Config) { c.ShutdownTimeout = -time.Second }, []string{"ShutdownTimeout must not be negative"}},
		{"a kafka-go Dialer with franz-go", func(c *consumer.Config) { c.Dialer = &kafka.Dialer{} }, []string{"Dialer is kafka-go's", "KafkaClient: consumer.KafkaGo", "set TLS and SASL instead"}},
		{"a Dialer and TLS", func(c *consumer.Config) {
			c.KafkaClient, c.Dialer, c.TLS = consumer.KafkaGo, &kafka.Dialer{}, &tls.Config{}
		}, []string{"Dialer and TLS or SASL are both set"}},
		{"static membership with kafka-go", func(c *consumer.Config) { c.KafkaClient, c.InstanceID = consumer.KafkaGo, "pod-0" }, []string{"InstanceID (static membership) needs KafkaClient: consumer.FranzGo"}},
		{"unknown client", func(c *consumer.Config) { c.KafkaClient = 9 }, []string{"KafkaClient must be consumer.FranzGo or consumer.KafkaGo (got 9)"}},
		{"instance id with a newline", func(c *consumer.Config) { c.InstanceID = "pod\n0" }, []string{"InstanceID must be printable"}},
		{"SASL without a mechanism", func(c *consumer.Config) { c.SASL = &kafkaconn.SASL{Username: "u"} }, []string{"SASL.Mechanism must be set", "kafkaconn.Plain"}},
		{"SASL SCRAM without a password", func(c *consumer.Config) { c.SASL = &kafkaconn.SASL{Mechanism: kafkaconn.ScramSHA512, Username: "u"} }, []string{"SASL SCRAM-SHA-512 needs Username and Password"}},
		{"SASL OAUTHBEARER without a token", func(c *consumer.Config) { c.SASL = &kafkaconn.SASL{Mechanism: kafkaconn.OAuthBearer} }, []string{"SASL OAUTHBEARER needs Token"}},
		{"SASL AWS without credentials", func(c *consumer.Config) { c.SASL = &kafkaconn.SASL{Mechanism: kafkaconn.AWSMSKIAM} }, []string{"SASL AWS_MSK_IAM needs AWS", "EnvAWSCredentials"}},
		{"SASL PLAIN without TLS", func(c *consumer.Config) {
			c.SASL = &kafkaconn.SASL{Mechanism: kafkaconn.Plain, Username: "u", Password: "p"}
		}, []string{"SASL PLAIN without TLS would send the password in clear", "set TLS", "SASL.AllowPlaintext"}},
		{"SASL of an unknown mechanism", func(c *consumer.Config) { c.SASL = &kafkaconn.SASL{Mechanism: "GSSAPI"} }, []string{`SASL.Mechanism "GSSAPI" is not one kafkaonce speaks`}},
		{"metadata too old", func(c *consumer.Config) { c.MetadataMaxAge = 2 * time.Hour }, []string{"MetadataMaxAge must be between 1s and 1h (got 2h0m0s)"}},
		{"open transactions reported too soon", func(c *consumer.Config) { c.OpenTransactionAfter = time.Millisecond }, []string{"OpenTransactionAfter must be at least 100ms (got 1ms)"}},
		{"a stall bound shorter than a fetch", func(c *consumer.Config) { c.StallAfter = time.Millisecond }, []string{"StallAfter must be at least 1s (got 1ms)"}},
		{"retries later without end", func(c *consumer.Config) { c.RetryLater.MaxRetries = 5000 }, []string{"RetryLater.MaxRetries must be between 1 and 1000 (got 5000)"}},
		{"retries later for a negative time", func(c *consumer.Config) { c.RetryLater.MaxElapsed = -time.Hour }, []string{"RetryLater.MaxElapsed must not be negative (got -1h0m0s)"}},
		{"a breaker of negative failures", func(c *consumer.Config) { c.CircuitBreaker.Failures = -1 }, []string{"CircuitBreaker.Failures must not be negative (got -1)"}},
		{"a breaker set but off", func(c *consumer.Config) { c.CircuitBreaker.CoolDown = time.Minute }, []string{"CircuitBreaker is set but its Failures is 0", "set Failures"}},
		{"a breaker's tiny window", func(c *consumer.Config) {
			c.CircuitBreaker = consumer.CircuitBreaker{Failures: 3, Window: time.Millisecond}
		}, []string{"CircuitBreaker.Window must be at least 1s (got 1ms)"}},
		{"a breaker's cap below its cool-down", func(c *consumer.Config) {
			c.CircuitBreaker = consumer.CircuitBreaker{Failures: 3, CoolDown: time.Hour, MaxCoolDown: time.Minute}
		}, []string{"CircuitBreaker.MaxCoolDown must not be shorter than CoolDown (got 1m0s and 1h0m0s)"}},
		{"a breaker's unknown class", func(c *consumer.Config) {
			c.CircuitBreaker = consumer.CircuitBreaker{Failures: 3, Classes: []deadletter.Class{"transient"}}
		}, []string{`CircuitBreaker.Classes: "transient" is not a class kafkaonce reports`, "deadletter.ClassRetriesExhausted"}},
		{"a first retry later than any", func(c *consumer.Config) { c.RetryLater.After = 2 * time.Hour }, []string{"RetryLater.After must be between 0 and RetryLater.MaxDelay (got 2h0m0s and 1h0m0s)"}},
		{"idle timeout within the handler's", func(c *consumer.Config) { c.IdleInTransactionTimeout = 20 * time.Second }, []string{"IdleInTransactionTimeout must be longer than HandlerTimeout (got 20s and 30s)"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			cfg := validConfig()
			tc.mutate(cfg)
			c, err := consumer.New(unusedPool(t), cfg)
			require.Error(t, err)
			require.Nil(t, c)
			for _, w := range tc.want {
				require.Contains(t, err.Error(), w)
			}
			require.True(t, strings.HasPrefix(err.Error(), "consumer: "), err.Error())
		})
	}
}

func TestNewReportsEveryProblemAtOnce(t *testing.T) {
	t.Parallel()
	_, err := consumer.New(unusedPool(t), &consumer.Config{})
	require.Error(t, err)
	for _, field := range []string{"Name", "Brokers", "Topics", "Handler"} {
		require.Contains(t, err.Error(), field+" must")
	}
}

func TestNewRejectsNilArguments(t *testing.T) {
	t.Parallel()
	_, err := consumer.New(nil, validConfig())
	require.ErrorContains(t, err, "db must not be nil")
	_, err = consumer.New(unusedPool(t), nil)
	require.ErrorContains(t, err, "cfg must not be nil")
}

func TestNewCopiesTheConfig(t *testing.T) {
	t.Parallel()
	cfg := validConfig()
	_, err := consumer.New(unusedPool(t), cfg)
	require.NoError(t, err)
	require.Zero(t, cfg.MaxBatch, "New must not write defaults into the caller's Config")
	require.Empty(t, cfg.GroupID)
}

func TestRunRefusesAnUnmigratedSchema(t *testing.T) {
	t.Parallel()
	e := setup(t, 1)
	cfg := e.config(e.applyHandler())
	cfg.Schema = "never_migrated_schema"
	c, err := consumer.New(e.db.Pool, cfg)
	require.NoError(t, err)
	err = c.Run(context.Background())
	require.ErrorContains(t, err, `schema "never_migrated_schema" is at version 0`)
	require.ErrorContains(t, err, "consumer.Migrate")
	require.ErrorContains(t, c.Run(context.Background()), "Run was already called")
}

func TestRunWithACancelledContextReturnsNil(t *testing.T) {
	t.Parallel()
	c, err := consumer.New(unusedPool(t), validConfig())
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	require.NoError(t, c.Run(ctx))
}

// A pool whose connections send statements in the simple protocol by
// default (as behind an older PgBouncer) is refused, saying what to use:
// pgx would join a batch's statements, a handler's queued ones among
// them, into one text, and cannot write the consumer's arrays into one.
// New refuses a *pgxpool.Pool; Run refuses any other DB at its start.
func TestASimpleProtocolPoolIsRefused(t *testing.T) {
	t.Parallel()
	e := setupWithDB(t, 1, func(c *pgxpool.Config) { c.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeSimpleProtocol })
	cfg := e.config(e.applyHandler())
	_, err := consumer.New(e.db.Pool, cfg)
	require.ErrorContains(t, err, "QueryExecModeSimpleProtocol")
	require.ErrorContains(t, err, "pgx.QueryExecModeExec")

	c, err := consumer.New(poolOnly{e.db.Pool}, cfg)
	require.NoError(t, err, "New cannot see the mode of a DB that is not a pool")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	require.ErrorContains(t, c.Run(ctx), "QueryExecModeSimpleProtocol")
}

// poolOnly is a consumer.DB that hides the pool's configuration.
type poolOnly struct{ p *pgxpool.Pool }

func (p poolOnly) Begin(ctx context.Context) (pgx.Tx, error)          { return p.p.Begin(ctx) }
func (p poolOnly) Acquire(ctx context.Context) (*pgxpool.Conn, error) { return p.p.Acquire(ctx) }

// A pool whose sessions start unfit for the consumer's statements (the
// check every batch makes once its handlers are done would fail for what
// no handler did, and set every message aside) is refused when Run
// starts, saying what to fix.
func TestAPoolWhoseSessionsStartUnfitIsRefused(t *testing.T) {
	t.Parallel()
	for name, param := range map[string][2]string{
		"a schema before pg_catalog":       {"search_path", "public, pg_catalog"},
		"session_replication_role replica": {"session_replication_role", "replica"},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			e := setupWithDB(t, 1, func(c *pgxpool.Config) { c.ConnConfig.RuntimeParams[param[0]] = param[1] })
			c, err := consumer.New(e.db.Pool, e.config(e.applyHandler()))
			require.NoError(t, err)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			err = c.Run(ctx)
			require.ErrorContains(t, err, "before any handler ran")
			require.ErrorContains(t, err, "fix the pool's settings")
			require.ErrorContains(t, err, "KO005")
		})
	}
}
