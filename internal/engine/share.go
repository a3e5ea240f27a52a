package engine

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/kafkaonce/kafkaonce/internal/cleanup"
	"github.com/kafkaonce/kafkaonce/internal/kafkaadmin"
	"github.com/kafkaonce/kafkaonce/internal/kafkaclient"
	"github.com/kafkaonce/kafkaonce/internal/retry"
)

// shareJoiner is a Kafka client that can join a share group (franz-go's).
type shareJoiner interface {
	JoinShare(ctx context.Context, cfg kafkaclient.ShareConfig) (kafkaclient.ShareMember, error)
}

// shareMember is the consumer as a member of a share group (KIP-932):
// there are no partitions of its own and no positions, only records the
// broker hands it under an acquisition lock. Its loop is
//
//	Poll → the records grouped by partition → per group one transaction
//	that claims, handles and sets aside (applyShare) → COMMIT → only then
//	each record settled: accepted (applied, or found claimed), rejected
//	(set aside in dead_letters by that transaction) → Flush
//
// and it polls again only once every record of the last poll is settled
// and flushed (kafkaclient.ShareMember refuses otherwise): a record is
// never accepted before the transaction that claimed it committed. A
// record whose accept is lost is delivered again and found claimed; two
// members holding one record (its lock ran out under the first) meet on
// the claim, and one of them applies it.
type shareMember struct {
	*deps
	m kafkaclient.ShareMember
	// settings are the group's: its delivery limit, and its lock
	// duration, which paces the renewals (see shareLocks).
	settings kafkaadmin.ShareSettings
	// key tells this member's open batches from those of the other
	// members sharing a partition (see txAttempt.openTopic).
	key   string
	locks *shareLocks
}

// runShare is Run for a share group, on client, once the consumer's
// background work runs: it joins, consumes until ctx ends, releases what
// it still holds and leaves.
func (c *Consumer) runShare(ctx context.Context, client kafkaclient.Client, joined func()) error {
	joiner, ok := client.(shareJoiner)
	if !ok {
		return errors.New("consumer: the Kafka client has no share groups: use KafkaClient FranzGo")
	}
	cfg, err := c.clientConfig()
	if err != nil {
		return err
	}
	admin, err := kafkaadmin.New(cfg)
	if err != nil {
		return fmt.Errorf("consumer: %w", err)
	}
	defer admin.Close()
	c.health.outSince.Store(time.Now().UnixNano())
	var settings kafkaadmin.ShareSettings
	var m kafkaclient.ShareMember
	err = c.retryKafka(ctx, "could not join the share group", func() error {
		if settings, err = admin.ShareSettings(ctx, c.cfg.GroupID); err != nil {
			return err
		}
		m, err = joiner.JoinShare(ctx, kafkaclient.ShareConfig{Group: c.cfg.GroupID, Topics: c.cfg.Topics, MaxRecords: c.cfg.MaxBatch})
		return err
	})
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return fmt.Errorf("consumer: %w", err)
	}
	joined()
	c.health.inGroup.Store(true)
	defer func() {
		c.health.inGroup.Store(false)
		c.health.polled(nil)
	}()
	s := &shareMember{deps: c.deps, m: m, settings: settings, key: newShareKey()}
	s.locks = newShareLocks(s)
	c.log.Info("share group member joined", slog.String("group", c.cfg.GroupID), slog.Int("delivery_limit", settings.DeliveryLimit),
		slog.Duration("lock_duration", settings.LockDuration), slog.String("start", settings.Start))
	runErr := s.run(ctx)
	closeCtx, cancel := cleanup.Context(context.WithoutCancel(ctx))
	defer cancel()
	if err := m.Close(closeCtx); err != nil {
		c.log.Warn("leaving the share group failed; its records are delivered again once their locks run out", slog.String("error", err.Error()))
	}
	if runErr != nil {
		return fmt.Errorf("consumer: %w", runErr)
	}
	c.log.Info("consumer stopped")
	return nil
}

// retryKafka runs fn until it succeeds or ctx ends, backing off and
// logging between tries: a worker that starts before its brokers waits
// for them.
func (c *Consumer) retryKafka(ctx context.Context, what string, fn func() error) error {
	b := c.retry.New()
	for {
		err := fn()
		if err == nil {
			return nil
		}
		c.log.Warn(what+"; trying again", slog.String("error", err.Error()))
		if err := retry.Sleep(ctx, b.Next()); err != nil {
			return err
		}
	}
}

// newShareKey is a member's key: random, so that two consumers of one
// name, in one process or two, never share one.
func newShareKey() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// run polls and applies until ctx ends, or until applyShare says the
// member must stop (its error). A batch in progress when ctx ends has
// ShutdownTimeout to finish (the transaction runs on work); the records it
// did not settle are released, for another member to take.
func (s *shareMember) run(ctx context.Context) error {
	stop, work, _, release := partitionContexts(ctx, s.cfg.ShutdownTimeout)
	defer release()
	b := s.retry.New()
	for stop.Err() == nil {
		if s.waitWhilePaused(stop); stop.Err() != nil {
			break
		}
		// A poll waits at most pollWait: one that ends with nothing and no
		// failure says that polls work again (see Health).
		pollCtx, cancel := context.WithTimeout(stop, s.pollWait())
		recs, err := s.m.Poll(pollCtx)
		waited := pollCtx.Err() != nil
		cancel()
		if err != nil {
			if stop.Err() != nil {
				break
			}
			if waited && errors.Is(err, context.DeadlineExceeded) {
				s.health.polled(nil)
				continue
			}
			if errors.Is(err, kafkaclient.ErrUnsettled) {
				// The last poll's settlements are made, but a flush that
				// outlasted its bound did not bring their answers: flush
				// again, or the member never polls again.
				s.locks.flush(stop)
			}
			s.health.polled(err)
			s.log.Warn("share group poll failed; polling again", slog.String("error", err.Error()))
			_ = retry.Sleep(stop, b.Next())
			continue
		}
		b.Reset()
		s.health.polled(nil)
		if len(recs) == 0 {
			continue
		}
		s.locks.hold(work, recs)
		s.delivered(work, recs)
		var stopErr error
		for _, group := range byPartition(recs) {
			if stop.Err() != nil || stopErr != nil {
				break
			}
			stopErr = s.applyShare(stop, work, group)
		}
		// Whatever was not settled (a shutdown cut the poll's work short,
		// or the member stops) goes back to the group at once.
		s.locks.releaseRest(work)
		if stopErr != nil {
			return stopErr
		}
	}
	return nil
}

// byPartition groups recs by partition, each group in offset order: one
// transaction per partition's records keeps a transaction's claims on one
// partition, as in a consumer group.
func byPartition(recs []kafkaclient.ShareRecord) [][]kafkaclient.ShareRecord {
	recs = slices.Clone(recs)
	slices.SortStableFunc(recs, func(a, b kafkaclient.ShareRecord) int {
		return cmp.Or(strings.Compare(a.Topic, b.Topic), cmp.Compare(a.Partition, b.Partition), cmp.Compare(a.Offset, b.Offset))
	})
	var out [][]kafkaclient.ShareRecord
	for i := 0; i < len(recs); {
		j := i + 1
		for j < len(recs) && recs[j].TopicPartition == recs[i].TopicPartition {
			j++
		}
		out = append(out, recs[i:j])
		i = j
	}
	return out
}

// lastDelivery reports whether r is on its last delivery: released or
// left to run out now, the broker would archive it without a word.
func (s *shareMember) lastDelivery(r *kafkaclient.ShareRecord) bool {
	return s.settings.DeliveryLimit > 0 && r.DeliveryCount >= s.settings.DeliveryLimit
}

// pollWait is how long a poll waits for records: a fraction of
// StallAfter, so that a member whose polls work again is ready again well
// before it would count as stalled.
func (s *shareMember) pollWait() time.Duration {
	return min(max(s.cfg.StallAfter/2, 100*time.Millisecond), 5*time.Second)
}

// renewEvery is how often held records are renewed: at half the lock
// duration, so a renewal that takes a while still lands in time.
func (s *shareMember) renewEvery() time.Duration {
	return max(s.settings.LockDuration/2, 10*time.Millisecond)
}
