package consumertest_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/require"

	"github.com/kafkaonce/kafkaonce/consumer"
	"github.com/kafkaonce/kafkaonce/consumer/consumertest"
	"github.com/kafkaonce/kafkaonce/deadletter"
	"github.com/kafkaonce/kafkaonce/internal/testenv"
	"github.com/kafkaonce/kafkaonce/outbox"
)

// fate is what a consumer does with a message whose handler fails.
type fate string

const (
	// setAsideAtOnce: one call, then a dead letter with one attempt.
	setAsideAtOnce fate = "set aside at once"
	// retriedThenSetAside: a call per attempt up to MaxAttempts, then a
	// dead letter of class retries_exhausted.
	retriedThenSetAside fate = "retried up to MaxAttempts, then set aside"
	// retriedUncounted: called again and again without an attempt being
	// counted, past MaxAttempts, until the handler passes; no letter.
	retriedUncounted fate = "retried without counting attempts until it passed"
)

// Settings of the consumer the cases run in; Handle gets the same timeout.
const (
	maxAttempts    = 3
	handlerTimeout = 500 * time.Millisecond
)

// classCase is a handler that fails one way.
type classCase struct {
	name string
	fail func(ctx context.Context, tx pgx.Tx) error
	// passAfter, when set, lets the handler pass from that many failed
	// calls on: a failure retried without limit must end for the
	// consumer's run to.
	passAfter int
	want      fate
	// class is the dead letter's, for a message set aside.
	class deadletter.Class
}

// raise fails with a Postgres error of the given SQLSTATE, raised by the
// server in the handler's transaction as a real statement's would be.
func raise(code string) func(ctx context.Context, tx pgx.Tx) error {
	return func(ctx context.Context, tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `DO $$ BEGIN RAISE EXCEPTION 'raised by the test' USING ERRCODE = '`+code+`'; END $$`)
		return err
	}
}

// get fails with what an HTTP GET of url comes to with client.
func get(client *http.Client, url string) func(ctx context.Context, tx pgx.Tx) error {
	return func(ctx context.Context, _ pgx.Tx) error {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return err
		}
		resp, err := client.Do(req)
		if err != nil {
			return fmt.Errorf("call partner: %w", err)
		}
		resp.Body.Close()
		return fmt.Errorf("the partner answered %s", resp.Status)
	}
}

// closedPort returns a loopback address nothing listens on: a partner
// that is down refuses the connection.
func closedPort(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := l.Addr().String()
	require.NoError(t, l.Close())
	return addr
}

// classCases are the cases; bare reaches the connection under a case's
// transaction, which the guard hands out to no handler, for the case of
// a connection that breaks.
func classCases(t *testing.T, bare *testenv.BareConns) []classCase {
	errDown := errors.New("partner down")
	down := closedPort(t)
	// A partner that accepts the request and never answers.
	hung := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-r.Context().Done():
		case <-time.After(10 * time.Second):
		}
	}))
	t.Cleanup(hung.Close)
	return []classCase{
		{name: "plain error", fail: func(context.Context, pgx.Tx) error { return errDown },
			want: retriedThenSetAside, class: deadletter.ClassRetriesExhausted},
		{name: "consumer.Permanent", fail: func(context.Context, pgx.Tx) error { return consumer.Permanent(errDown) },
			want: setAsideAtOnce, class: deadletter.ClassPermanent},
		{name: "consumer.Permanent wrapped", fail: func(context.Context, pgx.Tx) error {
			return fmt.Errorf("order 7: %w", consumer.Permanent(errDown))
		}, want: setAsideAtOnce, class: deadletter.ClassPermanent},
		{name: "outbox.Permanent", fail: func(context.Context, pgx.Tx) error { return outbox.Permanent(errDown) },
			want: setAsideAtOnce, class: deadletter.ClassPermanent},
		{name: "panic", fail: func(context.Context, pgx.Tx) error { panic("boom") },
			want: setAsideAtOnce, class: deadletter.ClassPanic},
		{name: "JSON syntax error", fail: func(context.Context, pgx.Tx) error {
			var v map[string]any
			return json.Unmarshal([]byte("not json"), &v)
		}, want: setAsideAtOnce, class: deadletter.ClassUndecodable},
		{name: "JSON type error", fail: func(context.Context, pgx.Tx) error {
			var v struct{ Amount int }
			return fmt.Errorf("decode: %w", json.Unmarshal([]byte(`{"Amount":"five"}`), &v))
		}, want: setAsideAtOnce, class: deadletter.ClassUndecodable},
		{name: "tx.Commit (ErrTxControlledByConsumer)", fail: func(ctx context.Context, tx pgx.Tx) error { return tx.Commit(ctx) },
			want: setAsideAtOnce, class: deadletter.ClassTxMisuse},
		{name: "COMMIT statement (ErrTxEnded)", fail: func(ctx context.Context, tx pgx.Tx) error {
			_, err := tx.Exec(ctx, `COMMIT`)
			return err
		}, want: setAsideAtOnce, class: deadletter.ClassTxMisuse},
		{name: "rows left open (ErrRowsLeftOpen)", fail: func(ctx context.Context, tx pgx.Tx) error {
			rows, err := tx.Query(ctx, `SELECT generate_series(1, 3)`)
			rows.Next()
			return err
		}, want: setAsideAtOnce, class: deadletter.ClassTxMisuse},
		{name: "swallowed SQL error (ErrTxAborted)", fail: func(ctx context.Context, tx pgx.Tx) error {
			_ = raise("P0001")(ctx, tx)
			return nil
		}, want: retriedThenSetAside, class: deadletter.ClassRetriesExhausted},
		{name: "timeout (ErrHandlerTimeout)", fail: func(ctx context.Context, tx pgx.Tx) error {
			<-ctx.Done()
			return ctx.Err()
		}, want: retriedThenSetAside, class: deadletter.ClassRetriesExhausted},
		{name: "timeout in a query on tx (ErrHandlerTimeout)", fail: func(ctx context.Context, tx pgx.Tx) error {
			// The query cancelled by the timeout breaks the connection
			// (pgx closes it): still the handler's failure.
			_, err := tx.Exec(ctx, `SELECT pg_sleep(10)`)
			return err
		}, want: retriedThenSetAside, class: deadletter.ClassRetriesExhausted},
		{name: "context.Canceled", fail: func(context.Context, pgx.Tx) error { return fmt.Errorf("call partner: %w", context.Canceled) },
			want: retriedThenSetAside, class: deadletter.ClassRetriesExhausted},
		// A handler's own network calls failing are its failures, though
		// their errors are net.Errors, as those of a broken connection to
		// Postgres are: the transaction's connection is fine.
		{name: "context.DeadlineExceeded of the handler's own context", fail: func(ctx context.Context, _ pgx.Tx) error {
			cctx, cancel := context.WithTimeout(ctx, time.Millisecond)
			defer cancel()
			<-cctx.Done()
			return fmt.Errorf("call partner: %w", cctx.Err())
		}, want: retriedThenSetAside, class: deadletter.ClassRetriesExhausted},
		{name: "HTTP call refused (partner down)", fail: get(http.DefaultClient, "http://"+down+"/"),
			want: retriedThenSetAside, class: deadletter.ClassRetriesExhausted},
		{name: "HTTP call timed out (http.Client.Timeout)", fail: get(&http.Client{Timeout: 20 * time.Millisecond}, hung.URL),
			want: retriedThenSetAside, class: deadletter.ClassRetriesExhausted},
		{name: "a connection of the handler's own to a database that is down", fail: func(ctx context.Context, _ pgx.Tx) error {
			conn, err := pgx.Connect(ctx, "postgres://nobody@"+down+"/none?sslmode=disable&connect_timeout=2")
			if err == nil {
				conn.Close(ctx)
				return errors.New("the closed port accepted a connection")
			}
			return fmt.Errorf("connect to the reporting database: %w", err)
		}, want: retriedThenSetAside, class: deadletter.ClassRetriesExhausted},
		// The transaction's own connection failing is the database's
		// failure, whatever the error: retried without counting.
		{name: "the transaction's network connection failed", fail: func(ctx context.Context, tx pgx.Tx) error {
			conn, err := bare.Of(ctx, tx)
			if err != nil {
				return err
			}
			_ = conn.PgConn().Conn().Close()
			_, err = tx.Exec(ctx, `SELECT 1`)
			return fmt.Errorf("insert: %w", err)
		}, passAfter: maxAttempts + 1, want: retriedUncounted},
		// A deadline of the handler's own that interrupts a query on tx
		// breaks the transaction's connection as a network failure would:
		// taken for the database's (docs/failures.md).
		{name: "the handler's own deadline interrupts a query on tx", fail: func(ctx context.Context, tx pgx.Tx) error {
			cctx, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
			defer cancel()
			_, err := tx.Exec(cctx, `SELECT pg_sleep(10)`)
			return fmt.Errorf("look up the order: %w", err)
		}, passAfter: maxAttempts + 1, want: retriedUncounted},
		{name: "the server ended the transaction's session", fail: func(ctx context.Context, tx pgx.Tx) error {
			_, err := tx.Exec(ctx, `SELECT pg_terminate_backend(pg_backend_pid())`)
			return fmt.Errorf("insert: %w", err)
		}, passAfter: maxAttempts + 1, want: retriedUncounted},
		{name: "SQLSTATE 22P02 invalid text", fail: raise("22P02"), want: setAsideAtOnce, class: deadletter.ClassData},
		{name: "SQLSTATE 23505 unique violation", fail: raise("23505"), want: setAsideAtOnce, class: deadletter.ClassData},
		{name: "SQLSTATE 54000 program limit", fail: raise("54000"), want: setAsideAtOnce, class: deadletter.ClassData},
		{name: "SQLSTATE 23503 foreign key", fail: raise("23503"), want: retriedThenSetAside, class: deadletter.ClassRetriesExhausted},
		{name: "SQLSTATE 42P01 undefined table", fail: raise("42P01"), want: retriedThenSetAside, class: deadletter.ClassRetriesExhausted},
		{name: "SQLSTATE P0001 raised by a trigger", fail: raise("P0001"), want: retriedThenSetAside, class: deadletter.ClassRetriesExhausted},
		{name: "SQLSTATE 40001 serialization failure", fail: raise("40001"), passAfter: maxAttempts + 1, want: retriedUncounted},
		{name: "SQLSTATE 40P01 deadlock", fail: raise("40P01"), passAfter: maxAttempts + 1, want: retriedUncounted},
	}
}

// The verdict of consumer.IsPermanent on what Handle returns must be what a
// consumer does with the same handler. Each case's handler runs once
// through Handle, and in a real consumer (a partition of its own) until the
// consumer is done with its message; what the consumer did is read from
// its tables and the handler's calls, not from its classification, so the
// test compares two behaviours rather than one function with itself.
func TestHandleErrorIsClassifiedAsTheConsumerDoes(t *testing.T) {
	t.Parallel()
	var bare testenv.BareConns
	cases := classCases(t, &bare)
	db := testenv.NewDB(t, testenv.MaxConns(int32(len(cases))+8), bare.Option())
	ctx := context.Background()

	handled := make([]error, len(cases))
	for i, tc := range cases {
		t.Run("Handle/"+tc.name, func(t *testing.T) {
			tx := consumertest.Tx(t, db.Pool) // some cases leave it unusable
			h := consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, _ *consumer.Message) error { return tc.fail(ctx, tx) })
			handled[i] = consumertest.HandleWithin(ctx, t, tx, h, consumertest.NewMessage([]byte("v")), handlerTimeout)
			require.Error(t, handled[i])
		})
	}

	k := testenv.NewKafka(t)
	topic := k.Topic(t, len(cases))
	calls := make([]atomic.Int32, len(cases))
	msgs := make([]kafka.Message, len(cases))
	for i := range cases {
		id := "case-" + strconv.Itoa(i)
		msgs[i] = kafka.Message{Partition: i, Key: []byte(id), Value: []byte("v"),
			Headers: []kafka.Header{{Key: consumer.DefaultMessageIDHeader, Value: []byte(id)}}}
	}
	k.Produce(t, topic, msgs...)
	c, err := consumer.New(db.Pool, &consumer.Config{
		Name:    "classify",
		GroupID: k.Group(t),
		Brokers: k.Brokers,
		Topics:  []string{topic},
		Schema:  db.Schema,
		Handler: consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
			tc := &cases[m.Partition]
			if n := calls[m.Partition].Add(1); tc.passAfter > 0 && int(n) > tc.passAfter {
				return nil
			}
			return tc.fail(ctx, tx)
		}),
		HandlerTimeout:    handlerTimeout,
		Retry:             consumer.RetryPolicy{MaxAttempts: maxAttempts, InitialInterval: 10 * time.Millisecond, MaxInterval: 50 * time.Millisecond},
		Logger:            slog.New(slog.DiscardHandler),
		SessionTimeout:    6 * time.Second,
		HeartbeatInterval: 500 * time.Millisecond,
		RebalanceTimeout:  10 * time.Second,
		ShutdownTimeout:   5 * time.Second,
	})
	require.NoError(t, err)
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- c.Run(runCtx) }()
	defer func() {
		stop()
		require.NoError(t, <-done)
	}()

	// The consumer is done with a case's message once its position is past
	// it: applied or set aside.
	// A case whose message is not done within the deadline fails on its
	// own, saying how often its handler was called.
	positions := db.Table("consumer_offsets")
	finishedNow := func() map[int]bool {
		rows, err := db.Pool.Query(ctx, `SELECT partition FROM `+positions+` WHERE consumer = 'classify' AND topic = $1 AND next_offset = 1`, topic)
		require.NoError(t, err)
		parts, err := pgx.CollectRows(rows, pgx.RowTo[int32])
		require.NoError(t, err)
		m := map[int]bool{}
		for _, p := range parts {
			m[int(p)] = true
		}
		return m
	}
	finished := finishedNow()
	for deadline := time.Now().Add(90 * time.Second); len(finished) < len(cases) && time.Now().Before(deadline); finished = finishedNow() {
		time.Sleep(50 * time.Millisecond)
	}

	store, err := deadletter.NewStore(db.Schema)
	require.NoError(t, err)
	letters, err := store.List(ctx, db.Pool, deadletter.Filter{Consumer: "classify", Topic: topic})
	require.NoError(t, err)
	letterOf := map[int]deadletter.Letter{}
	for _, l := range letters {
		letterOf[l.Partition] = l
	}
	for i, tc := range cases {
		t.Run("consumer/"+tc.name, func(t *testing.T) {
			n := int(calls[i].Load())
			require.Truef(t, finished[i], "after 90s and %d calls of the handler the consumer had neither applied nor set aside the message (want: %s)", n, tc.want)
			l, setAside := letterOf[i]
			var did fate
			switch {
			case setAside && l.Attempts == 1 && n == 1:
				did = setAsideAtOnce
				require.Equal(t, tc.class, l.Class)
			case setAside && l.Attempts == maxAttempts && n == maxAttempts:
				did = retriedThenSetAside
				require.Equal(t, tc.class, l.Class)
			case !setAside && n > maxAttempts:
				did = retriedUncounted
				require.EqualValues(t, 1, db.Int(t, `SELECT count(*) FROM `+db.Table("processed_messages")+` WHERE `+db.ConsumerIs("'classify'")+`
AND message_id = $1 AND status = 'applied'`, "case-"+strconv.Itoa(i)), "applied once it passed")
			default:
				t.Fatalf("the consumer called the handler %d times and set the message aside: %v (letter %+v)", n, setAside, l)
			}
			require.Equal(t, tc.want, did, "the case does not test what it says")
			require.Equalf(t, did == setAsideAtOnce, consumer.IsPermanent(handled[i]),
				"the consumer's message was %s, but consumer.IsPermanent says %v of Handle's error %v", did, consumer.IsPermanent(handled[i]), handled[i])
		})
	}
}

// Handle keeps the handler's own error reachable: a test can still ask
// errors.Is and errors.As about what the handler returned, whatever the
// verdict.
func TestHandleKeepsTheHandlersError(t *testing.T) {
	t.Parallel()
	db := testenv.NewEmptyDB(t)
	ctx := context.Background()
	errDown := errors.New("partner down")
	var syntax *json.SyntaxError
	for _, tc := range []struct {
		name      string
		fail      error
		is        error
		as        any
		permanent bool
	}{
		{"plain", fmt.Errorf("call partner: %w", errDown), errDown, nil, false},
		{"marked", consumer.Permanent(fmt.Errorf("call partner: %w", errDown)), errDown, nil, true},
		{"undecodable", fmt.Errorf("decode: %w", json.Unmarshal([]byte("{"), &struct{}{})), nil, &syntax, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tx := consumertest.Tx(t, db.Pool)
			h := consumer.HandlerFunc(func(context.Context, pgx.Tx, *consumer.Message) error { return tc.fail })
			err := consumertest.Handle(ctx, t, tx, h, consumertest.NewMessage(nil))
			require.Equal(t, tc.fail, err, "the handler's own error, unchanged")
			require.Equal(t, tc.permanent, consumer.IsPermanent(err))
			if tc.is != nil {
				require.ErrorIs(t, err, tc.is)
			}
			if tc.as != nil {
				require.ErrorAs(t, err, tc.as)
			}
		})
	}
}
