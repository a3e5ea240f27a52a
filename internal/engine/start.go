package engine

import (
	"github.com/kafkaonce/kafkaonce/internal/commitmark"
	"github.com/kafkaonce/kafkaonce/internal/kafkaclient"
)

// Where a partition starts is the engine's riskiest decision: one offset
// too far passes a message over without a word, one too early applies
// messages that were never the consumer's. It is made here, on values
// alone (what the store, the group and the log say: startFacts), so that
// every rule docs/guarantee.md states is a row of start_test.go; assign
// (worker.go) only reads the facts, acts on the plan and logs it.

// startFacts is what a partition's start is decided from.
type startFacts struct {
	// log is the stored position, the group's committed offset with its
	// metadata, and the log's bounds (see readLog).
	log logView
	// store and consumer name this store (store_identity) and this
	// consumer: a group offset whose mark names both was committed
	// against a position this database stored.
	store, consumer string
	// firstJustStored means the facts were read again because a first
	// start was stored just now (by this worker for the whole topic, or
	// by another member), so the stored position is that first start.
	firstJustStored bool
	// first is the first start found for a partition with neither a
	// stored position nor a group offset (see firstStart), -1 until it
	// is.
	first int64
}

// startPlan is what assign does with a partition.
type startPlan struct {
	// start is where processing starts: -1 means the first start must be
	// found first (firstStart), and the plan made again with it.
	start int64
	// origin is where the partition's processing first started in this
	// store, -1 when not known: the mark of the offsets committed from
	// now on carries it.
	origin int64
	// commit means the group's offset is committed again, at start, with
	// the mark of origin: it is behind, ahead, or lacks the mark.
	commit bool
	// store means start is stored as the partition's position before
	// anything is processed, where there is none: every later start then
	// resumes there, rather than resolving the first start again.
	store bool
	// note is what the plan has to say to the operator.
	note startNote
	// problem is why the partition cannot start at start.
	problem startProblem
}

// startNote names what a plan logs.
type startNote int

const (
	noteNone startNote = iota
	// noteGroupBehind: the group's offset is behind the stored position
	// (rewound, or an offset commit was lost); the messages between were
	// processed, and are passed over.
	noteGroupBehind
	// noteGroupAhead: the group's offset is ahead of the stored position:
	// the database lost committed transactions, and the messages between
	// are processed again.
	noteGroupAhead
	// noteLostRow: no stored position, and the group's offset carries
	// this store's and this consumer's mark: the database lost the
	// partition's row, and processing starts again at its first start.
	noteLostRow
	// noteForeignMark: no stored position, and the group's offset was
	// committed by kafkaonce for another store or consumer: adopted as
	// any group offset is.
	noteForeignMark
)

// startProblem names why a partition cannot start where its plan says.
type startProblem int

const (
	startFine startProblem = iota
	// startAheadOfLog: the start is beyond the log's end (the topic was
	// re-created or truncated): processing would skip its new messages.
	startAheadOfLog
	// startDeleted: the start is below the log's start: retention deleted
	// messages the consumer had not processed.
	startDeleted
)

// noStart is startPlan.start while the first start is to be found.
const noStart = -1

// decideStart decides where a partition starts (see docs/guarantee.md,
// "Rewinds and replays" and "The database is the source of truth"):
//
//   - a stored position decides, whatever the group's offset says; the
//     group's offset is committed again at it when it differs, or lacks
//     the mark of this store;
//   - without one, a group offset that this consumer committed against
//     this store means the row was lost: processing starts again at the
//     first start its mark names, or at the log's start when the mark
//     does not know it;
//   - any other group offset is adopted;
//   - with neither, the first start (f.first) is found: the log's start
//     or its last stable offset, per StartOffset (firstStart);
//   - a start decided without a stored position is stored before
//     anything is processed, if the log holds it.
func decideStart(f startFacts) startPlan {
	v := f.log
	p := startPlan{start: v.committed, origin: -1}
	mark, marked := commitmark.Mark{}, false
	if v.committed >= 0 {
		mark, marked = commitmark.Parse(v.committedMeta)
	}
	ours := marked && mark.Store == f.store && mark.Consumer == f.consumer
	switch {
	case v.hasPos && f.firstJustStored:
		p.origin = v.pos
	case v.hasPos && ours && mark.First >= 0:
		// A position moved back below the first start (offsets.Store.Reset)
		// moves the origin with it.
		p.origin = min(mark.First, v.pos)
	}
	if v.hasPos {
		switch {
		case v.committed < 0:
			p.commit = true
		case v.committed < v.pos:
			p.commit, p.note = true, noteGroupBehind
		case v.committed > v.pos:
			p.commit, p.note = true, noteGroupAhead
		case v.committedMeta != (commitmark.Mark{Store: f.store, Consumer: f.consumer, First: p.origin}).String():
			// The group's offset is the position, without this
			// consumer's mark (committed by an older kafkaonce, or reset
			// by a tool): committed again with it, so that a loss of the
			// row is recognised even on a partition that gets no new
			// message.
			p.commit = true
		}
		p.start = v.pos
		p.problem = v.problemAt(p.start)
		return p
	}
	switch {
	case ours:
		p.note = noteLostRow
		p.start = mark.First
		if p.start < 0 {
			p.start = v.logStart
		}
	case marked:
		p.note = noteForeignMark
	}
	if p.start < 0 {
		p.start = f.first
	}
	if p.start == noStart {
		return p
	}
	if p.problem = v.problemAt(p.start); p.problem == startFine {
		p.store, p.commit, p.origin = true, true, p.start
	}
	return p
}

// problemAt says whether the log holds start.
func (v logView) problemAt(start int64) startProblem {
	switch {
	case start > v.logEnd:
		return startAheadOfLog
	case start < v.logStart:
		return startDeleted
	}
	return startFine
}

// firstStartRule is how firstStart finds the first start of a partition
// with neither a stored position nor a group offset.
type firstStartRule int

const (
	// fromLogStartRule: the log's start (StartEarliest; or a partition
	// added to the topic after the consumer first started on it, so every
	// message in it came after that start).
	fromLogStartRule firstStartRule = iota
	// storeTopicStarts: the consumer's first start on the topic under
	// StartLatest: the first starts of all the topic's partitions are
	// stored at once (topicFirstStarts), and the plan made again.
	storeTopicStarts
)

// decideFirstStart is the rule for a partition's first start: latest is
// StartOffset == StartLatest, topicStarted whether any of the topic's
// partitions has a stored position.
func decideFirstStart(latest, topicStarted bool) firstStartRule {
	if latest && !topicStarted {
		return storeTopicStarts
	}
	return fromLogStartRule
}

// topicFirstStarts are the first starts stored for every partition of a
// topic at the consumer's first start on it under StartLatest: each
// partition's last stable offset (its end, unless a transaction is open:
// that transaction's records come after the start, as Kafka's own readers
// of committed records count them), and -1 (none stored) for a partition
// with a group offset, which its own start takes: stored now, the group
// offset would be passed over as a rewind.
func topicFirstStarts(bounds []kafkaclient.Bounds, committed []int64) []int64 {
	starts := make([]int64, len(bounds))
	for i, b := range bounds {
		starts[i] = b.Stable
		if i < len(committed) && committed[i] >= 0 {
			starts[i] = -1
		}
	}
	return starts
}

// topicCheck is what assign does with the topic id stored with the
// partition's position (see checkTopic).
type topicCheck int

const (
	// topicAsStored: nothing to do (the ids agree, or there is no
	// position, or the broker gives no id).
	topicAsStored topicCheck = iota
	// topicRecreated: the ids differ: the topic was deleted and created
	// again since the position was stored, and the partition stops.
	topicRecreated
	// topicAdopt: the position has no id stored, and takes the topic's.
	topicAdopt
)

// decideTopic compares the topic id stored with the position (stored)
// with the topic's id now (current).
func decideTopic(hasPos bool, stored, current kafkaclient.TopicID) topicCheck {
	switch {
	case !hasPos || current.IsZero():
		return topicAsStored
	case stored.Differs(current):
		return topicRecreated
	case stored.IsZero():
		return topicAdopt
	}
	return topicAsStored
}

// startsCarefully says whether a run goes one message at a time from its
// start, counting attempts: when the previous runs did not get past this
// offset (starts is how many runs started there, inProgress whether a
// batch was in progress when the last one ended), a message of the first
// batch may be killing the process.
func startsCarefully(starts int, inProgress bool) bool {
	return starts >= 2 || inProgress
}
