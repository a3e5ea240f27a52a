package kafkaclient

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// FetchConfig configures a partition's Fetcher.
type FetchConfig struct {
	Topic     string
	Partition int
	// Start is the offset fetched first (an absolute offset).
	Start int64
	// TopicID is the id of the topic Start was decided for (zero: not
	// known). Records or bounds of a topic with another id end the
	// fetcher with a *RecreatedError: their offsets are not the ones Start
	// counts.
	TopicID TopicID
	// MaxBatch, Linger and Quiet bound a batch: up to MaxBatch records,
	// waiting at most Linger after the first for more to arrive, and no
	// longer than Quiet after the last one (0: Linger alone bounds it).
	MaxBatch int
	Linger   time.Duration
	Quiet    time.Duration
	// Processed, if set, returns the offset below which the partition is
	// known to be processed (the consumer's stored position), or -1. A gap
	// that records deleted from the log would explain is no loss when they
	// lie below it: another member processed them before they went (see
	// Gap). It is read before the log bounds.
	Processed func(ctx context.Context) (int64, error)
	// IdleCheck is how long the partition may go without a record before
	// its log bounds are read, and then again every IdleCheck while it
	// stays idle (0: never). What a client cannot see in a fetch shows in
	// the bounds: a log that now ends before the offset expected (the
	// topic was re-created or truncated), records deleted before they
	// were fetched, and a transaction left open that holds the partition
	// back.
	IdleCheck time.Duration
	// HeldAfter is how long an open transaction may hold the partition
	// back before OnHeld hears of it. OnHeld is called from Next.
	HeldAfter time.Duration
	OnHeld    func(Held)
	// OnIdleBounds, if set, hears the bounds each idle check read, with
	// the offset expected next: what a partition that fetches nothing
	// could fetch (the consumer's liveness check tells an idle partition
	// from one whose fetches hand out nothing while records wait). It is
	// called from Next.
	OnIdleBounds func(b Bounds, next int64)
}

// Held says that an open transaction holds a partition back: a reader of
// committed records gets nothing at or after its first record until the
// transaction commits or aborts.
type Held struct {
	Topic     string
	Partition int
	// At is the offset of the open transaction's first record, where the
	// partition waits; End is the log end, past the records held back.
	At, End int64
	// Since is when the partition was first seen waiting at At.
	Since time.Time
	// Released is set when the wait reported before is over.
	Released bool
}

// QuietFor is the quiet time that goes with a linger time: a fifth of it.
// Long enough to span the gap between two fetch responses when records are
// flowing (well under a millisecond on a local network), short enough to
// save most of the linger when they are not.
func QuietFor(linger time.Duration) time.Duration { return linger / 5 }

// IdleCheckFor is the idle check that goes with a HeldAfter: a quarter of
// it, within 100 ms and 10 s. Often enough to report an open transaction
// within a fraction of HeldAfter, and a log that a re-created topic cut
// short within seconds, at a few small requests per idle partition and
// check.
func IdleCheckFor(heldAfter time.Duration) time.Duration {
	return min(max(heldAfter/4, 100*time.Millisecond), 10*time.Second)
}

// Source is what a client library gives a Fetcher: one partition's
// records, each once, in offset order (with gaps where offsets hold no
// record a reader is handed).
type Source interface {
	// Next returns the next record, waiting until ctx is done. logStart
	// is the log start the broker reported with the fetch that brought the
	// record, or -1 when the client does not say. A record is never lost
	// by ctx ending: one that Next did not return is returned later.
	Next(ctx context.Context) (rec Record, logStart int64, err error)
	// MoveTo moves the source to offset: Next returns the record at or
	// after it next, and nothing fetched before the call.
	MoveTo(offset int64) error
	// Close stops fetching.
	Close()
}

// Fetcher hands out a partition's records in batches, in offset order,
// and accounts for every offset it does not hand out (see check).
type Fetcher struct {
	cfg    FetchConfig
	src    Source
	bounds func(ctx context.Context) (Bounds, error)

	// next is the offset expected next: the one after the last record
	// handed out, or the start.
	next int64
	// held is a verdict found with the records before it: those went out
	// first, the error goes out with the next call, and every call after.
	held error
	// logStarts[i] is the log start that came with the record at buf[i]
	// of the batch being checked.
	logStarts []int64
	// checkAt is when the log's bounds are read next if no record comes
	// (IdleCheck after the last record or the last check). waitingAt and
	// heldSince describe an open transaction the partition waits on, and
	// reported whether OnHeld heard of it.
	checkAt   time.Time
	waitingAt int64
	heldSince time.Time
	reported  bool
	// topicOf, when set, reads the topic's id: a client whose fetches do
	// not say which topic id they read sets it (see CheckTopicEachBatch).
	topicOf func(ctx context.Context) (TopicID, error)
}

// CheckTopicEachBatch makes f read the topic's id with topicOf after each
// batch is fetched and before it is handed out, for a client whose fetches
// do not say which topic they read (kafka-go's reader goes on at the same
// offset in a topic deleted and created again). Records fetched before an
// id read that is still FetchConfig.TopicID are of that topic; when it is
// another, nothing of the batch goes out and Next returns a
// *RecreatedError from then on.
func (f *Fetcher) CheckTopicEachBatch(topicOf func(ctx context.Context) (TopicID, error)) {
	f.topicOf = topicOf
}

// NewFetcher returns a Fetcher of src, which reads cfg's partition from
// cfg.Start; bounds reads the partition's log bounds.
func NewFetcher(cfg FetchConfig, src Source, bounds func(ctx context.Context) (Bounds, error)) *Fetcher {
	return &Fetcher{cfg: cfg, src: src, bounds: bounds, next: cfg.Start, checkAt: time.Now().Add(cfg.IdleCheck), waitingAt: -1}
}

// Next appends the next batch to buf[:0] and returns it: it waits for one
// record until ctx is done, then takes whatever else is ready or arrives
// within the linger time, up to MaxBatch, stopping early once nothing has
// arrived for the quiet time. A record is never lost by a context ending.
//
// The batch holds consecutive offsets from the one expected, except across
// gaps explained as offsets that hold no record (transaction markers,
// records of aborted transactions, compaction) or as records deleted after
// they were processed (see Gap). A batch ends before a gap of records
// deleted unprocessed: Next returns the records before it, and a
// *DeletedError from then on. If the gap cannot be looked into (a lookup
// fails), the records before it go out and the lookup's error comes next;
// open a new Fetcher at the offset expected to try again.
//
// Why the quiet time: a fetch response brings the records the broker had,
// all at once. Once they are taken and nothing follows, the partition is
// between bursts, and lingering on only delays the batch in hand (by the
// whole linger, at moderate load every batch). Under full load records
// never run out, so batches still fill up.
func (f *Fetcher) Next(ctx context.Context, buf []Record) ([]Record, error) {
	buf = buf[:0]
	if f.held != nil {
		return buf, f.held
	}
	buf, err := f.fetch(ctx, buf)
	if err != nil {
		return buf, err
	}
	if err := f.sameTopic(ctx); err != nil {
		return buf[:0], err
	}
	return f.check(ctx, buf)
}

// sameTopic checks, for a fetcher that checks each batch, that the topic
// is still the one the fetcher was opened for (see CheckTopicEachBatch).
// A failed read of the id hands out nothing: the caller opens a new
// Fetcher at the offset it expects, and the records are fetched again.
func (f *Fetcher) sameTopic(ctx context.Context) error {
	if f.topicOf == nil || f.cfg.TopicID.IsZero() {
		return nil
	}
	id, err := f.topicOf(ctx)
	if err != nil {
		return fmt.Errorf("kafkaclient: %s/%d: reading the topic's id before handing out a batch: %w", f.cfg.Topic, f.cfg.Partition, err)
	}
	if f.cfg.TopicID.Differs(id) {
		f.held = &RecreatedError{Topic: f.cfg.Topic, Partition: f.cfg.Partition, Expected: f.cfg.TopicID, Found: id}
		return f.held
	}
	return nil
}

// Close stops fetching. A wait on an open transaction that was reported
// is reported over: whoever fetches the partition next reports it again
// if it still holds.
func (f *Fetcher) Close() {
	f.release()
	f.src.Close()
}

// fetch is Next without the check of offsets.
func (f *Fetcher) fetch(ctx context.Context, buf []Record) ([]Record, error) {
	f.logStarts = f.logStarts[:0]
	rec, logStart, err := f.first(ctx)
	if err != nil {
		return buf, err
	}
	buf = append(buf, rec)
	f.logStarts = append(f.logStarts, logStart)
	if f.cfg.MaxBatch == 1 {
		return buf, nil
	}
	lctx, cancel := context.WithTimeout(ctx, f.cfg.Linger)
	defer cancel()
	var quiet *time.Timer
	if f.cfg.Quiet > 0 && f.cfg.Quiet < f.cfg.Linger {
		// One timer per batch, pushed back by every record: cancelling
		// lctx ends the wait as the linger's end would.
		quiet = time.AfterFunc(f.cfg.Quiet, cancel)
		defer quiet.Stop()
	}
	for len(buf) < f.cfg.MaxBatch {
		rec, logStart, err := f.src.Next(lctx)
		if err != nil {
			if lctx.Err() != nil {
				break // linger over, quiet, or ctx done: the batch so far stands
			}
			// The records before the failure go out first: the failure is
			// judged from the offset after them.
			if f.held = f.explain(ctx, err, buf[len(buf)-1].Offset+1); f.held != nil {
				break
			}
			continue
		}
		buf = append(buf, rec)
		f.logStarts = append(f.logStarts, logStart)
		if quiet != nil {
			quiet.Reset(f.cfg.Quiet)
		}
	}
	return buf, nil
}

// first waits for one record until ctx is done, reading the log's bounds
// every IdleCheck meanwhile (see idle).
func (f *Fetcher) first(ctx context.Context) (Record, int64, error) {
	for {
		wait, cancel := ctx, context.CancelFunc(func() {})
		if f.cfg.IdleCheck > 0 {
			wait, cancel = context.WithDeadline(ctx, f.checkAt)
		}
		rec, logStart, err := f.src.Next(wait)
		cancel()
		if err == nil {
			f.checkAt = time.Now().Add(f.cfg.IdleCheck)
			f.release()
			return rec, logStart, nil
		}
		if ctx.Err() != nil {
			return Record{}, 0, err
		}
		if wait.Err() == nil || !errors.Is(err, wait.Err()) {
			if err := f.explain(ctx, err, f.next); err != nil {
				return Record{}, 0, err
			}
			continue
		}
		f.checkAt = time.Now().Add(f.cfg.IdleCheck)
		if err := f.idle(ctx); err != nil {
			return Record{}, 0, err
		}
	}
}

// idle looks at the log's bounds of a partition that has had no record for
// IdleCheck (see verdict), and at whether an open transaction holds it
// back: the last stable offset is the offset expected, below the log's
// end. (Every offset before it is accounted for, markers included, so a
// reader that waits there waits for the transaction; one that waits below
// it waits for something else: a slow or failing fetch, not reported as a
// transaction.) A failed lookup is no verdict: the next check tries again.
func (f *Fetcher) idle(ctx context.Context) error {
	b, err := f.bounds(ctx)
	if err != nil {
		return nil
	}
	if f.cfg.OnIdleBounds != nil {
		f.cfg.OnIdleBounds(b, f.next)
	}
	if err := f.verdict(ctx, b, f.next); err != nil {
		return err
	}
	if b.Stable < b.End && b.Stable == f.next {
		f.wait(b)
		return nil
	}
	f.release()
	return nil
}

// explain returns what a source's error means, for a source that had
// handed out everything before next. One that says the offset asked for is
// outside the log is looked into with the log's bounds (see verdict): a
// verdict is returned; records deleted after they were processed (another
// member went on while this one was behind) are no loss, and the source
// moves to the log's start (nil is returned: read on). Any other error, or
// one the bounds do not explain, is returned as it is, for the caller to
// open a new Fetcher at the offset expected.
func (f *Fetcher) explain(ctx context.Context, err error, next int64) error {
	if !errors.Is(err, ErrOutOfRange) {
		return err
	}
	b, berr := f.bounds(ctx)
	if berr != nil {
		return fmt.Errorf("%w (and the log's bounds could not be read: %v)", err, berr)
	}
	if v := f.verdict(ctx, b, next); v != nil {
		return v
	}
	if b.Start > next {
		if serr := f.src.MoveTo(b.Start); serr != nil {
			return fmt.Errorf("%w (and moving to the log start failed: %v)", err, serr)
		}
		return nil
	}
	return err
}

// verdict says what the log's bounds mean for next, the offset expected
// next: a log of another topic id is a new topic (*RecreatedError); a log
// that ends before it was re-created or truncated
// (*AheadError); one that starts after it lost records nobody fetched,
// unless they were processed (*DeletedError; see Gap). nil: neither.
func (f *Fetcher) verdict(ctx context.Context, b Bounds, next int64) error {
	switch {
	case f.cfg.TopicID.Differs(b.TopicID):
		return &RecreatedError{Topic: f.cfg.Topic, Partition: f.cfg.Partition, Expected: f.cfg.TopicID, Found: b.TopicID}
	case b.End < next:
		return &AheadError{Topic: f.cfg.Topic, Partition: f.cfg.Partition, Expected: next, LogEnd: b.End}
	case b.Start > next:
		processed := int64(-1)
		if f.cfg.Processed != nil {
			var err error
			if processed, err = f.cfg.Processed(ctx); err != nil {
				return nil
			}
		}
		if lost, from := Gap(next, processed, b.Start); lost {
			return &DeletedError{Topic: f.cfg.Topic, Partition: f.cfg.Partition, From: from, LogStart: b.Start}
		}
	}
	return nil
}

// wait notes that the partition waits at b.Stable, behind an open
// transaction, and reports it once it has waited HeldAfter there.
func (f *Fetcher) wait(b Bounds) {
	now := time.Now()
	if f.waitingAt != b.Stable {
		f.release()
		f.waitingAt, f.heldSince = b.Stable, now
	}
	if !f.reported && now.Sub(f.heldSince) >= f.cfg.HeldAfter && f.cfg.OnHeld != nil {
		f.reported = true
		f.cfg.OnHeld(Held{Topic: f.cfg.Topic, Partition: f.cfg.Partition, At: b.Stable, End: b.End, Since: f.heldSince})
	}
}

// release ends a wait on an open transaction, reporting its end if its
// start was reported.
func (f *Fetcher) release() {
	if f.reported && f.cfg.OnHeld != nil {
		f.cfg.OnHeld(Held{Topic: f.cfg.Topic, Partition: f.cfg.Partition, At: f.waitingAt, Since: f.heldSince, Released: true})
	}
	f.waitingAt, f.reported = -1, false
}
