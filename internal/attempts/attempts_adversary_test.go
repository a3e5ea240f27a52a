package attempts_test

import (
	"context"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/require"
)

// A reason of invalid UTF-8, NUL bytes and 1 MiB is stored, cut
// to valid UTF-8, and does not fail the record (S7).
func TestAStopReasonOfInvalidBytesIsStored(t *testing.T) {
	t.Parallel()
	db, s := setup(t)
	ctx := context.Background()
	reason := "bad \xff\xfe\x00 " + strings.Repeat("\xc3", 1<<20) // 1 MiB of cut-off 2-byte sequences
	require.NoError(t, s.Stopped(ctx, db.Pool, "c", "t", 0, 0, reason))
	stops, err := s.Stops(ctx, db.Pool, "c")
	require.NoError(t, err)
	require.Len(t, stops, 1)
	require.True(t, utf8.ValidString(stops[0].Reason))
	require.Less(t, len(stops[0].Reason), 16<<10)
	require.True(t, strings.HasPrefix(stops[0].Reason, "bad \uFFFD"))
	// A cancelled context fails fast, and leaves nothing half-written.
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	require.Error(t, s.Stopped(cctx, db.Pool, "c", "t", 1, 0, "x"))
}
