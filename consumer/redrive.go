package consumer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/jackc/pgx/v5"

	"github.com/kafkaonce/kafkaonce/deadletter"
	"github.com/kafkaonce/kafkaonce/dedupe"
	"github.com/kafkaonce/kafkaonce/internal/txguard"
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
// applied already.
func (c *Consumer) redriveOne(ctx context.Context, letterID int64) (applied bool, err error) {
	var msg *Message
	err = c.inTx(ctx, func(q querier) error {
		tx := q.(pgx.Tx)
		l, err := c.letters.GetForUpdate(ctx, tx, c.cfg.Name, letterID)
		if err != nil {
			return err
		}
		if l.RedrivenAt != nil {
			return errAlreadyApplied
		}
		msg = messageOfLetter(&l)
		id := l.MessageID
		if id == "" {
			if id, err = messageID(c.cfg.MessageID, msg); err != nil {
				return err
			}
		}
		msg.ID = id
		claim := dedupe.Claim{MessageID: id, Fingerprint: dedupe.FingerprintOf(msg.Key, msg.Value), Offset: l.Offset}
		ok, existing, err := c.claims.Reclaim(ctx, tx, c.cfg.Name, l.Topic, l.Partition, claim)
		if err != nil {
			return err
		}
		if !ok {
			if existing.Fingerprint != claim.Fingerprint {
				return &FingerprintConflictError{Topic: l.Topic, Partition: l.Partition, Offset: l.Offset, MessageID: id,
					Fingerprint: claim.Fingerprint, Existing: existing}
			}
			// The id was applied meanwhile (a later copy of the message):
			// the letter is settled.
			if err := c.letters.MarkRedriven(ctx, tx, l.ID); err != nil {
				return err
			}
			return errAlreadySettled
		}
		hctx, cancel := context.WithTimeout(ctx, c.cfg.HandlerTimeout)
		defer cancel()
		gtx := txguard.Wrap(tx)
		herr := c.callHandler(hctx, gtx, msg)
		switch {
		case herr == nil && gtx.Misused():
			herr = ErrTxControlledByConsumer
		case herr == nil && tx.Conn().PgConn().TxStatus() == 'E':
			herr = ErrTxAborted
		}
		if herr != nil {
			return fmt.Errorf("handler: %w", herr)
		}
		return c.letters.MarkRedriven(ctx, tx, l.ID)
	})
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

// callHandler runs the handler, turning a panic into an error that keeps
// the stack.
func (c *Consumer) callHandler(ctx context.Context, tx pgx.Tx, msg *Message) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("%w: %v\n%s", ErrHandlerPanicked, r, stack())
		}
	}()
	if c.cfg.BatchHandler != nil {
		b := &Batch{Tx: tx, Messages: []*Message{msg}}
		if err := c.cfg.BatchHandler.HandleBatch(ctx, b); err != nil {
			return err
		}
		return b.runQueued(ctx, tx)
	}
	return c.cfg.Handler.Handle(ctx, tx, msg)
}

// callBatchHandler runs the BatchHandler over b, turning a panic into an
// error as callHandler does. b's queued statements are left to the caller.
func (c *Consumer) callBatchHandler(ctx context.Context, b *Batch) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("%w: %v\n%s", ErrHandlerPanicked, r, stack())
		}
	}()
	return c.cfg.BatchHandler.HandleBatch(ctx, b)
}
