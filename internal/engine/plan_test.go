package engine

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kafkaonce/kafkaonce/deadletter"
)

// TestPlanAfterFailure covers how the next transaction over a batch is
// planned after the message at k failed in one that committed nothing.
func TestPlanAfterFailure(t *testing.T) {
	t.Parallel()
	permanentF := func() *failure { return newFailure(classPermanent, deadletter.ClassPermanent, errors.New("rejected")) }
	transientF := func() *failure {
		return newFailure(classTransient, deadletter.ClassRetriesExhausted, errors.New("partner down"))
	}
	const n = 5
	cases := []struct {
		name       string
		start      plan // savepointFrom n and no dead letters, unless set
		k          int
		fail       func() *failure
		deadLetter bool // Config.OnPermanentFailure is DeadLetter
		alone      bool
		// What the plan becomes.
		n, savepointFrom int
		setAside         []int
		after            bool
	}{
		{"permanent, set aside in the same transaction", plan{}, 2, permanentF, true, false, n, 3, []int{2}, false},
		{"permanent first, set aside in the same transaction", plan{}, 0, permanentF, true, false, n, 1, []int{0}, false},
		{"permanent after earlier savepoints", plan{savepointFrom: 1}, 3, permanentF, true, false, n, 1, []int{3}, false},
		{"permanent under StopPartition, first", plan{}, 0, permanentF, false, true, n, n, nil, false},
		{"permanent under StopPartition, later", plan{}, 3, permanentF, false, false, 3, n, nil, true},
		{"transient first: alone at once", plan{}, 0, transientF, true, true, n, n, nil, false},
		{"transient later: its predecessors first", plan{}, 4, transientF, true, false, 4, n, nil, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			p := tc.start
			p.n = n
			if p.savepointFrom == 0 {
				p.savepointFrom = n
			}
			f := tc.fail()
			require.Equal(t, tc.alone, p.afterFailure(tc.k, f, tc.deadLetter))
			require.Equal(t, tc.n, p.n, "n")
			require.Equal(t, tc.savepointFrom, p.savepointFrom, "savepointFrom")
			var aside []int
			for i := range n {
				if p.deadLetter[i] != nil {
					require.Same(t, f, p.deadLetter[i])
					aside = append(aside, i)
				}
			}
			require.Equal(t, tc.setAside, aside, "set aside")
			require.Equal(t, tc.after, p.after != nil, "after")
			if tc.after {
				require.Same(t, f, p.after)
			}
		})
	}
}

// TestNewPlan covers the plan a batch starts with.
func TestNewPlan(t *testing.T) {
	t.Parallel()
	t.Run("one plain transaction", func(t *testing.T) {
		t.Parallel()
		s := newSetup(t, 4)
		w := &worker{deps: s.d, attemptsUpTo: -1}
		p := w.newPlan(s.a.items)
		require.Equal(t, plan{n: 4, savepointFrom: 4}, p)
	})
	t.Run("messages without a valid id are set aside", func(t *testing.T) {
		t.Parallel()
		s := newSetup(t, 4)
		s.a.items[1].idErr = errors.New("no id header")
		s.a.items[3].idErr = errors.New("id too long")
		p := (&worker{deps: s.d, attemptsUpTo: -1}).newPlan(s.a.items)
		require.Len(t, p.deadLetter, 2)
		for _, i := range []int{1, 3} {
			require.Equal(t, classPermanent, p.deadLetter[i].class)
			require.Equal(t, deadletter.ClassInvalidID, p.deadLetter[i].kind)
			require.ErrorIs(t, p.deadLetter[i].err, s.a.items[i].idErr)
		}
		require.Equal(t, 4, p.savepointFrom, "setting aside needs no savepoint")
	})
	t.Run("attempt rows recorded at or after the batch's start are cleared", func(t *testing.T) {
		t.Parallel()
		s := newSetup(t, 4)
		for _, tc := range []struct {
			upTo  int64
			clear bool
		}{{-1, false}, {firstOffset - 1, false}, {firstOffset, true}, {firstOffset + 10, true}} {
			p := (&worker{deps: s.d, attemptsUpTo: tc.upTo}).newPlan(s.a.items)
			require.Equal(t, tc.clear, p.clearAttempts, "attempts recorded up to %d", tc.upTo)
		}
	})
}
