package outbox_test

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/require"

	"github.com/kafkaonce/kafkaonce/consumer"
	"github.com/kafkaonce/kafkaonce/internal/testenv"
	"github.com/kafkaonce/kafkaonce/kafkaconn"
	"github.com/kafkaonce/kafkaonce/outbox"
)

func TestMain(m *testing.M) { testenv.Main(m) }

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

func write(t *testing.T, db *testenv.DB, msgs ...outbox.Message) []string {
	t.Helper()
	o, err := outbox.New(db.Schema)
	require.NoError(t, err)
	var ids []string
	require.NoError(t, pgx.BeginFunc(context.Background(), db.Pool, func(tx pgx.Tx) error {
		ids, err = o.Write(context.Background(), tx, msgs...)
		return err
	}))
	return ids
}

// kafkaClient is the client the suite's relays publish with (see
// testenv.KafkaClient): the suite runs once with each.
func kafkaClient() outbox.KafkaClient {
	if testenv.KafkaClient() == "kafka-go" {
		return outbox.KafkaGo
	}
	return outbox.FranzGo
}

// runRelay runs a relay in the background until the test ends.
func runRelay(t *testing.T, db *testenv.DB, cfg outbox.RelayConfig) *outbox.Relay {
	t.Helper()
	cfg.Schema, cfg.KafkaClient = db.Schema, kafkaClient()
	cfg.Logger = quiet
	r, err := outbox.NewRelay(db.Pool, &cfg)
	require.NoError(t, err)
	testenv.Background(t, r.Run)
	return r
}

func pending(t *testing.T, db *testenv.DB) int64 {
	return db.Int(t, `SELECT count(*) FROM `+db.Table("outbox")+` WHERE failed_at IS NULL`)
}

func readAll(t *testing.T, brokers []string, topic string, n int) []kafka.Message {
	t.Helper()
	rd := kafka.NewReader(kafka.ReaderConfig{Brokers: brokers, Topic: topic, Partition: 0, MaxWait: 100 * time.Millisecond})
	defer rd.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var out []kafka.Message
	for len(out) < n {
		m, err := rd.ReadMessage(ctx)
		require.NoError(t, err, "read %d of %d", len(out), n)
		out = append(out, m)
	}
	return out
}

func header(m kafka.Message, k string) string {
	for _, h := range m.Headers {
		if h.Key == k {
			return string(h.Value)
		}
	}
	return ""
}

func TestPublishesToKafkaInOrderWithTheIDAsMessageID(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	k := testenv.NewKafka(t)
	topic := k.Topic(t, 1)
	var msgs []outbox.Message
	for i := range 50 {
		msgs = append(msgs, outbox.Message{Destination: topic, Key: []byte("k" + strconv.Itoa(i%5)), Value: []byte(strconv.Itoa(i)),
			Headers: []outbox.Header{{Key: "trace", Value: []byte("t")}}})
	}
	ids := write(t, db, msgs...)
	// A rolled-back transaction's rows never leave.
	o, _ := outbox.New(db.Schema)
	tx, err := db.Pool.Begin(context.Background())
	require.NoError(t, err)
	_, err = o.Write(context.Background(), tx, outbox.Message{Destination: topic, Value: []byte("rolled back")})
	require.NoError(t, err)
	require.NoError(t, tx.Rollback(context.Background()))

	runRelay(t, db, outbox.RelayConfig{Brokers: k.Brokers})
	got := readAll(t, k.Brokers, topic, 50)
	byKey := map[string][]int{}
	for i, m := range got {
		require.Equal(t, "t", header(m, "trace"))
		v, _ := strconv.Atoi(string(m.Value))
		require.Equal(t, ids[v], header(m, "message-id"), "message %d", i)
		byKey[string(m.Key)] = append(byKey[string(m.Key)], v)
	}
	for key, vs := range byKey {
		require.IsIncreasing(t, vs, "key %s in order", key)
	}
	waitFor(t, func() bool { return pending(t, db) == 0 }, "delivered rows deleted")
}

func TestACrashBetweenPublishAndDeleteIsDeduplicatedDownstream(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	db.Exec(t, `CREATE TABLE `+db.Table("effects")+` (message_id text NOT NULL)`)
	k := testenv.NewKafka(t)
	topic := k.Topic(t, 1)
	var msgs []outbox.Message
	for i := range 20 {
		msgs = append(msgs, outbox.Message{Destination: topic, Key: []byte("k"), Value: []byte(strconv.Itoa(i))})
	}
	write(t, db, msgs...)

	r, err := outbox.NewRelay(db.Pool, &outbox.RelayConfig{Schema: db.Schema, KafkaClient: kafkaClient(), Brokers: k.Brokers, Logger: quiet})
	require.NoError(t, err)
	defer r.Close()
	r.SetAfterDeliver(func() { panic("relay killed after publishing") })
	require.PanicsWithValue(t, "relay killed after publishing", func() { _, _ = r.Round(context.Background()) })
	require.EqualValues(t, 20, pending(t, db), "nothing recorded: the rows are still pending")

	runRelay(t, db, outbox.RelayConfig{Brokers: k.Brokers})
	got := readAll(t, k.Brokers, topic, 40)
	require.Equal(t, header(got[0], "message-id"), header(got[20], "message-id"), "published twice, with the same id")

	// A kafkaonce consumer downstream applies each message once.
	c, err := consumer.New(db.Pool, &consumer.Config{Name: "downstream", Brokers: k.Brokers, Topics: []string{topic}, Schema: db.Schema,
		Logger: quiet, SessionTimeout: 6 * time.Second, HeartbeatInterval: 500 * time.Millisecond,
		Handler: consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
			_, err := tx.Exec(ctx, `INSERT INTO `+db.Table("effects")+` VALUES ($1)`, m.ID)
			return err
		})})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	waitFor(t, func() bool {
		return db.Int(t, `SELECT coalesce(max(next_offset), 0) FROM `+db.Table("consumer_offsets")) == 40
	}, "the consumer through both copies")
	cancel()
	require.NoError(t, <-done)
	require.EqualValues(t, 20, db.Int(t, `SELECT count(*) FROM `+db.Table("effects")))
	require.EqualValues(t, 20, db.Int(t, `SELECT count(DISTINCT message_id) FROM `+db.Table("effects")))
}

// provider is a local fake of an e-mail API: it honours Idempotency-Key and
// answers per script.
type provider struct {
	mu        sync.Mutex
	delivered map[string]int         // idempotency key -> deliveries accepted
	calls     map[string][]time.Time // key -> call times
	script    func(key string, call int) (status int, retryAfter string)
}

func (p *provider) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	key := r.Header.Get("Idempotency-Key")
	p.mu.Lock()
	p.calls[key] = append(p.calls[key], time.Now())
	n := len(p.calls[key])
	p.mu.Unlock()
	status, ra := http.StatusOK, ""
	if p.script != nil {
		status, ra = p.script(string(r.URL.Query().Get("v")), n)
	}
	if ra != "" {
		w.Header().Set("Retry-After", ra)
	}
	if status == http.StatusOK {
		p.mu.Lock()
		p.delivered[key]++
		p.mu.Unlock()
	}
	if status == -1 { // hang until the client gives up
		time.Sleep(2 * time.Second)
		return
	}
	w.WriteHeader(status)
}

func newProvider(t *testing.T, script func(v string, call int) (int, string)) (*provider, *httptest.Server) {
	p := &provider{delivered: map[string]int{}, calls: map[string][]time.Time{}, script: script}
	srv := httptest.NewServer(p)
	t.Cleanup(srv.Close)
	return p, srv
}

func httpDeliver(srv *httptest.Server, timeout time.Duration) outbox.DeliverFunc {
	client := &http.Client{Timeout: timeout}
	return func(ctx context.Context, d *outbox.Delivery) error {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+"/send?v="+string(d.Value), nil)
		req.Header.Set("Idempotency-Key", d.ID)
		return outbox.HTTPResult(client.Do(req))
	}
}

func TestHTTPDeliveryFollowsTheRetryRules(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	p, srv := newProvider(t, func(v string, call int) (int, string) {
		switch {
		case v == "ok":
			return 200, ""
		case v == "busy" && call == 1:
			return 429, "1" // come back in a second
		case v == "down" && call <= 2:
			return 503, ""
		case v == "flaky" && call == 1:
			return 500, ""
		case v == "slow" && call == 1:
			return -1, "" // times out
		case v == "bad":
			return 400, ""
		case v == "gone":
			return 404, ""
		case v == "broken":
			return 500, ""
		}
		return 200, ""
	})
	ids := map[string]string{}
	for _, v := range []string{"ok", "busy", "down", "flaky", "slow", "bad", "gone", "broken"} {
		ids[v] = write(t, db, outbox.Message{Destination: "email", Key: []byte(v), Value: []byte(v)})[0]
	}
	runRelay(t, db, outbox.RelayConfig{Deliver: httpDeliver(srv, 500*time.Millisecond), RetryInitialInterval: 10 * time.Millisecond,
		RetryMaxInterval: 50 * time.Millisecond, MaxAttempts: 4, MinRetriesPerMinute: 1000})
	waitFor(t, func() bool { return pending(t, db) == 0 }, "every row delivered or parked")

	p.mu.Lock()
	defer p.mu.Unlock()
	for _, v := range []string{"ok", "busy", "down", "flaky", "slow"} {
		require.Equal(t, 1, p.delivered[ids[v]], "%s delivered once", v)
	}
	busy := p.calls[ids["busy"]]
	require.GreaterOrEqual(t, busy[1].Sub(busy[0]), 900*time.Millisecond, "Retry-After honoured")
	require.Len(t, p.calls[ids["bad"]], 1, "400 is not retried")
	require.Len(t, p.calls[ids["gone"]], 1, "404 is not retried")
	require.Len(t, p.calls[ids["broken"]], 4, "5xx retried up to MaxAttempts")

	o, _ := outbox.New(db.Schema)
	parked, err := o.Parked(context.Background(), db.Pool, 10)
	require.NoError(t, err)
	require.Len(t, parked, 3)
	reasons := map[string]string{}
	for _, pk := range parked {
		reasons[string(pk.Value)] = pk.LastError
	}
	require.Contains(t, reasons["bad"], "HTTP 400")
	require.Contains(t, reasons["gone"], "HTTP 404")
	require.Contains(t, reasons["broken"], "HTTP 500")
}

func TestParkedRowsCanBeRetried(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	var fixed atomic.Bool
	p, srv := newProvider(t, func(string, int) (int, string) {
		if fixed.Load() {
			return 200, ""
		}
		return 401, ""
	})
	id := write(t, db, outbox.Message{Destination: "email", Key: []byte("k"), Value: []byte("x")})[0]
	runRelay(t, db, outbox.RelayConfig{Deliver: httpDeliver(srv, time.Second)})
	o, _ := outbox.New(db.Schema)
	waitFor(t, func() bool { ps, _ := o.Parked(context.Background(), db.Pool, 1); return len(ps) == 1 }, "parked")

	fixed.Store(true) // the API key was rotated
	n, err := o.Retry(context.Background(), db.Pool, id)
	require.NoError(t, err)
	require.EqualValues(t, 1, n)
	waitFor(t, func() bool { p.mu.Lock(); defer p.mu.Unlock(); return p.delivered[id] == 1 }, "delivered after the retry")
}

func TestSeveralRelaysKeepEachKeysOrder(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t, testenv.MaxConns(12))
	var mu sync.Mutex
	seen := map[string][]int{}
	var calls atomic.Int64
	deliver := func(_ context.Context, d *outbox.Delivery) error {
		calls.Add(1)
		v, _ := strconv.Atoi(string(d.Value))
		if v%7 == 3 && d.Attempt == 1 {
			return errors.New("transient") // a retry must hold back the key's later rows
		}
		mu.Lock()
		seen[string(d.Key)] = append(seen[string(d.Key)], v)
		mu.Unlock()
		return nil
	}
	var msgs []outbox.Message
	const n = 2000
	for i := range n {
		msgs = append(msgs, outbox.Message{Destination: "api", Key: []byte(fmt.Sprintf("key-%d", i%40)), Value: []byte(strconv.Itoa(i))})
	}
	write(t, db, msgs...)
	for range 3 {
		runRelay(t, db, outbox.RelayConfig{Deliver: deliver, BatchSize: 50, LockBuckets: 8, RetryInitialInterval: time.Millisecond,
			RetryMaxInterval: 5 * time.Millisecond, MinRetriesPerMinute: 10000})
	}
	waitFor(t, func() bool { return pending(t, db) == 0 }, "all delivered")
	mu.Lock()
	defer mu.Unlock()
	total := 0
	for key, vs := range seen {
		require.IsIncreasing(t, vs, "key %s delivered in order", key)
		total += len(vs)
	}
	require.Equal(t, n, total, "each row delivered once (no crashes here)")
}

// An error marked by consumer.Permanent is as permanent to the relay as one
// marked by outbox.Permanent: the row is parked after one call.
func TestConsumerPermanentParksTheRowAtOnce(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	var calls atomic.Int32
	deliver := func(context.Context, *outbox.Delivery) error {
		calls.Add(1)
		return fmt.Errorf("deliver: %w", consumer.Permanent(errors.New("the receiver rejected the message")))
	}
	write(t, db, outbox.Message{Destination: "api", Key: []byte("k"), Value: []byte("v")})
	runRelay(t, db, outbox.RelayConfig{Deliver: deliver, RetryInitialInterval: time.Millisecond, RetryMaxInterval: 5 * time.Millisecond,
		MaxAttempts: 5, MinRetriesPerMinute: 1000})
	waitFor(t, func() bool { return pending(t, db) == 0 }, "the row parked")

	o, _ := outbox.New(db.Schema)
	parked, err := o.Parked(context.Background(), db.Pool, 10)
	require.NoError(t, err)
	require.Len(t, parked, 1)
	require.Equal(t, 1, parked[0].Attempts, "parked at the first failure")
	require.Contains(t, parked[0].LastError, "the receiver rejected the message")
	require.EqualValues(t, 1, calls.Load(), "not retried")
}

func TestRetryBudget(t *testing.T) {
	t.Parallel()
	now := time.Unix(0, 0)
	success, allow := outbox.NewTestBudget(0.5, 2, func() time.Time { return now })
	require.True(t, allow())
	require.True(t, allow())
	require.False(t, allow(), "min spent, no successes")
	success()
	success()
	require.True(t, allow(), "one more per two successes")
	require.False(t, allow())
	now = now.Add(time.Minute)
	require.True(t, allow(), "a new minute")
}

func TestHTTPResult(t *testing.T) {
	t.Parallel()
	resp := func(code int, ra string) *http.Response {
		r := &http.Response{StatusCode: code, Header: http.Header{}, Body: io.NopCloser(nil)}
		r.Body = http.NoBody
		if ra != "" {
			r.Header.Set("Retry-After", ra)
		}
		return r
	}
	require.NoError(t, outbox.HTTPResult(resp(204, ""), nil))
	for _, code := range []int{400, 401, 403, 404, 409, 422} {
		err := outbox.HTTPResult(resp(code, ""), nil)
		require.ErrorContains(t, err, "permanent", "HTTP %d", code)
	}
	for _, code := range []int{408, 425, 500, 502, 504} {
		err := outbox.HTTPResult(resp(code, ""), nil)
		require.Error(t, err)
		require.NotContains(t, err.Error(), "permanent", "HTTP %d is retried", code)
	}
	require.ErrorContains(t, outbox.HTTPResult(resp(429, "7"), nil), "retry after 7s")
	require.ErrorContains(t, outbox.HTTPResult(resp(503, time.Now().Add(time.Minute).UTC().Format(http.TimeFormat)), nil), "retry after")
	require.ErrorContains(t, outbox.HTTPResult(nil, context.DeadlineExceeded), "may be retried")
}

func TestNewRelayValidates(t *testing.T) {
	t.Parallel()
	db := testenv.NewEmptyDB(t)
	_, err := outbox.NewRelay(db.Pool, &outbox.RelayConfig{})
	require.ErrorContains(t, err, "set Brokers to publish to Kafka, or Deliver")
	_, err = outbox.NewRelay(db.Pool, &outbox.RelayConfig{Brokers: []string{"x:1"}, BatchSize: -1, Schema: "Bad"})
	require.ErrorContains(t, err, "BatchSize must be between")
	require.ErrorContains(t, err, "Schema must match")
	_, err = outbox.NewRelay(db.Pool, &outbox.RelayConfig{Brokers: []string{"x:1"}, SASL: &kafkaconn.SASL{Mechanism: kafkaconn.Plain, Username: "u", Password: "p"}})
	require.ErrorContains(t, err, "SASL PLAIN without TLS would send the password in clear")
	_, err = outbox.NewRelay(db.Pool, &outbox.RelayConfig{Brokers: []string{"x:1"}, DeliveryTimeout: -time.Second})
	require.ErrorContains(t, err, "DeliveryTimeout must be positive")
	t.Run("a kafka-go Dialer needs KafkaGo", func(t *testing.T) {
		_, err := outbox.NewRelay(db.Pool, &outbox.RelayConfig{Brokers: []string{"x:1"}, Dialer: &kafka.Dialer{}})
		require.ErrorContains(t, err, "Dialer is kafka-go's and is used only with KafkaClient: outbox.KafkaGo")
		r, err := outbox.NewRelay(db.Pool, &outbox.RelayConfig{Brokers: []string{"x:1"}, KafkaClient: outbox.KafkaGo, Dialer: &kafka.Dialer{}})
		require.NoError(t, err)
		require.NoError(t, r.Close())
		_, err = outbox.NewRelay(db.Pool, &outbox.RelayConfig{Brokers: []string{"x:1"}, KafkaClient: outbox.KafkaGo, Dialer: &kafka.Dialer{}, TLS: &tls.Config{}})
		require.ErrorContains(t, err, "Dialer and TLS or SASL are both set")
	})
	t.Run("an unknown client", func(t *testing.T) {
		_, err := outbox.NewRelay(db.Pool, &outbox.RelayConfig{Brokers: []string{"x:1"}, KafkaClient: 9})
		require.ErrorContains(t, err, "KafkaClient must be outbox.FranzGo or outbox.KafkaGo (got 9)")
	})
	o, _ := outbox.New(db.Schema)
	_, err = o.Write(context.Background(), db.Pool, outbox.Message{})
	require.ErrorContains(t, err, "Destination must name")
}

func waitFor(t *testing.T, cond func() bool, what string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
