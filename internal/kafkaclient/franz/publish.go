package franz

import (
	"context"
	"fmt"
	"sync"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kafkaonce/kafkaonce/internal/kafkaclient"
)

// producer is the client's kgo producer, made on first use: idempotent
// (the default), so a retry of a produce request the broker already
// wrote is not written twice, and waiting for all in-sync replicas.
type producer struct {
	once sync.Once
	cl   *kgo.Client
	err  error
}

// Publish implements kafkaclient.Client.
func (c *Client) Publish(ctx context.Context, topic string, recs []kafkaclient.Record) error {
	c.producer.once.Do(func() {
		c.producer.cl, c.producer.err = kgo.NewClient(append(c.base[:len(c.base):len(c.base)], kgo.RequiredAcks(kgo.AllISRAcks()))...)
	})
	if c.producer.err != nil {
		return fmt.Errorf("franz: %w", c.producer.err)
	}
	krs := make([]*kgo.Record, len(recs))
	for i := range recs {
		r := &recs[i]
		kr := &kgo.Record{Topic: topic, Key: r.Key, Value: r.Value, Timestamp: r.Time}
		for _, h := range r.Headers {
			kr.Headers = append(kr.Headers, kgo.RecordHeader{Key: h.Key, Value: h.Value})
		}
		krs[i] = kr
	}
	if err := c.producer.cl.ProduceSync(ctx, krs...).FirstErr(); err != nil {
		return fmt.Errorf("franz: produce to %s: %w", topic, err)
	}
	return nil
}
