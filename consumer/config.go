package consumer

import (
	"log/slog"
	"reflect"
	"slices"
	"time"

	"github.com/kafkaonce/kafkaonce/consumer/settings"
	"github.com/kafkaonce/kafkaonce/dedupe"
	"github.com/kafkaonce/kafkaonce/internal/engine"
	"github.com/kafkaonce/kafkaonce/kafkaoncetype"
)

// Defaults for Config fields left at their zero value.
const (
	DefaultMaxBatch                 = 1000
	DefaultMaxWait                  = 5 * time.Millisecond
	DefaultSchema                   = kafkaoncetype.DefaultSchema
	DefaultShutdownTimeout          = 10 * time.Second
	DefaultStatementTimeout         = 30 * time.Second
	DefaultLockTimeout              = 10 * time.Second
	DefaultIdleInTransactionTimeout = 60 * time.Second
	DefaultSessionTimeout           = 30 * time.Second
	DefaultRebalanceTimeout         = 30 * time.Second
	DefaultHeartbeatInterval        = 3 * time.Second
	DefaultFetchMaxBytes            = 1 << 20
	DefaultRetryInitialInterval     = 100 * time.Millisecond
	DefaultRetryMaxInterval         = 5 * time.Second
	DefaultMaxAttempts              = 5
	DefaultRetryMaxElapsed          = 10 * time.Minute
	DefaultHandlerTimeout           = 30 * time.Second
	DefaultSuspectDuplicateWindow   = 10 * time.Minute
	DefaultPruneBatch               = dedupe.DefaultPruneBatch
	DefaultMetadataMaxAge           = 30 * time.Second
	DefaultOpenTransactionAfter     = time.Minute
	DefaultStallAfter               = 5 * time.Minute

	// SuspectWindowMessages bounds the suspect-duplicate memory: the last
	// this many messages of each partition.
	SuspectWindowMessages = kafkaoncetype.SuspectWindowMessages

	// MaxMaxBatch bounds MaxBatch: a batch is one transaction, and its
	// messages are held in memory until it commits.
	MaxMaxBatch = 10000
	// MaxNameLen bounds Name and GroupID.
	MaxNameLen = 200
)

// LeaveUnset, given as a session timeout, leaves the server's or role's
// setting in force instead of setting one.
const LeaveUnset = kafkaoncetype.LeaveUnset

// KafkaClient selects the library the consumer speaks Kafka with: FranzGo
// (the default) or KafkaGo. docs/design.md compares the two.
type KafkaClient = kafkaoncetype.KafkaClient

const (
	FranzGo = kafkaoncetype.FranzGo
	KafkaGo = kafkaoncetype.KafkaGo
)

// GroupType says which kind of Kafka group the consumer is a member of:
// ConsumerGroup (the default) or ShareGroup.
type GroupType = kafkaoncetype.GroupType

const (
	ConsumerGroup = kafkaoncetype.ConsumerGroup
	ShareGroup    = kafkaoncetype.ShareGroup
)

// GroupProtocol says which protocol a consumer group's members speak:
// ClassicProtocol (the default) or ConsumerProtocol (KIP-848).
type GroupProtocol = kafkaoncetype.GroupProtocol

const (
	ClassicProtocol  = kafkaoncetype.ClassicProtocol
	ConsumerProtocol = kafkaoncetype.ConsumerProtocol
)

// StartOffset says where a partition starts when neither Kafka nor Postgres
// has a position for it: StartEarliest (the default) or StartLatest.
type StartOffset = kafkaoncetype.StartOffset

const (
	StartEarliest = kafkaoncetype.StartEarliest
	StartLatest   = kafkaoncetype.StartLatest
)

// FailurePolicy says what happens to a message that cannot be applied:
// DeadLetter (the default) or StopPartition.
type FailurePolicy = kafkaoncetype.FailurePolicy

const (
	DeadLetter    = kafkaoncetype.DeadLetter
	StopPartition = kafkaoncetype.StopPartition
)

// SuspectPolicy says what to do with a suspect duplicate: ReportSuspects
// (the default) or SkipSuspects.
type SuspectPolicy = kafkaoncetype.SuspectPolicy

const (
	ReportSuspects = kafkaoncetype.ReportSuspects
	SkipSuspects   = kafkaoncetype.SkipSuspects
)

// Config configures a Consumer. Only Name, Brokers, Topics and a Handler
// or a BatchHandler are required; every other field has a default, named
// in its doc (see settings.Config for the fields). It is declared in
// package settings so that the consumer's engine holds it whole.
type Config = settings.Config

// withDefaults returns a copy of c with zero fields set to their defaults.
// Slices are copied so that the caller changing its Config after New has no
// effect.
func withDefaults(c *Config) Config {
	out := *c
	out.Brokers = slices.Clone(c.Brokers)
	out.Topics = slices.Clone(c.Topics)
	out.Hooks = slices.Clone(c.Hooks)
	out.Pruners = slices.Clone(c.Pruners)
	setDefault(&out.GroupID, c.Name)
	if f, ok := out.MessageID.(MessageIDFunc); out.MessageID == nil || ok && f == nil {
		// A nil MessageIDFunc is as unset as a nil field: it would
		// otherwise panic on every message.
		out.MessageID = IDFromHeader(DefaultMessageIDHeader)
	}
	setDefault(&out.MaxBatch, DefaultMaxBatch)
	setDefault(&out.MaxWait, DefaultMaxWait)
	setDefault(&out.FetchMaxBytes, DefaultFetchMaxBytes)
	setDefault(&out.Schema, DefaultSchema)
	if out.Logger == nil {
		out.Logger = slog.Default()
	}
	setDefault(&out.ShutdownTimeout, DefaultShutdownTimeout)
	setDefault(&out.StatementTimeout, DefaultStatementTimeout)
	setDefault(&out.HandlerTimeout, DefaultHandlerTimeout)
	// A lock wait must end as a lock_timeout (contention: retried without
	// counting) before HandlerTimeout cuts it (the message's failure).
	setDefault(&out.LockTimeout, min(DefaultLockTimeout, out.HandlerTimeout/2))
	setDefault(&out.IdleInTransactionTimeout, DefaultIdleInTransactionTimeout)
	setDefault(&out.SessionTimeout, DefaultSessionTimeout)
	setDefault(&out.RebalanceTimeout, DefaultRebalanceTimeout)
	setDefault(&out.HeartbeatInterval, DefaultHeartbeatInterval)
	setDefault(&out.Retry.InitialInterval, DefaultRetryInitialInterval)
	setDefault(&out.Retry.MaxInterval, DefaultRetryMaxInterval)
	setDefault(&out.Retry.MaxAttempts, DefaultMaxAttempts)
	setDefault(&out.Retry.MaxElapsed, DefaultRetryMaxElapsed)
	if out.RetryLater.MaxElapsed == 0 {
		setDefault(&out.RetryLater.MaxRetries, DefaultRetryLaterMaxRetries)
	}
	setDefault(&out.RetryLater.MaxDelay, DefaultRetryLaterMaxDelay)
	if out.CircuitBreaker.Failures > 0 {
		b := &out.CircuitBreaker
		b.Classes = slices.Clone(b.Classes)
		setDefault(&b.Window, kafkaoncetype.DefaultBreakerWindow)
		setDefault(&b.CoolDown, kafkaoncetype.DefaultBreakerCoolDown)
		setDefault(&b.MaxCoolDown, max(kafkaoncetype.DefaultBreakerMaxCoolDown, b.CoolDown))
	}
	setDefault(&out.SuspectDuplicateWindow, DefaultSuspectDuplicateWindow)
	setDefault(&out.MetadataMaxAge, DefaultMetadataMaxAge)
	setDefault(&out.OpenTransactionAfter, DefaultOpenTransactionAfter)
	setDefault(&out.StallAfter, DefaultStallAfter)
	setDefault(&out.Prune.Retention, dedupe.DefaultRetention)
	setDefault(&out.Prune.Batch, DefaultPruneBatch)
	return out
}

func setDefault[T comparable](field *T, def T) {
	var zero T
	if *field == zero {
		*field = def
	}
}

// engineConfig is what the engine runs with: c, validated and with its
// defaults, whole, beside its handler and id function turned into the
// functions the engine calls and its hooks sorted.
func engineConfig(c *Config, hooks engine.Hooks) engine.Config {
	return engine.Config{
		Config:        *c,
		Handle:        handleFunc(c.Handler),
		HandleBatch:   handleBatchFunc(c.BatchHandler),
		DeriveID:      messageIDFunc(c.MessageID),
		MessageIDRule: ruleText(c.MessageID),
		HookFuncs:     hooks,
	}
}

// isNilInside reports whether v is a non-nil interface holding a nil
// pointer, func, map, slice, channel or interface.
func isNilInside(v any) bool {
	if v == nil {
		return false
	}
	switch rv := reflect.ValueOf(v); rv.Kind() {
	case reflect.Pointer, reflect.Func, reflect.Map, reflect.Slice, reflect.Chan, reflect.Interface:
		return rv.IsNil()
	}
	return false
}
