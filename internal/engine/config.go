package engine

import (
	"context"
	"crypto/tls"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"

	"github.com/kafkaonce/kafkaonce/kafkaconn"
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
	Handle      func(ctx context.Context, tx pgx.Tx, msg *Message) error
	HandleBatch func(ctx context.Context, b *Batch) error
	// MessageID derives a message's id: its errors are invalid ids.
	MessageID func(msg *Message) (string, error)
	// MessageIDRule is the text of MessageID's rule, recorded at start-up
	// for kafkaonce's tools; "" for a function of the user's own.
	MessageIDRule string
	Hooks         Hooks

	ClaimFirst  bool
	MaxBatch    int
	MaxWait     time.Duration
	KafkaClient KafkaClient
	TLS         *tls.Config
	SASL        *kafkaconn.SASL
	// Dialer is kafka-go's, for KafkaClient KafkaGo only.
	Dialer               *kafka.Dialer
	InstanceID           string
	MetadataMaxAge       time.Duration
	OpenTransactionAfter time.Duration
	StartOffset          StartOffset
	FetchMaxBytes        int
	Schema               string
	Logger               *slog.Logger

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
	HandlerTimeout       time.Duration

	OnPermanentFailure     FailurePolicy
	DeadLetterTopic        string
	SuspectDuplicateWindow time.Duration
	SuspectDuplicates      SuspectPolicy

	PruneInterval  time.Duration
	PruneRetention time.Duration
	PruneBatch     int
}

// LeaveUnset, as a session timeout, leaves the server's setting in force.
const LeaveUnset time.Duration = -1

// StartOffset, FailurePolicy and SuspectPolicy mirror the consumer
// package's types of the same names, value for value.
type (
	StartOffset   int
	FailurePolicy int
	SuspectPolicy int
)

const (
	StartEarliest StartOffset = iota
	StartLatest
)

const (
	DeadLetter FailurePolicy = iota
	StopPartition
)

const (
	ReportSuspects SuspectPolicy = iota
	SkipSuspects
)

// SuspectWindowMessages bounds the suspect-duplicate memory: the last this
// many messages of each partition.
const SuspectWindowMessages = 20000
