package engine

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/kafkaonce/kafkaonce/internal/store/recorded"
)

// Bounds of recording the settings at start-up. The record only serves
// kafkaonce's tools, so it must never hold up consuming for long: a row
// lock held elsewhere (an operator's open transaction) is waited for
// recordLockWait at most, and each write recordTimeout; a failed one is
// tried again in the background, first after recordRetryFirst.
const (
	recordLockWait   = time.Second
	recordTimeout    = 5 * time.Second
	recordRetryFirst = 2 * time.Second
	recordRetryMax   = time.Minute
)

// recordSettings records, in the consumer's row of the consumers table,
// what kafkaonce's tools would otherwise have to be told: the id rule, the
// group, topics and brokers (see recordWhenJoined for when). It never holds up consuming for longer than
// recordTimeout: losing the record costs an operator some flags, while
// refusing to start would stop the effects themselves. A failed write is
// logged at warning level and tried again in the background (after
// recordRetryFirst, doubling up to recordRetryMax) until it succeeds or
// Run ends: until then the tools would read the previous start's record,
// which may name another group or id rule. The returned func stops the
// retries and waits for them; Run calls it before it returns.
func (c *Consumer) recordSettings(ctx context.Context) (stop func()) {
	// The start's time orders records: a retry that lands after a later
	// start of the same name (another worker's) must not replace its
	// record. Workers' clocks are taken to agree within the time between
	// two starts of one name.
	s := recorded.Settings{Consumer: c.cfg.Name, MessageIDRule: c.cfg.MessageIDRule, GroupID: c.cfg.GroupID,
		GroupType: c.cfg.GroupType.String(), Topics: c.cfg.Topics, Brokers: c.cfg.Brokers, RecordedAt: time.Now(), RecordedBy: recordedBy(c.cfg.InstanceID)}
	if s.MessageIDRule == "" {
		s.MessageIDRule = recorded.Custom
	}
	s.KafkaTLS = c.cfg.TLS != nil
	if c.cfg.SASL != nil {
		s.KafkaSASL = string(c.cfg.SASL.Mechanism)
	}
	if d := c.cfg.Dialer; d != nil {
		s.KafkaTLS = d.TLS != nil
		if d.SASLMechanism != nil {
			s.KafkaSASL = d.SASLMechanism.Name()
		}
	}
	err := c.recordOnce(ctx, s)
	if err == nil || ctx.Err() != nil { // cancelled while recording, Run is stopping: nothing to warn about
		return func() {}
	}
	c.log.Warn("could not record the consumer's settings for kafkaonce's tools; consuming all the same, and trying again in the background. "+
		"Until it succeeds, kafkaonce audit, replay and status read the previous record (or none): give them --id, --group, --topic and --brokers",
		slog.String("error", err.Error()))
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		wait := recordRetryFirst
		for {
			select {
			case <-rctx.Done():
				return
			case <-time.After(wait):
			}
			if err := c.recordOnce(rctx, s); err == nil {
				c.log.Info("recorded the consumer's settings for kafkaonce's tools")
				return
			} else if rctx.Err() != nil {
				return
			}
			wait = min(2*wait, recordRetryMax)
		}
	}()
	return func() {
		cancel()
		<-done
	}
}

// recordedBy names this worker for the record: an operator who finds the
// tools reading settings other than a healthy worker's can find the one
// that wrote them.
func recordedBy(instanceID string) string {
	host, _ := os.Hostname()
	if instanceID != "" {
		return fmt.Sprintf("%s (pid %d, instance %s)", host, os.Getpid(), instanceID)
	}
	return fmt.Sprintf("%s (pid %d)", host, os.Getpid())
}

// recordWhenJoined records the settings once the member has joined its
// group (joined, called at every assignment: the first one starts the
// record, in the background), not at start-up: a worker that cannot reach
// the brokers (a wrong address, TLS against a plain listener, refused
// credentials) never joins, and must not replace the record of a healthy
// one, which the tools read. stop waits for the record's attempts to end;
// Run calls it before it returns.
func (c *Consumer) recordWhenJoined(ctx context.Context) (joined, stop func()) {
	var mu sync.Mutex
	var started, stopped bool
	var done chan struct{}
	var stopRetries func()
	joined = func() {
		mu.Lock()
		defer mu.Unlock()
		if started || stopped {
			return
		}
		started, done = true, make(chan struct{})
		go func() {
			s := c.recordSettings(ctx)
			mu.Lock()
			stopRetries = s
			mu.Unlock()
			close(done)
		}()
	}
	stop = func() {
		mu.Lock()
		stopped = true
		d := done
		mu.Unlock()
		if d == nil {
			return
		}
		<-d
		stopRetries()
	}
	return joined, stop
}

// recordOnce makes one bounded attempt at writing s.
func (c *Consumer) recordOnce(ctx context.Context, s recorded.Settings) error {
	rctx, cancel := context.WithTimeout(ctx, recordTimeout)
	defer cancel()
	return c.recordIn(rctx, s)
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
