package consumer_test

import (
	"testing"

	"github.com/kafkaonce/kafkaonce/consumer"
	"github.com/kafkaonce/kafkaonce/internal/engine"
	"github.com/kafkaonce/kafkaonce/internal/schema"
)

// The consumer package states these values for its users and the engine
// uses its own copies: they must not drift apart. (The structs the two
// share, Message and the hooks' payloads, are kept equal by the compiler:
// the consumer converts between them.)
func TestPublicValuesMatchTheEngine(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ name, public, engine string }{
		{"DefaultMessageIDHeader", consumer.DefaultMessageIDHeader, engine.DefaultMessageIDHeader},
		{"DefaultSchema", consumer.DefaultSchema, schema.DefaultName},
		{"HeaderConsumer", consumer.HeaderConsumer, engine.HeaderConsumer},
		{"HeaderSourceTopic", consumer.HeaderSourceTopic, engine.HeaderSourceTopic},
		{"HeaderSourcePartition", consumer.HeaderSourcePartition, engine.HeaderSourcePartition},
		{"HeaderSourceOffset", consumer.HeaderSourceOffset, engine.HeaderSourceOffset},
		{"HeaderErrorClass", consumer.HeaderErrorClass, engine.HeaderErrorClass},
		{"HeaderError", consumer.HeaderError, engine.HeaderError},
		{"HeaderDeadLetterID", consumer.HeaderDeadLetterID, engine.HeaderDeadLetterID},
		{"HeaderTruncated", consumer.HeaderTruncated, engine.HeaderTruncated},
		{"HeaderOriginalSize", consumer.HeaderOriginalSize, engine.HeaderOriginalSize},
		{"HeaderTruncatedReason", consumer.HeaderTruncatedReason, engine.HeaderTruncatedReason},
		{"SkipAlreadyClaimed", string(consumer.SkipAlreadyClaimed), string(engine.SkipAlreadyClaimed)},
		{"SkipDuplicateInBatch", string(consumer.SkipDuplicateInBatch), string(engine.SkipDuplicateInBatch)},
		{"SkipSuspectDuplicate", string(consumer.SkipSuspectDuplicate), string(engine.SkipSuspectDuplicate)},
	} {
		if c.public != c.engine {
			t.Errorf("%s: consumer says %q, the engine uses %q", c.name, c.public, c.engine)
		}
	}
	for _, c := range []struct {
		name           string
		public, engine int64
	}{
		{"LeaveUnset", int64(consumer.LeaveUnset), int64(engine.LeaveUnset)},
		{"StartEarliest", int64(consumer.StartEarliest), int64(engine.StartEarliest)},
		{"StartLatest", int64(consumer.StartLatest), int64(engine.StartLatest)},
		{"DeadLetter", int64(consumer.DeadLetter), int64(engine.DeadLetter)},
		{"StopPartition", int64(consumer.StopPartition), int64(engine.StopPartition)},
		{"ReportSuspects", int64(consumer.ReportSuspects), int64(engine.ReportSuspects)},
		{"SkipSuspects", int64(consumer.SkipSuspects), int64(engine.SkipSuspects)},
		{"SuspectWindowMessages", consumer.SuspectWindowMessages, engine.SuspectWindowMessages},
		{"MaxMessageIDLen", consumer.MaxMessageIDLen, engine.MaxMessageIDLen},
	} {
		if c.public != c.engine {
			t.Errorf("%s: consumer says %d, the engine uses %d", c.name, c.public, c.engine)
		}
	}
}
