package kafkaclient

import (
	"context"
	"fmt"
)

// DeletedError says that records the fetcher expected were deleted from
// the log (retention, DeleteRecords) before it fetched them, and were not
// processed by anyone. The fetcher hands out nothing at or after them.
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
	return fmt.Sprintf("kafkaclient: %s/%d: offsets %d to %d were deleted from the log before they were processed (the log starts at %d)",
		e.Topic, e.Partition, e.From, e.LogStart-1, e.LogStart)
}

// AheadError says that the log no longer holds the offset the fetcher
// expected, nor anything before it that it did not hand out: it ends below
// that offset, was truncated under it, or belongs to a topic deleted and
// re-created under the same name. Records written to the new log at
// offsets below Expected would be passed over, so the fetcher hands out
// nothing more.
type AheadError struct {
	Topic     string
	Partition int
	Expected  int64
	// LogEnd is the log's end when it was found behind Expected, or -1.
	LogEnd int64
	// Why says how it was found, when not by the log's end.
	Why string
}

func (e *AheadError) Error() string {
	if e.Why != "" {
		return fmt.Sprintf("kafkaclient: %s/%d at offset %d: %s", e.Topic, e.Partition, e.Expected, e.Why)
	}
	return fmt.Sprintf("kafkaclient: %s/%d: the log ends at %d, before offset %d, which was expected next", e.Topic, e.Partition, e.LogEnd, e.Expected)
}

// Gap explains the offsets from expected on that a fetch went past: the
// next record fetched has a larger offset. processed is the offset below
// which the partition is known processed (-1: unknown), read before
// logStart, which is read after the fetch (or came with it).
//
// A log start at or below expected means the log still holds every offset
// from expected on, so the ones the fetch went past hold no record a reader
// is handed: transaction markers, records of aborted transactions,
// compaction. (The log start only moves forward, so it was at or below
// expected when the fetch was made too.) A log start past expected means the
// offsets from expected up to it are gone, and the client may have gone past
// them; the records there are lost unless processed covers them, which
// happens when this reader was paused or cut off while another one went on.
//
// One case is ambiguous: a gap that markers or compaction made and that
// retention then passed, before the bounds were read, looks like a
// deletion. Gap reports it as one: a false report stops a partition that an
// operator can restart, a false all-clear would skip records without a word.
//
// It returns whether records were lost, and the first offset lost.
func Gap(expected, processed, logStart int64) (lost bool, from int64) {
	if logStart <= expected || processed >= logStart {
		return false, 0
	}
	return true, max(expected, processed)
}

// check drops any record below the offset expected (repeats: no client
// should hand them out), takes out transaction markers, and explains every
// gap of the batch. A gap whose fetch reported a log start at or below the
// offset expected is explained by it; any other is looked into once per
// batch, after the whole batch was fetched: the stored position, then the
// log bounds. It cuts the batch before the first gap that is a loss and
// holds the verdict for the next call.
//
// Each record's Next is the offset after it, or after the markers right
// behind it in the batch: where the partition's position may move once the
// record is processed. Markers at the head of a batch move Position only.
func (f *Fetcher) check(ctx context.Context, buf []Record) ([]Record, error) {
	n, unexplained, expect := 0, false, f.next
	for i, r := range buf {
		if r.Offset < expect {
			continue
		}
		if r.Offset > expect && (f.logStarts[i] < 0 || f.logStarts[i] > expect) {
			unexplained = true
		}
		buf[n], f.logStarts[n] = r, f.logStarts[i]
		n++
		expect = r.Offset + 1
	}
	buf = buf[:n]
	var processed, logStart int64
	var err error
	if unexplained {
		processed, logStart, err = f.lookup(ctx)
	}
	out := 0
	expect = f.next
	for i, r := range buf {
		if r.Offset > expect && (f.logStarts[i] < 0 || f.logStarts[i] > expect) {
			if err != nil {
				f.held = fmt.Errorf("kafkaclient: %s/%d: the fetch went from offset %d to %d, and the gap could not be looked into: %w",
					f.cfg.Topic, f.cfg.Partition, expect, r.Offset, err)
				return f.cut(buf[:out], expect)
			}
			if lost, from := Gap(expect, processed, logStart); lost {
				f.held = &DeletedError{Topic: f.cfg.Topic, Partition: f.cfg.Partition, From: from, LogStart: logStart}
				return f.cut(buf[:out], expect)
			}
		}
		expect = r.Offset + 1
		if r.Marker {
			// Every offset since the record before it is accounted for.
			if out > 0 {
				buf[out-1].Next = expect
			}
			continue
		}
		r.Next = expect
		buf[out] = r
		out++
	}
	f.next = expect
	return buf[:out], nil
}

// Position is the offset after everything the fetcher has accounted for:
// the records handed out and the offsets without a record after them.
func (f *Fetcher) Position() int64 { return f.next }

// cut ends the batch with the records kept so far, where the fetcher
// stays: they go out now, and the held error with the next call (now if
// there are none).
func (f *Fetcher) cut(kept []Record, expect int64) ([]Record, error) {
	f.next = expect
	if len(kept) == 0 {
		return kept, f.held
	}
	return kept, nil
}

// lookup reads what explains a gap: the processed position first (-1
// without a Processed function), then the log start.
func (f *Fetcher) lookup(ctx context.Context) (processed, logStart int64, err error) {
	processed = -1
	if f.cfg.Processed != nil {
		if processed, err = f.cfg.Processed(ctx); err != nil {
			return 0, 0, fmt.Errorf("processed position: %w", err)
		}
	}
	b, err := f.bounds(ctx)
	if err != nil {
		return 0, 0, err
	}
	return processed, b.Start, nil
}

// TransactionalError says that a client that cannot read transactional
// topics correctly was handed a transaction marker: the topic is written by
// transactional producers. The fetcher hands out nothing more.
type TransactionalError struct {
	Topic     string
	Partition int
	Offset    int64
	// Client names the client library at fault.
	Client string
}

func (e *TransactionalError) Error() string {
	return fmt.Sprintf("kafkaclient: %s/%d: offset %d is a transaction marker: the topic is written by transactional producers, and %s cannot tell records of aborted transactions from others",
		e.Topic, e.Partition, e.Offset, e.Client)
}
