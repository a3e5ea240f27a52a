package main

import (
	"context"
	"encoding/json"
	"strconv"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kadm"
)

// positionsPlanOf runs a positions command with --json and reads its plan.
func (w *world) positionsPlanOf(args ...string) positionsPlan {
	w.t.Helper()
	out, errOut, code := w.cli(append(args, "--json")...)
	require.Equal(w.t, 0, code, out+errOut)
	var p positionsPlan
	require.NoError(w.t, json.Unmarshal([]byte(out), &p))
	return p
}

// A reset back reads messages again, and the claims skip those applied; a
// reset forward skips messages, so it is refused without --allow-skip and
// passes them over with it.
func TestPositionsReset(t *testing.T) {
	t.Parallel()
	w := newWorld(t, 2)
	w.produce(20, "a") // a0, a2, ... on partition 0; a1, a3, ... on 1
	w.consume(nil, 10)

	t.Run("back: the plan says what is read again, and nothing is applied twice", func(t *testing.T) {
		out, errOut, code := w.cli("positions", "reset", "--consumer", w.name, "--topic", w.topic, "--partition", "0", "--to", "4", "--dry-run")
		require.Equal(t, 0, code, out+errOut)
		require.Contains(t, out, "NEW POSITION")
		require.Contains(t, out, "6 offsets below the stored positions will be read again: the consumer skips the messages whose claims it still has")
		require.Contains(t, out, "the group's offsets in Kafka are left as they are")
		require.EqualValues(t, 10, w.position(0), "a dry run changes nothing")

		p := w.positionsPlanOf("positions", "reset", "--consumer", w.name, "--partition", "0", "--to", "4", "--yes")
		require.True(t, p.Executed)
		require.Equal(t, []positionChange{{Partition: 0, LogStart: 0, LogEnd: 10, Committed: 10, Stored: 10, Target: 4, Start: -1, ReadAgain: 6}}, p.Partitions)
		require.EqualValues(t, 4, w.position(0))
		require.EqualValues(t, 10, w.position(1), "only --partition moves")
		w.consume(nil, 10)
		w.requireEffectsOnce(20)
	})

	t.Run("a reset to where the positions are changes nothing", func(t *testing.T) {
		out, errOut, code := w.cli("positions", "reset", "--consumer", w.name, "--to", "latest")
		require.Equal(t, 0, code, out+errOut)
		require.Contains(t, out, "every position is at its target already; nothing changed")
	})

	w.produce(10, "b") // offsets 10..14 of each partition; b1, b3, b5 first on partition 1

	t.Run("forward is refused without --allow-skip", func(t *testing.T) {
		out, errOut, code := w.cli("positions", "reset", "--consumer", w.name, "--partition", "1", "--to", "13", "--yes")
		require.Equal(t, 2, code, out+errOut)
		require.Contains(t, out, "WARNING: 3 offsets between the stored positions and the new ones will never be processed")
		require.Contains(t, errOut, "passes over 3 offsets never processed")
		require.Contains(t, errOut, "pass --allow-skip")
		require.EqualValues(t, 10, w.position(1))
	})

	t.Run("forward with --allow-skip passes the messages over", func(t *testing.T) {
		p := w.positionsPlanOf("positions", "reset", "--consumer", w.name, "--partition", "1", "--to", "13", "--allow-skip", "--yes")
		require.True(t, p.Executed)
		require.EqualValues(t, 3, p.Partitions[0].SkippedForGood)
		require.EqualValues(t, 13, w.position(1))
		w.consume(nil, 15)
		w.requireEffectsOnce(27)
		require.Zero(t, w.db.Int(t, `SELECT count(*) FROM `+w.db.Table("effects")+` WHERE message_id IN ('b1','b3','b5')`))
	})
}

// Forgetting a position sends the next member where the group's offset
// says: the consumer's own offset is taken for a lost position (processed
// again from the first start, the claims deciding), another client's is
// adopted.
func TestPositionsForget(t *testing.T) {
	t.Parallel()
	w := newWorld(t, 1)
	w.produce(10, "f")
	w.consume(nil, 10)
	require.Eventually(t, func() bool { return w.kafka.CommittedOffsets(t, w.name, w.topic, 1)[0] == 10 },
		30*time.Second, 50*time.Millisecond, "the consumer commits its group offset")

	t.Run("the consumer's own group offset: again from the first start", func(t *testing.T) {
		out, errOut, code := w.cli("positions", "forget", "--consumer", w.name, "--topic", w.topic, "--dry-run")
		require.Equal(t, 0, code, out+errOut)
		require.Contains(t, out, "NEXT START")
		require.Contains(t, out, "processes again from the partition's first start")
		require.Contains(t, out, "10 offsets below the stored positions will be read again")
		require.EqualValues(t, 10, w.position(0), "a dry run changes nothing")

		p := w.positionsPlanOf("positions", "forget", "--consumer", w.name, "--yes")
		require.True(t, p.Executed)
		require.Equal(t, []positionChange{{Partition: 0, LogStart: 0, LogEnd: 10, Committed: 10, Stored: 10, Target: 0, From: fromFirstStart, Start: -1, ReadAgain: 10}}, p.Partitions)
		require.EqualValues(t, -1, w.position(0))
		w.consume(nil, 10)
		w.requireEffectsOnce(10)
	})

	t.Run("another client's group offset is where the next member starts", func(t *testing.T) {
		w.kafka.CommitGroupOffsets(t, w.name, w.topic, map[int]int64{0: 6})
		p := w.positionsPlanOf("positions", "forget", "--consumer", w.name, "--dry-run")
		require.Equal(t, fromGroupOffset, p.Partitions[0].From)
		require.EqualValues(t, 6, p.Partitions[0].Target)
		require.EqualValues(t, 4, p.Partitions[0].ReadAgain)
		require.False(t, p.Executed)
	})

	t.Run("a group offset ahead of the position needs --allow-skip", func(t *testing.T) {
		w.produce(5, "g") // offsets 10..14
		w.kafka.CommitGroupOffsets(t, w.name, w.topic, map[int]int64{0: 12})
		_, errOut, code := w.cli("positions", "forget", "--consumer", w.name, "--yes")
		require.Equal(t, 2, code, errOut)
		require.Contains(t, errOut, "passes over 2 offsets never processed")
		require.EqualValues(t, 10, w.position(0))
	})

	t.Run("nothing to forget", func(t *testing.T) {
		out, errOut, code := w.cli("positions", "forget", "--consumer", w.name, "--allow-skip", "--yes")
		require.Equal(t, 0, code, out+errOut)
		_, errOut, code = w.cli("positions", "forget", "--consumer", w.name, "--yes")
		require.Equal(t, 2, code)
		require.Contains(t, errOut, "no stored positions on topic "+w.topic+": nothing to forget; check --topic")
	})
}

// Like replay, reset and forget refuse while the group has active members:
// a member goes on from the position it holds.
func TestPositionsRefusedWithAnActiveMember(t *testing.T) {
	t.Parallel()
	w := newWorld(t, 1)
	w.produce(3, "r")
	w.runConsumer()
	require.Eventually(t, func() bool { return w.minPosition() >= 3 }, 30*time.Second, 50*time.Millisecond)

	for _, args := range [][]string{
		{"positions", "reset", "--consumer", w.name, "--to", "0", "--yes"},
		{"positions", "forget", "--consumer", w.name, "--yes"},
	} {
		t.Run(args[1], func(t *testing.T) {
			out, errOut, code := w.cli(args...)
			require.Equal(t, 2, code, out+errOut)
			require.Contains(t, out, "1 active members", "the plan is shown first")
			require.Contains(t, errOut, "group "+w.name+" has 1 active member(s): stop the consumers first (or pass --force")
			require.EqualValues(t, 3, w.position(0))
		})
	}
}

// Bad input is refused before anything changes, naming the flag to fix.
func TestPositionsBadInput(t *testing.T) {
	t.Parallel()
	w := newWorld(t, 2)
	w.produce(4, "x")
	w.consume(nil, 2)

	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"no consumer", []string{"reset", "--to", "0"}, "--consumer is required"},
		{"unknown consumer", []string{"reset", "--consumer", "nobody", "--to", "0"}, `consumer "nobody" is not known in schema ` + w.db.Schema + `: it has recorded no settings and stored no positions there; check --consumer`},
		{"unknown consumer, forget", []string{"forget", "--consumer", "nobody"}, `consumer "nobody" is not known`},
		{"unknown topic", []string{"forget", "--consumer", w.name, "--topic", "nope"}, `has no stored positions on topic "nope" and does not record reading it: check --topic`},
		{"no --to", []string{"reset", "--consumer", w.name}, "--to is required: earliest, latest, or an offset"},
		{"partition out of range", []string{"reset", "--consumer", w.name, "--partition", "2", "--to", "0"}, "--partition 2 is not a partition of " + w.topic + ", which has partitions 0 to 1"},
		{"negative partition", []string{"reset", "--consumer", w.name, "--partition", "-1", "--to", "0"}, "--partition -1 is negative"},
		{"negative offset", []string{"reset", "--consumer", w.name, "--to=-3"}, "--to -3 is negative: offsets start at 0"},
		{"offset past the log end", []string{"reset", "--consumer", w.name, "--to", "3"}, "--to 3 is past the log end of " + w.topic + "/0 (2)"},
		{"bad --to", []string{"reset", "--consumer", w.name, "--to", "soon"}, `--to "soon" is not earliest, latest or an offset`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, errOut, code := w.cli(append([]string{"positions"}, tc.args...)...)
			require.Equal(t, 2, code, out+errOut)
			require.Contains(t, errOut, tc.want)
			require.EqualValues(t, 2, w.position(0), "nothing changed")
			require.EqualValues(t, 2, w.position(1), "nothing changed")
		})
	}
}

// A consumer that moves a position between the plan and the change keeps
// it: reset and forget change a position only from what the plan read.
// The test holds the position's row, as a batch transaction does, until
// the command waits for it, then moves it.
func TestPositionsChangeNothingMovedSinceThePlan(t *testing.T) {
	t.Parallel()
	w := newWorld(t, 1)
	w.produce(20, "m")
	w.consume(nil, 10)
	for _, args := range [][]string{
		{"positions", "reset", "--consumer", w.name, "--to", "5", "--yes", "--force"},
		{"positions", "forget", "--consumer", w.name, "--allow-skip", "--yes", "--force"},
	} {
		t.Run(args[1], func(t *testing.T) {
			before := w.position(0)
			r := w.cliWhileHoldingPositions(`SET next_offset = next_offset + 1`, args...)
			require.Equal(t, 2, r.code, r.out+r.errOut)
			require.Contains(t, r.errOut, "moved from "+strconv.FormatInt(before, 10)+" to "+strconv.FormatInt(before+1, 10))
			require.Contains(t, r.errOut, "nothing changed: stop the consumers and run positions "+args[1]+" again")
			require.EqualValues(t, before+1, w.position(0), "the position the consumer moved is kept")
		})
	}
}

// A partition added to the topic after the consumer ran has no stored
// position: the consumer would process it from its log start. A reset
// --to latest then passes over every message in it, never processed, so
// docs/operations.md says the plan counts them (SKIPPED) and the command
// refuses without --allow-skip. It must not skip them silently.
func TestPositionsResetOfAPartitionWithoutAPositionCountsWhatItSkips(t *testing.T) {
	t.Parallel()
	w := newWorld(t, 1)
	w.produce(6, "a")
	w.consume(nil, 6)

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	resp, err := kadm.NewClient(w.kafka.Client(t)).CreatePartitions(ctx, 1, w.topic)
	require.NoError(t, err)
	require.NoError(t, resp.Error())
	require.Eventually(t, func() bool { n, err := kafkaPartitions(w); return err == nil && n == 2 }, 30*time.Second, 50*time.Millisecond)
	var msgs []kafka.Message
	for i := range 4 {
		id := "n" + strconv.Itoa(i)
		msgs = append(msgs, kafka.Message{Partition: 1, Key: []byte(id), Value: []byte("v" + id), Headers: []kafka.Header{{Key: "message-id", Value: []byte(id)}}})
	}
	w.kafka.Produce(t, w.topic, msgs...)
	require.EqualValues(t, -1, w.position(1), "the new partition has no stored position yet")

	out, errOut, code := w.cli("positions", "reset", "--consumer", w.name, "--to", "latest", "--yes")
	require.Equal(t, 2, code, "the reset passes over n0..n3, never processed: it must be refused without --allow-skip: %s", errOut)
	require.Contains(t, out, "WARNING: 4 offsets between the stored positions and the new ones will never be processed", "the plan must count the skipped offsets")
	require.Contains(t, out, "partition 1 has no stored position: a member would start at 0 (")

	w.consume(nil, 4)
	var applied []string
	rows, err := w.db.Pool.Query(ctx, `SELECT message_id FROM `+w.db.Table("effects")+` WHERE message_id LIKE 'n%' ORDER BY 1`)
	require.NoError(t, err)
	for rows.Next() {
		var id string
		require.NoError(t, rows.Scan(&id))
		applied = append(applied, id)
	}
	require.NoError(t, rows.Err())
	require.Equal(t, []string{"n0", "n1", "n2", "n3"}, applied, "the new partition's messages were skipped without --allow-skip")
}
