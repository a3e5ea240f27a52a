package engine

import (
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/kafkaonce/kafkaonce/internal/store/claims"
	"github.com/kafkaonce/kafkaonce/internal/store/positions"
)

func pgErr(code string) error { return &pgconn.PgError{Code: code, Message: "refused " + code} }

func TestOutcomeKinds(t *testing.T) {
	t.Parallel()

	t.Run("infrastructure", func(t *testing.T) {
		t.Parallel()
		require.Equal(t, txFailed, infra(errors.New("connection reset")).kind)
		require.Equal(t, lostRace, infra(pgErr("40P01")).kind, "a deadlock is a lost race")
		require.Equal(t, lostRace, infra(pgErr("55P03")).kind, "a lock timeout is a lost race")
		require.Equal(t, lostRace, infra(pgErr("40001")).kind, "a serialization failure is a lost race")
	})

	t.Run("only a success has no error", func(t *testing.T) {
		t.Parallel()
		s := newSetup(t, 3)
		for _, out := range []txOutcome{
			infra(errors.New("x")),
			failedMessage(1, errors.New("x"), newFailure(classTransient, "", errors.New("x"))),
			s.a.handlersFailed(handledOver(3, nil), errors.New("x")),
			s.a.batchFailed(s.batchOf(0, 1, 2), errors.New("x")),
			s.a.ownStatementFailed(pgErr("22003")),
		} {
			require.NotEqual(t, succeeded, out.kind)
			require.Error(t, out.err)
		}
	})
}

// TestCommitFailed covers what a batch whose closing round trip (the
// BatchHandler's queued statements, the consumer's, COMMIT) failed comes
// to, by the statement that failed and its error.
func TestCommitFailed(t *testing.T) {
	t.Parallel()
	const user, closing = 2, 6 // two queued statements, then ours, COMMIT at 6
	cases := []struct {
		name     string
		ce       *commitError
		messages int  // the transaction's messages
		batch    bool // a BatchHandler queued statements for all of them
		kind     outcomeKind
		failedAt int
	}{
		{"outcome unknown", &commitError{stmt: -1, err: errors.New("EOF")}, 3, true, txFailed, 0},
		{"nothing sent", &commitError{stmt: notSent, err: errors.New("conn busy")}, 3, true, txFailed, 0},
		{"queued statement failed, several messages", &commitError{stmt: 1, err: pgErr("23505")}, 3, true, isolate, 0},
		{"queued statement failed, one message", &commitError{stmt: 0, err: pgErr("22P02")}, 1, true, messageFailed, 0},
		{"queued statement deadlocked", &commitError{stmt: 0, err: pgErr("40P01")}, 3, true, lostRace, 0},
		{"queued statement ended the tx, several", &commitError{stmt: 3, err: pgErr(positions.TxEnded)}, 3, true, isolate, 0},
		{"handler's statement ended the tx, several, no batch", &commitError{stmt: 0, err: pgErr(positions.TxEnded)}, 3, false, oneByOne, 0},
		{"handler's statement ended the tx, one, no batch", &commitError{stmt: 0, err: pgErr(positions.TxEnded)}, 1, false, messageFailed, 0},
		{"handler made the tx read only, several", &commitError{stmt: 3, err: pgErr(readOnlyTransaction)}, 3, true, oneByOne, 0},
		{"handler made the tx read only, one", &commitError{stmt: 3, err: pgErr(readOnlyTransaction)}, 1, true, messageFailed, 0},
		{"read only inside the queued statements", &commitError{stmt: 1, err: pgErr(readOnlyTransaction)}, 3, true, isolate, 0},
		{"COMMIT refused a deferred constraint, several", &commitError{stmt: closing, err: pgErr("23503")}, 3, true, oneByOne, 0},
		{"COMMIT refused a deferred constraint, one", &commitError{stmt: closing, err: pgErr("23505")}, 1, true, messageFailed, 0},
		{"COMMIT lost a serialization race", &commitError{stmt: closing, err: pgErr("40001")}, 3, true, lostRace, 0},
		{"COMMIT rolled back an aborted block", &commitError{stmt: closing, err: pgx.ErrTxCommitRollback}, 3, true, oneByOne, 0},
		{"COMMIT refused a deferred constraint, two", &commitError{stmt: closing, err: pgErr("23503")}, 2, true, oneByOne, 0},
		{"own statement refused for good", &commitError{stmt: 4, err: pgErr("22003")}, 3, true, stopped, 0},
		{"first own statement refused for good", &commitError{stmt: user, err: pgErr("22003")}, 3, true, stopped, 0},
		{"own statement timed out", &commitError{stmt: 4, err: pgErr("57014")}, 3, true, txFailed, 0},
		{"own statement deadlocked", &commitError{stmt: 4, err: pgErr("40P01")}, 3, true, lostRace, 0},
		{"own statement, server shutting down", &commitError{stmt: 5, err: pgErr("57P01")}, 3, true, txFailed, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := newSetup(t, tc.messages)
			var b *Batch
			users := 0
			if tc.batch {
				index := make([]int, tc.messages)
				for i := range index {
					index[i] = i
				}
				b, users = s.batchOf(index...), user
			}
			out := s.a.commitFailed(tc.ce, handledOver(tc.messages, b), users, closing)
			require.Equal(t, tc.kind, out.kind, "outcome %v", out.err)
			require.Error(t, out.err)
			require.ErrorIs(t, out.err, tc.ce.err, "the outcome's error keeps what the server said")
			require.Zero(t, out.committed)
			if tc.kind == messageFailed {
				require.Equal(t, tc.failedAt, out.failedAt)
				require.NotNil(t, out.fail)
			}
		})
	}
}

// TestCommitFailedWithNoHandlerRun covers a transaction that applies no
// message (it sets its messages aside, or skips duplicates): a refusal of
// it is the consumer's own, never a message's, since setting the message
// aside would meet the same refusal.
func TestCommitFailedWithNoHandlerRun(t *testing.T) {
	t.Parallel()
	const closing = 4
	cases := []struct {
		name     string
		ce       *commitError
		messages int
		kind     outcomeKind
	}{
		{"COMMIT refused a letter for good", &commitError{stmt: closing, err: pgErr("22023")}, 1, stopped},
		{"COMMIT refused the position for good, several", &commitError{stmt: closing, err: pgErr("23514")}, 3, stopped},
		{"COMMIT timed out", &commitError{stmt: closing, err: pgErr("57014")}, 1, txFailed},
		{"COMMIT lost a serialization race", &commitError{stmt: closing, err: pgErr("40001")}, 1, lostRace},
		{"COMMIT rolled back an aborted block", &commitError{stmt: closing, err: pgx.ErrTxCommitRollback}, 2, txFailed},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := newSetup(t, tc.messages)
			for i := range s.a.st.fates {
				s.a.st.fates[i] = fateDeadLettered
			}
			out := s.a.commitFailed(tc.ce, handledOver(tc.messages, nil), 0, closing)
			require.Equal(t, tc.kind, out.kind, "outcome %v", out.err)
			require.ErrorIs(t, out.err, tc.ce.err)
		})
	}
}

// TestOneTripFailed covers what a one-round-trip batch that did not commit
// comes to: dropped (the batch then runs claim-first and sorts it out), or
// an outcome of its own.
func TestOneTripFailed(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name    string
		ce      *commitError
		claimed bool // the claims went through before the failure
		dropped bool
		kind    outcomeKind // when not dropped
	}{
		{"outcome unknown", &commitError{stmt: -1, err: errors.New("EOF")}, true, false, txFailed},
		{"nothing sent", &commitError{stmt: notSent, err: errors.New("conn closed")}, false, false, txFailed},
		{"COMMIT rolled back", &commitError{stmt: 9, err: pgx.ErrTxCommitRollback}, true, true, 0},
		{"position moved", &commitError{stmt: 1, err: pgErr(positions.CheckFailed)}, false, true, 0},
		{"re-send not claimed alike", &commitError{stmt: 3, err: pgErr(claims.ExpectFailed)}, true, true, 0},
		{"queued statement ended the tx", &commitError{stmt: 5, err: pgErr(positions.TxEnded)}, true, true, 0},
		{"an id already claimed", &commitError{stmt: 2, err: pgErr("23505")}, false, true, 0},
		{"statement timeout before the claims", &commitError{stmt: 1, err: pgErr("57014")}, false, false, txFailed},
		{"lock timeout before the claims", &commitError{stmt: 2, err: pgErr("55P03")}, false, false, lostRace},
		{"deadlock after the claims", &commitError{stmt: 4, err: pgErr("40P01")}, true, false, lostRace},
		{"queued statement's own violation", &commitError{stmt: 4, err: pgErr("23505")}, true, true, 0},
		{"queued statement's missing parent", &commitError{stmt: 4, err: pgErr("23503")}, true, true, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := newSetup(t, 3)
			out, ok := s.a.oneTripFailed(tc.ce, tc.claimed)
			require.Equal(t, tc.dropped, !ok)
			if ok {
				require.Equal(t, tc.kind, out.kind, "outcome %v", out.err)
				require.ErrorIs(t, out.err, tc.ce.err)
			}
		})
	}
}
