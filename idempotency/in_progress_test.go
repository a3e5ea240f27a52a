package idempotency_test

import (
	"context"
	"errors"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kafkaonce/kafkaonce/idempotency"
	"github.com/kafkaonce/kafkaonce/internal/testenv"
)

// With InProgressWait, a duplicate of a phased request whose run is live
// waits for the run to answer, and replays that answer, as a duplicate
// of a plain request does.
func TestADuplicateOfAPhasedRunWaitsForItsAnswer(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	inPhase := make(chan struct{})
	var calls atomic.Int64
	_, url := servePhased(t, db.Pool, db.Schema, idempotency.Config{InProgressWait: 5 * time.Second}, idempotency.Flow{
		Name: "slow",
		Start: func(*http.Request, pgx.Tx, *idempotency.Run) (idempotency.Step, error) {
			return idempotency.Continue("call", nil), nil
		},
		Phases: []idempotency.Phase{{From: "call", External: func(ctx context.Context, run *idempotency.Run) (idempotency.Step, error) {
			if calls.Add(1) == 1 {
				close(inPhase)
			}
			time.Sleep(500 * time.Millisecond)
			return idempotency.Respond(http.StatusCreated, nil, []byte(time.Now().Format(time.RFC3339Nano))), nil
		}}},
	})
	first := make(chan string, 1)
	go func() {
		resp, body, err := postTo(t, http.DefaultClient, url, "k", `{}`)
		if err != nil || resp.StatusCode != http.StatusCreated {
			first <- "failed"
			return
		}
		first <- body
	}()
	<-inPhase
	resp, body, err := postTo(t, http.DefaultClient, url, "k", `{}`)
	require.NoError(t, err)
	require.Equal(t, http.StatusCreated, resp.StatusCode, "the duplicate waited for the run: %s", body)
	require.Equal(t, "true", resp.Header.Get(idempotency.ReplayedHeader))
	require.Equal(t, <-first, body, "and replays its answer")
	require.EqualValues(t, 1, calls.Load())
}

// A statement_timeout shorter than InProgressWait ends the wait for a
// key's lock with SQLSTATE 57014: the key is still in progress (409), not
// a database failure (503).
func TestALockWaitEndedByStatementTimeoutIsInProgress(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t, func(c *pgxpool.Config) {
		c.ConnConfig.RuntimeParams["statement_timeout"] = "200"
	})
	p := newPaymentsOn(t, db, &idempotency.Config{InProgressWait: 3 * time.Second})
	started, release := p.holdCalls()
	first := p.postInBackground("k", "alice", `{"amount":1,"account":"a"}`)
	<-started
	resp, body := p.post("k", "alice", `{"amount":1,"account":"a"}`)
	close(release)
	require.Equal(t, http.StatusConflict, resp.StatusCode, body)
	require.NotEmpty(t, resp.Header.Get("Retry-After"))
	require.Equal(t, http.StatusCreated, (<-first).status)
}

// A phase error of any bytes (a provider's Latin-1 answer, a NUL) is
// stored as the run's last error, and its lease ends: the client's retry
// resumes the run at once.
func TestAPhaseErrorOfAnyBytesReleasesTheLease(t *testing.T) {
	t.Parallel()
	for name, why := range map[string]string{
		"not UTF-8": "provider said: caf\xe9 \xff\xfe",
		"a NUL":     "provider said: \x00 nothing",
		"very long": string(make([]byte, 1<<20)),
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			db := testenv.NewDB(t)
			var calls atomic.Int64
			_, url := servePhased(t, db.Pool, db.Schema, idempotency.Config{}, idempotency.Flow{
				Name:  "quoting",
				Lease: time.Minute,
				Start: func(*http.Request, pgx.Tx, *idempotency.Run) (idempotency.Step, error) {
					return idempotency.Continue("call", nil), nil
				},
				Phases: []idempotency.Phase{{From: "call", External: func(ctx context.Context, run *idempotency.Run) (idempotency.Step, error) {
					if calls.Add(1) == 1 {
						return idempotency.Step{}, errors.New(why)
					}
					return idempotency.Respond(http.StatusCreated, nil, []byte("done")), nil
				}}},
			})
			resp, body, err := postTo(t, http.DefaultClient, url, "k", `{}`)
			require.NoError(t, err)
			require.Equal(t, http.StatusInternalServerError, resp.StatusCode, body)
			store, err := idempotency.NewStore(db.Schema)
			require.NoError(t, err)
			k, err := store.Get(context.Background(), db.Pool, "alice", "k")
			require.NoError(t, err)
			require.NotNil(t, k.Run)
			require.NotEmpty(t, k.Phased.LastError, "the reason is stored")
			require.LessOrEqual(t, len(k.Phased.LastError), 4<<10, "in at most 4 KiB")
			require.False(t, k.Run.LeaseUntil.After(time.Now()), "the lease ended")

			resp, body, err = postTo(t, http.DefaultClient, url, "k", `{}`)
			require.NoError(t, err)
			require.Equal(t, http.StatusCreated, resp.StatusCode, "the retry resumed the run at once: %s", body)
		})
	}
}

// A retry that waits for the row's lock (its server is still in an
// Atomic phase past its lease) and then takes the run over counts its
// phase's deadline from when its lease started, after the wait: the
// resumed phase gets the whole lease.
func TestARunTakenOverAfterALockWaitGetsAWholeLease(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	const lease = 2 * time.Second
	resumedWith := make(chan time.Duration, 1)
	_, url := servePhased(t, db.Pool, db.Schema, idempotency.Config{}, heldPastItsLease(lease, 1200*time.Millisecond, func(ctx context.Context) {
		deadline, _ := ctx.Deadline()
		resumedWith <- time.Until(deadline)
	}))
	go func() { _, _, _ = postTo(t, http.DefaultClient, url, "k", `{}`) }()
	time.Sleep(lease + 200*time.Millisecond) // the lease ran out; the row stays locked for a second more
	resp, body, err := postTo(t, http.DefaultClient, url, "k", `{}`)
	require.NoError(t, err)
	require.Equal(t, http.StatusCreated, resp.StatusCode, body)
	left := <-resumedWith
	require.Greater(t, left, lease*3/4, "the resumed phase had %v of a %v lease", left.Round(10*time.Millisecond), lease)
}

// A duplicate with InProgressWait looks at the run again and again, and
// its wait is InProgressWait in all: when the lease runs out while its
// server is still in an Atomic phase, and another retry (X) takes the
// key's claim to take the run over (X then waits for the row's lock,
// holding the key's advisory lock), the duplicate's next look waits for
// that lock only for what is left of its wait.
func TestAPhasedDuplicateWaitsAtMostInProgressWaitInAll(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	const lease = 3 * time.Second
	const wait = time.Second
	f := heldPastItsLease(lease, 2500*time.Millisecond, func(context.Context) {})
	_, waiting := servePhased(t, db.Pool, db.Schema, idempotency.Config{InProgressWait: wait}, f)
	_, plain := servePhased(t, db.Pool, db.Schema, idempotency.Config{}, f)
	go func() { _, _, _ = postTo(t, http.DefaultClient, plain, "k", `{}`) }()

	// The run's lease ends at lease_until.
	var until time.Time
	require.Eventually(t, func() bool {
		err := db.Pool.QueryRow(context.Background(), `SELECT lease_until FROM `+db.Table("idempotency_keys")+` WHERE lease_until IS NOT NULL`).Scan(&until)
		return err == nil
	}, 5*time.Second, 10*time.Millisecond)

	// The duplicate arrives 600 ms before the lease ends, and waits.
	time.Sleep(time.Until(until.Add(-600 * time.Millisecond)))
	type answer struct {
		status  int
		elapsed time.Duration
	}
	dup := make(chan answer, 1)
	go func() {
		start := time.Now()
		resp, _, err := postTo(t, http.DefaultClient, waiting, "k", `{}`)
		if err != nil {
			dup <- answer{-1, time.Since(start)}
			return
		}
		dup <- answer{resp.StatusCode, time.Since(start)}
	}()
	// X arrives just after the lease ended, and takes the claim.
	time.Sleep(time.Until(until.Add(5 * time.Millisecond)))
	go func() { _, _, _ = postTo(t, http.DefaultClient, plain, "k", `{}`) }()

	a := <-dup
	t.Logf("the duplicate was answered %d after %v", a.status, a.elapsed.Round(10*time.Millisecond))
	if a.status == http.StatusCreated {
		// On a loaded machine the duplicate's look after the lease ran out
		// may come before X's claim: it is then the retry that takes the
		// run over, and waits for the row as a taker does, not for a run
		// in progress. Nothing here to measure.
		return
	}
	require.Equal(t, http.StatusConflict, a.status)
	require.LessOrEqual(t, a.elapsed, wait+400*time.Millisecond, "a phased duplicate waits up to InProgressWait in all")
}

// heldPastItsLease is a flow whose Atomic phase, the first time it runs,
// holds the run's row for the lease and over more, then fails; every later
// run calls resumed with its context and answers 201.
func heldPastItsLease(lease, over time.Duration, resumed func(ctx context.Context)) idempotency.Flow {
	var calls atomic.Int64
	return idempotency.Flow{
		Name:  "held",
		Lease: lease,
		Start: func(*http.Request, pgx.Tx, *idempotency.Run) (idempotency.Step, error) {
			return idempotency.Continue("a", nil), nil
		},
		Phases: []idempotency.Phase{{From: "a", Atomic: func(ctx context.Context, _ pgx.Tx, _ *idempotency.Run) (idempotency.Step, error) {
			if calls.Add(1) == 1 {
				time.Sleep(lease + over) // holding the row past the lease
				return idempotency.Step{}, errors.New("held past its lease")
			}
			resumed(ctx)
			return idempotency.Respond(http.StatusCreated, nil, []byte("done")), nil
		}}},
	}
}

// A failed statement aborts only the handler's part of the transaction:
// the key stays in progress until the handler returns, so a duplicate
// sent meanwhile is answered 409 (and, with InProgressWait, waits for the
// first to end, then runs afresh: never beside it).
func TestAKeyStaysInProgressAfterAFailedStatement(t *testing.T) {
	t.Parallel()
	t.Run("no wait", func(t *testing.T) {
		t.Parallel()
		p := newPayments(t, nil)
		var duplicate atomic.Int64
		var calls atomic.Int64
		p.handle = func(w http.ResponseWriter, r *http.Request, tx pgx.Tx) error {
			if calls.Add(1) > 1 {
				return p.create(w, r, tx)
			}
			_, err := tx.Exec(r.Context(), `SELECT 1/0`)
			assert.Error(t, err)
			resp, _ := p.post("k1", "alice", `{"amount":1}`)
			duplicate.Store(int64(resp.StatusCode))
			return err
		}
		resp, body := p.post("k1", "alice", `{"amount":1}`)
		require.Equal(t, http.StatusInternalServerError, resp.StatusCode, body)
		require.EqualValues(t, http.StatusConflict, duplicate.Load(), "the duplicate finds the key in progress")
		require.EqualValues(t, 1, calls.Load(), "the handler ran once")
	})
	t.Run("InProgressWait", func(t *testing.T) {
		t.Parallel()
		p := newPayments(t, &idempotency.Config{InProgressWait: 10 * time.Second})
		var running, most atomic.Int64
		failed := make(chan struct{})
		p.handle = func(w http.ResponseWriter, r *http.Request, tx pgx.Tx) error {
			now := running.Add(1)
			defer running.Add(-1)
			for m := most.Load(); now > m && !most.CompareAndSwap(m, now); m = most.Load() {
			}
			select {
			case <-failed:
				return p.create(w, r, tx)
			default:
			}
			_, err := tx.Exec(r.Context(), `SELECT 1/0`)
			close(failed)
			time.Sleep(300 * time.Millisecond) // still running, after the failure: a duplicate must not start
			return err
		}
		first := p.postInBackground("k1", "alice", `{"amount":1}`)
		<-failed
		second := p.postInBackground("k1", "alice", `{"amount":1}`)
		require.Equal(t, http.StatusInternalServerError, (<-first).status)
		require.Equal(t, http.StatusCreated, (<-second).status, "the duplicate ran afresh once the first ended")
		require.EqualValues(t, 1, most.Load(), "never two calls at once")
		require.EqualValues(t, 1, p.count())
	})
}
