// Package kafkafetch reads one partition's messages in batches with
// kafka-go, and looks up a partition's log bounds.
//
// A Fetcher hands out the partition's offsets in order and accounts for
// every offset it does not hand out: kafka-go moves a reader that is below
// the log start up to it without a word (when it opens, and in its read
// loop), so every offset fetched is compared with the one expected, and a
// gap between them is explained before anything after it is handed out
// (see gap.go).
package kafkafetch

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/segmentio/kafka-go"
)

// Config configures a partition fetcher.
type Config struct {
	Brokers   []string
	Dialer    *kafka.Dialer
	Topic     string
	Partition int
	// Start is an absolute offset, or kafka.FirstOffset / kafka.LastOffset.
	Start int64
	// MaxBatch, Linger and Quiet bound a batch: up to MaxBatch messages,
	// waiting at most Linger after the first for more to arrive, and no
	// longer than Quiet after the last one (0: Linger alone bounds it).
	MaxBatch int
	Linger   time.Duration
	Quiet    time.Duration
	MaxBytes int
	Logger   kafka.Logger
	ErrLog   kafka.Logger
	// Processed, if set, returns the offset below which the partition is
	// known to be processed (the consumer's stored position), or -1. A gap
	// that messages deleted from the log would explain is no loss when
	// they lie below it: another reader processed them before they went
	// (see Gap). It is read before the log bounds.
	Processed func(ctx context.Context) (int64, error)
}

// QuietFor is the quiet time that goes with a linger time: a fifth of it.
// Long enough to span the gap between two fetch responses when messages are
// flowing (well under a millisecond on a local network), short enough to
// save most of the linger when they are not.
func QuietFor(linger time.Duration) time.Duration { return linger / 5 }

// Fetcher reads one partition.
type Fetcher struct {
	r        *kafka.Reader
	maxBatch int
	linger   time.Duration
	quiet    time.Duration

	topic     string
	partition int
	// next is the offset expected next: the one after the last message
	// handed out, or the start (-1 while a FirstOffset or LastOffset start
	// is not resolved by the first message).
	next int64
	// held is a gap's verdict found with the messages before it: those
	// went out first, the error goes out with the next call, and every
	// call after it.
	held error
	// processed and bounds are looked up to explain a gap.
	processed func(ctx context.Context) (int64, error)
	bounds    func(ctx context.Context) (first, end int64, err error)
}

// Open starts reading cfg.Topic/cfg.Partition at cfg.Start. kafka-go's
// reader prefetches in the background into a queue of MaxBatch messages, so
// memory stays bounded by MaxBatch messages plus one fetch of MaxBytes.
func Open(cfg Config) (*Fetcher, error) {
	r := kafka.NewReader(kafka.ReaderConfig{
		Brokers:       cfg.Brokers,
		Dialer:        cfg.Dialer,
		Topic:         cfg.Topic,
		Partition:     cfg.Partition,
		MinBytes:      1,
		MaxBytes:      cfg.MaxBytes,
		MaxWait:       500 * time.Millisecond,
		QueueCapacity: cfg.MaxBatch,
		// Report a position before the log start (retention deleted
		// messages we had not processed) instead of jumping silently.
		OffsetOutOfRangeError: true,
		Logger:                cfg.Logger,
		ErrorLogger:           cfg.ErrLog,
	})
	if err := r.SetOffset(cfg.Start); err != nil {
		r.Close()
		return nil, fmt.Errorf("kafkafetch: seek %s/%d to %d: %w", cfg.Topic, cfg.Partition, cfg.Start, err)
	}
	f := &Fetcher{r: r, maxBatch: cfg.MaxBatch, linger: cfg.Linger, quiet: cfg.Quiet,
		topic: cfg.Topic, partition: cfg.Partition, next: max(cfg.Start, -1), processed: cfg.Processed}
	f.bounds = func(ctx context.Context) (int64, int64, error) {
		return Bounds(ctx, cfg.Dialer, cfg.Brokers, cfg.Topic, cfg.Partition)
	}
	return f, nil
}

// Next appends the next batch to buf[:0] and returns it: it waits for one
// message until ctx is done, then takes whatever else is ready or arrives
// within the linger time, up to MaxBatch, stopping early once nothing has
// arrived for the quiet time. A message is never lost by a context ending:
// kafka-go hands out only messages it returns.
//
// The batch holds consecutive offsets from the one expected, except across
// gaps explained as offsets that hold no record, or as messages deleted
// after they were processed (see Gap). A batch ends before a gap of
// messages deleted unprocessed: Next returns the messages before it, and a
// *DeletedError from then on. If the gap cannot be looked into (a lookup
// fails), the messages before it go out and the lookup's error comes next;
// open a new Fetcher at the offset expected to try again.
//
// Why the quiet time: a fetch response brings the messages the broker had,
// and kafka-go queues them all at once. Once they are taken and nothing
// follows, the partition is between bursts, and lingering on only delays
// the batch in hand (by the whole linger, at moderate load every batch).
// Under full load the queue never runs dry, so batches still fill up.
func (f *Fetcher) Next(ctx context.Context, buf []kafka.Message) ([]kafka.Message, error) {
	buf = buf[:0]
	if f.held != nil {
		return buf, f.held
	}
	buf, err := f.fetch(ctx, buf)
	if err != nil {
		return buf, err
	}
	return f.check(ctx, buf)
}

// fetch is Next without the check of offsets.
func (f *Fetcher) fetch(ctx context.Context, buf []kafka.Message) ([]kafka.Message, error) {
	m, err := f.r.FetchMessage(ctx)
	if err != nil {
		return buf, err
	}
	buf = append(buf, m)
	if f.maxBatch == 1 {
		return buf, nil
	}
	lctx, cancel := context.WithTimeout(ctx, f.linger)
	defer cancel()
	var quiet *time.Timer
	if f.quiet > 0 && f.quiet < f.linger {
		// One timer per batch, pushed back by every message: cancelling
		// lctx ends the wait as the linger's end would.
		quiet = time.AfterFunc(f.quiet, cancel)
		defer quiet.Stop()
	}
	for len(buf) < f.maxBatch {
		m, err := f.r.FetchMessage(lctx)
		if err != nil {
			if lctx.Err() != nil {
				break // linger over, quiet, or ctx done: the batch so far stands
			}
			return buf, err
		}
		buf = append(buf, m)
		if quiet != nil {
			quiet.Reset(f.quiet)
		}
	}
	return buf, nil
}

// Close stops the background fetching.
func (f *Fetcher) Close() error { return f.r.Close() }

// Bounds returns the first offset still in a partition's log and the offset
// the next produced message will get (the high watermark).
func Bounds(ctx context.Context, dialer *kafka.Dialer, brokers []string, topic string, partition int) (first, end int64, err error) {
	if dialer == nil {
		dialer = kafka.DefaultDialer
	}
	var errs []error
	for _, b := range brokers {
		conn, err := dialer.DialLeader(ctx, "tcp", b, topic, partition)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if dl, ok := ctx.Deadline(); ok {
			_ = conn.SetDeadline(dl)
		} else {
			_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
		}
		first, end, err = conn.ReadOffsets()
		conn.Close()
		if err == nil {
			return first, end, nil
		}
		errs = append(errs, err)
	}
	return 0, 0, fmt.Errorf("kafkafetch: log bounds of %s/%d: %w", topic, partition, errors.Join(errs...))
}
