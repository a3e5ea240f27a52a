package kafkago

import (
	"context"
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

// Publish implements kafkaclient.Client.
func (c *Client) Publish(ctx context.Context, topic string, recs []kafkaclient.Record) error {
	c.writers.mu.Lock()
	if c.writers.w == nil {
		c.writers.w = map[string]*kafka.Writer{}
	}
	w := c.writers.w[topic]
	if w == nil {
		w = &kafka.Writer{Addr: kafka.TCP(c.cfg.Brokers...), Topic: topic, Transport: c.tr, Balancer: &kafka.Hash{},
			RequiredAcks: kafka.RequireAll, BatchTimeout: 5 * time.Millisecond}
		c.writers.w[topic] = w
	}
	c.writers.mu.Unlock()
	msgs := make([]kafka.Message, len(recs))
	for i := range recs {
		r := &recs[i]
		msgs[i] = kafka.Message{Key: r.Key, Value: r.Value, Time: r.Time}
		for _, h := range r.Headers {
			msgs[i].Headers = append(msgs[i].Headers, kafka.Header{Key: h.Key, Value: h.Value})
		}
	}
	if err := w.WriteMessages(ctx, msgs...); err != nil {
		return fmt.Errorf("kafkago: produce to %s: %w", topic, err)
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
