package engine

import (
	"context"
	"crypto/tls"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"

	"github.com/kafkaonce/kafkaonce/internal/maintenance"
	"github.com/kafkaonce/kafkaonce/kafkaconn"
	"github.com/kafkaonce/kafkaonce/kafkaoncetype"
)

// Config is what the engine runs with: consumer.Config once validated and
// given its defaults (its fields are documented there), with the user's
// handlers, id function and hooks turned into the functions below.
type Config struct {
	Name    string
	Brokers []string
	Topics  []string
	GroupID string

	// Handle applies one message. HandleBatch, when set, applies a batch
	// instead, and Handle is not used.
	Handle      func(ctx context.Context, tx pgx.Tx, msg *kafkaoncetype.Message) error
	HandleBatch func(ctx context.Context, b *Batch) error
	// MessageID derives a message's id: its errors are invalid ids.
	MessageID func(msg *kafkaoncetype.Message) (string, error)
	// MessageIDRule is the text of MessageID's rule, recorded at start-up
	// for kafkaonce's tools; "" for a function of the user's own.
	MessageIDRule string
	Hooks         Hooks

	ClaimFirst  bool
	MaxBatch    int
	MaxWait     time.Duration
	KafkaClient kafkaoncetype.KafkaClient
	TLS         *tls.Config
	SASL        *kafkaconn.SASL
	// Dialer is kafka-go's, for KafkaClient KafkaGo only.
	Dialer               *kafka.Dialer
	InstanceID           string
	MetadataMaxAge       time.Duration
	OpenTransactionAfter time.Duration
	// StallAfter is how long a partition with messages waiting may make no
	// progress before Health calls the consumer not live.
	StallAfter    time.Duration
	StartOffset   kafkaoncetype.StartOffset
	FetchMaxBytes int
	Schema        string
	Logger        *slog.Logger

	ShutdownTimeout          time.Duration
	StatementTimeout         time.Duration
	LockTimeout              time.Duration
	IdleInTransactionTimeout time.Duration
	SessionTimeout           time.Duration
	RebalanceTimeout         time.Duration
	HeartbeatInterval        time.Duration

	MaxAttempts          int
	RetryInitialInterval time.Duration
	RetryMaxInterval     time.Duration
	RetryMaxElapsed      time.Duration
	// RetryLaterAfter (0: only for marked errors), RetryLaterMaxRetries (0:
	// no bound), RetryLaterMaxDelay and RetryLaterMaxElapsed (0: no bound)
	// are Config.RetryLater (see retrylater.go).
	RetryLaterAfter      time.Duration
	RetryLaterMaxRetries int
	RetryLaterMaxDelay   time.Duration
	RetryLaterMaxElapsed time.Duration
	HandlerTimeout       time.Duration

	OnPermanentFailure kafkaoncetype.FailurePolicy
	// CircuitBreaker is consumer.Config's, its defaults given (see
	// breaker.go).
	CircuitBreaker         kafkaoncetype.CircuitBreaker
	DeadLetterTopic        string
	SuspectDuplicateWindow time.Duration
	SuspectDuplicates      kafkaoncetype.SuspectPolicy

	PruneInterval  time.Duration
	PruneRetention time.Duration
	PruneBatch     int
	// Pruners prune the tables of other features (the HTTP front door's
	// keys) with the consumer's own, at PruneInterval.
	Pruners []maintenance.Pruner
}
