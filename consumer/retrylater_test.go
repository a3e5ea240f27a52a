package consumer_test

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/kafkaonce/kafkaonce/consumer"
	"github.com/kafkaonce/kafkaonce/deadletter"
	"github.com/kafkaonce/kafkaonce/pauses"
)

// callCounts counts handler calls per message id.
type callCounts struct {
	mu sync.Mutex
	n  map[string]int
}

func (c *callCounts) add(id string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n == nil {
		c.n = map[string]int{}
	}
	c.n[id]++
	return c.n[id]
}

func (c *callCounts) of(id string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[id]
}

// letterOf is the retry state of the dead letter of id.
func (e *env) letterOf(id string) (class string, retryAt *time.Time, retries int, redriven bool) {
	e.t.Helper()
	err := e.db.Pool.QueryRow(context.Background(), `SELECT error_class, retry_at, retries, redriven_at IS NOT NULL FROM `+e.db.Table("dead_letters")+`
WHERE consumer = $1 AND message_id = $2`, e.name, id).Scan(&class, &retryAt, &retries, &redriven)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", nil, 0, false
	}
	require.NoError(e.t, err)
	return class, retryAt, retries, redriven
}

func TestRetryLater(t *testing.T) {
	t.Parallel()

	t.Run("a marked failure is set aside, the partition goes on, and it is applied once when due", func(t *testing.T) {
		t.Parallel()
		e := setup(t, 1)
		ids := e.produceIDs("r", 20)
		var partnerDown atomic.Bool
		partnerDown.Store(true)
		calls := &callCounts{}
		cfg := e.config(consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
			calls.add(m.ID)
			if m.ID == "r-3" && partnerDown.Load() {
				return consumer.RetryLater(errors.New("mail partner unavailable"), 300*time.Millisecond)
			}
			return e.applyHandler().Handle(ctx, tx, m)
		}))
		e.start(cfg)
		e.waitCommitted(map[int]int64{0: 20}, 30*time.Second)
		require.EqualValues(t, 19, e.effects(), "every message but r-3 applied: r-3 held nothing up")
		class, retryAt, _, redriven := e.letterOf("r-3")
		require.Equal(t, "retry_later", class)
		require.NotNil(t, retryAt, "set aside with the time it is due")
		require.False(t, redriven)
		waitFor(t, 30*time.Second, "a retry of r-3 that failed", func() bool { _, _, retries, _ := e.letterOf("r-3"); return retries >= 1 })

		partnerDown.Store(false)
		waitFor(t, 30*time.Second, "r-3 applied by its retry", func() bool { _, _, _, redriven := e.letterOf("r-3"); return redriven })
		e.requireExactlyOnce(ids)
		_, retryAt, _, _ = e.letterOf("r-3")
		require.Nil(t, retryAt, "a letter redriven is due no more")
		require.EqualValues(t, 20, e.db.Int(t, `SELECT count(*) FROM `+e.db.Table("processed_messages")+` WHERE `+e.db.ConsumerIs("$1")+` AND status = 'applied'`, e.name))
	})

	t.Run("under the policy a failure that could pass is not retried in place, and runs out into an ordinary letter", func(t *testing.T) {
		t.Parallel()
		e := setup(t, 1)
		ids := e.produceIDs("p", 10)
		calls := &callCounts{}
		cfg := e.config(consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
			calls.add(m.ID)
			if m.ID == "p-1" {
				return errors.New("partner down for good")
			}
			return e.applyHandler().Handle(ctx, tx, m)
		}))
		cfg.RetryLater = consumer.RetryLaterPolicy{After: 100 * time.Millisecond, MaxRetries: 3, MaxDelay: 200 * time.Millisecond}
		cfg.Retry.MaxAttempts = 10
		e.start(cfg)
		e.waitCommitted(map[int]int64{0: 10}, 30*time.Second)
		waitFor(t, 60*time.Second, "p-1 out of retries", func() bool { class, _, _, _ := e.letterOf("p-1"); return class == "retries_exhausted" })
		class, retryAt, retries, redriven := e.letterOf("p-1")
		require.Equal(t, "retries_exhausted", class)
		require.Nil(t, retryAt, "an ordinary dead letter is due no more")
		require.Equal(t, 3, retries)
		require.False(t, redriven)
		stillFor(t, 2500*time.Millisecond, "a letter out of retries was retried again", func() bool { return calls.of("p-1") == 4 })
		require.Equal(t, 4, calls.of("p-1"), "one call in the partition, then MaxRetries retries: none in place")
		e.requireExactlyOnce(without(ids, "p-1"))
	})

	t.Run("a pause of the letter's topic holds its retries until the resume", func(t *testing.T) {
		t.Parallel()
		e := setup(t, 1)
		ids := e.produceIDs("r", 5)
		var partnerDown atomic.Bool
		partnerDown.Store(true)
		calls := &callCounts{}
		cfg := e.config(consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
			calls.add(m.ID)
			if m.ID == "r-2" && partnerDown.Load() {
				return consumer.RetryLater(errors.New("mail partner unavailable"), 100*time.Millisecond)
			}
			return e.applyHandler().Handle(ctx, tx, m)
		}))
		c, err := consumer.New(e.db.Pool, cfg)
		require.NoError(t, err)
		e.run(c)
		e.waitCommitted(map[int]int64{0: 5}, 30*time.Second)
		waitFor(t, 30*time.Second, "a retry of r-2", func() bool { return calls.of("r-2") >= 2 })
		ctx := context.Background()
		require.NoError(t, c.Pause(ctx, pauses.Topic(e.topic), "mail partner down"))
		paused := calls.of("r-2")
		stillFor(t, 3*time.Second, "no retry while the topic is paused", func() bool { return calls.of("r-2") <= paused+1 }) // one may have begun
		before := calls.of("r-2")
		stillFor(t, 2*time.Second, "still none", func() bool { return calls.of("r-2") == before })

		partnerDown.Store(false)
		require.NoError(t, c.Resume(ctx, pauses.Topic(e.topic)))
		waitFor(t, 30*time.Second, "r-2 applied by a retry after the resume", func() bool { _, _, _, redriven := e.letterOf("r-2"); return redriven })
		e.requireExactlyOnce(ids)
	})

	t.Run("a policy that cannot set messages aside is refused", func(t *testing.T) {
		t.Parallel()
		e := setup(t, 1)
		cfg := e.config(e.applyHandler())
		cfg.OnPermanentFailure = consumer.StopPartition
		cfg.RetryLater.After = time.Minute
		_, err := consumer.New(e.db.Pool, cfg)
		require.ErrorContains(t, err, "RetryLater.After sets failing messages aside, and OnPermanentFailure StopPartition stops the partition instead")
	})
}

func without(ids []string, drop string) []string {
	var out []string
	for _, id := range ids {
		if id != drop {
			out = append(out, id)
		}
	}
	return out
}

// TestRetryLaterWithABatchHandler: a BatchHandler whose batch fails
// because of one message that asks to be retried later (consumer.RetryLater,
// or an error that could pass under Config.RetryLater.After) must have
// that message set aside as retry_later, every other message of the batch
// applied once, the partition committed past it, and the message applied
// once by its retry when the partner is back: both when batches go in one
// round trip and when they claim first.
func TestRetryLaterWithABatchHandler(t *testing.T) {
	t.Parallel()
	for _, policy := range []bool{false, true} {
		name := "marked error"
		if policy {
			name = "policy"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			bothWays(t, batchPaths, func(t *testing.T, claimFirst bool) {
				e := setup(t, 1)
				ids := e.produceIDs("b", 30)
				var partnerDown atomic.Bool
				partnerDown.Store(true)
				h := &batchEffects{e: e, before: func(msgs []*consumer.Message) error {
					for _, m := range msgs {
						if m.ID == "b-7" && partnerDown.Load() {
							err := errors.New("mail partner unavailable")
							if policy {
								return err
							}
							return consumer.RetryLater(err, 200*time.Millisecond)
						}
					}
					return nil
				}}
				cfg := batchConfig(e, h)
				cfg.ClaimFirst = claimFirst
				if policy {
					cfg.RetryLater.After = 200 * time.Millisecond
				}
				r := e.start(cfg)
				e.waitCommitted(map[int]int64{0: 30}, 30*time.Second)
				class, retryAt, _, redriven := e.letterOf("b-7")
				require.Equal(t, "retry_later", class)
				require.NotNil(t, retryAt)
				require.False(t, redriven)
				e.requireExactlyOnce(without(ids, "b-7"))

				partnerDown.Store(false)
				waitFor(t, 30*time.Second, "b-7 applied by its retry", func() bool { _, _, _, redriven := e.letterOf("b-7"); return redriven })
				stillFor(t, 2500*time.Millisecond, "b-7 applied more than once", func() bool { return e.effects() == 30 })
				r.stop()
				e.requireExactlyOnce(ids)
				require.EqualValues(t, 30, e.db.Int(t, `SELECT count(*) FROM `+e.db.Table("processed_messages")+` WHERE `+e.db.ConsumerIs("$1")+` AND status = 'applied'`, e.name))
				require.Equal(t, 30, e.events.snapshot().applied, "applied hooks: one per message")
			})
		})
	}
}

// TestRetryLaterWithABatchHandlerWhoseQueuedStatementFails: under
// Config.RetryLater.After, a BatchHandler whose queued statement fails for
// one message with an error that could pass (a foreign-key parent that
// has not arrived yet) must have that message set aside and retried, the
// rest of the batch applied once, and the message applied once when its
// parent is there.
func TestRetryLaterWithABatchHandlerWhoseQueuedStatementFails(t *testing.T) {
	t.Parallel()
	bothWays(t, batchPaths, func(t *testing.T, claimFirst bool) {
		e := setup(t, 1)
		parents, children := e.db.Table("parents"), e.db.Table("children")
		e.db.Exec(t, `CREATE TABLE `+parents+` (id text PRIMARY KEY)`)
		e.db.Exec(t, `CREATE TABLE `+children+` (id text NOT NULL REFERENCES `+parents+`(id))`)
		ids := e.produceIDs("q", 30)
		for _, id := range ids {
			if id != "q-7" {
				e.db.Exec(t, `INSERT INTO `+parents+` VALUES ($1)`, id)
			}
		}
		h := &batchEffects{e: e, extra: func(b *consumer.Batch) {
			ids := make([]string, len(b.Messages))
			for i, m := range b.Messages {
				ids[i] = m.ID
			}
			b.Queue(`INSERT INTO `+children+` SELECT unnest($1::text[])`, ids)
		}}
		cfg := batchConfig(e, h)
		cfg.ClaimFirst = claimFirst
		cfg.RetryLater.After = 200 * time.Millisecond
		r := e.start(cfg)
		e.waitCommitted(map[int]int64{0: 30}, 30*time.Second)
		class, retryAt, _, _ := e.letterOf("q-7")
		require.Equal(t, "retry_later", class)
		require.NotNil(t, retryAt)
		e.requireExactlyOnce(without(ids, "q-7"))
		require.EqualValues(t, 29, e.db.Int(t, `SELECT count(*) FROM `+children))

		e.db.Exec(t, `INSERT INTO `+parents+` VALUES ('q-7')`)
		waitFor(t, 30*time.Second, "q-7 applied by its retry", func() bool { _, _, _, redriven := e.letterOf("q-7"); return redriven })
		r.stop()
		e.requireExactlyOnce(ids)
		require.EqualValues(t, 30, e.db.Int(t, `SELECT count(*) FROM `+children))
		require.EqualValues(t, 30, e.db.Int(t, `SELECT count(DISTINCT id) FROM `+children))
	})
}

// TestRetryLaterAskedForByARetryIsHonoured: consumer.RetryLater "marks
// err as a failure to retry after d". A retry of a message set aside for
// later whose handler again returns RetryLater(err, d) (the partner now
// says: come back in half an hour) must not be retried before d, within
// RetryLater.MaxDelay (here an hour).
func TestRetryLaterAskedForByARetryIsHonoured(t *testing.T) {
	t.Parallel()
	e := setup(t, 1)
	ids := e.produceIDs("d", 4)
	calls := &callCounts{}
	const asked = 30 * time.Minute
	var askedNanos atomic.Int64
	cfg := e.config(consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		n := calls.add(m.ID)
		if m.ID == "d-1" {
			if n == 1 {
				return consumer.RetryLater(errors.New("partner down"), 0)
			}
			if n == 2 {
				askedNanos.Store(time.Now().UnixNano())
			}
			return consumer.RetryLater(errors.New("partner down: retry after 30 minutes"), asked)
		}
		return e.applyHandler().Handle(ctx, tx, m)
	}))
	cfg.RetryLater.MaxDelay = time.Hour
	e.start(cfg)
	e.waitCommitted(map[int]int64{0: 4}, 30*time.Second)
	waitFor(t, 30*time.Second, "the first retry of d-1 failed", func() bool { _, _, retries, _ := e.letterOf("d-1"); return retries >= 1 })
	askedAt := time.Unix(0, askedNanos.Load())
	class, retryAt, retries, _ := e.letterOf("d-1")
	require.Equal(t, "retry_later", class)
	require.NotNil(t, retryAt)
	require.Falsef(t, retryAt.Before(askedAt.Add(asked-time.Minute)),
		"the retry asked to be retried after %v, and is due at %v, %v after it asked (retries %d, %d handler calls)",
		asked, retryAt.Format(time.RFC3339Nano), retryAt.Sub(askedAt).Round(time.Millisecond), retries, calls.of("d-1"))
	e.requireExactlyOnce(without(ids, "d-1"))
}

// Retries bounded by time (RetryLater.MaxElapsed, no MaxRetries): a
// message whose partner stays down is retried, however many times, until
// the budget from its first failure is spent, and is then an ordinary
// dead letter.
func TestRetryLaterBoundedByTime(t *testing.T) {
	t.Parallel()
	e := setup(t, 1)
	ids := e.produceIDs("m", 3)
	calls := &callCounts{}
	cfg := e.config(consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		if calls.add(m.ID); m.ID == "m-1" {
			return consumer.RetryLater(errors.New("partner down"), 0)
		}
		return e.applyHandler().Handle(ctx, tx, m)
	}))
	cfg.RetryLater.MaxElapsed = 1500 * time.Millisecond
	started := time.Now()
	e.start(cfg)
	waitFor(t, 30*time.Second, "m-1 out of its time budget", func() bool { class, _, _, _ := e.letterOf("m-1"); return class == "retries_exhausted" })
	require.GreaterOrEqual(t, time.Since(started), 1500*time.Millisecond, "retried until the budget was spent")
	require.GreaterOrEqual(t, calls.of("m-1"), 2, "retried at least once")
	e.requireExactlyOnce(without(ids, "m-1"))
}

// logLevels records the level of every log record that names a message
// id, by id.
type logLevels struct {
	mu     sync.Mutex
	levels map[string][]slog.Level
	msgs   map[string][]string
}

func (l *logLevels) Enabled(context.Context, slog.Level) bool { return true }
func (l *logLevels) WithAttrs([]slog.Attr) slog.Handler       { return l }
func (l *logLevels) WithGroup(string) slog.Handler            { return l }
func (l *logLevels) Handle(_ context.Context, r slog.Record) error {
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == "message_id" {
			l.mu.Lock()
			defer l.mu.Unlock()
			if l.levels == nil {
				l.levels, l.msgs = map[string][]slog.Level{}, map[string][]string{}
			}
			id := a.Value.String()
			l.levels[id] = append(l.levels[id], r.Level)
			l.msgs[id] = append(l.msgs[id], r.Level.String()+" "+r.Message)
			return false
		}
		return true
	})
	return nil
}

// failureWatch records the failures reported for each message.
type failureWatch struct {
	mu  sync.Mutex
	got map[string][]consumer.Failure
}

func (w *failureWatch) OnMessageFailed(_ context.Context, m *consumer.Message, f consumer.Failure) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.got == nil {
		w.got = map[string][]consumer.Failure{}
	}
	w.got[m.ID] = append(w.got[m.ID], f)
}

// A retry later is expected: the message's failures are logged at INFO
// (its first, its setting aside, the failed retries), reported to hooks
// as class retry_later and not permanent (it will be retried), and only
// the end of its retries, when it is an ordinary dead letter for an
// operator, is a warning.
func TestRetryLaterIsLoggedAsExpected(t *testing.T) {
	t.Parallel()
	e := setup(t, 1)
	ids := e.produceIDs("n", 3)
	logs, failures := &logLevels{}, &failureWatch{}
	cfg := e.config(consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		if m.ID == "n-1" {
			return consumer.RetryLater(errors.New("mail partner unavailable"), 0)
		}
		return e.applyHandler().Handle(ctx, tx, m)
	}))
	cfg.Logger = slog.New(logs)
	cfg.Hooks = append(cfg.Hooks, failures)
	cfg.RetryLater.MaxRetries = 2
	e.start(cfg)
	waitFor(t, 30*time.Second, "n-1 out of retries", func() bool { class, _, _, _ := e.letterOf("n-1"); return class == "retries_exhausted" })
	e.requireExactlyOnce(without(ids, "n-1"))

	logs.mu.Lock()
	levels, msgs := logs.levels["n-1"], logs.msgs["n-1"]
	logs.mu.Unlock()
	warnings := 0
	for i, lv := range levels {
		if lv > slog.LevelInfo {
			require.Containsf(t, msgs[i], "ordinary dead letter now", "an expected retry later logged above INFO (all: %q)", msgs)
			warnings++
		}
	}
	require.Equal(t, 1, warnings, "the end of the retries is a warning: %q", msgs)
	failures.mu.Lock()
	defer failures.mu.Unlock()
	require.NotEmpty(t, failures.got["n-1"])
	first := failures.got["n-1"][0]
	require.Equal(t, deadletter.ClassRetryLater, first.Class)
	require.False(t, first.Permanent, "a message set aside to retry later will be retried")
}
