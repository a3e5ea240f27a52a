package kafkafetch

import (
	"context"
	"fmt"

	"github.com/segmentio/kafka-go"
)

// DeletedError: messages the fetcher expected were deleted from the log
// (retention, DeleteRecords) before it fetched them, and were not processed
// by anyone: kafka-go moved past them to the log start. The fetcher hands
// out nothing at or after them.
type DeletedError struct {
	Topic     string
	Partition int
	// From is the first offset deleted unprocessed: the one the fetcher
	// expected, or the processed position when that is further on.
	From int64
	// LogStart is the log start the gap was explained with: every offset
	// from From up to it is gone.
	LogStart int64
}

func (e *DeletedError) Error() string {
	return fmt.Sprintf("kafkafetch: %s/%d: offsets %d to %d were deleted from the log before they were processed (the log starts at %d)",
		e.Topic, e.Partition, e.From, e.LogStart-1, e.LogStart)
}

// Gap explains the offsets from expected on that a fetch went past: the
// next message fetched has a larger offset. processed is the offset below
// which the partition is known processed (-1: unknown), read before
// logStart, which is read after the fetch.
//
// A log start at or below expected means the log still holds every offset
// from expected on, so the ones the fetch went past hold no record a reader
// is handed: compaction removed them. (The log start only moves forward, so
// it was at or below expected when the fetch was made too, and kafka-go had
// no reason to move.) A log start past expected means the offsets from
// expected up to it are gone, and kafka-go may have jumped over them; the
// messages there are lost unless processed covers them, which happens when
// this reader was paused or cut off while another one went on.
//
// One case is ambiguous: on a topic that is both compacted and trimmed by
// retention, a gap that compaction made and that retention then passed,
// before the bounds were looked up, looks like a deletion. Gap reports it as
// one: a false report stops a partition that an operator can restart, a
// false all-clear would skip messages without a word.
//
// It returns whether messages were lost, and the first offset lost.
func Gap(expected, processed, logStart int64) (lost bool, from int64) {
	if logStart <= expected || processed >= logStart {
		return false, 0
	}
	return true, max(expected, processed)
}

// check drops any message below the offset expected (kafka-go hands out
// none; they would be repeats), and explains every gap of the batch with
// one lookup of the stored position and then the log bounds, made after the
// whole batch was fetched. It cuts the batch before the first gap that is a
// loss and holds the verdict for the next call.
func (f *Fetcher) check(ctx context.Context, buf []kafka.Message) ([]kafka.Message, error) {
	n, gaps, expect := 0, false, f.next
	for _, m := range buf {
		if expect >= 0 && m.Offset < expect {
			continue
		}
		gaps = gaps || expect >= 0 && m.Offset > expect
		buf[n] = m
		n++
		expect = m.Offset + 1
	}
	buf = buf[:n]
	if !gaps {
		if n > 0 {
			f.next = expect
		}
		return buf, nil
	}
	processed, logStart, err := f.lookup(ctx)
	expect = f.next
	for i, m := range buf {
		if m.Offset > expect {
			if err != nil {
				f.held = fmt.Errorf("kafkafetch: %s/%d: the fetch went from offset %d to %d, and the gap could not be looked into: %w",
					f.topic, f.partition, expect, m.Offset, err)
				return f.cut(buf, i, expect)
			}
			if lost, from := Gap(expect, processed, logStart); lost {
				f.held = &DeletedError{Topic: f.topic, Partition: f.partition, From: from, LogStart: logStart}
				return f.cut(buf, i, expect)
			}
		}
		expect = m.Offset + 1
	}
	f.next = expect
	return buf, nil
}

// cut ends the batch before buf[i], where the fetcher stays: the messages
// before it go out now, and the held error with the next call (now if there
// are none).
func (f *Fetcher) cut(buf []kafka.Message, i int, expect int64) ([]kafka.Message, error) {
	f.next = expect
	if i == 0 {
		return buf[:0], f.held
	}
	return buf[:i], nil
}

// lookup reads what explains a gap: the processed position first (-1
// without a Processed function), then the log start.
func (f *Fetcher) lookup(ctx context.Context) (processed, logStart int64, err error) {
	processed = -1
	if f.processed != nil {
		if processed, err = f.processed(ctx); err != nil {
			return 0, 0, fmt.Errorf("processed position: %w", err)
		}
	}
	logStart, _, err = f.bounds(ctx)
	if err != nil {
		return 0, 0, err
	}
	return processed, logStart, nil
}
