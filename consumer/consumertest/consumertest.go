// Package consumertest helps test a consumer.Handler or BatchHandler
// against a real Postgres database: build a synthetic message, run the
// handler in a transaction that is rolled back when the test ends, and look
// at its effects inside that transaction; or deliver messages to a real
// consumer through an in-process Kafka broker (HandleBatch, ReplayTwice).
//
//	func TestTransferHandler(t *testing.T) {
//		tx := consumertest.Tx(t, pool)
//		msg := consumertest.NewMessage([]byte(`{"from":"a","to":"b","amount":5}`), consumertest.WithID("t-1"))
//		if err := consumertest.Handle(ctx, t, tx, handler, msg); err != nil {
//			t.Fatal(err)
//		}
//		// query tx to check the balances
//	}
//
// Handle runs the handler through the consumer's own code for calling
// handlers (see Handle). It does not claim the message id: deduplication
// is the consumer's job and is tested in kafkaonce itself. HandleBatch
// runs a BatchHandler (or a Handler) as production does, through a real
// consumer reading an in-process Kafka broker: the batch is handled in the
// consumer's guarded transaction after its claims, a failing message is
// retried or set aside as the consumer's policies say, and the result says
// what became of each message; a later call in the same test delivers
// again, and its messages are skipped. ReplayTwice checks a handler's
// effects happen once: it runs the handler in an attempt that is rolled
// back, then through a consumer, then again through a replay of the topic,
// and compares your tables.
//
// # What Handle does not check
//
// Handle makes one call and does not check what the consumer does around
// it. It claims no message id, so handling a message twice applies it
// twice. It neither undoes nor reports what the handler writes outside tx
// (through the pool, another connection, an HTTP call): those writes stay,
// even when the handler fails. Constraints deferred to COMMIT are never
// checked, since tx is never committed (SET CONSTRAINTS ALL IMMEDIATE in
// tx checks them). The handler runs alone, with
// consumer.DefaultHandlerTimeout, not in a batch of several messages nor
// with your Config's HandlerTimeout. No setting of Config changes
// IsPermanent's verdict; Retry.MaxAttempts and OnPermanentFailure decide
// only what follows it. ReplayTwice runs a handler through a real
// consumer, and catches writes outside its transaction into the tables it
// is given.
//
// # What ReplayTwice checks
//
// A failure names what broke. A write outside the handler's transaction
// names the table, the rows added or removed, and the first message whose
// rolled-back attempt changed it; the attempt's own error, if any, is
// ignored, since its transaction is rolled back either way. A replay that
// changed tables names them. A run that applied nothing fails with the
// dead letters' class and error.
//
// So ReplayTwice catches a message id that is not stable (derived from the
// time, a random value, a counter); writes outside the handler's
// transaction into the tables listed (through the pool or another
// connection, by a service that writes them), even writes idempotent on
// their own, which an attempt that is never applied (a message set aside)
// must not make either; and tables changed by something other than the
// messages. It does not see:
//   - effects outside the tables listed (an e-mail, an HTTP call, a file):
//     have the test's fake of that service record them in a listed table;
//   - writes outside the transaction that the rolled-back attempt does not
//     make: ones that depend on timing, on concurrency, or on the batch
//     (the attempts run one message at a time, one after another);
//   - whether the effects are the right ones: assert those after
//     ReplayTwice returns.
//
// A message set aside in the first run is checked only by its rolled-back
// attempt; one whose id cfg.MessageID cannot derive is never handled.
//
// The messages' Key, Value, Headers, Time and Partition are produced as
// NewMessage built them. For its in-process broker ReplayTwice sets
// Brokers, Topics, GroupID, Dialer (none), StartOffset (earliest) and the
// session timings, and creates a DeadLetterTopic there if cfg names one;
// *cfg is left as it was.
//
// Each call has a broker and a topic of its own, and a consumer named
// cfg.Name plus a suffix unique to the call (ReplayResult.Consumer), so
// claims and positions left by an earlier run never meet this one. That
// consumer's claims, positions and dead letters are deleted when the test
// ends, unless it failed: they are then left for you to look at. Your
// tables are not cleaned: ReplayTwice compares them before and after each
// step, so rows from earlier runs do no harm, but a test writing to the
// same tables at the same time is reported as a changing table.
//
// A run that cannot finish fails at once with the reason: a partition
// stopped at a message (Config.OnPermanentFailure set to StopPartition).
// One still retrying a message when ReplayOptions.Timeout passes fails
// naming the message and its last error.
package consumertest

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/kafkaonce/kafkaonce/consumer"
	"github.com/kafkaonce/kafkaonce/internal/engine"
)

// Defaults of NewMessage.
const (
	DefaultTopic = "test-topic"
	DefaultID    = "test-message-1"
)

// Option adjusts a synthetic message.
type Option func(*consumer.Message)

// WithID sets the message id, and the DefaultMessageIDHeader header to it,
// as a producer following the default convention would.
func WithID(id string) Option {
	return func(m *consumer.Message) {
		m.ID = id
		m.Headers = append(m.Headers, consumer.Header{Key: consumer.DefaultMessageIDHeader, Value: []byte(id)})
	}
}

// WithKey sets the message key.
func WithKey(key []byte) Option { return func(m *consumer.Message) { m.Key = key } }

// WithHeader adds a header.
func WithHeader(key string, value []byte) Option {
	return func(m *consumer.Message) { m.Headers = append(m.Headers, consumer.Header{Key: key, Value: value}) }
}

// WithPosition sets where the message sits in the log.
func WithPosition(topic string, partition int, offset int64) Option {
	return func(m *consumer.Message) { m.Topic, m.Partition, m.Offset = topic, partition, offset }
}

// NewMessage returns a message with the given value, at DefaultTopic
// partition 0 offset 0, with id DefaultID unless an option sets another.
func NewMessage(value []byte, opts ...Option) *consumer.Message {
	m := &consumer.Message{Topic: DefaultTopic, Value: value, Time: time.Now()}
	for _, o := range opts {
		o(m)
	}
	if m.ID == "" {
		WithID(DefaultID)(m)
	}
	return m
}

// NewMessageFor is NewMessage with the id cfg.MessageID derives from the
// message, as the consumer does (the default header when MessageID is
// unset), so that a test of a handler sees the id it sees in production:
// an IDFromJSONField consumer's id comes from the value, not from DefaultID.
// The test fails when the rule derives no valid id: the consumer would set
// such a message aside (as invalid_id) without calling the handler.
func NewMessageFor(tb testing.TB, cfg *consumer.Config, value []byte, opts ...Option) *consumer.Message {
	tb.Helper()
	if cfg == nil {
		tb.Fatalf("consumertest: NewMessageFor needs the consumer's *consumer.Config (got nil)")
	}
	m := &consumer.Message{Topic: DefaultTopic, Value: value, Time: time.Now()}
	for _, o := range opts {
		o(m)
	}
	src := idSource(cfg)
	id, err := func() (id string, err error) {
		defer func() {
			if r := recover(); r != nil {
				err = fmt.Errorf("the MessageID function panicked: %v", r)
			}
		}()
		if id, err = src.MessageID(m); err == nil {
			err = consumer.ValidateMessageID(id)
		}
		return id, err
	}()
	if err != nil {
		tb.Fatalf("consumertest: cfg.MessageID derives no valid id for the message at %s: %v; the consumer would set it aside as invalid_id without calling the handler", m.Position(), err)
	}
	m.ID = id
	return m
}

// Tx begins a transaction on db that is rolled back when the test ends, so
// nothing a test does in it is ever committed.
func Tx(tb testing.TB, db consumer.DB) pgx.Tx {
	tb.Helper()
	tx, err := db.Begin(context.Background())
	if err != nil {
		tb.Fatalf("consumertest: begin: %v", err)
	}
	tb.Cleanup(func() {
		unusable := tx.Conn().IsClosed() || tx.Conn().PgConn().IsBusy() // left so by a handler (see Handle)
		if err := tx.Rollback(context.Background()); err != nil && !errors.Is(err, pgx.ErrTxClosed) && !unusable {
			tb.Errorf("consumertest: rollback: %v", err)
		}
	})
	return tx
}

// connClosed reports whether tx's connection is closed (it broke, or the
// server ended the session).
func connClosed(tx pgx.Tx) bool {
	c := tx.Conn()
	return c != nil && c.IsClosed()
}

// Handle runs h for msg inside tx, as the consumer would, and returns the
// handler's error as the consumer sees it: the handler is called through
// the consumer's own code for calling handlers, so a panic, a run past
// consumer.DefaultHandlerTimeout and a misuse of tx (a commit or rollback,
// rows left open, a swallowed SQL error) come back as the consumer's
// errors for them (consumer.ErrHandlerPanicked and the rest), and any other
// error as the handler returned it, for errors.Is and errors.As. The
// transaction refuses every use once the handler has returned.
// consumer.IsPermanent of the error says what the consumer would do with
// the message, by the consumer's own classification:
//
//	err := consumertest.Handle(ctx, t, tx, handler, consumertest.NewMessage([]byte("not json")))
//	require.True(t, consumer.IsPermanent(err)) // dead-lettered, not retried
//
// The handler runs in a savepoint, so a failing one leaves no trace in tx.
// What Handle does not check is in the package's documentation.
func Handle(ctx context.Context, tb testing.TB, tx pgx.Tx, h consumer.Handler, msg *consumer.Message) error {
	tb.Helper()
	return handle(ctx, tb, tx, h, msg, consumer.DefaultHandlerTimeout)
}

// handle is Handle with the handler's timeout given (the tests of the
// timeout use a short one).
func handle(ctx context.Context, tb testing.TB, tx pgx.Tx, h consumer.Handler, msg *consumer.Message, timeout time.Duration) error {
	tb.Helper()
	sp, err := tx.Begin(ctx)
	if err != nil {
		tb.Fatalf("consumertest: savepoint: %v", err)
	}
	herr, hung := engine.HandleAlone(ctx, timeout, sp, h.Handle, nil, msg)
	if hung != nil {
		tb.Fatalf("consumertest: the handler hung: %v (its connection was closed, so tx is gone)", hung)
	}
	if errors.Is(herr, consumer.ErrTxEnded) || errors.Is(herr, consumer.ErrRowsLeftOpen) || herr != nil && connClosed(tx) {
		// tx is unusable: ended by the handler, savepoint and all, busy
		// with rows the handler left open, or its connection is gone.
		return herr
	}
	if herr != nil {
		if err := sp.Rollback(ctx); err != nil {
			tb.Fatalf("consumertest: roll back to savepoint after the handler failed with %v: %v", herr, err)
		}
		return herr
	}
	if err := sp.Commit(ctx); err != nil {
		tb.Fatalf("consumertest: release savepoint: %v", err)
	}
	return nil
}
