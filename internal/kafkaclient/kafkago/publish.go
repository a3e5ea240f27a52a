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

// writers are the client's kafka-go writers, one per topic published to.
type writers struct {
	mu sync.Mutex
	w  map[string]*kafka.Writer
}

// Publish implements kafkaclient.Client. Each record has its own result,
// as with franz-go: one too large, refused here or by the broker, fails
// alone (with the others of its batch, when the broker refused the batch),
// and the others are written. (kafka-go itself would fail the whole call
// for one message over BatchBytes.)
func (c *Client) Publish(ctx context.Context, topic string, recs []kafkaclient.Record) error {
	c.writers.mu.Lock()
	if c.writers.w == nil {
		c.writers.w = map[string]*kafka.Writer{}
	}
	w := c.writers.w[topic]
	if w == nil {
		w = &kafka.Writer{Addr: kafka.TCP(c.cfg.Brokers...), Topic: topic, Transport: c.tr, Balancer: &kafka.Hash{},
			RequiredAcks: kafka.RequireAll, BatchTimeout: 5 * time.Millisecond, BatchBytes: kafkaclient.MaxRecordBytes}
		c.writers.w[topic] = w
	}
	c.writers.mu.Unlock()
	errs := make(kafkaclient.PublishErrors, len(recs))
	var msgs []kafka.Message
	var at []int // msgs[j] is recs[at[j]]
	for i := range recs {
		r := &recs[i]
		if n := kafkaclient.RecordBytes(r); n > kafkaclient.MaxRecordBytes {
			errs[i] = fmt.Errorf("kafkago: produce to %s: %w", topic, kafkaclient.TooLarge(n))
			continue
		}
		m := kafka.Message{Key: r.Key, Value: r.Value, Time: r.Time}
		for _, h := range r.Headers {
			m.Headers = append(m.Headers, kafka.Header{Key: h.Key, Value: h.Value})
		}
		msgs, at = append(msgs, m), append(at, i)
	}
	failed := len(msgs) < len(recs)
	if len(msgs) > 0 {
		err := w.WriteMessages(ctx, msgs...)
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
			failed = true
			if errors.Is(e, kafka.MessageSizeTooLarge) || errors.Is(e, kafka.RecordListTooLarge) {
				e = fmt.Errorf("%w: %w", kafkaclient.ErrTooLarge, e)
			}
			errs[i] = fmt.Errorf("kafkago: produce to %s: %w", topic, e)
		}
	}
	if failed {
		return errs
	}
	return nil
}

func (c *Client) closeWriters() {
	c.writers.mu.Lock()
	defer c.writers.mu.Unlock()
	for _, w := range c.writers.w {
		_ = w.Close()
	}
	c.writers.w = nil
}
