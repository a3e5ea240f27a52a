package engine

import (
	"context"
	"errors"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kafkaonce/kafkaonce/internal/retry"
	"github.com/kafkaonce/kafkaonce/kafkaoncetype"
)

// TestLadder covers what the partition does after a transaction: which
// outcomes end its run, and how long the others wait before they run
// again.
func TestLadder(t *testing.T) {
	t.Parallel()
	lost := &positionLostError{stored: 10, believed: 20}
	stop := &kafkaoncetype.PartitionError{Topic: "t", Err: errors.New("refused for good")}
	live := context.Background()
	ended, cancel := context.WithCancel(context.Background())
	cancel()
	cases := []struct {
		name string
		out  txOutcome
		work context.Context
		ends error // the error that ends the run, nil when it goes on
	}{
		{"committed", txOutcome{committed: 3}, live, nil},
		{"committed as the grace ran out", txOutcome{committed: 3}, ended, nil},
		{"infrastructure", infra(errors.New("reset")), live, nil},
		{"infrastructure as the grace ran out", infra(errors.New("reset")), ended, context.Canceled},
		{"message failed", failedMessage(1, errors.New("x"), newFailure(classTransient, "", errors.New("x"))), live, nil},
		{"position lost", txOutcome{kind: positionLost, err: lost}, live, lost},
		{"partition stopped", txOutcome{kind: stopped, err: stop}, live, stop},
		{"isolate", txOutcome{kind: isolate, err: errors.New("batch failed")}, live, nil},
	}
	for _, tc := range cases {
		t.Run("run ends: "+tc.name, func(t *testing.T) {
			t.Parallel()
			require.Equal(t, tc.ends, endOfRun(tc.work, &tc.out))
		})
	}

	l := &ladder{backoff: retry.Policy{}.New(), short: contentionWaits.New()}
	waits := []struct {
		name string
		kind outcomeKind
		want *retry.Backoff
	}{
		{"infrastructure: the backoff", txFailed, l.backoff},
		{"lost race: briefly", lostRace, l.short},
		{"busy gate: at once", gateBusy, nil},
	}
	for _, tc := range waits {
		t.Run("wait before again, "+tc.name, func(t *testing.T) {
			t.Parallel()
			require.Same(t, tc.want, l.waitFor(tc.kind))
		})
	}
}
