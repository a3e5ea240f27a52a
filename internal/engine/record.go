package engine

import (
	"context"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/kafkaonce/kafkaonce/internal/store/recorded"
)

// Bounds of recording the settings at start-up. The record only serves
// kafkaonce's tools, so it must never hold up consuming for long: a row
// lock held elsewhere (an operator's open transaction) is waited for
// recordLockWait at most, and the whole write recordTimeout.
const (
	recordLockWait = time.Second
	recordTimeout  = 5 * time.Second
)

// recordSettings records, in the consumer's row of the consumers table,
// what kafkaonce's tools would otherwise have to be told: the id rule, the
// group, topics and brokers. A failure is logged at warning level and
// consuming goes on: losing the record costs an operator some flags, while
// refusing to start (or retrying here) would stop the effects themselves.
func (c *Consumer) recordSettings(ctx context.Context) {
	s := recorded.Settings{Consumer: c.cfg.Name, MessageIDRule: c.cfg.MessageIDRule, GroupID: c.cfg.GroupID,
		Topics: c.cfg.Topics, Brokers: c.cfg.Brokers}
	if s.MessageIDRule == "" {
		s.MessageIDRule = recorded.Custom
	}
	if d := c.cfg.Dialer; d != nil {
		s.KafkaTLS = d.TLS != nil
		if d.SASLMechanism != nil {
			s.KafkaSASL = d.SASLMechanism.Name()
		}
	}
	rctx, cancel := context.WithTimeout(ctx, recordTimeout)
	defer cancel()
	// Cancelled while recording, Run is stopping: nothing to warn about.
	if err := c.recordIn(rctx, s); err != nil && ctx.Err() == nil {
		c.log.Warn("could not record the consumer's settings for kafkaonce's tools; consuming all the same, "+
			"but kafkaonce audit, replay and status must be told --id, --group, --topic and --brokers until a start records them",
			slog.String("error", err.Error()))
	}
}

// recordIn writes s in a transaction of its own, with the session settings
// every transaction of the consumer's starts with, then a shorter lock wait.
func (c *Consumer) recordIn(ctx context.Context, s recorded.Settings) error {
	b := &pgx.Batch{}
	b.Queue(`SELECT set_config('lock_timeout', $1, true)`, recordLockWait.String())
	if err := c.recorded.QueueRecord(b, s); err != nil {
		return err
	}
	return c.inOneTrip(ctx, b)
}
