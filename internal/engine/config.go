package engine

import (
	"context"

	"github.com/jackc/pgx/v5"

	"github.com/kafkaonce/kafkaonce/consumer/settings"
	"github.com/kafkaonce/kafkaonce/kafkaoncetype"
)

// Config is what the engine runs with: the user's consumer.Config whole,
// validated and given its defaults (its fields are documented in package
// settings), and beside it the user's handlers, id function and hooks
// turned into the functions below.
type Config struct {
	settings.Config

	// Handle applies one message. HandleBatch, when set, applies a batch
	// instead, and Handle is not used.
	Handle      func(ctx context.Context, tx pgx.Tx, msg *kafkaoncetype.Message) error
	HandleBatch func(ctx context.Context, b *Batch) error
	// DeriveID is Config.MessageID as a function: its errors are invalid
	// ids.
	DeriveID func(msg *kafkaoncetype.Message) (string, error)
	// MessageIDRule is the text of MessageID's rule, recorded at start-up
	// for kafkaonce's tools; "" for a function of the user's own.
	MessageIDRule string
	// HookFuncs are Config.Hooks, sorted by the events they observe.
	HookFuncs Hooks
}
