package engine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/kafkaonce/kafkaonce/deadletter"
	"github.com/kafkaonce/kafkaonce/internal/kafkaclient"
)

// runPublisher publishes dead letters to Config.DeadLetterTopic with pub
// until ctx is done. It reads letters not yet published from the table and marks them
// published after the broker acknowledged them: at-least-once, and nothing
// is lost if the broker or the process is down for a while.
func (c *Consumer) runPublisher(ctx context.Context, pub kafkaclient.Publisher) {
	poll := time.NewTicker(5 * time.Second)
	defer poll.Stop()
	for {
		if err := c.publishPending(ctx, pub); err != nil && ctx.Err() == nil {
			c.log.Warn("dead-letter topic: publishing failed; retrying in a few seconds", slog.String("topic", c.cfg.DeadLetterTopic), slog.String("error", err.Error()))
		}
		select {
		case <-ctx.Done():
			// One last pass for letters written while draining.
			final, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if err := c.publishPending(final, pub); err != nil {
				c.log.Warn("dead-letter topic: letters left unpublished at shutdown are published at the next start", slog.String("error", err.Error()))
			}
			return
		case <-c.publish:
		case <-poll.C:
		}
	}
}

// publishPending publishes unpublished letters a page at a time.
func (c *Consumer) publishPending(ctx context.Context, pub kafkaclient.Publisher) error {
	for {
		var letters []deadletter.Letter
		err := c.readOnly(ctx, func(q querier) (err error) {
			letters, err = c.letters.List(ctx, q, deadletter.Filter{Consumer: c.cfg.Name, Unpublished: true, Limit: 100})
			return err
		})
		if err != nil || len(letters) == 0 {
			return err
		}
		if err := c.publishPage(ctx, pub, letters); err != nil {
			return err
		}
	}
}

// publishPage publishes a page of letters and marks published those the
// broker acknowledged, even when others failed: they are not published
// again. A letter too large for the topic holds back no other: one larger
// than a record may be (kafkaclient.MaxRecordBytes) goes cut to fit, and
// one the broker refuses goes alone, and then cut smaller until the topic
// takes it (see publishTooLarge). Any other failure is the topic's or the
// broker's, and the letters it hit wait for the next pass.
func (c *Consumer) publishPage(ctx context.Context, pub kafkaclient.Publisher, letters []deadletter.Letter) error {
	lrs := make([]*letterRecord, len(letters))
	recs := make([]kafkaclient.Record, len(letters))
	cuts := make([][]string, len(letters))
	for i := range letters {
		lrs[i] = newLetterRecord(&letters[i])
		var err error
		recs[i], cuts[i], err = lrs[i].fit(kafkaclient.MaxRecordBytes, fmt.Sprintf("the letter, %d bytes, is larger than the %d bytes a record written to the dead-letter topic may have; the whole letter is in dead_letters",
			lrs[i].size, kafkaclient.MaxRecordBytes))
		if err != nil {
			// The letter's own headers are bounded far below the limit.
			return fmt.Errorf("dead letter %d: %w", letters[i].ID, err)
		}
	}
	err := pub.Publish(ctx, c.cfg.DeadLetterTopic, recs)
	var each kafkaclient.PublishErrors
	if err != nil && (!errors.As(err, &each) || len(each) != len(recs)) {
		return err
	}
	var published []int64
	var failed error
	for i := range letters {
		var e error
		if each != nil {
			e = each[i]
		}
		switch {
		case e == nil:
			c.logCut(lrs[i], &recs[i], cuts[i])
		case errors.Is(e, kafkaclient.ErrTooLarge):
			e = c.publishTooLarge(ctx, pub, lrs[i], &recs[i], cuts[i], len(recs) > 1)
		}
		switch {
		case e == nil:
			published = append(published, letters[i].ID)
		case failed == nil:
			failed = e
		}
	}
	if len(published) > 0 {
		if err := c.inTx(ctx, func(q querier) error { return c.letters.MarkPublished(ctx, q, published) }); err != nil {
			return err
		}
	}
	return failed
}

// publishTooLarge publishes a letter the client or the broker refused as
// too large for the topic. Refused in a call with others, it may have been
// only its batch that was: it goes alone first. Refused alone, the topic's
// max.message.bytes is under its size, and that limit is not known here: it
// goes cut to half the size, and half again, until the topic takes it.
// Only a topic that takes not even a letter's own headers (a few hundred
// bytes, under any sensible max.message.bytes) makes it fail, and then
// every letter would: that is the topic's failure, reported as such.
func (c *Consumer) publishTooLarge(ctx context.Context, pub kafkaclient.Publisher, lr *letterRecord, rec *kafkaclient.Record, cut []string, withOthers bool) error {
	publish := func(r *kafkaclient.Record) error {
		return pub.Publish(ctx, c.cfg.DeadLetterTopic, []kafkaclient.Record{*r})
	}
	if withOthers {
		if err := publish(rec); err == nil || !errors.Is(err, kafkaclient.ErrTooLarge) {
			if err == nil {
				c.logCut(lr, rec, cut)
			}
			return err
		}
	}
	refused := kafkaclient.RecordBytes(rec)
	for {
		limit := refused / 2
		cutRec, cut, err := lr.fit(limit, fmt.Sprintf("the letter, %d bytes, is larger than the dead-letter topic's max.message.bytes (it refused %d bytes); the whole letter is in dead_letters",
			lr.size, refused))
		if err != nil {
			return fmt.Errorf("dead-letter topic %s refuses letter %d even cut to %d bytes (%w): raise the topic's max.message.bytes", c.cfg.DeadLetterTopic, lr.l.ID, limit, err)
		}
		err = publish(&cutRec)
		if err == nil {
			c.logCut(lr, &cutRec, cut)
			return nil
		}
		if !errors.Is(err, kafkaclient.ErrTooLarge) {
			return err
		}
		refused = kafkaclient.RecordBytes(&cutRec)
	}
}

// logCut tells operators that a letter goes to the topic cut, and where
// the whole letter is.
func (c *Consumer) logCut(lr *letterRecord, rec *kafkaclient.Record, cut []string) {
	if len(cut) == 0 {
		return
	}
	c.log.Warn("dead-letter topic: a letter too large for the topic is published cut to fit; the whole letter is in dead_letters",
		slog.String("topic", c.cfg.DeadLetterTopic), slog.Int64("dead_letter_id", lr.l.ID), slog.Int("bytes", lr.size),
		slog.Int("published_bytes", kafkaclient.RecordBytes(rec)), slog.String("cut", strings.Join(cut, ",")))
}
