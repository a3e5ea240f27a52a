package franz

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/twmb/franz-go/pkg/kerr"
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

// Publish implements kafkaclient.Client. Each record has its own result:
// one too large, refused here or by the broker, fails alone (with the
// others of its batch, when the broker refused the batch), and the others
// are written.
func (c *Client) Publish(ctx context.Context, topic string, recs []kafkaclient.Record) error {
	c.producer.once.Do(func() {
		c.producer.cl, c.producer.err = kgo.NewClient(append(c.base[:len(c.base):len(c.base)], kgo.RequiredAcks(kgo.AllISRAcks()),
			// The batch limit is MaxRecordBytes, which every record sent
			// fits (RecordBytes counts more than kgo does).
			kgo.ProducerBatchMaxBytes(kafkaclient.MaxRecordBytes))...)
	})
	if c.producer.err != nil {
		return fmt.Errorf("franz: %w", c.producer.err)
	}
	errs := make(kafkaclient.PublishErrors, len(recs))
	var krs []*kgo.Record
	at := map[*kgo.Record]int{} // results come in the order they finish
	for i := range recs {
		r := &recs[i]
		if n := kafkaclient.RecordBytes(r); n > kafkaclient.MaxRecordBytes {
			errs[i] = fmt.Errorf("franz: produce to %s: %w", topic, kafkaclient.TooLarge(n))
			continue
		}
		kr := &kgo.Record{Topic: topic, Key: r.Key, Value: r.Value, Timestamp: r.Time}
		for _, h := range r.Headers {
			kr.Headers = append(kr.Headers, kgo.RecordHeader{Key: h.Key, Value: h.Value})
		}
		krs, at[kr] = append(krs, kr), i
	}
	failed := len(krs) < len(recs)
	if len(krs) > 0 {
		for _, res := range c.producer.cl.ProduceSync(ctx, krs...) {
			if res.Err == nil {
				continue
			}
			failed = true
			err := res.Err
			if errors.Is(err, kerr.MessageTooLarge) || errors.Is(err, kerr.RecordListTooLarge) {
				err = fmt.Errorf("%w: %w", kafkaclient.ErrTooLarge, err)
			}
			errs[at[res.Record]] = fmt.Errorf("franz: produce to %s: %w", topic, err)
		}
	}
	if failed {
		return errs
	}
	return nil
}
