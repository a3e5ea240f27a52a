package settings

import (
	"crypto/tls"
	"log/slog"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/kafkaonce/kafkaonce/kafkaconn"
	"github.com/kafkaonce/kafkaonce/kafkaoncetype"
)

// Config configures a Consumer. Only Name, Brokers, Topics and a Handler
// or a BatchHandler are required; every other field has a default, named
// in its doc.
type Config struct {
	// Name identifies the consumer in processed_messages and
	// consumer_offsets: it is the dedupe scope. Two workers with the same
	// Name share claims (a message id applied by one is skipped by the
	// other); workers with different names apply every message once each.
	// Never rename a running consumer: the new name starts with no claims
	// and no positions. Required; at most MaxNameLen bytes of printable
	// UTF-8.
	Name string

	// Brokers are the bootstrap addresses ("host:port") of the Kafka
	// cluster. Required.
	Brokers []string

	// Topics are consumed by the group. Required.
	Topics []string

	// GroupID is the Kafka consumer group, or with GroupType ShareGroup
	// the share group. Defaults to Name.
	GroupID string

	// GroupType is the kind of group GroupID names (see GroupType). With
	// ShareGroup the members share partitions and settle each record on
	// its own, after its transaction commits: there is no order and no
	// stored position, and the settings about partitions and positions
	// (StartOffset, InstanceID, OnPermanentFailure StopPartition) are
	// refused; where the group starts is the group's own setting
	// (share.auto.offset.reset). FranzGo only. Defaults to ConsumerGroup.
	GroupType kafkaoncetype.GroupType

	// GroupProtocol is the protocol the member speaks to the group
	// coordinator (see GroupProtocol). ConsumerProtocol needs a broker
	// that serves it (Kafka 4.0 or later): on one that does not, Run
	// fails and says so rather than falling back to the classic protocol.
	// Under it, SessionTimeout and HeartbeatInterval are refused: they
	// are the group's configs (consumer.session.timeout.ms,
	// consumer.heartbeat.interval.ms), set on the broker. A running group
	// moves from one protocol to the other one member at a time
	// (docs/operations.md). FranzGo only; ConsumerGroup only. Defaults to
	// ClassicProtocol.
	GroupProtocol kafkaoncetype.GroupProtocol

	// Handler applies each message inside the consumer's transaction. Set
	// either Handler or BatchHandler.
	Handler Handler

	// BatchHandler applies the new messages of a batch together, in one
	// call per transaction, instead of Handler's one call per message: see
	// BatchHandler. Set either Handler or BatchHandler.
	BatchHandler BatchHandler

	// ClaimFirst makes every batch claim its messages before the
	// BatchHandler is called, so the handler only ever sees messages that
	// turn out new. By default, a batch that looks new is tried in one
	// round trip instead: the handler is called first, with every message,
	// and its queued statements are sent together with the claims and the
	// COMMIT; if any message was already claimed, nothing commits and the
	// batch runs again claim-first (see BatchHandler). Set ClaimFirst when
	// a handler call must not see duplicates even in an attempt that is
	// dropped.
	ClaimFirst bool

	// MessageID derives each message's id (the dedupe key): a built-in
	// MessageIDRule (IDFromHeader, IDFromJSONField, IDFromContentHash,
	// IDFromPosition), or a function of your own wrapped in MessageIDFunc.
	// When Run starts, the consumer records the rule's text in its row of
	// the consumers table ("custom" for a MessageIDFunc), with GroupID,
	// Topics and Brokers, so that kafkaonce audit, replay and status use
	// them without being told; with a MessageIDFunc, kafkaonce audit needs
	// --id. Defaults to IDFromHeader(DefaultMessageIDHeader).
	MessageID MessageIDSource

	// MaxBatch is the most messages of one partition handled in one
	// transaction. Larger batches amortise the transaction's round trips;
	// smaller ones hold row locks for less time. While transactions lose
	// races for rows (deadlocks, serialization failures, lock timeouts),
	// each partition's batches are smaller than this, growing back as they
	// commit; see HookContention. Defaults to DefaultMaxBatch; at most
	// MaxMaxBatch.
	MaxBatch int

	// MaxWait is how long a worker waits for more messages to fill a batch
	// once it has one. Defaults to DefaultMaxWait; at most 10s. The wait
	// ends sooner when the partition goes quiet: when no message has come
	// for a fifth of MaxWait, the fetched messages are used up and the
	// batch in hand goes at once rather than waiting out MaxWait. Under
	// load the fetched messages never run out, and batches fill up to
	// MaxBatch.
	MaxWait time.Duration

	// KafkaClient is the library the consumer reads Kafka with (see
	// KafkaClient). Defaults to FranzGo.
	KafkaClient kafkaoncetype.KafkaClient

	// TLS, when set, encrypts every connection to the brokers, and with a
	// client certificate authenticates the consumer to them (mTLS):
	// kafkaconn.TLSConfig loads one from PEM files. Defaults to plaintext.
	TLS *tls.Config

	// SASL, when set, authenticates every connection to the brokers:
	// PLAIN, SCRAM-SHA-256, SCRAM-SHA-512, OAUTHBEARER or AWS_MSK_IAM (see
	// kafkaconn.SASL and docs/security.md). PLAIN needs TLS, unless
	// SASL.AllowPlaintext is set for a development broker on loopback.
	// Defaults to none.
	SASL *kafkaconn.SASL

	// Dialer is kafka-go's, for KafkaClient KafkaGo only: when set, it
	// opens every connection the consumer makes instead of one built from
	// TLS and SASL, for workers that have one configured already.
	// Defaults to none.
	Dialer *kafka.Dialer

	// InstanceID makes this member of the group static (Kafka's
	// group.instance.id): a member that restarts within SessionTimeout
	// (under ConsumerProtocol, the group's consumer.session.timeout.ms)
	// gets its partitions back without the group rebalancing, so the other
	// members do not even pause. Give each process of the group its own,
	// stable across restarts (a pod's name in a StatefulSet); two running
	// at once with one id fence each other. A static member that stops
	// does not leave the group: its partitions wait for it until
	// SessionTimeout passes, so raise SessionTimeout above a restart's
	// length. FranzGo only. Defaults to none (a dynamic member).
	InstanceID string

	// MetadataMaxAge bounds how old the consumer's view of the cluster may
	// get: a partition added to a topic is seen within it, and assigned by
	// the rebalance that follows. Defaults to DefaultMetadataMaxAge.
	MetadataMaxAge time.Duration

	// OpenTransactionAfter is how long a partition may wait on a
	// producer's open transaction before it is reported (a warning, and
	// HookPartitionHeld): the consumer reads committed records only, in
	// order, so an open transaction holds back everything after its first
	// record. Defaults to DefaultOpenTransactionAfter.
	OpenTransactionAfter time.Duration

	// StallAfter is how long a partition with messages waiting may make no
	// progress (no fetch returned, no transaction tried, no handler called)
	// before Health calls the consumer not live, so that a liveness probe
	// restarts a process whose loops are wedged. Waits that are no stall
	// never count: a partition at the log's end, paused, or stopped. Set it
	// above your longest handler call and retry wait (HandlerTimeout,
	// Retry.MaxInterval). A Kafka broker unreachable for that long counts
	// too, where a restart is harmless. Defaults to DefaultStallAfter.
	StallAfter time.Duration

	// StartOffset is where a partition with no committed offset and no
	// stored position starts. It is resolved once, at the partition's first
	// start, and the offset it gives is stored as the position before any
	// message is processed, so a member that takes the partition over
	// resumes there rather than at a start or end the log has since moved
	// to. Defaults to StartEarliest.
	StartOffset kafkaoncetype.StartOffset

	// FetchMaxBytes is the most bytes a fetch asks the broker for, per
	// partition (with franz-go, whose fetch requests cover every partition
	// on a broker at once, a request asks for up to 16 partitions' worth,
	// at most 64 MiB). A partition holds at most two batches (MaxBatch
	// messages, or FetchMaxBytes, twice) fetched ahead of its worker, so
	// the two bound memory together. Defaults to DefaultFetchMaxBytes.
	FetchMaxBytes int

	// Schema is the Postgres schema holding kafkaonce's tables (see
	// Migrate). Defaults to DefaultSchema.
	Schema string

	// Logger receives the consumer's logs, with the keys consumer, topic,
	// partition, offset, message_id and attempt. Payloads and connection
	// strings are never logged. Defaults to slog.Default().
	Logger *slog.Logger

	// ShutdownTimeout bounds how long a worker may take, once its partition
	// is revoked or Run's context is cancelled, to finish the batch it is
	// in. A batch still running then is rolled back (its messages will be
	// redelivered). Keep it below RebalanceTimeout, or a rebalance waits on
	// this member. Defaults to DefaultShutdownTimeout.
	ShutdownTimeout time.Duration

	// StatementTimeout, LockTimeout and IdleInTransactionTimeout are set
	// (SET LOCAL) in every transaction the consumer runs, so that a hung
	// statement, a lock wait or a client that died mid-transaction cannot
	// hold a message's claim, and so its partition, forever.
	// IdleInTransactionTimeout must be longer than HandlerTimeout: a
	// handler may work for that long without a statement. LockTimeout must
	// be shorter than HandlerTimeout: a lock wait it ends is contention,
	// retried without counting, while one HandlerTimeout cuts counts as
	// the message's failure. Defaults: DefaultStatementTimeout,
	// DefaultLockTimeout (or half of HandlerTimeout, when that is shorter),
	// DefaultIdleInTransactionTimeout. LeaveUnset keeps the server's value
	// (with the server's lock_timeout, a long lock wait is cut by
	// HandlerTimeout and counts).
	// A transaction over several messages that races the consumer's others
	// (outside the gate they take turns through after contention) waits at
	// most 200ms for a lock whatever LockTimeout says: a longer wait is
	// taken for contention (see HookContention).
	StatementTimeout         time.Duration
	LockTimeout              time.Duration
	IdleInTransactionTimeout time.Duration

	// SessionTimeout, RebalanceTimeout and HeartbeatInterval tune the
	// consumer group protocol. A member that stops heartbeating for
	// SessionTimeout loses its partitions, and its later offset commits are
	// rejected by the broker; its in-flight transaction may still commit,
	// which the message claims make harmless. Defaults:
	// DefaultSessionTimeout, DefaultRebalanceTimeout,
	// DefaultHeartbeatInterval.
	SessionTimeout    time.Duration
	RebalanceTimeout  time.Duration
	HeartbeatInterval time.Duration

	// Retry says how often, and how far apart, a message whose handler
	// failed with an error that could pass is tried again before it is set
	// aside (see RetryPolicy). Zero fields take their defaults.
	Retry kafkaoncetype.RetryPolicy

	// RetryLater sets failing messages aside to be retried later by the
	// consumer, instead of holding their partition (see RetryLaterPolicy):
	// those whose handler returned an error marked by RetryLater, and with
	// RetryLater.After set every message whose handler failed with an
	// error that could pass. Zero fields take their defaults.
	RetryLater kafkaoncetype.RetryLaterPolicy

	// HandlerTimeout bounds one handler call. When it passes, the handler's
	// context is cancelled (pgx then interrupts a running statement); a
	// handler that still has not returned 2 seconds later is abandoned with
	// its goroutine, its connection is closed (Postgres rolls the
	// transaction back and releases its locks), and the attempt counts as a
	// failure, so a hung handler cannot stall the partition or the group.
	// Defaults to DefaultHandlerTimeout.
	HandlerTimeout time.Duration

	// CircuitBreaker, when its Failures is set, pauses a topic (or the
	// whole consumer) by itself when its messages fail too often, and tries
	// it again after a cool-down (see CircuitBreaker). Zero fields take
	// their defaults.
	CircuitBreaker kafkaoncetype.CircuitBreaker

	// OnPermanentFailure decides the fate of a message that cannot be
	// applied. Either way nothing is lost and the error is logged and
	// reported to hooks. Defaults to DeadLetter.
	OnPermanentFailure kafkaoncetype.FailurePolicy

	// DeadLetterTopic, when set, is a Kafka topic to which every dead letter
	// is also published, with headers naming its source (see
	// HeaderSourceTopic and the other Header* constants) and the message-id
	// header. Publishing is at-least-once: letters are published from the
	// dead_letters table after they commit, and marked published after the
	// broker acknowledged them, so a crash in between publishes a letter
	// twice. A letter too large for the topic is published cut to fit
	// (see HeaderTruncated), and the whole letter stays in the table.
	// Defaults to none (the table only).
	DeadLetterTopic string

	// SuspectDuplicateWindow is how far back a partition remembers which id
	// each content had (bounded as well by the last SuspectWindowMessages
	// messages). A message whose key and value were seen within it under
	// another id is a suspect duplicate: the mark of a producer that makes a
	// fresh id on every retry, which id deduplication cannot see. The check
	// is in memory, with no database work (BENCHMARKS.md has its cost).
	// Defaults to
	// DefaultSuspectDuplicateWindow; LeaveUnset turns it off.
	SuspectDuplicateWindow time.Duration

	// SuspectDuplicates says what to do with suspect duplicates. Defaults to
	// ReportSuspects.
	SuspectDuplicates kafkaoncetype.SuspectPolicy

	// Prune makes the consumer prune its own old claims in the background
	// (see Pruning). Off unless Prune.Interval is set.
	Prune kafkaoncetype.Pruning

	// Pruners prune the tables of other features in the same pass as the
	// claims, at each Prune.Interval: give idempotency.Store.Pruner() to
	// prune the HTTP front door's expired keys of the schema, which a
	// consumer no longer prunes unasked. Needs Prune.Interval. Defaults
	// to none.
	Pruners []kafkaoncetype.Pruner

	// Hooks observe the consumer; see Hook. Defaults to none.
	Hooks []Hook
}
