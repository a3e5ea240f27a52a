package consumer_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/kafkaonce/kafkaonce/consumer"
	"github.com/kafkaonce/kafkaonce/deadletter"
	"github.com/kafkaonce/kafkaonce/internal/faultproxy"
	"github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// TestRetryLaterDatabaseFailureDuringARetryCountsNothing: failures.md
// promises "A failure of the database during a retry counts nothing." A
// retry whose handler's statement loses a serialization race (SQLSTATE
// 40001, a failure the worker retries without counting) must leave the
// letter's retries alone, so with MaxRetries 1 the message is still
// applied once the database behaves.
func TestRetryLaterDatabaseFailureDuringARetryCountsNothing(t *testing.T) {
	t.Parallel()
	e := setup(t, 1)
	ids := e.produceIDs("d", 5)
	calls := &callCounts{}
	var dbFailing atomic.Bool
	dbFailing.Store(true)
	cfg := e.config(consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		n := calls.add(m.ID)
		if m.ID == "d-2" {
			if n == 1 {
				return consumer.RetryLater(errors.New("partner down"), 0)
			}
			if dbFailing.Load() {
				_, err := tx.Exec(ctx, `DO $$ BEGIN RAISE EXCEPTION 'could not serialize access' USING ERRCODE = '40001'; END $$`)
				return err
			}
		}
		return e.applyHandler().Handle(ctx, tx, m)
	}))
	cfg.RetryLater.MaxRetries = 1
	e.start(cfg)
	e.waitCommitted(map[int]int64{0: 5}, 30*time.Second)
	waitFor(t, 30*time.Second, "a retry of d-2 that met the database failure", func() bool { return calls.of("d-2") >= 2 })
	dbFailing.Store(false)
	waitFor(t, 30*time.Second, "d-2 applied by a retry once the database behaves", func() bool {
		class, _, retries, redriven := e.letterOf("d-2")
		if class == "retries_exhausted" {
			t.Fatalf("the letter ran out of retries on a database failure (retries %d, %d handler calls)", retries, calls.of("d-2"))
		}
		return redriven
	})
	e.requireExactlyOnce(ids)
}

// TestRetryLaterTwoMembersRetryADueLetterAtMostMaxRetries: two members of
// one group (same Name) both poll due letters. failures.md: after
// RetryLater.MaxRetries failed retries the letter is an ordinary dead
// letter. With MaxRetries 1 the handler runs once in the partition and
// once in a retry: no member may retry a letter that is no longer due.
func TestRetryLaterTwoMembersRetryADueLetterAtMostMaxRetries(t *testing.T) {
	t.Parallel()
	e := setup(t, 1)
	ids := e.produceIDs("t", 4)
	calls := &callCounts{}
	cfg := e.config(consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		n := calls.add(m.ID)
		if m.ID == "t-1" {
			if n == 1 {
				return consumer.RetryLater(errors.New("partner down"), 0)
			}
			// A slow partner: longer than the maintenance poll, so the
			// other member's poll lists the letter meanwhile.
			select {
			case <-time.After(3 * time.Second):
			case <-ctx.Done():
			}
			return errors.New("partner still down")
		}
		return e.applyHandler().Handle(ctx, tx, m)
	}))
	cfg.RetryLater.MaxRetries = 1
	cfg2 := *cfg
	e.start(cfg)
	e.start(&cfg2)
	e.waitCommitted(map[int]int64{0: 4}, 30*time.Second)
	waitFor(t, 60*time.Second, "t-1 out of retries", func() bool { class, _, _, _ := e.letterOf("t-1"); return class == "retries_exhausted" })
	for end := time.Now().Add(6 * time.Second); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
		if n := calls.of("t-1"); n > 2 {
			_, _, retries, _ := e.letterOf("t-1")
			t.Fatalf("a letter out of retries was retried again: %d handler calls, retries %d (MaxRetries 1)", n, retries)
		}
	}
	_, retryAt, retries, _ := e.letterOf("t-1")
	require.Nil(t, retryAt)
	require.Equal(t, 1, retries, "retries counted past RetryLater.MaxRetries")
	require.Equal(t, 2, calls.of("t-1"), "one call in the partition, then MaxRetries retries")
	e.requireExactlyOnce(without(ids, "t-1"))
}

// TestRetryLaterNegativeDelayIsDueAtOnceAndAppliedOnce: RetryLater with a
// negative delay is due at once, and its retry applies the message once.
func TestRetryLaterNegativeDelayIsDueAtOnceAndAppliedOnce(t *testing.T) {
	t.Parallel()
	e := setup(t, 1)
	ids := e.produceIDs("n", 5)
	calls := &callCounts{}
	cfg := e.config(consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		if calls.add(m.ID) == 1 && m.ID == "n-3" {
			return consumer.RetryLater(errors.New("partner down"), -time.Hour)
		}
		return e.applyHandler().Handle(ctx, tx, m)
	}))
	e.start(cfg)
	waitFor(t, 30*time.Second, "n-3 applied by its retry", func() bool { _, _, _, redriven := e.letterOf("n-3"); return redriven })
	stillFor(t, 2500*time.Millisecond, "n-3 retried after it was applied", func() bool { return calls.of("n-3") == 2 })
	e.requireExactlyOnce(ids)
}

// TestMaxAttemptsCountsHandlerCallsWithoutRetryLater: failures.md,
// Retry.MaxAttempts is "handler failures per message before it is set
// aside". Without RetryLater, a message that always fails gets exactly
// MaxAttempts handler calls, also across a restart in its retries.
func TestMaxAttemptsCountsHandlerCallsWithoutRetryLater(t *testing.T) {
	t.Parallel()
	for _, restart := range []bool{false, true} {
		name := "in one run"
		if restart {
			name = "across a restart"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			e := setup(t, 1)
			ids := e.produceIDs("m", 6)
			calls := &callCounts{}
			second := make(chan struct{})
			cfg := e.config(consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
				if m.ID == "m-2" {
					if calls.add(m.ID) == 2 {
						close(second)
					}
					return errors.New("partner down")
				}
				return e.applyHandler().Handle(ctx, tx, m)
			}))
			cfg.Retry = consumer.RetryPolicy{MaxAttempts: 3, InitialInterval: 500 * time.Millisecond, MaxInterval: 500 * time.Millisecond}
			r := e.start(cfg)
			if restart {
				<-second
				r.stop()
				e.start(cfg)
			}
			e.waitCommitted(map[int]int64{0: 6}, 60*time.Second)
			class, _, _, _ := e.letterOf("m-2")
			require.Equal(t, "retries_exhausted", class)
			require.Equal(t, 3, calls.of("m-2"), "handler calls of a message with MaxAttempts 3")
			e.requireExactlyOnce(without(ids, "m-2"))
		})
	}
}

// TestRetryLaterARetryRejectedAtCommitEndsAsAnOrdinaryLetter: failures.md,
// "after RetryLater.MaxRetries failed retries, or one failure that is
// permanent, the letter is an ordinary dead letter"; guarantee.md counts
// data Postgres rejects only at COMMIT (a deferred constraint) among the
// permanent failures. A retry whose transaction a deferred constraint
// rejects at COMMIT must end the retries, not be retried at every poll.
func TestRetryLaterARetryRejectedAtCommitEndsAsAnOrdinaryLetter(t *testing.T) {
	t.Parallel()
	e := setup(t, 1)
	pairs := e.db.Table("pairs")
	e.db.Exec(t, `CREATE TABLE `+pairs+` (k int, CONSTRAINT one_k UNIQUE (k) DEFERRABLE INITIALLY DEFERRED)`)
	ids := e.produceIDs("c", 4)
	calls := &callCounts{}
	cfg := e.config(consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		if m.ID == "c-1" {
			if calls.add(m.ID) == 1 {
				return consumer.RetryLater(errors.New("partner down"), 0)
			}
			// Accepted statement by statement, refused at COMMIT.
			_, err := tx.Exec(ctx, `INSERT INTO `+pairs+` VALUES (1), (1)`)
			return err
		}
		return e.applyHandler().Handle(ctx, tx, m)
	}))
	cfg.RetryLater.MaxRetries = 2
	e.start(cfg)
	e.waitCommitted(map[int]int64{0: 4}, 30*time.Second)
	deadline := time.Now().Add(20 * time.Second)
	for {
		class, retryAt, retries, _ := e.letterOf("c-1")
		if class != "retry_later" && retryAt == nil {
			break
		}
		if n := calls.of("c-1"); time.Now().After(deadline) || n > 3 {
			t.Fatalf("a retry refused at COMMIT is retried for ever: %d handler calls (MaxRetries 2), letter still %s with retries %d, retry_at %v",
				n, class, retries, retryAt)
		}
		time.Sleep(100 * time.Millisecond)
	}
	require.LessOrEqual(t, calls.of("c-1"), 3)
	e.requireExactlyOnce(without(ids, "c-1"))
}

// TestRetryLaterALostConnectionDuringARetryCountsNothing: failures.md
// promises "A failure of the database during a retry (a serialization
// failure, a lost connection) counts nothing: the next poll tries again."
// Here the connection to Postgres breaks while the retry's handler runs
// (every connection through the proxy is cut, as a network failure would
// do it), and the handler's next statement meets the broken connection.
// With RetryLater.MaxRetries 1 that failure must not use up the
// one retry: the next poll must retry the letter and apply it once.
func TestRetryLaterALostConnectionDuringARetryCountsNothing(t *testing.T) {
	t.Parallel()
	e := setup(t, 1)
	proxy, err := faultproxy.Start(e.db.ServerAddr(t))
	require.NoError(t, err)
	t.Cleanup(func() { proxy.Close() })
	ids := e.produceIDs("l", 5)
	calls := &callCounts{}
	cfg := e.config(consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		n := calls.add(m.ID)
		if m.ID == "l-2" {
			switch n {
			case 1:
				return consumer.RetryLater(errors.New("partner down"), 0)
			case 2:
				// The network between the consumer and Postgres fails
				// while the retry runs.
				// The handler meets it a moment later (by then the
				// network is back: the pool's idle connections, cut too,
				// are found broken and replaced when next taken).
				proxy.CutAll()
				time.Sleep(1500 * time.Millisecond)
				_, err := tx.Exec(ctx, `SELECT 1`)
				return err
			}
		}
		return e.applyHandler().Handle(ctx, tx, m)
	}))
	cfg.RetryLater.MaxRetries = 1
	e.start(cfg, e.db.PoolVia(t, proxy.Addr()))
	e.waitCommitted(map[int]int64{0: 5}, 30*time.Second)
	waitFor(t, 60*time.Second, "l-2 applied by a retry after the connection came back", func() bool {
		class, _, retries, redriven := e.letterOf("l-2")
		if class != "retry_later" {
			t.Fatalf("a lost connection during a retry used up the letter's retries: class %s, retries %d, %d handler calls (MaxRetries 1)",
				class, retries, calls.of("l-2"))
		}
		return redriven
	})
	e.requireExactlyOnce(ids)
}

// TestRetryLaterAHandlerAbandonedDuringARetry: a retry whose handler
// writes its effect and then hangs, ignoring its context, is abandoned
// after HandlerTimeout: its transaction is gone with its connection, the
// failed retry counts once, and the next retry applies the message once,
// even while the abandoned handler is still running and returns nil
// after it. In the database (asHung) or in Go.
func TestRetryLaterAHandlerAbandonedDuringARetry(t *testing.T) {
	t.Parallel()
	for _, inDB := range []bool{false, true} {
		name := "hung in Go"
		if inDB {
			name = "hung in a statement"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			e := setup(t, 1)
			ids := e.produceIDs("h", 5)
			calls := &callCounts{}
			hungReturned := make(chan struct{})
			apply := e.applyHandler()
			cfg := e.config(consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
				n := calls.add(m.ID)
				if m.ID == "h-2" {
					switch n {
					case 1:
						return consumer.RetryLater(errors.New("partner down"), 0)
					case 2:
						defer close(hungReturned)
						if err := apply.Handle(ctx, tx, m); err != nil {
							return err
						}
						if inDB {
							_, _ = tx.Exec(context.Background(), `SELECT pg_sleep(4)`)
						} else {
							time.Sleep(4 * time.Second)
						}
						return nil
					}
				}
				return apply.Handle(ctx, tx, m)
			}))
			cfg.HandlerTimeout = 300 * time.Millisecond
			cfg.RetryLater.MaxRetries = 3
			r := e.start(cfg)
			e.waitCommitted(map[int]int64{0: 5}, 30*time.Second)
			waitFor(t, 60*time.Second, "h-2 applied by a retry after the hung one", func() bool { _, _, _, redriven := e.letterOf("h-2"); return redriven })
			<-hungReturned
			stillFor(t, 3*time.Second, "h-2 applied twice", func() bool { return e.effects() == 5 })
			r.stop()
			e.requireExactlyOnce(ids)
			class, retryAt, retries, _ := e.letterOf("h-2")
			require.Equal(t, "retry_later", class)
			require.Nil(t, retryAt)
			require.Equal(t, 1, retries, "the abandoned retry counts once")
			require.Equal(t, 3, calls.of("h-2"))
			require.Equal(t, 5, e.events.snapshot().applied, "applied hooks")
		})
	}
}

// TestRetryLaterOperatorActsWhileARetryRuns: an operator settles a
// retry_later letter, and redrives it, while the consumer's maintenance
// is in the middle of retrying it. Whether the retry applies the message
// or fails, the message is applied at most once, a settled letter is
// retried no more, and the operator's redrive reports what happened.
func TestRetryLaterOperatorActsWhileARetryRuns(t *testing.T) {
	t.Parallel()
	for _, retrySucceeds := range []bool{true, false} {
		name := "the retry applies"
		if !retrySucceeds {
			name = "the retry fails"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			e := setup(t, 1)
			ids := e.produceIDs("o", 4)
			calls := &callCounts{}
			inRetry, release := make(chan struct{}), make(chan struct{})
			apply := e.applyHandler()
			cfg := e.config(consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
				n := calls.add(m.ID)
				if m.ID == "o-1" {
					switch n {
					case 1:
						return consumer.RetryLater(errors.New("partner down"), 0)
					case 2:
						close(inRetry)
						<-release
						if !retrySucceeds {
							return errors.New("partner still down")
						}
					}
				}
				return apply.Handle(ctx, tx, m)
			}))
			cfg.HandlerTimeout = 20 * time.Second
			c, err := consumer.New(e.db.Pool, cfg)
			require.NoError(t, err)
			r := e.run(c)
			e.waitCommitted(map[int]int64{0: 4}, 30*time.Second)
			<-inRetry
			letterID := e.letters()["o-1"].ID
			store, err := deadletter.NewStore(e.db.Schema)
			require.NoError(t, err)

			type redriven struct {
				res consumer.RedriveResult
				err error
			}
			settled, redrove := make(chan int64, 1), make(chan redriven, 1)
			go func() {
				n, err := store.Settle(context.Background(), e.db.Pool, e.name, []int64{letterID})
				if err != nil {
					n = -1
				}
				settled <- n
			}()
			go func() {
				res, err := c.Redrive(context.Background(), consumer.RedriveFilter{IDs: []int64{letterID}})
				redrove <- redriven{res, err}
			}()
			waitFor(t, 20*time.Second, "the settle and the redrive waiting for the retry's lock", func() bool {
				return e.db.LockWaits(t, "dead_letters") >= 2
			})
			close(release)
			n := <-settled
			rd := <-redrove
			require.NoError(t, rd.err)
			stillFor(t, 5*time.Second, "o-1 handled again after it was applied or settled", func() bool { return calls.of("o-1") <= 3 })
			r.stop()
			l := e.letters()["o-1"]
			if retrySucceeds {
				require.EqualValues(t, 0, n, "settle of a letter the retry applied")
				require.NotNil(t, l.RedrivenAt)
				require.Nil(t, l.SettledAt)
				e.requireExactlyOnce(ids)
				require.Equal(t, 2, calls.of("o-1"))
				require.Equal(t, 1, rd.res.AlreadyApplied+rd.res.Applied, "redrive result %+v", rd.res)
				require.Equal(t, 0, rd.res.Applied)
				return
			}
			// The retry failed. The settle and the operator's redrive
			// then take the letter in either order.
			if l.SettledAt != nil {
				require.LessOrEqual(t, calls.of("o-1"), 3)
			}
			if l.RedrivenAt != nil {
				e.requireExactlyOnce(ids)
			} else {
				e.requireExactlyOnce(without(ids, "o-1"))
			}
		})
	}
}

// TestRetryLaterExhaustedIsPublishedOnceThroughAnOutage: failures.md, a
// letter set aside for later becomes an ordinary dead letter after
// RetryLater.MaxRetries failed retries, "published to DeadLetterTopic if
// there is one". It must not reach the topic while it is still retried,
// and a broker refusing the dead-letter topic's produces when it ran out
// must delay it, not lose it nor publish it twice.
func TestRetryLaterExhaustedIsPublishedOnceThroughAnOutage(t *testing.T) {
	t.Parallel()
	e := setupOn(t, 1, ownKafka(t)) // its produce requests are refused for a while
	dlq := e.deadLetterTopic(t, 0)
	var outage atomic.Bool
	var refused atomic.Int64
	e.kafka.Fake.ControlKey(kmsg.Produce.Int16(), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
		req := kreq.(*kmsg.ProduceRequest)
		if !outage.Load() {
			return nil, nil, false
		}
		resp := req.ResponseKind().(*kmsg.ProduceResponse)
		for _, rt := range req.Topics {
			st := kmsg.NewProduceResponseTopic()
			st.Topic, st.TopicID = rt.Topic, rt.TopicID
			for _, rp := range rt.Partitions {
				sp := kmsg.NewProduceResponseTopicPartition()
				sp.Partition = rp.Partition
				sp.ErrorCode = kerr.UnknownServerError.Code
				st.Partitions = append(st.Partitions, sp)
			}
			resp.Topics = append(resp.Topics, st)
		}
		// Only the consumer's publisher produces once the test's
		// messages are in (a request of protocol v13 names its topics
		// by id, not by name).
		refused.Add(1)
		e.kafka.Fake.KeepControl()
		return resp, nil, true
	})
	ids := e.produceIDs("x", 4)
	calls := &callCounts{}
	cfg := e.config(consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		n := calls.add(m.ID)
		if m.ID == "x-1" {
			if n == 1 {
				return consumer.RetryLater(errors.New("partner down"), 0)
			}
			if n == 3 {
				// The last retry: the broker refuses from now on.
				outage.Store(true)
			}
			return errors.New("partner still down")
		}
		return e.applyHandler().Handle(ctx, tx, m)
	}))
	cfg.RetryLater.MaxRetries = 2
	cfg.DeadLetterTopic = dlq
	e.start(cfg)
	e.waitCommitted(map[int]int64{0: 4}, 30*time.Second)
	waitFor(t, 60*time.Second, "x-1 out of retries", func() bool { class, _, _, _ := e.letterOf("x-1"); return class == "retries_exhausted" })
	waitFor(t, 30*time.Second, "a publish of the letter refused", func() bool { return refused.Load() > 0 })
	require.Nil(t, e.letters()["x-1"].PublishedAt, "marked published while the broker refused it")
	outage.Store(false)
	waitFor(t, 60*time.Second, "the letter published after the outage", func() bool { return e.letters()["x-1"].PublishedAt != nil })

	rd := kafka.NewReader(kafka.ReaderConfig{Brokers: e.kafka.Brokers, Topic: dlq, Partition: 0, MaxWait: 100 * time.Millisecond})
	defer rd.Close()
	var got []kafka.Message
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		m, err := rd.ReadMessage(ctx)
		cancel()
		if err != nil {
			break
		}
		got = append(got, m)
	}
	require.Len(t, got, 1, "records of the letter on the dead-letter topic")
	require.Equal(t, "x-1", header(got[0], consumer.DefaultMessageIDHeader))
	require.Equal(t, "retries_exhausted", header(got[0], consumer.HeaderErrorClass))
	e.requireExactlyOnce(without(ids, "x-1"))
}
