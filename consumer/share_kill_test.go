package consumer_test

import (
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kafkaonce/kafkaonce/consumer"
)

// A share group member killed with SIGKILL (a child process, see
// TestChildConsumerProcess) loses no record and applies none twice: what
// its transactions committed stays applied, and is found claimed when it
// is delivered again; what it was still working on goes back to the group
// once its locks run out, and another member applies it once.
func TestShareGroupMemberKilledLosesNothingAndAppliesNothingTwice(t *testing.T) {
	// killed runs a child member of the group per spec until it is killed,
	// and returns the records its transactions committed.
	killed := func(e *shareEnv, spec childSpec) map[string]int64 {
		spec.DatabaseURL, spec.Schema, spec.Brokers, spec.Topic, spec.Group, spec.Name = e.db.URL, e.db.Schema, e.kafka.Brokers, e.topic, e.group, e.name
		spec.Share = true
		killed, out := e.runChild(spec, 30*time.Second)
		require.True(e.t, killed, "the child was not killed:\n%s", out)
		e.t.Cleanup(func() {
			if e.t.Failed() {
				e.t.Logf("the killed member's output:\n%s", out)
			}
		})
		dead := e.countsBy(`SELECT message_id, count(*) FROM ` + e.db.Table("effects") + ` GROUP BY 1`)
		e.t.Logf("the killed member had committed %v", slices.Sorted(maps.Keys(dead)))
		return dead
	}
	// takeOver starts a member in the killed one's place and requires every
	// record applied once, those the killed member committed without their
	// handlers, and claimed of them found claimed (those it did not accept).
	takeOver := func(e *shareEnv, ids []string, dead map[string]int64, claimed int) {
		e.start(e.shareConfig(false, nil))
		e.waitEffects(len(ids), 30*time.Second)
		waitFor(e.t, 30*time.Second, "every record settled by the member that took over", func() bool {
			r := e.events.snapshot()
			return r.applied+r.skipped[consumer.SkipAlreadyClaimed] >= len(ids)-len(dead)+claimed
		})
		stillFor(e.t, shareLock, "no effect applied twice", func() bool { return e.effects() == int64(len(ids)) })
		e.requireExactlyOnce(ids)
		for id := range dead {
			require.Zerof(e.t, e.callsOf(id), "handler calls of %s, which the killed member committed", id)
		}
		r := e.events.snapshot()
		require.Equal(e.t, len(ids)-len(dead), r.applied, "records the member that took over applied")
		require.Equal(e.t, claimed, r.skipped[consumer.SkipAlreadyClaimed], "records it found claimed")
		require.Empty(e.t, e.letters(), "nothing set aside")
	}

	// The killed member's handler dies in the middle of a batch: the
	// records of the poll before a transient failure committed (and were
	// accepted), those from it on were handled in a transaction still
	// open.
	// That transaction dies with the process; its records come back and
	// are applied once, the committed ones are not applied again.
	t.Run("mid-batch, after records before it committed", func(t *testing.T) {
		t.Parallel()
		e := setupShare(t, shareOptions{})
		ids := e.produceIDs("m", 10)
		// ids[3] fails twice: the first failure undoes the transaction,
		// the second, in a transaction with savepoints, commits what came
		// before it, and the next starts from it; ids[6]'s handler kills
		// the process with that next transaction open.
		dead := killed(e, childSpec{FailOn: ids[3], FailCalls: 2, KillOn: ids[6]})
		require.NotEmpty(t, dead, "the killed member committed records before it died")
		require.NotContains(t, dead, ids[6], "the record the member died on")
		require.NotContains(t, dead, ids[3], "the record after the commit, handled in the transaction that died")
		// They were accepted after their COMMIT: not delivered again.
		takeOver(e, ids, dead, 0)
	})

	// The killed member dies right after a transaction's COMMIT, before it
	// accepts the transaction's records (OnMessageApplied runs between the
	// two): they come back, each is found claimed and accepted without its
	// handler, and is not applied again.
	t.Run("after a COMMIT, before its records' accept", func(t *testing.T) {
		t.Parallel()
		e := setupShare(t, shareOptions{})
		ids := e.produceIDs("m", 10)
		dead := killed(e, childSpec{KillAfterApplied: true})
		require.NotEmpty(t, dead, "the killed member committed records before it died")
		// Never accepted, every one is delivered again and found claimed.
		takeOver(e, ids, dead, len(dead))
	})
}
