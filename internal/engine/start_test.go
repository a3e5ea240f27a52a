package engine

import (
	"slices"
	"testing"

	"github.com/kafkaonce/kafkaonce/internal/commitmark"
	"github.com/kafkaonce/kafkaonce/internal/kafkaclient"
)

// The rows below are docs/guarantee.md's rules for where a partition
// starts, one decision each. Every log of the tests holds offsets 10 to
// 99 (start 10, end 100).

const (
	testStore    = "store-a"
	testConsumer = "ledger"
)

// ourMark is the metadata this consumer commits against this store, for
// a partition that first started at first.
func ourMark(first int64) string {
	return commitmark.Mark{Store: testStore, Consumer: testConsumer, First: first}.String()
}

// startLog is a log of offsets 10 to 99, with the stored position and the
// group's offset set by the options.
func startLog(opts ...func(*logView)) logView {
	v := logView{committed: -1, logStart: 10, logEnd: 100, stable: 100}
	for _, o := range opts {
		o(&v)
	}
	return v
}

func stored(pos int64) func(*logView) {
	return func(v *logView) { v.pos, v.hasPos = pos, true }
}

func group(offset int64, meta string) func(*logView) {
	return func(v *logView) { v.committed, v.committedMeta = offset, meta }
}

func TestDecideStart(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name      string
		log       logView
		justFirst bool
		// first is the first start found; 0 means none yet (no log of
		// these tests holds offset 0).
		first int64
		want  startPlan
	}{
		// A stored position decides.
		{name: "a stored position and no group offset: start there, and commit it",
			log:  startLog(stored(50)),
			want: startPlan{start: 50, origin: -1, commit: true}},
		{name: "a group rewound behind the stored position: the position, nothing applied again",
			log:  startLog(stored(50), group(10, ourMark(20))),
			want: startPlan{start: 50, origin: 20, commit: true, note: noteGroupBehind}},
		{name: "a group offset ahead of the stored position: processed again from the position, not skipped",
			log:  startLog(stored(50), group(70, ourMark(20))),
			want: startPlan{start: 50, origin: 20, commit: true, note: noteGroupAhead}},
		{name: "a group offset at the position with this consumer's mark: nothing to commit",
			log:  startLog(stored(50), group(50, ourMark(20))),
			want: startPlan{start: 50, origin: 20}},
		{name: "a group offset at the position without a mark: committed again with one",
			log:  startLog(stored(50), group(50, "")),
			want: startPlan{start: 50, origin: -1, commit: true}},
		{name: "a mark that does not know the first start is kept as it is",
			log:  startLog(stored(50), group(50, ourMark(-1))),
			want: startPlan{start: 50, origin: -1}},
		{name: "a position moved back below the first start moves the origin with it",
			log:  startLog(stored(15), group(50, ourMark(20))),
			want: startPlan{start: 15, origin: 15, commit: true, note: noteGroupAhead}},
		{name: "another store's mark says nothing of the origin here",
			log:  startLog(stored(50), group(50, commitmark.Mark{Store: "store-b", Consumer: testConsumer, First: 20}.String())),
			want: startPlan{start: 50, origin: -1, commit: true}},
		{name: "a first start stored just now is the origin",
			log: startLog(stored(100)), justFirst: true,
			want: startPlan{start: 100, origin: 100, commit: true}},
		{name: "a stored position at the log's end: nothing to read yet, and nothing wrong",
			log:  startLog(stored(100), group(100, ourMark(20))),
			want: startPlan{start: 100, origin: 20}},
		{name: "a stored position beyond the log's end: the topic was re-created or truncated",
			log:  startLog(stored(150), group(150, ourMark(20))),
			want: startPlan{start: 150, origin: 20, problem: startAheadOfLog}},
		{name: "a stored position below the log's start: messages deleted before they were processed",
			log:  startLog(stored(5), group(5, ourMark(0))),
			want: startPlan{start: 5, origin: 0, problem: startDeleted}},

		// Without a stored position, the group's offset, as its mark says.
		{name: "a group offset another client committed is adopted, and stored first",
			log:  startLog(group(40, "")),
			want: startPlan{start: 40, origin: 40, commit: true, store: true}},
		{name: "an adopted group offset below the log's start: messages deleted",
			log:  startLog(group(4, "")),
			want: startPlan{start: 4, origin: -1, problem: startDeleted}},
		{name: "this consumer's mark without a position: the row was lost; again from the first start",
			log:  startLog(group(70, ourMark(20))),
			want: startPlan{start: 20, origin: 20, commit: true, store: true, note: noteLostRow}},
		{name: "a lost row whose mark does not know the first start: again from the log's start",
			log:  startLog(group(70, ourMark(-1))),
			want: startPlan{start: 10, origin: 10, commit: true, store: true, note: noteLostRow}},
		{name: "a lost row whose first start retention deleted: messages deleted, nothing stored",
			log:  startLog(group(70, ourMark(3))),
			want: startPlan{start: 3, origin: -1, note: noteLostRow, problem: startDeleted}},
		{name: "another database's mark is adopted as any group offset",
			log:  startLog(group(70, commitmark.Mark{Store: "store-b", Consumer: testConsumer, First: 20}.String())),
			want: startPlan{start: 70, origin: 70, commit: true, store: true, note: noteForeignMark}},
		{name: "another consumer's mark in this database is adopted as any group offset",
			log:  startLog(group(70, commitmark.Mark{Store: testStore, Consumer: "renamed", First: 20}.String())),
			want: startPlan{start: 70, origin: 70, commit: true, store: true, note: noteForeignMark}},
		{name: "metadata that only looks like a mark is another client's",
			log:  startLog(group(70, "kafkaonce/1 store=store-a first=x consumer=ledger")),
			want: startPlan{start: 70, origin: 70, commit: true, store: true}},

		// With neither, the first start.
		{name: "no position and no group offset: the first start is to be found",
			log:  startLog(),
			want: startPlan{start: noStart, origin: -1}},
		{name: "the first start found is stored before anything is processed",
			log: startLog(), first: 10,
			want: startPlan{start: 10, origin: 10, commit: true, store: true}},
		{name: "a first start at the log's end is stored too: messages produced later are processed",
			log: startLog(), first: 100,
			want: startPlan{start: 100, origin: 100, commit: true, store: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			first := tc.first
			if first == 0 {
				first = noStart
			}
			got := decideStart(startFacts{log: tc.log, store: testStore, consumer: testConsumer, firstJustStored: tc.justFirst, first: first})
			if got != tc.want {
				t.Errorf("decideStart = %+v, want %+v", got, tc.want)
			}
		})
	}
}

func TestDecideFirstStart(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name                 string
		latest, topicStarted bool
		want                 firstStartRule
	}{
		{"earliest: the log's start", false, false, fromLogStartRule},
		{"earliest, the topic started: the log's start", false, true, fromLogStartRule},
		{"latest, the consumer's first start on the topic: every partition's start stored at once", true, false, storeTopicStarts},
		{"latest, a partition added after the first start: the log's start, every message came after it", true, true, fromLogStartRule},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if got := decideFirstStart(tc.latest, tc.topicStarted); got != tc.want {
				t.Errorf("decideFirstStart(%v, %v) = %v, want %v", tc.latest, tc.topicStarted, got, tc.want)
			}
		})
	}
}

func TestTopicFirstStarts(t *testing.T) {
	t.Parallel()
	bounds := []kafkaclient.Bounds{
		{Start: 0, End: 30, Stable: 30},
		{Start: 5, End: 40, Stable: 33}, // a transaction open since 33
		{Start: 0, End: 10, Stable: 10},
	}
	t.Run("each partition starts at its last stable offset, not its end", func(t *testing.T) {
		t.Parallel()
		got := topicFirstStarts(bounds, []int64{-1, -1, -1})
		if want := []int64{30, 33, 10}; !slices.Equal(got, want) {
			t.Errorf("topicFirstStarts = %v, want %v", got, want)
		}
	})
	t.Run("a partition with a group offset stores none: its own start takes the offset", func(t *testing.T) {
		t.Parallel()
		got := topicFirstStarts(bounds, []int64{-1, 7, -1})
		if want := []int64{30, -1, 10}; !slices.Equal(got, want) {
			t.Errorf("topicFirstStarts = %v, want %v", got, want)
		}
	})
}

func TestDecideTopic(t *testing.T) {
	t.Parallel()
	a, b := kafkaclient.TopicID{1}, kafkaclient.TopicID{2}
	var none kafkaclient.TopicID
	for _, tc := range []struct {
		name            string
		hasPos          bool
		stored, current kafkaclient.TopicID
		want            topicCheck
	}{
		{"no position: nothing to compare", false, none, a, topicAsStored},
		{"the same topic", true, a, a, topicAsStored},
		{"the broker gives no id", true, a, none, topicAsStored},
		{"a position without an id takes the topic's", true, none, a, topicAdopt},
		{"another id: the topic was re-created", true, a, b, topicRecreated},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if got := decideTopic(tc.hasPos, tc.stored, tc.current); got != tc.want {
				t.Errorf("decideTopic = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestStartsCarefully(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name       string
		starts     int
		inProgress bool
		want       bool
	}{
		{"the first run from this offset", 1, false, false},
		{"a second run from the same offset: the first died on it", 2, false, true},
		{"a batch was in progress when the last run ended", 1, true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if got := startsCarefully(tc.starts, tc.inProgress); got != tc.want {
				t.Errorf("startsCarefully(%d, %v) = %v, want %v", tc.starts, tc.inProgress, got, tc.want)
			}
		})
	}
}
