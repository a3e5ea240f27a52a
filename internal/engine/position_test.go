package engine

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestPositionLost covers how a transaction tells, from the stored
// position it locked, that the database lost transactions this worker
// committed.
func TestPositionLost(t *testing.T) {
	t.Parallel()
	at := func(v int64) *int64 { return &v }
	cases := []struct {
		name   string
		known  bool   // the worker committed a position before
		stored *int64 // nil: no row
		want   *positionLostError
	}{
		{"first batch, no row", false, nil, nil},
		{"first batch, a row", false, at(5), nil},
		{"where the worker left it", true, at(firstOffset), nil},
		{"ahead of the worker", true, at(firstOffset + 10), nil},
		{"behind the worker", true, at(firstOffset - 30), &positionLostError{stored: firstOffset - 30, believed: firstOffset}},
		{"gone", true, nil, &positionLostError{stored: 42, believed: firstOffset, missing: true}},
	}
	t.Run("gone, first start not known", func(t *testing.T) {
		t.Parallel()
		a := newSetup(t, 1).a
		a.origin = -1
		require.Equal(t, &positionLostError{stored: fromLogStart, believed: firstOffset, missing: true}, a.positionLost(nil))
	})
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			a := newSetup(t, 1).a
			a.positionKnown, a.origin = tc.known, 42 // the partition's first start
			require.Equal(t, tc.want, a.positionLost(tc.stored))
		})
	}
	t.Run("what it says", func(t *testing.T) {
		t.Parallel()
		require.Contains(t, (&positionLostError{stored: 7, believed: 9}).Error(), "processing again from 7")
		require.Contains(t, (&positionLostError{stored: fromLogStart, believed: 9, missing: true}).Error(), "processing again from the log's start")
	})
}
