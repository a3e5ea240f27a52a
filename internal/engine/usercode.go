package engine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"

	"github.com/kafkaonce/kafkaonce/consumer/settings"
	"github.com/kafkaonce/kafkaonce/internal/usercall"
	"github.com/kafkaonce/kafkaonce/kafkaoncetype"
)

// handlerCutoffGrace is how long a handler whose context was cancelled
// (HandlerTimeout passed, or the consumer is shutting down) may take to
// return before its attempt is abandoned.
const handlerCutoffGrace = 2 * time.Second

// userCode is the user's code as the engine calls it: the handler (or
// batch handler) and the message id function. Every call of them goes
// through here, from a worker's batch, a redrive and consumertest.Handle
// alike, under the same rules: the bounds of limits (HandlerTimeout, then
// abandonment), panics recovered, the transaction guarded, and an aborted
// transaction or rows left open turned into errors (see internal/usercall).
type userCode struct {
	handle      func(ctx context.Context, tx pgx.Tx, msg *kafkaoncetype.Message) error
	handleBatch func(ctx context.Context, b *Batch) error // nil without a BatchHandler
	messageID   func(msg *kafkaoncetype.Message) (string, error)
	limits      usercall.Limits
	log         *slog.Logger
}

func newUserCode(cfg *Config, log *slog.Logger) userCode {
	return userCode{handle: cfg.Handle, handleBatch: cfg.HandleBatch, messageID: cfg.DeriveID,
		limits: usercall.Limits{Timeout: cfg.HandlerTimeout, Grace: handlerCutoffGrace}, log: log}
}

// call calls the handler for one message, the item at index i of the
// attempt, with tx. A BatchHandler gets a Batch of that message, and its
// queued statements run in tx before the call counts as done.
func (u *userCode) call(ctx context.Context, uc *usercall.Attempt, i int, tx pgx.Tx, msg *kafkaoncetype.Message) error {
	if u.handleBatch == nil {
		return uc.Call(ctx, i, tx, func(ctx context.Context, tx pgx.Tx) error {
			return u.handle(ctx, tx, msg)
		})
	}
	return uc.Call(ctx, i, tx, func(ctx context.Context, tx pgx.Tx) error {
		b := u.newBatch([]*kafkaoncetype.Message{msg}, []int{i})
		b.Tx = tx
		if err := u.handleBatch(ctx, b); err != nil {
			b.seal()
			return err
		}
		if err := b.runQueued(ctx, tx); err != nil {
			return err
		}
		return b.refusal()
	})
}

// callBatch calls the BatchHandler with b, giving it tx. b is sealed when
// the call ends; its queued statements are left to the caller.
func (u *userCode) callBatch(ctx context.Context, uc *usercall.Attempt, tx pgx.Tx, b *Batch) error {
	err := uc.CallFor(ctx, b.index[0], len(b.index), tx, func(ctx context.Context, tx pgx.Tx) error {
		b.Tx = tx
		return u.handleBatch(ctx, b)
	})
	b.seal()
	if err == nil {
		err = b.refusal()
	}
	return err
}

// id derives and validates msg's id, wrapping any problem as a
// MessageError around ErrInvalidMessageID.
func (u *userCode) id(msg *kafkaoncetype.Message) (string, error) {
	id, err := u.callID(msg)
	if err == nil {
		if verr := ValidateMessageID(id); verr != nil {
			err = fmt.Errorf("%w: the id %s", kafkaoncetype.ErrInvalidMessageID, verr)
		}
	} else {
		err = fmt.Errorf("%w: %v", kafkaoncetype.ErrInvalidMessageID, err)
	}
	if err != nil {
		shown := id
		if !utf8.ValidString(shown) || strings.IndexByte(shown, 0) >= 0 || len(shown) > 64 {
			shown = "" // never echo unprintable or huge ids into logs
		}
		return "", &kafkaoncetype.MessageError{Topic: msg.Topic, Partition: msg.Partition, Offset: msg.Offset, MessageID: shown, Err: err}
	}
	return id, nil
}

// callID calls the id function. A panicking one gives an invalid id, not
// a crash: a bug in one id function must not take down every partition of
// the process.
func (u *userCode) callID(msg *kafkaoncetype.Message) (id string, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("MessageID function panicked: %v", r)
		}
	}()
	return u.messageID(msg)
}

// ValidateMessageID checks the rules every message id must meet to be
// stored as a Postgres text key (see consumer.ValidateMessageID).
func ValidateMessageID(id string) error {
	switch {
	case id == "":
		return errors.New("is empty")
	case len(id) > kafkaoncetype.MaxMessageIDLen:
		return fmt.Errorf("is %d bytes long, more than the %d allowed", len(id), kafkaoncetype.MaxMessageIDLen)
	case strings.IndexByte(id, 0) >= 0:
		return errors.New("contains a NUL byte, which Postgres text cannot store")
	case !utf8.ValidString(id):
		return errors.New("is not valid UTF-8")
	}
	return nil
}

// newBatch makes the Batch of one BatchHandler call. A Batch is never
// reused: a goroutine the handler left behind holds only its own.
func (u *userCode) newBatch(msgs []*kafkaoncetype.Message, index []int) *Batch {
	return &Batch{Messages: msgs, index: index, late: u.lateQueue}
}

// lateQueue reports a statement queued after its BatchHandler call ended.
func (u *userCode) lateQueue(sql string) {
	u.log.Error("a BatchHandler queued a statement after its call had ended (returned, or abandoned after HandlerTimeout); the statement was dropped: queue only from within HandleBatch",
		slog.String("statement", truncate(sql, 200)))
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

// HandleAlone runs handle for msg in tx, outside any batch, as a worker
// runs a handler: the same code, the same rules (see userCode), with
// timeout for HandlerTimeout. It is consumertest's way in, so that a test
// runs a handler exactly as the consumer does. With handleBatch set
// instead of handle, a BatchHandler gets a Batch of msg alone and its
// queued statements run in tx, as after a batch that failed. abandoned is
// set when the handler hung and was cut off: tx's connection is then
// closed.
func HandleAlone(ctx context.Context, timeout time.Duration, tx pgx.Tx, handle func(context.Context, pgx.Tx, *kafkaoncetype.Message) error, handleBatch func(context.Context, *Batch) error, msg *kafkaoncetype.Message) (err, abandoned error) {
	u := newUserCode(&Config{Handle: handle, HandleBatch: handleBatch, Config: settings.Config{HandlerTimeout: timeout}}, slog.Default())
	err, ab := usercall.Run(ctx, u.limits, func(hctx, _ context.Context, uc *usercall.Attempt) error {
		uc.SetConn(tx.Conn().PgConn().Conn())
		return u.call(hctx, uc, 0, tx, msg)
	})
	if ab != nil {
		return nil, ab.Err()
	}
	return err, nil
}
