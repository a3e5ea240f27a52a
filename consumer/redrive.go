package consumer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/jackc/pgx/v5"

	"github.com/kafkaonce/kafkaonce/deadletter"
	"github.com/kafkaonce/kafkaonce/dedupe"
	"github.com/kafkaonce/kafkaonce/internal/store/claims"
	"github.com/kafkaonce/kafkaonce/internal/usercall"
)

// RedriveFilter selects the dead letters of this consumer to redrive. Only
// letters not yet redriven are considered. Zero fields select everything.
type RedriveFilter struct {
	// IDs selects these letters.
	IDs []int64
	// Topic, and Partition when HasPartition, select by source.
	Topic        string
	Partition    int
	HasPartition bool
	// Class selects by error class.
	Class deadletter.Class
	// Requested selects letters an operator asked to redrive (kafkaonce
	// dead-letters redrive). A running consumer redrives those by itself.
	Requested bool
	// Limit bounds how many letters one call redrives (default 100).
	Limit int
}

// RedriveResult says what a redrive did.
type RedriveResult struct {
	// Applied counts letters whose message the handler applied.
	Applied int
	// AlreadyApplied counts letters found redriven meanwhile, or whose
	// message id was applied in another way (a later duplicate of it).
	AlreadyApplied int
	// Failed lists letters the handler (or the claim) failed for; they stay
	// dead letters.
	Failed []RedriveError
}

// RedriveError is the failure of one letter's redrive.
type RedriveError struct {
	LetterID int64
	Err      error
}

func (e RedriveError) Error() string { return fmt.Sprintf("dead letter %d: %v", e.LetterID, e.Err) }

// Redrive runs dead letters of this consumer through its handler again,
// typically after the bug or the outage that set them aside was fixed. Each
// letter gets a transaction of its own that locks the letter, claims its
// message id again (dead-lettered → applied), runs the handler and marks the
// letter redriven: redriving a letter twice, even at the same time from two
// processes, applies it once.
//
// A redrive runs outside the partition's order: the partition went on past
// the message when it was set aside. Redrive needs no Kafka connection and
// may run while the consumer runs, in this process or another.
func (c *Consumer) Redrive(ctx context.Context, f RedriveFilter) (RedriveResult, error) {
	var letters []deadletter.Letter
	err := c.readOnly(ctx, func(q querier) (err error) {
		letters, err = c.letters.List(ctx, q, deadletter.Filter{
			Consumer: c.cfg.Name, IDs: f.IDs, Topic: f.Topic, Partition: f.Partition, HasPartition: f.HasPartition,
			Class: f.Class, Pending: true, RedriveRequested: f.Requested, Limit: f.Limit,
		})
		return err
	})
	if err != nil {
		return RedriveResult{}, fmt.Errorf("consumer: redrive: %w", err)
	}
	var res RedriveResult
	for _, l := range letters {
		applied, err := c.redriveOne(ctx, l.ID)
		switch {
		case ctx.Err() != nil:
			return res, ctx.Err()
		case err != nil:
			res.Failed = append(res.Failed, RedriveError{LetterID: l.ID, Err: err})
			c.log.Warn("redrive failed; the letter stays", slog.Int64("dead_letter", l.ID), slog.String("error", err.Error()))
			if l.RedriveRequestedAt != nil {
				if merr := c.inTx(ctx, func(q querier) error { return c.letters.MarkRedriveFailed(ctx, q, l.ID, err.Error()) }); merr != nil {
					c.log.Warn("could not record a failed redrive", slog.Int64("dead_letter", l.ID), slog.String("error", merr.Error()))
				}
			}
		case applied:
			res.Applied++
		default:
			res.AlreadyApplied++
		}
	}
	return res, nil
}

// errAlreadyApplied ends a redrive transaction that found nothing to do.
var errAlreadyApplied = errors.New("already applied")

// redriveOne redrives one letter; applied is false when it turned out to be
// applied already. Its transaction runs as an attempt under the handler
// watchdog, as a worker's batch does: a handler that hangs is abandoned
// after HandlerTimeout (or, once ctx ends, after a short grace), so neither
// Redrive nor the consumer's shutdown waits on it.
func (c *Consumer) redriveOne(ctx context.Context, letterID int64) (applied bool, err error) {
	var msg *Message
	err, abandoned := usercall.Run(ctx, c.limits(), func(hctx, ctx context.Context, uc *usercall.Attempt) error {
		bt, err := c.beginWith(ctx, &pgx.Batch{})
		if err != nil {
			return err
		}
		defer bt.rollback(ctx)
		uc.Hold(bt.cutLoose)
		tx := bt.tx
		err = func() error {
			l, err := c.letters.GetForUpdate(ctx, tx, c.cfg.Name, letterID)
			if err != nil {
				return err
			}
			if l.RedrivenAt != nil {
				return errAlreadyApplied
			}
			m := messageOfLetter(&l)
			id := l.MessageID
			if id == "" {
				if id, err = messageID(c.cfg.MessageID, m); err != nil {
					return err
				}
			}
			m.ID = id
			claim := claims.Claim{MessageID: id, Fingerprint: dedupe.FingerprintOf(m.Key, m.Value), Offset: l.Offset}
			ok, existing, err := c.claims.Reclaim(ctx, tx, c.cfg.Name, l.Topic, l.Partition, claim)
			if err != nil {
				return err
			}
			if !ok {
				if existing.Fingerprint != claim.Fingerprint {
					return &FingerprintConflictError{Topic: l.Topic, Partition: l.Partition, Offset: l.Offset, MessageID: id,
						Fingerprint: claim.Fingerprint, Existing: existing}
				}
				// The id was applied meanwhile (a later copy of the
				// message): the letter is settled.
				if err := c.letters.MarkRedriven(ctx, tx, l.ID); err != nil {
					return err
				}
				return errAlreadySettled
			}
			if err := c.handle(hctx, uc, 0, tx, m); err != nil {
				return fmt.Errorf("handler: %w", err)
			}
			msg = m
			return c.letters.MarkRedriven(ctx, tx, l.ID)
		}()
		if err != nil {
			return err
		}
		return bt.commitWith(ctx, &pgx.Batch{})
	})
	if abandoned != nil {
		return false, fmt.Errorf("handler: %w", abandoned.Err())
	}
	switch {
	case errors.Is(err, errAlreadyApplied):
		return false, nil
	case errors.Is(err, errAlreadySettled):
		return false, c.markSettled(ctx, letterID)
	case err != nil:
		return false, err
	}
	for _, h := range c.hooks.applied {
		h.OnMessageApplied(ctx, msg)
	}
	c.log.Info("dead letter redriven", slog.Int64("dead_letter", letterID), slog.String("topic", msg.Topic),
		slog.Int("partition", msg.Partition), slog.Int64("offset", msg.Offset), slog.String("message_id", msg.ID))
	return true, nil
}

// errAlreadySettled rolls back a redrive whose id turned out to be applied;
// markSettled then records that in a transaction of its own.
var errAlreadySettled = errors.New("settled by a later copy")

func (c *Consumer) markSettled(ctx context.Context, letterID int64) error {
	return c.inTx(ctx, func(q querier) error { return c.letters.MarkRedriven(ctx, q, letterID) })
}

func messageOfLetter(l *deadletter.Letter) *Message {
	m := &Message{Topic: l.Topic, Partition: l.Partition, Offset: l.Offset, Key: l.Key, Value: l.Value, Time: l.MessageTime}
	for _, h := range l.Headers {
		m.Headers = append(m.Headers, Header{Key: h.Key, Value: h.Value})
	}
	return m
}
