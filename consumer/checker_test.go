package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kafkaonce/kafkaonce/consumer"
	"github.com/kafkaonce/kafkaonce/internal/kafkaadmin"
	"github.com/kafkaonce/kafkaonce/internal/testenv"
)

// expectation is what a test produced and injected, for the checker.
type expectation struct {
	// ids are the message ids whose produce the broker acknowledged.
	ids []string
	// poison are the ids the test made unprocessable: they must be
	// dead-lettered and have no effect.
	poison []string
	// deleted are the records the test deleted from the log, as retention
	// would (nil: none). A message deleted before it was processed must be
	// inside a range the consumer reported as deleted (ErrMessagesDeleted,
	// through HookPartitionStopped), and every range reported must really
	// have been deleted.
	deleted *deletions
	// shareLimit is set when a share group consumed the records: it is
	// the group's delivery limit. There are no stored positions nor group
	// offsets to check; a partition is drained when every record of it is
	// settled (see requireShareDrained). And a record that is not poison may be set aside instead
	// of applied when its last delivery did not finish (a member stopped
	// on it, and the letter written before its handler ran stays) or
	// failed: its letter says "share group delivery N of N". A copy of
	// the same id elsewhere in the log (a producer's re-send) may still be
	// applied, once; the letter's own record never is.
	shareLimit int
}

// commitWatch sees every OffsetCommit the in-process broker receives for a
// test's groups and compares it, at that moment, with the stored position:
// a committed offset ahead of durable processing would lose messages on the
// next assignment.
type commitWatch struct {
	mu         sync.Mutex
	closed     bool
	seen       int
	unverified int // commits seen while the position could not be read
	violations []string
}

// watchCommits installs the watch (in-process broker only).
func (e *env) watchCommits() {
	if e.kafka.Fake == nil || e.commits != nil {
		return
	}
	// Commits of Kafka 4's protocol name topics by id: the watch looks an
	// id it does not know up (the test's topic may have been re-created).
	admin := kadm.NewClient(e.kafka.Client(e.t))
	// The topic's id is looked up while the broker sleeps the control
	// function (SleepControl), when another commit's control function may
	// run: it has a lock of its own.
	var idMu sync.Mutex
	var topicID [16]byte
	resolve := func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if td, err := admin.ListTopics(ctx, e.topic); err == nil {
			idMu.Lock()
			topicID = td[e.topic].ID
			idMu.Unlock()
		}
	}
	currentID := func() [16]byte { idMu.Lock(); defer idMu.Unlock(); return topicID }
	resolve()
	w := &commitWatch{}
	e.commits = w
	e.t.Cleanup(func() { w.mu.Lock(); w.closed = true; w.mu.Unlock() })
	e.kafka.Fake.ControlKey(kmsg.OffsetCommit.Int16(), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
		req := kreq.(*kmsg.OffsetCommitRequest)
		// Commits outside a generation are an operator's resets (the tests'
		// rewinds), not the consumer's.
		if req.Generation < 0 || len(req.Group) < len(e.group) || req.Group[:len(e.group)] != e.group {
			return nil, nil, false
		}
		// An id not known yet is looked up before w.mu is taken: the
		// broker runs other requests while a control function sleeps, and
		// their control functions, this one for another commit among them,
		// would wait on w.mu while the broker waits on them, and the
		// sleeper never wakes.
		for _, t := range req.Topics {
			if t.Topic == "" && t.TopicID != currentID() {
				e.kafka.Fake.SleepControl(resolve)
			}
		}
		id := currentID()
		w.mu.Lock()
		defer w.mu.Unlock()
		if w.closed {
			return nil, nil, false
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		for _, t := range req.Topics {
			topic := t.Topic
			if topic == "" && t.TopicID == id {
				topic = e.topic
			}
			for _, p := range t.Partitions {
				var stored int64 = -1
				err := e.db.Pool.QueryRow(ctx, `SELECT next_offset FROM `+e.db.Table("consumer_offsets")+` WHERE consumer = $1 AND topic = $2 AND partition = $3`,
					e.name, topic, p.Partition).Scan(&stored)
				if err != nil && !errors.Is(err, pgx.ErrNoRows) {
					// Postgres could not be asked (a test restarting it): this
					// commit cannot be judged either way. No row at all is
					// judged: nothing was processed durably.
					w.unverified++
					continue
				}
				w.seen++
				if p.Offset > stored {
					w.violations = append(w.violations, fmt.Sprintf("%s/%d: offset %d committed while the stored position was %d", topic, p.Partition, p.Offset, stored))
				}
			}
		}
		return nil, nil, false // observe only: the broker handles the request
	})
}

// check drains and verifies the end-to-end invariants: no double effect, no
// loss (a message the test deleted from the log may go unprocessed only
// inside a range the consumer reported deleted, and every range reported
// was deleted), no phantom, processed_messages one to one with the
// effects, offsets never committed ahead of durable processing, every
// partition drained, dead letters exactly the poison (less poison reported
// deleted), and no session left in a transaction or connection left
// checked out. Stop the consumers first.
func (e *env) check(exp expectation) {
	t := e.t
	t.Helper()
	ctx := context.Background()

	// Every partition drained: stored position and committed offset at the
	// log end.
	admin := testenv.Admin(e.t, e.kafka.Brokers)
	parts := make([]int, e.parts)
	for i := range parts {
		parts[i] = i
	}
	bounds, err := admin.LogBounds(ctx, e.topic, parts)
	require.NoError(t, err)
	ends := map[int]int64{}
	for p, b := range bounds {
		ends[p] = b.End
	}
	if exp.shareLimit > 0 {
		e.requireShareDrained(ends)
	} else {
		stored := e.storedPositions()
		for p, end := range ends {
			if end > 0 {
				require.Equalf(t, end, stored[p], "partition %d drained: stored position at the log end", p)
			}
		}
	}

	poison := map[string]bool{}
	for _, id := range exp.poison {
		poison[id] = true
	}
	produced := map[string]bool{}
	for _, id := range exp.ids {
		produced[id] = true
	}

	// Deletions: every range the consumer reported was deleted by the
	// test; a message it deleted may go unprocessed only inside them.
	reported := e.reportedDeletions()
	for p, ranges := range reported {
		below := int64(0)
		if exp.deleted != nil {
			below = exp.deleted.below[p]
		}
		for _, r := range ranges {
			require.Truef(t, r.From <= r.To && r.To < below,
				"partition %d: offsets %d to %d reported deleted, but the test deleted only below %d", p, r.From, r.To, below)
		}
	}
	reportedLost := func(id string) bool {
		if exp.deleted == nil || len(exp.deleted.at[id]) == 0 {
			return false
		}
		for _, at := range exp.deleted.at[id] {
			if !reported.cover(at) {
				return false
			}
		}
		return true
	}

	// A share group's records set aside on their last delivery, and not
	// applied (the effect of their id, if any, is another copy's).
	lastDelivery := map[string]int64{}
	if exp.shareLimit > 0 {
		lastDelivery = e.countsBy(`SELECT d.message_id, count(*) FROM `+e.db.Table("dead_letters")+` d WHERE d.consumer = $1 AND strpos(d.error, $2) > 0
			AND NOT EXISTS (SELECT FROM `+e.db.Table("effects")+` f WHERE f.partition = d.partition AND f.kafka_offset = d.kafka_offset) GROUP BY 1`,
			e.name, fmt.Sprintf("share group delivery %d of %d", exp.shareLimit, exp.shareLimit))
	}

	// Effects: once for every good id, never for poison, nothing else.
	effects := e.countsBy(`SELECT message_id, count(*) FROM ` + e.db.Table("effects") + ` GROUP BY 1`)
	var double, lost, phantom, poisoned []string
	for id := range produced {
		switch n := effects[id]; {
		case poison[id] && n > 0:
			poisoned = append(poisoned, id)
		case !poison[id] && n == 0 && !reportedLost(id) && lastDelivery[id] == 0:
			lost = append(lost, id)
		case n > 1:
			double = append(double, fmt.Sprintf("%s×%d", id, n))
		}
	}
	for id := range effects {
		if !produced[id] {
			phantom = append(phantom, id)
		}
	}
	require.Empty(t, sorted(double), "double effects")
	require.Empty(t, sorted(lost), "lost messages (acknowledged, never applied nor dead-lettered, nor reported deleted)")
	require.Empty(t, sorted(phantom), "phantom effects (never produced)")
	require.Empty(t, sorted(poisoned), "poison applied")

	// processed_messages matches the effects one to one, and the dead
	// letters account exactly for the poison.
	claims := e.countsBy(`SELECT message_id, count(*) FROM `+e.db.Table("processed_messages")+` WHERE `+e.db.ConsumerIs("$1")+` AND status = 'applied' GROUP BY 1`, e.name)
	require.Equal(t, len(effects), len(claims), "applied claims and effects")
	var unclaimed []string
	for id := range effects {
		if _, ok := claims[id]; !ok {
			unclaimed = append(unclaimed, id)
		}
	}
	require.Empty(t, sorted(unclaimed), "effects without their claims")
	letters := e.countsBy(`SELECT coalesce(message_id, '<no id>'), count(*) FROM `+e.db.Table("dead_letters")+` WHERE consumer = $1 GROUP BY 1`, e.name)
	var unlettered, stray []string
	for id := range poison {
		if letters[id] != 1 && !(letters[id] == 0 && reportedLost(id)) {
			unlettered = append(unlettered, fmt.Sprintf("%s×%d", id, letters[id]))
		}
	}
	for id, n := range letters {
		if !poison[id] && lastDelivery[id] != n {
			stray = append(stray, id)
		}
	}
	require.Empty(t, sorted(unlettered), "poison not dead-lettered exactly once (nor reported deleted)")
	if len(stray) > 0 && exp.shareLimit > 0 {
		// Which records the letters and the effects are of.
		for i, id := range stray {
			var where string
			require.NoError(t, e.db.Pool.QueryRow(ctx, `SELECT concat_ws(' ', (SELECT string_agg(format('letter %s/%s %s%s: %s', partition, kafka_offset, error_class,
				CASE WHEN provisional THEN ' (provisional)' END, error), '; ') FROM `+e.db.Table("dead_letters")+` WHERE consumer = $1 AND message_id = $2),
				(SELECT string_agg(format('effect %s/%s', partition, kafka_offset), '; ') FROM `+e.db.Table("effects")+` WHERE message_id = $2))`, e.name, id).Scan(&where))
			stray[i] = id + ": " + where
		}
	}
	require.Empty(t, sorted(stray), "dead letters for messages that are not poison")

	// Kafka offsets caught up, and never ran ahead.
	if exp.shareLimit == 0 {
		e.waitCommitted(ends, 30*time.Second)
	}
	if e.commits != nil && exp.shareLimit == 0 {
		e.commits.mu.Lock()
		violations, seen := append([]string(nil), e.commits.violations...), e.commits.seen
		e.commits.mu.Unlock()
		require.Empty(t, violations, "offsets committed ahead of durable processing")
		require.Positive(t, seen, "the watch saw the offset commits")
	}

	// Nothing left open.
	waitFor(t, 10*time.Second, "no session left in a transaction", func() bool { return e.db.Sessions(t, "idle in transaction%") == 0 })
	// A handler abandoned for good holds no connection either: its
	// attempt's was taken out of the pool when it was cut off. A consumer
	// still running borrows one now and then for a moment (its pauses
	// poll, maintenance): a leaked one stays.
	waitFor(t, 10*time.Second, "no connection checked out of the pool", func() bool { return e.db.Pool.Stat().AcquiredConns() == 0 })
}

// requireShareDrained waits until every partition of the share group is
// drained: its share-partition start at its log end in ends, or its share
// lag 0 (Kafka moves the start past the records it holds settled in its
// cache only later: it reports the last ones settled by the lag).
func (e *env) requireShareDrained(ends map[int]int64) {
	e.t.Helper()
	admin := testenv.Admin(e.t, e.kafka.Brokers)
	var starts map[int]kafkaadmin.SharePartition
	defer func() {
		if e.t.Failed() {
			e.t.Logf("share-partitions: %v, log ends %v", starts, ends)
		}
	}()
	waitFor(e.t, 30*time.Second, "every share-partition drained: its start at the log end", func() bool {
		var err error
		if starts, err = admin.ShareOffsets(context.Background(), e.group, e.topic); err != nil {
			return false
		}
		for p, end := range ends {
			if sp, ok := starts[p]; end > 0 && (!ok || sp.Start != end && sp.Lag != 0) {
				return false
			}
		}
		return true
	})
}

func (e *env) countsBy(sql string, args ...any) map[string]int64 {
	rows, err := e.db.Pool.Query(context.Background(), sql, args...)
	require.NoError(e.t, err)
	out := map[string]int64{}
	for rows.Next() {
		var k string
		var n int64
		require.NoError(e.t, rows.Scan(&k, &n))
		out[k] = n
	}
	require.NoError(e.t, rows.Err())
	return out
}

func sorted(s []string) []string {
	sort.Strings(s)
	if len(s) > 20 {
		return append(s[:20], fmt.Sprintf("... and %d more", len(s)-20))
	}
	return s
}

// deletions are the records a test deleted from the log, as retention
// would, and the ids that were in them.
type deletions struct {
	mu sync.Mutex
	// below is each partition's log start as the test set it.
	below map[int]int64
	// at says where each id's deleted copies were.
	at map[string][]logOffset
}

// count is how many deleted copies of messages the test noted.
func (d *deletions) count() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	n := 0
	for _, at := range d.at {
		n += len(at)
	}
	return n
}

type logOffset struct {
	partition int
	offset    int64
}

// deleteRecordsBefore deletes partition p's records below offset, as
// retention would, and notes in d the ids of those still in the log.
func (e *env) deleteRecordsBefore(d *deletions, p int, before int64) {
	e.t.Helper()
	admin := testenv.Admin(e.t, e.kafka.Brokers)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	bounds, err := admin.LogBounds(ctx, e.topic, []int{p})
	require.NoError(e.t, err)
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.below == nil {
		d.below, d.at = map[int]int64{}, map[string][]logOffset{}
	}
	if start := bounds[p].Start; start < before {
		r := kafka.NewReader(kafka.ReaderConfig{Brokers: e.kafka.Brokers, Topic: e.topic, Partition: p, MaxBytes: 1 << 20})
		defer r.Close()
		require.NoError(e.t, r.SetOffset(start))
		for next := start; next < before; {
			m, err := r.FetchMessage(ctx)
			require.NoError(e.t, err, "reading the records to delete")
			if m.Offset >= before {
				break
			}
			id := ""
			for _, h := range m.Headers {
				if h.Key == consumer.DefaultMessageIDHeader {
					id = string(h.Value)
				}
			}
			d.at[id] = append(d.at[id], logOffset{p, m.Offset})
			next = m.Offset + 1
		}
	}
	e.kafka.DeleteRecordsBefore(e.t, e.topic, p, before)
	d.below[p] = max(d.below[p], before)
}

// deletedRanges are the ranges a consumer reported deleted, by partition.
type deletedRanges map[int][]*consumer.MessagesDeletedError

func (r deletedRanges) cover(at logOffset) bool {
	for _, d := range r[at.partition] {
		if d.From <= at.offset && at.offset <= d.To {
			return true
		}
	}
	return false
}

// reportedDeletions collects the ErrMessagesDeleted the consumers reported
// through HookPartitionStopped.
func (e *env) reportedDeletions() deletedRanges {
	out := deletedRanges{}
	for _, s := range e.events.snapshot().stopped {
		var d *consumer.MessagesDeletedError
		if errors.As(s, &d) && d.Topic == e.topic {
			out[d.Partition] = append(out[d.Partition], d)
		}
	}
	return out
}
