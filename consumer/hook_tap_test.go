package consumer_test

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/kafkaonce/kafkaonce/consumer"
)

// A hook that keeps every payload it is given, copied, so that a test can
// compare what the engine filled in with what it should have.

// seenMsg is a copy of a *consumer.Message as a hook saw it (the message
// itself is valid only during the call).
type seenMsg struct {
	ID        string
	Topic     string
	Partition int
	Offset    int64
	Key       []byte
	Value     []byte
	Headers   []consumer.Header
	Time      time.Time
}

func copyMsg(m *consumer.Message) seenMsg {
	s := seenMsg{ID: m.ID, Topic: m.Topic, Partition: m.Partition, Offset: m.Offset,
		Key: bytes.Clone(m.Key), Value: bytes.Clone(m.Value), Time: m.Time}
	for _, h := range m.Headers {
		s.Headers = append(s.Headers, consumer.Header{Key: h.Key, Value: bytes.Clone(h.Value)})
	}
	return s
}

type tapFailure struct {
	msg seenMsg
	f   consumer.Failure
}

type tapDead struct {
	msg seenMsg
	d   consumer.DeadLettered
}

type tapSkip struct {
	msg    seenMsg
	reason consumer.SkipReason
}

type tapEnd struct {
	info consumer.BatchInfo
	res  consumer.BatchResult
}

type tapContention struct {
	info consumer.BatchInfo
	c    consumer.Contention
}

type tapSuspect struct {
	msg   seenMsg
	first consumer.SuspectOf
}

// tap implements every hook interface and keeps what it is told.
type tap struct {
	mu   sync.Mutex
	seen tapped
}

var (
	_ consumer.HookPartitionAssigned   = (*tap)(nil)
	_ consumer.HookPartitionStopped    = (*tap)(nil)
	_ consumer.HookBatchStart          = (*tap)(nil)
	_ consumer.HookBatchEnd            = (*tap)(nil)
	_ consumer.HookMessageApplied      = (*tap)(nil)
	_ consumer.HookMessageSkipped      = (*tap)(nil)
	_ consumer.HookFingerprintConflict = (*tap)(nil)
	_ consumer.HookOffsetsCommitted    = (*tap)(nil)
	_ consumer.HookMessageFailed       = (*tap)(nil)
	_ consumer.HookMessageDeadLettered = (*tap)(nil)
	_ consumer.HookSuspectDuplicate    = (*tap)(nil)
	_ consumer.HookHandlerEnd          = (*tap)(nil)
	_ consumer.HookContention          = (*tap)(nil)
)

func (t *tap) OnPartitionAssigned(_ context.Context, a consumer.PartitionAssignment) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.seen.assigned = append(t.seen.assigned, a)
}

func (t *tap) OnPartitionStopped(_ context.Context, err *consumer.PartitionError) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.seen.stopped = append(t.seen.stopped, err)
}

func (t *tap) OnBatchStart(_ context.Context, b consumer.BatchInfo) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.seen.starts = append(t.seen.starts, b)
}

func (t *tap) OnBatchEnd(_ context.Context, b consumer.BatchInfo, r consumer.BatchResult) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.seen.ends = append(t.seen.ends, tapEnd{b, r})
}

func (t *tap) OnMessageApplied(_ context.Context, m *consumer.Message) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.seen.applied = append(t.seen.applied, copyMsg(m))
}

func (t *tap) OnMessageSkipped(_ context.Context, m *consumer.Message, r consumer.SkipReason) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.seen.skipped = append(t.seen.skipped, tapSkip{copyMsg(m), r})
}

func (t *tap) OnFingerprintConflict(_ context.Context, err *consumer.FingerprintConflictError) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.seen.conflicts = append(t.seen.conflicts, err)
}

func (t *tap) OnOffsetsCommitted(_ context.Context, offs []consumer.TopicPartitionOffset, err error) {
	if err != nil {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	t.seen.committed = append(t.seen.committed, append([]consumer.TopicPartitionOffset(nil), offs...))
}

func (t *tap) OnMessageFailed(_ context.Context, m *consumer.Message, f consumer.Failure) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.seen.failed = append(t.seen.failed, tapFailure{copyMsg(m), f})
}

func (t *tap) OnMessageDeadLettered(_ context.Context, m *consumer.Message, d consumer.DeadLettered) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.seen.dead = append(t.seen.dead, tapDead{copyMsg(m), d})
}

func (t *tap) OnSuspectDuplicate(_ context.Context, m *consumer.Message, first consumer.SuspectOf) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.seen.suspects = append(t.seen.suspects, tapSuspect{copyMsg(m), first})
}

func (t *tap) OnHandlerEnd(_ context.Context, _ *consumer.Message, _ time.Duration, err error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.seen.handlerEnd = append(t.seen.handlerEnd, err)
}

func (t *tap) OnContention(_ context.Context, b consumer.BatchInfo, c consumer.Contention) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.seen.contention = append(t.seen.contention, tapContention{b, c})
}

// tapped is what a tap saw.
type tapped struct {
	assigned   []consumer.PartitionAssignment
	stopped    []*consumer.PartitionError
	starts     []consumer.BatchInfo
	ends       []tapEnd
	applied    []seenMsg
	skipped    []tapSkip
	conflicts  []*consumer.FingerprintConflictError
	committed  [][]consumer.TopicPartitionOffset
	failed     []tapFailure
	dead       []tapDead
	suspects   []tapSuspect
	handlerEnd []error
	contention []tapContention
}

// text renders every payload the hooks were given, errors by their text:
// what a hook could pass on to logs, metrics or traces, for a test that
// looks for what must never reach one (a secret).
func (s tapped) text() string {
	var b strings.Builder
	line := func(v ...any) { fmt.Fprintln(&b, v...) }
	for _, v := range s.assigned {
		line(fmt.Sprintf("%+v", v))
	}
	for _, v := range s.stopped {
		line(v.Error())
	}
	for _, v := range s.starts {
		line(fmt.Sprintf("%+v", v))
	}
	for _, v := range s.ends {
		line(fmt.Sprintf("%+v %+v", v.info, v.res))
	}
	for _, v := range s.applied {
		line(fmt.Sprintf("%+v", v))
	}
	for _, v := range s.skipped {
		line(fmt.Sprintf("%+v %v", v.msg, v.reason))
	}
	for _, v := range s.conflicts {
		line(v.Error())
	}
	for _, v := range s.committed {
		line(fmt.Sprintf("%+v", v))
	}
	for _, v := range s.failed {
		line(fmt.Sprintf("%+v %+v", v.msg, v.f))
	}
	for _, v := range s.dead {
		line(fmt.Sprintf("%+v %+v", v.msg, v.d))
	}
	for _, v := range s.suspects {
		line(fmt.Sprintf("%+v %+v", v.msg, v.first))
	}
	for _, v := range s.handlerEnd {
		line(fmt.Sprint(v))
	}
	for _, v := range s.contention {
		line(fmt.Sprintf("%+v %+v", v.info, v.c))
	}
	return b.String()
}

func (t *tap) snap() tapped {
	t.mu.Lock()
	defer t.mu.Unlock()
	// The hooks only append: a copy of the slice headers never sees an
	// element change.
	return t.seen
}

// failedFor returns the failures reported for the message at offset.
func (s tapped) failedFor(offset int64) []tapFailure {
	var out []tapFailure
	for _, f := range s.failed {
		if f.msg.Offset == offset {
			out = append(out, f)
		}
	}
	return out
}

// deadFor returns the dead-letter reports for the message at offset.
func (s tapped) deadFor(offset int64) []tapDead {
	var out []tapDead
	for _, d := range s.dead {
		if d.msg.Offset == offset {
			out = append(out, d)
		}
	}
	return out
}

// withTap returns cfg with a fresh tap added to its hooks.
func withTap(cfg *consumer.Config) *tap {
	t := &tap{}
	cfg.Hooks = append(cfg.Hooks, t)
	return t
}

// eachMessage is a BatchHandler that runs h for each message of the batch,
// with the batch's Tx.
func eachMessage(h consumer.Handler) consumer.BatchHandler {
	return consumer.BatchHandlerFunc(func(ctx context.Context, b *consumer.Batch) error {
		for _, m := range b.Messages {
			if err := h.Handle(ctx, b.Tx, m); err != nil {
				return err
			}
		}
		return nil
	})
}

// queueEffects is a BatchHandler that queues one effects row per message
// (nothing through Tx: it may run in one round trip).
func (e *env) queueEffects() consumer.BatchHandler {
	sql := `INSERT INTO ` + e.db.Table("effects") + ` (message_id, topic, partition, kafka_offset, value) VALUES ($1, $2, $3, $4, $5)`
	return consumer.BatchHandlerFunc(func(ctx context.Context, b *consumer.Batch) error {
		for _, m := range b.Messages {
			b.Queue(sql, m.ID, m.Topic, m.Partition, m.Offset, string(m.Value))
		}
		return nil
	})
}
