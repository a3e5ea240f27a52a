package consumer_test

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Migration 015 promises "a record is the last start's: workers of one name
// started with different settings (a rolling change) leave the last one's".
// The background retry added for a failed record breaks it: a worker whose
// record failed at start writes its settings whenever the retry succeeds,
// over the record of a worker that started after it.
//
// Interleaving: worker A starts in group gA while an operator's
// transaction holds the consumers row; its record fails after the 1s lock
// wait; its first retry, 2s later, waits and fails too; the next is due 4s
// after that. The operator's transaction ends. Worker B (the rolling
// change's new version, group gB) starts and records gB. A's next retry
// then writes gA over it. Both keep running; the row names
// gA, the older start's group, with a settings_recorded_at later than B's
// start, so replay and status plan for gA (and replay, seeing gB's member
// as no member of "its" group, would not refuse to rewind while B runs).
func TestAdversary2ALateRetryOverwritesTheRecordOfALaterStart(t *testing.T) {
	t.Parallel()
	e := setup(t, 1)
	ctx := context.Background()
	hold := e.holdConsumerRow(t)

	gA, gB := e.group+"_a", e.group+"_b"
	var logsA syncBuffer
	a := e.config(e.applyHandler())
	a.GroupID = gA
	a.Logger = slog.New(slog.NewTextHandler(&logsA, &slog.HandlerOptions{Level: slog.LevelWarn}))
	e.start(a)
	waitFor(t, 15*time.Second, "worker A's record failing", func() bool {
		return strings.Contains(logsA.String(), "could not record the consumer's settings")
	})
	// Its first retry (2s later) waits on the row too, and fails; the next
	// comes 4s after that. The operator's transaction ends in between.
	waiting := func() bool {
		return e.db.Int(t, `SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE '%`+e.db.Schema+`%consumers%'`) > 0
	}
	waitFor(t, 15*time.Second, "worker A's retry waiting on the row", waiting)
	waitFor(t, 15*time.Second, "worker A's retry giving up", func() bool { return !waiting() })
	require.NoError(t, hold.Rollback(ctx)) // the operator's transaction ends

	b := e.config(e.applyHandler())
	b.GroupID = gB
	e.start(b)
	waitFor(t, 15*time.Second, "worker B's record", func() bool { return e.recordedRow().group == gB })
	bRecordedAt := time.Now()

	// A's next retry comes 4s after the last; give it 8s.
	deadline := time.Now().Add(8 * time.Second)
	for time.Now().Before(deadline) {
		if g := e.recordedRow().group; g != gB {
			t.Fatalf("the record names group %q %v after worker B (group %q) started and recorded: "+
				"worker A, started earlier, overwrote the later start's record with its own settings; the tools now plan for the wrong group",
				g, time.Since(bRecordedAt).Round(100*time.Millisecond), gB)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
