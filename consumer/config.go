package consumer

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"reflect"
	"slices"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/kafkaonce/kafkaonce/consumer/settings"
	"github.com/kafkaonce/kafkaonce/dedupe"
	"github.com/kafkaonce/kafkaonce/internal/engine"
	"github.com/kafkaonce/kafkaonce/internal/schema"
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

// validate checks a Config that went through withDefaults and returns every
// problem found, each naming the field, the rule and a fix.
func validate(c *Config) error {
	var errs []error
	bad := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("consumer: "+format, args...))
	}
	if err := validateName(c.Name); err != nil {
		bad("Name %v; it names the dedupe scope, e.g. \"ledger\"", err)
	}
	if c.GroupID != c.Name {
		if err := validateName(c.GroupID); err != nil {
			bad("GroupID %v (or leave it empty to use Name)", err)
		}
	}
	if len(c.Brokers) == 0 {
		bad(`Brokers must list at least one broker address, e.g. []string{"localhost:9092"}`)
	}
	for i, b := range c.Brokers {
		if _, port, err := net.SplitHostPort(b); err != nil || port == "" {
			bad("Brokers[%d] must be host:port (got %q)", i, b)
		}
	}
	if len(c.Topics) == 0 {
		bad(`Topics must name at least one topic, e.g. []string{"transfers"}`)
	}
	seen := map[string]bool{}
	for i, t := range c.Topics {
		if err := validateTopic(t); err != nil {
			bad("Topics[%d] %v", i, err)
		}
		if seen[t] {
			bad("Topics[%d] repeats %q; name each topic once", i, t)
		}
		seen[t] = true
	}
	switch {
	case c.Handler == nil && c.BatchHandler == nil:
		bad("Handler must be set: it applies each message, e.g. consumer.HandlerFunc(func(ctx, tx, msg) error { ... }) (or set BatchHandler to apply a batch per call)")
	case c.Handler != nil && c.BatchHandler != nil:
		bad("Handler and BatchHandler are both set; set one: Handler for a call per message, BatchHandler for a call per batch")
	}
	if isNilInside(c.MessageID) {
		// A nil *MessageIDRule (or a nil value of a type of your own)
		// would panic on every message and set each one aside.
		bad("MessageID is a nil %T: set a rule (consumer.IDFromHeader(\"message-id\"), IDFromJSONField, …), a MessageIDFunc, or leave it unset for the default", c.MessageID)
	}
	if r, ok := ruleOf(c.MessageID); ok {
		if err := r.check(); err != nil {
			bad("MessageID %v", err)
		}
	}
	if c.MaxBatch < 1 || c.MaxBatch > MaxMaxBatch {
		bad("MaxBatch must be between 1 and %d (got %d)", MaxMaxBatch, c.MaxBatch)
	}
	if c.MaxWait < 0 || c.MaxWait > 10*time.Second {
		bad("MaxWait must be between 0 and 10s (got %v)", c.MaxWait)
	}
	switch c.KafkaClient {
	case FranzGo:
		if c.Dialer != nil {
			bad("Dialer is kafka-go's and is used only with KafkaClient: consumer.KafkaGo; with franz-go (the default) set TLS and SASL instead")
		}
	case KafkaGo:
		if c.InstanceID != "" {
			bad("InstanceID (static membership) needs KafkaClient: consumer.FranzGo; kafka-go has no static membership")
		}
	default:
		bad("KafkaClient must be consumer.FranzGo or consumer.KafkaGo (got %d)", c.KafkaClient)
	}
	if c.Dialer != nil && (c.TLS != nil || c.SASL != nil) {
		bad("Dialer and TLS or SASL are both set: set the Dialer's own TLS and SASLMechanism, or leave Dialer unset")
	}
	if err := c.SASL.CheckOver(c.TLS); err != nil {
		bad("%v", err)
	}
	if c.InstanceID != "" {
		if err := validateName(c.InstanceID); err != nil {
			bad("InstanceID %v; give each process its own stable id, e.g. the pod's name", err)
		}
	}
	if c.MetadataMaxAge < time.Second || c.MetadataMaxAge > time.Hour {
		bad("MetadataMaxAge must be between 1s and 1h (got %v)", c.MetadataMaxAge)
	}
	if c.OpenTransactionAfter < 100*time.Millisecond {
		bad("OpenTransactionAfter must be at least 100ms (got %v)", c.OpenTransactionAfter)
	}
	if c.StallAfter < time.Second {
		bad("StallAfter must be at least 1s (got %v): it is how long a partition may make no progress before the consumer is reported not live", c.StallAfter)
	}
	if c.StartOffset != StartEarliest && c.StartOffset != StartLatest {
		bad("StartOffset must be StartEarliest or StartLatest (got %d)", c.StartOffset)
	}
	if c.FetchMaxBytes < 1024 || c.FetchMaxBytes > 256<<20 {
		bad("FetchMaxBytes must be between 1 KiB and 256 MiB (got %d)", c.FetchMaxBytes)
	}
	if err := schema.ValidateName(c.Schema); err != nil {
		bad("Schema %v", err)
	}
	if c.ShutdownTimeout < 0 {
		bad("ShutdownTimeout must not be negative (got %v)", c.ShutdownTimeout)
	}
	for _, st := range []struct {
		name string
		d    time.Duration
	}{{"StatementTimeout", c.StatementTimeout}, {"LockTimeout", c.LockTimeout}, {"IdleInTransactionTimeout", c.IdleInTransactionTimeout}} {
		if st.d != LeaveUnset && st.d < time.Millisecond {
			bad("%s must be at least 1ms, or consumer.LeaveUnset to keep the server's setting (got %v)", st.name, st.d)
		}
	}
	if c.SessionTimeout < time.Second {
		bad("SessionTimeout must be at least 1s (got %v)", c.SessionTimeout)
	}
	if c.RebalanceTimeout < time.Second {
		bad("RebalanceTimeout must be at least 1s (got %v)", c.RebalanceTimeout)
	}
	if c.HeartbeatInterval <= 0 || c.HeartbeatInterval*3 > c.SessionTimeout {
		bad("HeartbeatInterval must be positive and at most a third of SessionTimeout (%v), so a member heartbeats a few times per session (got %v)", c.SessionTimeout, c.HeartbeatInterval)
	}
	if c.Retry.InitialInterval <= 0 || c.Retry.MaxInterval < c.Retry.InitialInterval {
		bad("Retry.InitialInterval must be positive and at most Retry.MaxInterval (got %v and %v)", c.Retry.InitialInterval, c.Retry.MaxInterval)
	}
	if c.Retry.MaxAttempts < 1 || c.Retry.MaxAttempts > 1000 {
		bad("Retry.MaxAttempts must be between 1 and 1000 (got %d)", c.Retry.MaxAttempts)
	}
	if c.Retry.MaxElapsed < 0 {
		bad("Retry.MaxElapsed must not be negative (got %v)", c.Retry.MaxElapsed)
	}
	if c.RetryLater.After < 0 || c.RetryLater.After > c.RetryLater.MaxDelay {
		bad("RetryLater.After must be between 0 and RetryLater.MaxDelay (got %v and %v)", c.RetryLater.After, c.RetryLater.MaxDelay)
	}
	switch {
	case c.RetryLater.MaxElapsed < 0:
		bad("RetryLater.MaxElapsed must not be negative (got %v)", c.RetryLater.MaxElapsed)
	case c.RetryLater.MaxElapsed > 0 && c.RetryLater.MaxRetries == 0:
		// Bounded by time alone.
	case c.RetryLater.MaxRetries < 1 || c.RetryLater.MaxRetries > 1000:
		bad("RetryLater.MaxRetries must be between 1 and 1000 (got %d)", c.RetryLater.MaxRetries)
	}
	if c.RetryLater.After > 0 && c.OnPermanentFailure == StopPartition {
		bad("RetryLater.After sets failing messages aside, and OnPermanentFailure StopPartition stops the partition instead: a consumer that must not skip a message cannot retry it later; leave RetryLater.After zero, or use DeadLetter")
	}
	checkBreaker(c.CircuitBreaker, bad)
	if c.HandlerTimeout < 10*time.Millisecond {
		bad("HandlerTimeout must be at least 10ms (got %v)", c.HandlerTimeout)
	}
	if c.LockTimeout != LeaveUnset && c.LockTimeout >= c.HandlerTimeout {
		bad("LockTimeout must be shorter than HandlerTimeout (got %v and %v): a wait for a row lock that HandlerTimeout cuts counts as the message's failure and sets it aside after Retry.MaxAttempts, where one that LockTimeout ends is contention, retried without counting; lower LockTimeout (or leave it unset: it then defaults to half of HandlerTimeout when that is under %v) or raise HandlerTimeout",
			c.LockTimeout, c.HandlerTimeout, 2*DefaultLockTimeout)
	}
	if c.IdleInTransactionTimeout != LeaveUnset && c.IdleInTransactionTimeout >= time.Millisecond && c.IdleInTransactionTimeout <= c.HandlerTimeout {
		bad("IdleInTransactionTimeout must be longer than HandlerTimeout (got %v and %v): a handler working without statements (a slow lookup) would have its transaction ended by the server on every attempt, and the batch would be retried for ever; raise IdleInTransactionTimeout or lower HandlerTimeout",
			c.IdleInTransactionTimeout, c.HandlerTimeout)
	}
	if c.OnPermanentFailure != DeadLetter && c.OnPermanentFailure != StopPartition {
		bad("OnPermanentFailure must be DeadLetter or StopPartition (got %d)", c.OnPermanentFailure)
	}
	if c.DeadLetterTopic != "" {
		if err := validateTopic(c.DeadLetterTopic); err != nil {
			bad("DeadLetterTopic %v", err)
		}
		for _, t := range c.Topics {
			if t == c.DeadLetterTopic {
				bad("DeadLetterTopic must not be one of Topics (%q): the consumer would read its own dead letters", t)
			}
		}
	}
	if c.SuspectDuplicateWindow != LeaveUnset && c.SuspectDuplicateWindow < time.Second {
		bad("SuspectDuplicateWindow must be at least 1s, or consumer.LeaveUnset to turn detection off (got %v)", c.SuspectDuplicateWindow)
	}
	if c.SuspectDuplicates != ReportSuspects && c.SuspectDuplicates != SkipSuspects {
		bad("SuspectDuplicates must be ReportSuspects or SkipSuspects (got %d)", c.SuspectDuplicates)
	}
	if c.Prune.Interval < 0 {
		bad("Prune.Interval must not be negative (got %v)", c.Prune.Interval)
	}
	if c.Prune.Retention < dedupe.MinRetention {
		bad("Prune.Retention must be at least %v, so that producer re-sends are still recognised (got %v)", dedupe.MinRetention, c.Prune.Retention)
	}
	if c.Prune.Batch < 1 || c.Prune.Batch > 100000 {
		bad("Prune.Batch must be between 1 and 100000 (got %d)", c.Prune.Batch)
	}
	if len(c.Pruners) > 0 && c.Prune.Interval == 0 {
		bad("Pruners are set but Prune.Interval is 0, so they would never run: set Prune.Interval, or leave Pruners empty and run kafkaonce prune")
	}
	for i, p := range c.Pruners {
		if p.Step == nil {
			bad("Pruners[%d] (%q) has no Step: take a feature's own, such as idempotency.Store.Pruner()", i, p.Table)
		}
	}
	return errors.Join(errs...)
}

func validateName(s string) error {
	switch {
	case s == "":
		return errors.New("must be set")
	case len(s) > MaxNameLen:
		return fmt.Errorf("must be at most %d bytes (got %d)", MaxNameLen, len(s))
	case !utf8.ValidString(s):
		return errors.New("must be valid UTF-8")
	case strings.IndexFunc(s, func(r rune) bool { return !unicode.IsPrint(r) }) >= 0:
		return fmt.Errorf("must be printable, without control characters or spaces other than ' ' (got %q)", s)
	case strings.TrimSpace(s) != s:
		return fmt.Errorf("must not start or end with spaces (got %q)", s)
	}
	return nil
}

// validateTopic applies Kafka's rules for topic names.
func validateTopic(t string) error {
	switch {
	case t == "":
		return errors.New("must not be empty")
	case t == "." || t == "..":
		return fmt.Errorf("must not be %q", t)
	case len(t) > 249:
		return fmt.Errorf("must be at most 249 characters (got %d)", len(t))
	}
	for _, r := range t {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '.' || r == '_' || r == '-') {
			return fmt.Errorf("must use only letters, digits, '.', '_' and '-' (got %q)", t)
		}
	}
	return nil
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
