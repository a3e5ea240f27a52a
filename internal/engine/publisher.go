package engine

import (
	"context"
	"log/slog"
	"strconv"
	"time"

	"github.com/kafkaonce/kafkaonce/deadletter"
	"github.com/kafkaonce/kafkaonce/internal/kafkaclient"
	"github.com/kafkaonce/kafkaonce/kafkaoncetype"
)

// Headers of a message published to Config.DeadLetterTopic: the consumer
// package exports the same names (a test keeps them equal).
const (
	DefaultMessageIDHeader = "message-id"

	HeaderConsumer        = "kafkaonce-consumer"
	HeaderSourceTopic     = "kafkaonce-source-topic"
	HeaderSourcePartition = "kafkaonce-source-partition"
	HeaderSourceOffset    = "kafkaonce-source-offset"
	HeaderErrorClass      = "kafkaonce-error-class"
	HeaderError           = "kafkaonce-error"
	HeaderDeadLetterID    = "kafkaonce-dead-letter-id"
)

// maxHeaderError bounds the error text carried in a header.
const maxHeaderError = 1024

// runPublisher publishes dead letters to Config.DeadLetterTopic until ctx is
// done. It reads letters not yet published from the table and marks them
// published after the broker acknowledged them: at-least-once, and nothing
// is lost if the broker or the process is down for a while.
func (c *Consumer) runPublisher(ctx context.Context) {
	poll := time.NewTicker(5 * time.Second)
	defer poll.Stop()
	for {
		if err := c.publishPending(ctx); err != nil && ctx.Err() == nil {
			c.log.Warn("dead-letter topic: publishing failed; retrying in a few seconds", slog.String("topic", c.cfg.DeadLetterTopic), slog.String("error", err.Error()))
		}
		select {
		case <-ctx.Done():
			// One last pass for letters written while draining.
			final, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if err := c.publishPending(final); err != nil {
				c.log.Warn("dead-letter topic: letters left unpublished at shutdown are published at the next start", slog.String("error", err.Error()))
			}
			return
		case <-c.publish:
		case <-poll.C:
		}
	}
}

// publishPending publishes unpublished letters a page at a time.
func (c *Consumer) publishPending(ctx context.Context) error {
	for {
		var letters []deadletter.Letter
		err := c.readOnly(ctx, func(q querier) (err error) {
			letters, err = c.letters.List(ctx, q, deadletter.Filter{Consumer: c.cfg.Name, Unpublished: true, Limit: 100})
			return err
		})
		if err != nil || len(letters) == 0 {
			return err
		}
		recs := make([]kafkaclient.Record, len(letters))
		ids := make([]int64, len(letters))
		for i := range letters {
			recs[i], ids[i] = publishedLetter(&letters[i]), letters[i].ID
		}
		if err := c.client.Publish(ctx, c.cfg.DeadLetterTopic, recs); err != nil {
			return err
		}
		if err := c.inTx(ctx, func(q querier) error { return c.letters.MarkPublished(ctx, q, ids) }); err != nil {
			return err
		}
	}
}

func publishedLetter(l *deadletter.Letter) kafkaclient.Record {
	m := kafkaclient.Record{Key: l.Key, Value: l.Value, Time: l.MessageTime}
	hasID := false
	for _, h := range l.Headers {
		m.Headers = append(m.Headers, kafkaoncetype.Header{Key: h.Key, Value: h.Value})
		hasID = hasID || h.Key == DefaultMessageIDHeader
	}
	if !hasID && l.MessageID != "" {
		m.Headers = append(m.Headers, kafkaoncetype.Header{Key: DefaultMessageIDHeader, Value: []byte(l.MessageID)})
	}
	errText := l.Error
	if len(errText) > maxHeaderError {
		errText = errText[:maxHeaderError]
	}
	m.Headers = append(m.Headers,
		kafkaoncetype.Header{Key: HeaderConsumer, Value: []byte(l.Consumer)},
		kafkaoncetype.Header{Key: HeaderSourceTopic, Value: []byte(l.Topic)},
		kafkaoncetype.Header{Key: HeaderSourcePartition, Value: []byte(strconv.Itoa(l.Partition))},
		kafkaoncetype.Header{Key: HeaderSourceOffset, Value: []byte(strconv.FormatInt(l.Offset, 10))},
		kafkaoncetype.Header{Key: HeaderErrorClass, Value: []byte(l.Class)},
		kafkaoncetype.Header{Key: HeaderError, Value: []byte(errText)},
		kafkaoncetype.Header{Key: HeaderDeadLetterID, Value: []byte(strconv.FormatInt(l.ID, 10))},
	)
	return m
}
