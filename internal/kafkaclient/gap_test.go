package kafkaclient

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestGap(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name                          string
		expected, processed, logStart int64
		lost                          bool
		from                          int64
	}{
		{"markers or compaction: the log still starts before the gap", 20, 20, 0, false, 0},
		{"markers or compaction: the log starts at the gap", 20, 20, 20, false, 0},
		{"deleted before they were fetched", 20, 20, 50, true, 20},
		{"deleted, nothing stored", 20, -1, 50, true, 20},
		{"deleted, and the stored position lost transactions", 20, 10, 50, true, 20},
		{"deleted after another reader processed part of them", 20, 30, 50, true, 30},
		{"deleted after another reader processed them all", 20, 50, 50, false, 0},
		{"deleted after another reader went further", 20, 60, 50, false, 0},
		// The ambiguous case: a gap without records that retention passed
		// before the lookup is reported.
		{"compacted, then passed by retention", 20, 20, 21, true, 20},
	} {
		t.Run(c.name, func(t *testing.T) {
			lost, from := Gap(c.expected, c.processed, c.logStart)
			require.Equal(t, c.lost, lost)
			require.Equal(t, c.from, from)
		})
	}
}
