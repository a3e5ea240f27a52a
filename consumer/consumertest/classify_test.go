package consumertest_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
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

func classCases() []classCase {
	errDown := errors.New("partner down")
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
		{name: "context.Canceled", fail: func(context.Context, pgx.Tx) error { return fmt.Errorf("call partner: %w", context.Canceled) },
			want: retriedThenSetAside, class: deadletter.ClassRetriesExhausted},
		// context.DeadlineExceeded is a net.Error, and the consumer takes
		// any net.Error for a lost connection: retried without counting.
		{name: "context.DeadlineExceeded", fail: func(context.Context, pgx.Tx) error {
			return fmt.Errorf("call partner: %w", context.DeadlineExceeded)
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
	cases := classCases()
	db := testenv.NewDB(t, testenv.MaxConns(int32(len(cases))+8))
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
	positions := db.Table("consumer_offsets")
	deadline := time.Now().Add(90 * time.Second)
	for db.Int(t, `SELECT count(*) FROM `+positions+` WHERE consumer = 'classify' AND topic = $1 AND next_offset = 1`, topic) < int64(len(cases)) {
		require.Truef(t, time.Now().Before(deadline), "the consumer did not finish every case's message within 90s")
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
