package kafkago

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/kafkaonce/kafkaonce/internal/kafkaclient"
)

// Open implements kafkaclient.Client with a kafka-go Reader pinned to the
// partition. It prefetches in the background into a queue of MaxBatch
// records, so memory stays bounded by MaxBatch records plus one fetch of
// FetchMaxBytes.
func (c *Client) Open(cfg kafkaclient.FetchConfig) (*kafkaclient.Fetcher, error) {
	r := kafka.NewReader(kafka.ReaderConfig{
		Brokers:       c.cfg.Brokers,
		Dialer:        c.dialer,
		Topic:         cfg.Topic,
		Partition:     cfg.Partition,
		MinBytes:      1,
		MaxBytes:      c.cfg.FetchMaxBytes,
		MaxWait:       500 * time.Millisecond,
		QueueCapacity: max(cfg.MaxBatch, 1),
		// Records of open transactions are never handed out. (Those of
		// aborted ones are: see the package doc.)
		IsolationLevel: kafka.ReadCommitted,
		// Report a position before the log start (retention deleted
		// records not yet processed) instead of jumping silently.
		OffsetOutOfRangeError: true,
		Logger:                logger(c.log, levelChatter),
		ErrorLogger:           logger(c.log, slog.LevelDebug),
	})
	if err := r.SetOffset(cfg.Start); err != nil {
		r.Close()
		return nil, fmt.Errorf("kafkago: seek %s/%d to %d: %w", cfg.Topic, cfg.Partition, cfg.Start, err)
	}
	src := &readerSource{r: r}
	f := kafkaclient.NewFetcher(cfg, src, func(ctx context.Context) (kafkaclient.Bounds, error) {
		return c.Bounds(ctx, cfg.Topic, cfg.Partition)
	})
	// kafka-go's fetches do not say which topic id they read, and its
	// reader goes on at the same offset in a topic deleted and created
	// again: each batch is checked against the topic's id.
	f.CheckTopicEachBatch(func(ctx context.Context) (kafkaclient.TopicID, error) { return c.topicID(ctx, cfg.Topic) })
	return f, nil
}

// readerSource hands out a Reader's messages as records.
type readerSource struct {
	r       *kafka.Reader
	headers kafkaclient.HeaderArena
}

func (s *readerSource) Next(ctx context.Context) (kafkaclient.Record, int64, error) {
	m, err := s.r.FetchMessage(ctx)
	if errors.Is(err, kafka.OffsetOutOfRange) {
		return kafkaclient.Record{}, 0, fmt.Errorf("%w: %w", kafkaclient.ErrOutOfRange, err)
	}
	if err != nil {
		return kafkaclient.Record{}, 0, err
	}
	if isMarker(&m) {
		return kafkaclient.Record{}, 0, &kafkaclient.TransactionalError{Topic: m.Topic, Partition: m.Partition, Offset: m.Offset, Client: "kafka-go"}
	}
	return kafkaclient.Record{Topic: m.Topic, Partition: m.Partition, Offset: m.Offset, Key: m.Key, Value: m.Value,
		Headers: kafkaclient.CopyHeaders(&s.headers, m.Headers, header), Time: m.Time, HighWaterMark: m.HighWaterMark}, -1, nil
}

func (s *readerSource) MoveTo(offset int64) error { return s.r.SetOffset(offset) }

func (s *readerSource) Close() { _ = s.r.Close() }

// isMarker reports whether m is a transaction marker (a control record)
// as kafka-go hands it out: a 4-byte key holding version 0 and type 0
// (abort) or 1 (commit), a 6-byte value holding version 0 and the
// coordinator's epoch, no headers. A record a producer wrote exactly so is
// taken for one too; the partition then stops, which errs on the safe side.
func isMarker(m *kafka.Message) bool {
	k, v := m.Key, m.Value
	return len(k) == 4 && k[0] == 0 && k[1] == 0 && k[2] == 0 && k[3] <= 1 &&
		len(v) == 6 && v[0] == 0 && v[1] == 0 && len(m.Headers) == 0
}

func header(h *kafka.Header) (string, []byte) { return h.Key, h.Value }
