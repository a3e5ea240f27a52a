package engine

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestDuplicateForesight covers the duplicates a worker predicts from
// memory, which a one-trip batch leaves out of its handler call and claims
// (and the database then checks).
func TestDuplicateForesight(t *testing.T) {
	t.Parallel()
	const next = firstOffset // the worker's position
	cases := []struct {
		name string
		// change makes items[3] (offset firstOffset+3) what the case says.
		change      func(items []item)
		resent      bool
		copyOf      int // firstCopyInBatch, -1 for none
		wasForeseen bool
	}{
		{"new", func([]item) {}, false, -1, false},
		{"re-send of a committed message", func(items []item) { items[3].repeatOf = next - 10 }, true, -1, true},
		{"first copy at the position is in the batch, not committed", func(items []item) {
			items[3].msg.ID, items[3].fp, items[3].repeatOf = items[0].msg.ID, items[0].fp, next
		}, false, 0, true},
		{"repeat of an earlier message of the batch", func(items []item) {
			items[3].msg.ID, items[3].fp, items[3].repeatOf = items[1].msg.ID, items[1].fp, firstOffset+1
		}, false, 1, true},
		{"same offset remembered, another id", func(items []item) {
			items[3].fp, items[3].repeatOf = items[1].fp, firstOffset+1
		}, false, -1, false},
		{"same offset remembered, other content", func(items []item) {
			items[3].msg.ID, items[3].repeatOf = items[1].msg.ID, firstOffset+1
		}, false, -1, false},
		{"first copy later in the batch", func(items []item) { items[3].repeatOf = firstOffset + 4 }, false, -1, false},
		{"first copy at its own offset", func(items []item) { items[3].repeatOf = firstOffset + 3 }, false, -1, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			items := newSetup(t, 5).a.items
			tc.change(items)
			require.Equal(t, tc.resent, items[3].resent(next), "resent")
			require.Equal(t, tc.copyOf, firstCopyInBatch(items, 3), "firstCopyInBatch")
			require.Equal(t, tc.wasForeseen, foreseen(items, 3, next), "foreseen")
		})
	}
}
