package consumertest

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/kafkaonce/kafkaonce/consumer"
)

// BatchOptions adjusts HandleBatch.
type BatchOptions struct {
	// Timeout bounds the run (default 60s): a message still being retried
	// then fails the test, naming its last error.
	Timeout time.Duration
}

// Fate is how the consumer settled a message.
type Fate string

// The fates of a message.
const (
	// Applied: the handler's effects committed with the message's claim.
	Applied Fate = "applied"
	// Skipped: not handled, its id being claimed already (see SkipReason).
	Skipped Fate = "skipped"
	// DeadLettered: set aside in dead_letters (see DeadLetter), which
	// includes a message set aside to retry later.
	DeadLettered Fate = "dead_lettered"
)

// Outcome is what the consumer did with one message.
type Outcome struct {
	// Message is the message as the consumer handled it: its ID derived
	// by cfg.MessageID (empty when none could be), its Topic, Partition
	// and Offset where Kafka put it.
	Message *consumer.Message
	Fate    Fate
	// SkipReason is why a Skipped message was: already_claimed (by an
	// earlier delivery, in this call or an earlier one of the test) or
	// duplicate_in_batch.
	SkipReason consumer.SkipReason
	// DeadLetter is why a DeadLettered message was set aside: its class
	// (consumer.IsPermanent's verdict, retries_exhausted, retry_later,
	// conflict, invalid_id …), the error and the attempts.
	DeadLetter consumer.DeadLettered
	// Failures are the message's failed attempts, in order, as
	// Hooks.OnMessageFailed reports them. A batch that failed as a whole
	// is no message's attempt: its messages run again one per call, and
	// only a message that then fails on its own has failures, so a
	// neighbour of a failing message is Applied with none.
	Failures []consumer.Failure

	id string // as the hooks reported it
}

// BatchResult is what HandleBatch's consumer did with the messages.
type BatchResult struct {
	// Consumer is the Name the consumer ran under: cfg.Name, a tilde and
	// a suffix unique to the test. Look for its dead letters under it.
	Consumer string
	// Outcomes holds one Outcome per message of msgs, in their order.
	Outcomes []Outcome
	// Applied, Skipped and DeadLettered count the Outcomes by Fate.
	Applied, Skipped, DeadLettered int
}

// HandleBatch delivers msgs to a consumer configured by cfg, through an
// in-process Kafka broker, and returns what the consumer did with each: a
// test of a BatchHandler (or a Handler) that runs it exactly as
// production does, since the consumer that runs it is the real one. The
// messages of a partition reach the BatchHandler together when they fit
// in one fetch (cfg.MaxBatch), inside the consumer's guarded transaction,
// after their ids are claimed (or, for a handler that only queues its
// statements, in one round trip with the claims); the statements the
// handler queued, outbox rows among them (outbox.Outbox.Queue), commit
// with the claims. A batch that fails runs again one message per call, a
// failing message is retried or set aside by cfg's policies (Retry,
// RetryLater, OnPermanentFailure), and its neighbours are applied once:
// BatchResult.Outcomes says which, and why.
//
// The calls of one test (one tb) with the same cfg.Schema and cfg.Name
// share a consumer, named cfg.Name plus a suffix unique to the test
// (BatchResult.Consumer), and so its claims: a message delivered again by
// a later call is Skipped, as a redelivery from Kafka would be. Each call
// has a broker and a topic of its own, so no call reads another's
// messages. The consumer's claims, positions and dead letters are deleted
// when the test ends, unless it failed; your tables are yours to clean.
//
// Build msgs with NewMessage (their ids in the default header) or
// NewMessageFor; their Key, Value, Headers, Time and Partition are
// produced as built. cfg needs Name and a BatchHandler (or Handler), and
// MessageID and Schema unless the defaults suit; HandleBatch works on a
// copy, sets what concerns its broker (as ReplayTwice does), and migrates
// the schema if needed.
//
// Unlike Handle, the effects are committed. A run fails the test when a
// partition stops (OnPermanentFailure StopPartition), or when a message
// has not settled within BatchOptions.Timeout, naming its last failure:
// a transient error is retried per cfg.Retry, so a test of one sets a
// short Retry, or returns consumer.Permanent. To check that the effects
// happen once however the consumer runs the handler, use ReplayTwice.
func HandleBatch(tb testing.TB, db consumer.DB, cfg *consumer.Config, msgs []*consumer.Message, opts ...BatchOptions) BatchResult {
	tb.Helper()
	if cfg == nil {
		tb.Fatalf("consumertest: HandleBatch needs a *consumer.Config (got nil)")
	}
	var o BatchOptions
	if len(opts) > 0 {
		o = opts[0]
	}
	if o.Timeout == 0 {
		o.Timeout = time.Minute
	}
	run := *cfg // the caller's Config stays as it was
	if run.Schema == "" {
		run.Schema = consumer.DefaultSchema
	}
	ctx := context.Background()
	if _, err := consumer.Migrate(ctx, db, run.Schema); err != nil {
		tb.Fatalf("consumertest: migrate: %v", err)
	}
	delivery := 0
	if run.Name != "" {
		run.Name, delivery = testConsumer(tb, db, run.Schema, run.Name)
	}

	// A topic of its own per call: the positions the consumer stored for
	// an earlier call's topic do not apply to this one.
	topic := "handle-batch-" + strconv.Itoa(delivery)
	broker, perPartition := brokerWith(ctx, tb, topic, msgs)
	defer broker.Close()
	onBroker(tb, &run, broker.Brokers, topic, "handle-batch")

	seen := runUntilSettled(tb, db, run, perPartition, o.Timeout, "HandleBatch")
	res := BatchResult{Consumer: run.Name, Outcomes: make([]Outcome, len(msgs))}
	next := map[int]int64{} // the offset Kafka gave the partition's next message
	for i, m := range msgs {
		off := next[m.Partition]
		next[m.Partition]++
		got := seen.outcomeAt(m.Partition, off)
		if got == nil {
			tb.Fatalf("consumertest: HandleBatch: the consumer reported nothing of message %d (%s at offset %d)", i, m.ID, off)
		}
		out := *got
		handled := *m
		handled.ID, handled.Topic, handled.Offset = got.id, topic, off
		out.Message = &handled
		res.Outcomes[i] = out
		switch out.Fate {
		case Applied:
			res.Applied++
		case Skipped:
			res.Skipped++
		case DeadLettered:
			res.DeadLettered++
		}
	}
	return res
}

// String describes the outcome, for a test's failure message.
func (o Outcome) String() string {
	s := fmt.Sprintf("%s at %s: %s", o.Message.ID, o.Message.Position(), o.Fate)
	switch o.Fate {
	case Skipped:
		s += " (" + string(o.SkipReason) + ")"
	case DeadLettered:
		s += fmt.Sprintf(" (%s after %d attempt(s): %v)", o.DeadLetter.Class, o.DeadLetter.Attempts, o.DeadLetter.Err)
	}
	return s
}

// testConsumerKey names the consumer HandleBatch runs for one test.
type testConsumerKey struct {
	tb           testing.TB
	schema, name string
}

// testConsumerState is that consumer's name, and how many calls it had.
type testConsumerState struct {
	name  string
	calls int
}

var (
	testConsumersMu sync.Mutex
	testConsumers   = map[testConsumerKey]*testConsumerState{}
)

// testConsumer returns the name of tb's consumer for name in schemaName,
// and the number of this call among the test's; the first call of a test
// names it and has it forgotten when the test ends.
func testConsumer(tb testing.TB, db consumer.DB, schemaName, name string) (scoped string, call int) {
	key := testConsumerKey{tb, schemaName, name}
	testConsumersMu.Lock()
	defer testConsumersMu.Unlock()
	st := testConsumers[key]
	if st == nil {
		st = &testConsumerState{name: scopedNameWith(name, "~test-")}
		testConsumers[key] = st
		tb.Cleanup(func() {
			testConsumersMu.Lock()
			delete(testConsumers, key)
			testConsumersMu.Unlock()
			forgetConsumer(tb, db, schemaName, st.name)
		})
	}
	st.calls++
	return st.name, st.calls
}
