package kafkago

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/kafkaonce/kafkaonce/internal/kafkaclient"
)

// chunkRecords bounds the records of one WriteMessages call, and is the
// writers' BatchSize: kafka-go makes room for BatchSize messages in every
// batch it starts.
const chunkRecords = 500

// writers are the client's kafka-go writers, one per topic published to.
type writers struct {
	mu sync.Mutex
	w  map[string]*topicWriter
	// closed is set by Close: a Publish after it fails, and makes no
	// writer that nothing would close.
	closed bool
}

// topicWriter is a topic's writer, written through by one Publish at a
// time (mu): kafka-go adds the messages of concurrent calls to the same
// batches, and a call's messages could then straddle two batches of a
// partition, one failing and the next written.
type topicWriter struct {
	mu sync.Mutex
	w  *kafka.Writer
}

// Publish implements kafkaclient.Client. Each record has its own result,
// as with franz-go: one too large, refused here or by the broker, fails
// with the records behind it of its key (and, refused by the broker, with
// the others of its batch), and the others are written. (kafka-go itself
// would fail the whole call for one message over BatchBytes.)
//
// The records go in WriteMessages calls of at most MaxRecordBytes (as
// RecordBytes counts them, more than kafka-go does) and chunkRecords, one
// after the other: kafka-go splits a call's messages into one batch per
// partition, under BatchBytes and BatchSize, so each partition's messages
// in a call are one batch, which the broker appends or refuses whole. A
// key whose record failed sends nothing more (kafkaclient.FailedKeys):
// kafka-go writes a partition's batches one after the other, the next
// even when one failed.
func (c *Client) Publish(ctx context.Context, topic string, recs []kafkaclient.Record) error {
	tw := c.writer(topic)
	if tw == nil {
		return fmt.Errorf("kafkago: produce to %s: the client is closed", topic)
	}
	tw.mu.Lock()
	defer tw.mu.Unlock()
	errs := make(kafkaclient.PublishErrors, len(recs))
	failed, anyFailed := kafkaclient.FailedKeys{}, false
	fail := func(i int, err error) {
		errs[i] = fmt.Errorf("kafkago: produce to %s: %w", topic, err)
		failed.Fail(recs[i].Key, err)
		anyFailed = true
	}
	var msgs []kafka.Message
	var at []int // msgs[j] is recs[at[j]]
	bytes := 0
	write := func() {
		if len(msgs) == 0 {
			return
		}
		err := tw.w.WriteMessages(ctx, msgs...)
		var each kafka.WriteErrors
		perMessage := errors.As(err, &each) && len(each) == len(msgs)
		for j, i := range at {
			e := err
			if perMessage {
				e = each[j]
			}
			if e == nil {
				continue
			}
			if errors.Is(e, kafka.MessageSizeTooLarge) || errors.Is(e, kafka.RecordListTooLarge) {
				e = fmt.Errorf("%w: %w", kafkaclient.ErrTooLarge, e)
			}
			fail(i, e)
		}
		msgs, at, bytes = msgs[:0], at[:0], 0
	}
	for i := range recs {
		r := &recs[i]
		n := kafkaclient.RecordBytes(r)
		if bytes+n > kafkaclient.MaxRecordBytes || len(msgs) == chunkRecords {
			write()
		}
		err := failed.Held(r.Key)
		if err == nil && n > kafkaclient.MaxRecordBytes {
			err = kafkaclient.TooLarge(n)
		}
		if err != nil {
			fail(i, err)
			continue
		}
		m := kafka.Message{Key: r.Key, Value: r.Value, Time: r.Time}
		for _, h := range r.Headers {
			m.Headers = append(m.Headers, kafka.Header{Key: h.Key, Value: h.Value})
		}
		msgs, at, bytes = append(msgs, m), append(at, i), bytes+n
	}
	write()
	if anyFailed {
		return errs
	}
	return nil
}

// writer returns topic's writer, made on first use; nil after Close.
func (c *Client) writer(topic string) *topicWriter {
	c.writers.mu.Lock()
	defer c.writers.mu.Unlock()
	if c.writers.closed {
		return nil
	}
	if c.writers.w == nil {
		c.writers.w = map[string]*topicWriter{}
	}
	tw := c.writers.w[topic]
	if tw == nil {
		tw = &topicWriter{w: &kafka.Writer{Addr: kafka.TCP(c.cfg.Brokers...), Topic: topic, Transport: c.tr, Balancer: &kafka.Hash{},
			RequiredAcks: kafka.RequireAll, BatchTimeout: 5 * time.Millisecond, BatchSize: chunkRecords, BatchBytes: kafkaclient.MaxRecordBytes}}
		c.writers.w[topic] = tw
	}
	return tw
}

func (c *Client) closeWriters() {
	c.writers.mu.Lock()
	defer c.writers.mu.Unlock()
	for _, tw := range c.writers.w {
		_ = tw.w.Close()
	}
	c.writers.w = nil
	c.writers.closed = true
}
