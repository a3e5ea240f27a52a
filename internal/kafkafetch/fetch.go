// Package kafkafetch reads one partition's messages in batches with
// kafka-go, and looks up a partition's log bounds.
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
	return &Fetcher{r: r, maxBatch: cfg.MaxBatch, linger: cfg.Linger, quiet: cfg.Quiet}, nil
}

// Next appends the next batch to buf[:0] and returns it: it waits for one
// message until ctx is done, then takes whatever else is ready or arrives
// within the linger time, up to MaxBatch, stopping early once nothing has
// arrived for the quiet time. A message is never lost by a context ending:
// kafka-go hands out only messages it returns.
//
// Why the quiet time: a fetch response brings the messages the broker had,
// and kafka-go queues them all at once. Once they are taken and nothing
// follows, the partition is between bursts, and lingering on only delays
// the batch in hand (by the whole linger, at moderate load every batch).
// Under full load the queue never runs dry, so batches still fill up.
func (f *Fetcher) Next(ctx context.Context, buf []kafka.Message) ([]kafka.Message, error) {
	buf = buf[:0]
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
