package outbox

import (
	"crypto/tls"
	"log/slog"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/kafkaonce/kafkaonce/kafkaconn"
	"github.com/kafkaonce/kafkaonce/kafkaoncetype"
)

// Defaults of RelayConfig.
const (
	DefaultBatchSize            = 500
	DefaultPollInterval         = 50 * time.Millisecond
	DefaultMaxAttempts          = 10
	DefaultRetryInitialInterval = time.Second
	DefaultRetryMaxInterval     = 5 * time.Minute
	DefaultRetryBudget          = 0.1
	DefaultMinRetriesPerMinute  = 10
	DefaultConcurrency          = 8
	DefaultLockBuckets          = 16
	DefaultDeliveryTimeout      = 30 * time.Second
)

// KafkaClient selects the library the relay publishes to Kafka with:
// FranzGo (the default) or KafkaGo, as consumer.Config.KafkaClient does.
type KafkaClient = kafkaoncetype.KafkaClient

const (
	// FranzGo publishes with franz-go's idempotent producer: a produce
	// request the client retries after the broker wrote it is not written
	// twice.
	FranzGo = kafkaoncetype.FranzGo
	// KafkaGo publishes with segmentio/kafka-go, for programs that
	// configure kafka-go already (see RelayConfig.Dialer). A retried
	// request may write a record twice; consumers deduplicate it by id.
	KafkaGo = kafkaoncetype.KafkaGo
)

// RelayConfig configures a Relay. Zero fields take the defaults named.
type RelayConfig struct {
	// Schema holds the outbox table. Defaults to "kafkaonce".
	Schema string

	// Brokers are where the relay publishes to Kafka: each row's
	// Destination is the topic, its id the message-id header.
	Brokers []string
	// KafkaClient is the library the relay publishes with (see
	// KafkaClient). Defaults to FranzGo.
	KafkaClient KafkaClient
	// TLS and SASL secure the connections to the brokers, as in
	// consumer.Config (see docs/security.md), with either client. Default:
	// plaintext, no authentication.
	TLS  *tls.Config
	SASL *kafkaconn.SASL
	// Dialer, instead of TLS and SASL, is a kafka-go dialer whose TLS and
	// SASL settings the relay uses, for KafkaClient KafkaGo only (NewRelay
	// refuses it with franz-go, which takes TLS and SASL).
	Dialer *kafka.Dialer
	// MessageIDHeader names the header carrying the row id. Defaults to
	// "message-id", the header kafkaonce consumers read by default.
	MessageIDHeader string

	// Deliver, when set, receives every row instead of Kafka.
	Deliver DeliverFunc

	// Destinations limits the relay to these destinations. Defaults to all.
	Destinations []string

	// BatchSize bounds the rows one round takes. Defaults to
	// DefaultBatchSize.
	BatchSize int
	// PollInterval is the pause after a round that found less than a full
	// batch. Defaults to DefaultPollInterval.
	PollInterval time.Duration

	// MaxAttempts bounds the attempts at one row; then it is parked.
	// Defaults to DefaultMaxAttempts.
	MaxAttempts int
	// Retries wait random(0, min(RetryMaxInterval, RetryInitialInterval·2^n)),
	// or longer when the receiver said Retry-After. Defaults:
	// DefaultRetryInitialInterval, DefaultRetryMaxInterval.
	RetryInitialInterval time.Duration
	RetryMaxInterval     time.Duration
	// RetryBudget and MinRetriesPerMinute cap retries per minute at
	// MinRetriesPerMinute + RetryBudget × successful deliveries, so a
	// receiver that is down gets a trickle of retries, not a flood. Retries
	// over the budget wait, without using up an attempt. Defaults:
	// DefaultRetryBudget, DefaultMinRetriesPerMinute.
	RetryBudget         float64
	MinRetriesPerMinute int

	// Concurrency bounds parallel Deliver calls (different keys). Defaults to
	// DefaultConcurrency.
	Concurrency int
	// LockBuckets is how many key buckets (of Buckets) one round may take;
	// other relays take the rest. Defaults to DefaultLockBuckets.
	LockBuckets int

	// DeliveryTimeout bounds one Deliver call, and one write to Kafka. The
	// round's transaction, and the locks on its buckets, stay open until
	// its deliveries return, so a hung receiver must not hold them: when
	// DeliveryTimeout passes, the call's context is cancelled; a Deliver
	// that still has not returned 2 seconds later is abandoned with its
	// goroutine. The attempt counts as a failure and is retried with
	// backoff; the round records its results and commits, which frees its
	// buckets. An abandoned call may still reach the receiver, which
	// deduplicates by id. Defaults to DefaultDeliveryTimeout.
	DeliveryTimeout time.Duration

	// Logger defaults to slog.Default().
	Logger *slog.Logger
	// OnDelivered, when set, is called for every delivered row after its
	// deletion committed (for metrics such as commit-to-delivery delay).
	// HookDelivered reports the same, with the destination and attempts.
	OnDelivered func(id string, createdAt time.Time)

	// Hooks observe the relay: deliveries, failed attempts and the
	// backlog (see Hook; promhooks.NewRelay and otelhooks.NewRelay turn
	// them into metrics).
	Hooks []Hook
	// BacklogInterval is how often Run counts the backlog for
	// HookBacklog; the counts run only when a hook implements it.
	// Defaults to DefaultBacklogInterval.
	BacklogInterval time.Duration
}
