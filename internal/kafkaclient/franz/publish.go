package franz

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"sync"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kafkaonce/kafkaonce/internal/kafkaclient"
)

// producer is the client's kgo producer, made on first use: idempotent
// (kgo's default, never turned off here), so a retry of a produce request
// the broker already wrote is not written twice and a partition's batches
// are appended in order, and waiting for all in-sync replicas.
//
// It flushes by hand, one Publish at a time (mu): a call buffers all its
// records before any is sent. A batch the broker refuses then fails with
// every record buffered behind it in its partition (kgo fails them all,
// to keep its sequence numbers whole), so none of a key's records after a
// failed one is written. Sent while the call still buffered, a batch could
// fail before the key's later records were buffered, and those would be
// written.
type producer struct {
	life   sync.Mutex // guards cl, err and closed
	cl     *kgo.Client
	err    error
	closed bool
	mu     sync.Mutex
	// left, guarded by mu, is closed once the records of the last call
	// that gave up (its context ended) are done: written or failed.
	left chan struct{}
}

// Publish implements kafkaclient.Client. Each record has its own result:
// one too large, refused here or by the broker, fails with the records
// behind it of its key (and, refused by the broker, with the others of its
// batch and those behind them in its partition), and the others are
// written.
func (c *Client) Publish(ctx context.Context, topic string, recs []kafkaclient.Record) error {
	cl, err := c.producer.open(func() (*kgo.Client, error) {
		return kgo.NewClient(append(c.base[:len(c.base):len(c.base)], kgo.RequiredAcks(kgo.AllISRAcks()),
			// The batch limit is MaxRecordBytes, which every record sent
			// fits (RecordBytes counts more than kgo does).
			kgo.ProducerBatchMaxBytes(kafkaclient.MaxRecordBytes), kgo.ManualFlushing(),
			// A key goes to the partition kafka-go's Hash balancer picks
			// (FNV-1a, as Sarama), not kgo's default (murmur2, as Java's
			// client): the outbox relay published with kafka-go before,
			// and a key that moved partition could overtake its earlier
			// records. Both clients then put a key in the same place.
			kgo.RecordPartitioner(kgo.StickyKeyPartitioner(kgo.SaramaCompatHasher(fnv32a))))...)
	})
	if err != nil {
		return fmt.Errorf("franz: produce to %s: %w", topic, err)
	}
	c.producer.mu.Lock()
	defer c.producer.mu.Unlock()
	// The records of a call that gave up must be done before this call
	// buffers: one still buffered carries that call's ended context, and
	// kgo, failing it, fails every record buffered behind it in its
	// partition, this call's too.
	if err := c.producer.awaitLeft(ctx, cl); err != nil {
		return fmt.Errorf("franz: produce to %s: records of an earlier call that gave up are not done: %w", topic, err)
	}
	var mu sync.Mutex // guards errs and failed against the promises
	errs := make(kafkaclient.PublishErrors, len(recs))
	failed, anyFailed := kafkaclient.FailedKeys{}, false
	fail := func(i int, err error) {
		errs[i] = fmt.Errorf("franz: produce to %s: %w", topic, err)
		failed.Fail(recs[i].Key, err)
		anyFailed = true
	}
	var wg sync.WaitGroup
	for i := range recs {
		r := &recs[i]
		mu.Lock()
		err := failed.Held(r.Key)
		if n := kafkaclient.RecordBytes(r); err == nil && n > kafkaclient.MaxRecordBytes {
			err = kafkaclient.TooLarge(n)
		}
		if err != nil {
			fail(i, err)
		}
		mu.Unlock()
		if err != nil {
			continue
		}
		kr := &kgo.Record{Topic: topic, Key: r.Key, Value: r.Value, Timestamp: r.Time}
		for _, h := range r.Headers {
			kr.Headers = append(kr.Headers, kgo.RecordHeader{Key: h.Key, Value: h.Value})
		}
		wg.Add(1)
		cl.Produce(ctx, kr, func(_ *kgo.Record, err error) {
			defer wg.Done()
			if err == nil {
				return
			}
			if errors.Is(err, kerr.MessageTooLarge) || errors.Is(err, kerr.RecordListTooLarge) {
				err = fmt.Errorf("%w: %w", kafkaclient.ErrTooLarge, err)
			}
			mu.Lock()
			fail(i, err)
			mu.Unlock()
		})
	}
	// Flush until this call's records are done, not until every record
	// buffered is: one of an earlier call that gave up waiting may be
	// stuck (for a topic that does not exist, say). The flush has ended
	// before the next call buffers, which must not be sent meanwhile.
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	flushCtx, stopFlush := context.WithCancel(ctx)
	flushed := make(chan struct{})
	go func() { defer close(flushed); _ = cl.Flush(flushCtx) }()
	select {
	case <-done:
	case <-ctx.Done():
	}
	stopFlush()
	<-flushed
	select {
	case <-done:
	default:
		// The records left go when a later call flushes, or fail with
		// their context; the next call waits for them (awaitLeft).
		c.producer.left = done
		return fmt.Errorf("franz: produce to %s: %w", topic, ctx.Err())
	}
	mu.Lock()
	defer mu.Unlock()
	if anyFailed {
		return errs
	}
	return nil
}

// errClosed is the error of a Publish after Close.
var errClosed = errors.New("the client is closed")

// open returns the producer, made with newClient on first use; after close, an
// error.
func (p *producer) open(newClient func() (*kgo.Client, error)) (*kgo.Client, error) {
	p.life.Lock()
	defer p.life.Unlock()
	if p.closed {
		return nil, errClosed
	}
	if p.cl == nil && p.err == nil {
		p.cl, p.err = newClient()
	}
	return p.cl, p.err
}

// close closes the producer, if made, and any made later: a Publish after
// it fails.
func (p *producer) close() {
	p.life.Lock()
	cl := p.cl
	p.closed = true
	p.life.Unlock()
	if cl != nil {
		cl.Close()
	}
}

// awaitLeft flushes, called locked, until the records of the last call
// that gave up are done, or ctx ends.
func (p *producer) awaitLeft(ctx context.Context, cl *kgo.Client) error {
	if p.left == nil {
		return nil
	}
	select {
	case <-p.left:
		p.left = nil
		return nil
	default:
	}
	flushCtx, stopFlush := context.WithCancel(ctx)
	flushed := make(chan struct{})
	go func() { defer close(flushed); _ = cl.Flush(flushCtx) }()
	select {
	case <-p.left:
	case <-ctx.Done():
	}
	stopFlush()
	<-flushed
	select {
	case <-p.left:
		p.left = nil
		return nil
	default:
		return ctx.Err()
	}
}

// fnv32a is the hash of kafka-go's Hash balancer.
func fnv32a(b []byte) uint32 {
	h := fnv.New32a()
	_, _ = h.Write(b)
	return h.Sum32()
}
