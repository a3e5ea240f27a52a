package idempotency_test

import (
	"context"
	"errors"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/kafkaonce/kafkaonce/idempotency"
)

// sweepSetup is a payment flow whose provider is down, and a way to read
// its key's history.
type sweepSetup struct {
	pp    *phasedPayments
	ph    *idempotency.Phased
	url   string
	store *idempotency.Store
}

func newSweepSetup(t *testing.T, tune func(f *idempotency.Flow, pp *phasedPayments)) *sweepSetup {
	pp := newPhasedPayments(t)
	f := pp.flow(time.Minute)
	tune(&f, pp)
	ph, url := pp.serve(t, pp.db.Pool, f)
	store, err := idempotency.NewStore(pp.db.Schema)
	require.NoError(t, err)
	pp.provider.fail.Store(1 << 30)
	return &sweepSetup{pp: pp, ph: ph, url: url, store: store}
}

func (s *sweepSetup) key(t *testing.T) idempotency.Key {
	k, err := s.store.Get(context.Background(), s.pp.db.Pool, "alice", "k-1")
	require.NoError(t, err)
	require.NotNil(t, k.Phased, "a phased key has a history")
	return k
}

func (s *sweepSetup) post(t *testing.T) (*http.Response, string) {
	resp, body, err := postTo(t, http.DefaultClient, s.url, "k-1", `{"amount":5}`)
	require.NoError(t, err)
	return resp, body
}

// The recovery sweep leaves a run whose phase failed alone for
// SweepBackoff, doubled at each take; a client's retry resumes it at
// once all the same.
func TestTheSweepBacksOffARunWhosePhaseKeepsFailing(t *testing.T) {
	t.Parallel()
	const backoff = 400 * time.Millisecond
	s := newSweepSetup(t, func(f *idempotency.Flow, _ *phasedPayments) { f.SweepBackoff = backoff })
	resp, body := s.post(t)
	require.Equal(t, http.StatusInternalServerError, resp.StatusCode, body)
	failedAt := time.Now()
	k := s.key(t)
	require.Equal(t, 1, k.Phased.Taken)
	require.WithinDuration(t, failedAt.Add(backoff), k.Run.SweepAfter, 200*time.Millisecond, "the sweep waits for the backoff")
	require.Contains(t, k.Phased.LastError, "503")

	// Sweeps within the backoff take nothing; the first after it takes
	// the run once.
	eventually(t, 10*time.Second, func() bool {
		_, err := s.ph.Recover(context.Background(), 10)
		require.NoError(t, err)
		return s.key(t).Phased.Taken == 2
	}, "the sweep takes the run after its backoff")
	require.GreaterOrEqual(t, time.Since(failedAt), backoff, "the sweep took the run within its backoff")
	k = s.key(t)
	require.Equal(t, 2, k.Phased.Taken)
	require.WithinDuration(t, time.Now().Add(2*backoff), k.Run.SweepAfter, 300*time.Millisecond, "the second backoff is twice the first")
	for range 5 {
		_, err := s.ph.Recover(context.Background(), 10)
		require.NoError(t, err)
	}
	require.Equal(t, 2, s.key(t).Phased.Taken, "no take within the second backoff")

	resp, body = s.post(t)
	require.Equal(t, http.StatusInternalServerError, resp.StatusCode, "the retry resumed the run at once: %s", body)
	require.Equal(t, 3, s.key(t).Phased.Taken)
}

// A take beyond MaxTakes gives the run up: the key completes with the
// give-up response, which every retry gets, with when and why in its
// history; the provider is not called again.
func TestARunTakenMoreThanMaxTakesIsGivenUp(t *testing.T) {
	t.Parallel()
	t.Run("with the default response", func(t *testing.T) {
		t.Parallel()
		s := newSweepSetup(t, func(f *idempotency.Flow, _ *phasedPayments) { f.MaxTakes = 2 })
		for range 2 {
			resp, body := s.post(t)
			require.Equal(t, http.StatusInternalServerError, resp.StatusCode, body)
		}
		calls := s.pp.provider.calls.Load()
		resp, body := s.post(t)
		require.Equal(t, http.StatusFailedDependency, resp.StatusCode, body)
		require.Contains(t, body, "given up")
		require.NotContains(t, body, "503", "the provider's answer is for operators, not clients")
		again, replayed := s.post(t)
		require.Equal(t, http.StatusFailedDependency, again.StatusCode)
		require.Equal(t, "true", again.Header.Get(idempotency.ReplayedHeader))
		require.Equal(t, body, replayed)
		require.Equal(t, calls, s.pp.provider.calls.Load(), "a given-up run calls no one")

		k := s.key(t)
		require.Nil(t, k.Run, "the key is complete")
		require.Equal(t, 3, k.Phased.Taken)
		require.False(t, k.Phased.GivenUpAt.IsZero())
		require.Contains(t, k.Phased.GiveUpReason, "MaxTakes (2)")
		require.Contains(t, k.Phased.GiveUpReason, "503", "with the run's last error")
		require.Len(t, k.Phased.DerivedKey("charge"), 64)
		counts, err := s.store.Count(context.Background(), s.pp.db.Pool)
		require.NoError(t, err)
		require.EqualValues(t, 1, counts.GivenUp)
	})
	t.Run("by the sweep, with the flow's compensation", func(t *testing.T) {
		t.Parallel()
		var hookFails atomic.Bool
		hookFails.Store(true)
		s := newSweepSetup(t, func(f *idempotency.Flow, pp *phasedPayments) {
			f.MaxTakes = 1
			f.SweepBackoff = time.Millisecond
			f.GiveUp = func(ctx context.Context, tx pgx.Tx, run *idempotency.Run, reason string) (idempotency.Step, error) {
				if hookFails.CompareAndSwap(true, false) {
					return idempotency.Step{}, errors.New("compensation failed")
				}
				if _, err := tx.Exec(ctx, `UPDATE `+pp.table+` SET state = 'failed'`); err != nil {
					return idempotency.Step{}, err
				}
				return idempotency.Respond(http.StatusPaymentRequired, nil, []byte("declined: "+reason)), nil
			}
		})
		resp, body := s.post(t)
		require.Equal(t, http.StatusInternalServerError, resp.StatusCode, body)
		sweep := func() { // until the sweep took the run once more
			taken := s.key(t).Phased.Taken
			eventually(t, 10*time.Second, func() bool {
				_, err := s.ph.Recover(context.Background(), 10)
				require.NoError(t, err)
				return s.key(t).Phased.Taken > taken
			}, "the sweep takes the run after its backoff")
		}
		sweep()
		k := s.key(t)
		require.NotNil(t, k.Run, "a GiveUp that failed leaves the run to be given up again")
		require.Contains(t, k.Phased.LastError, "compensation failed")
		require.Equal(t, []string{"pending -"}, s.pp.payments(t))
		sweep()
		k = s.key(t)
		require.Nil(t, k.Run)
		require.Equal(t, http.StatusPaymentRequired, k.Status)
		require.Equal(t, []string{"failed -"}, s.pp.payments(t), "the compensation committed with the give-up")
		resp, body = s.post(t)
		require.Equal(t, http.StatusPaymentRequired, resp.StatusCode)
		require.Contains(t, body, "MaxTakes (1)")
	})
	t.Run("a GiveUp that does not respond with a stored status", func(t *testing.T) {
		t.Parallel()
		s := newSweepSetup(t, func(f *idempotency.Flow, _ *phasedPayments) {
			f.MaxTakes = 1
			f.GiveUp = func(context.Context, pgx.Tx, *idempotency.Run, string) (idempotency.Step, error) {
				return idempotency.Respond(http.StatusServiceUnavailable, nil, nil), nil
			}
		})
		s.post(t)
		resp, body := s.post(t)
		require.Equal(t, http.StatusInternalServerError, resp.StatusCode, body)
		k := s.key(t)
		require.NotNil(t, k.Run, "nothing is given up")
		require.Contains(t, k.Phased.LastError, "Flow.GiveUp must Respond with a status that is stored")
	})
}

// An operator gives a run up with Phased.GiveUp: only one whose lease ran
// out, with the reason they gave.
func TestAnOperatorGivesARunUp(t *testing.T) {
	t.Parallel()
	s := newSweepSetup(t, func(*idempotency.Flow, *phasedPayments) {})
	ctx := context.Background()
	_, err := s.ph.GiveUp(ctx, "alice", "k-1", "refunded by hand")
	require.ErrorIs(t, err, idempotency.ErrRunNotIdle, "no such run")
	_, err = s.ph.GiveUp(ctx, "alice", "k-1", "")
	require.ErrorContains(t, err, "reason")

	s.post(t)
	status, err := s.ph.GiveUp(ctx, "alice", "k-1", "refunded by hand")
	require.NoError(t, err)
	require.Equal(t, http.StatusFailedDependency, status)
	k := s.key(t)
	require.Equal(t, "refunded by hand", k.Phased.GiveUpReason)
	_, err = s.ph.GiveUp(ctx, "alice", "k-1", "again")
	require.ErrorIs(t, err, idempotency.ErrRunNotIdle, "a complete key")
}

// A completed run keeps its history: its flow, how often it was taken,
// and the derived keys its calls sent, to look them up at the provider.
func TestACompletedRunKeepsItsHistory(t *testing.T) {
	t.Parallel()
	s := newSweepSetup(t, func(*idempotency.Flow, *phasedPayments) {})
	s.pp.provider.fail.Store(1)
	resp, body := s.post(t)
	require.Equal(t, http.StatusInternalServerError, resp.StatusCode, body)
	resp, body = s.post(t)
	require.Equal(t, http.StatusCreated, resp.StatusCode, body)
	k := s.key(t)
	require.Nil(t, k.Run)
	require.Equal(t, "payments", k.Phased.Flow)
	require.Equal(t, 2, k.Phased.Taken)
	require.Contains(t, k.Phased.LastError, "503", "the failure it recovered from")
	require.False(t, k.Phased.LastErrorAt.IsZero())
	require.True(t, k.Phased.GivenUpAt.IsZero())
	s.pp.provider.mu.Lock()
	_, charged := s.pp.provider.charges[k.Phased.DerivedKey("charge")]
	s.pp.provider.mu.Unlock()
	require.True(t, charged, "the provider knows the charge by the derived key")
}
