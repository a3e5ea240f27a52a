package engine

import (
	"context"
	"fmt"
	"log/slog"
	"testing"

	"github.com/kafkaonce/kafkaonce/consumer/settings"
	"github.com/kafkaonce/kafkaonce/dedupe"
	"github.com/kafkaonce/kafkaonce/kafkaoncetype"
)

// The tests of this package cover the engine's decisions (what a failure
// means, which way a batch runs, what comes next) on values alone: no
// database, no broker. What only a running consumer can show is
// consumer's suite.

// firstOffset is the offset of the first message of a test batch.
const firstOffset = 100

// setup is an attempt over a batch of n new messages at offsets
// firstOffset onwards, with ids "m-<offset>", by a worker whose position
// is firstOffset and known, with a BatchHandler.
type setup struct {
	a *txAttempt
	// d is the consumer the attempt belongs to, for a worker of it.
	d *deps
}

func newSetup(t *testing.T, n int) *setup {
	t.Helper()
	d := &deps{
		cfg: Config{Config: settings.Config{Name: "test", OnPermanentFailure: kafkaoncetype.DeadLetter},
			HandleBatch: func(context.Context, *Batch) error { return nil }},
		log: slog.New(slog.DiscardHandler),
	}
	items := make([]item, n)
	for i := range items {
		off := int64(firstOffset + i)
		items[i] = item{msg: kafkaoncetype.Message{Topic: "t", Offset: off, ID: fmt.Sprintf("m-%d", off), Value: []byte{byte(i)}},
			end: off + 1, fp: fingerprintOf(i), repeatOf: -1}
	}
	a := &txAttempt{txDeps: d.txDeps(), topic: "t", items: items, next: firstOffset, positionKnown: true, st: &batchState{}}
	a.st.reset(n) // every message applied, until a test says otherwise
	a.p = plan{n: n, savepointFrom: n}
	return &setup{a: a, d: d}
}

// fingerprintOf is a fingerprint of its own for each i.
func fingerprintOf(i int) dedupe.Fingerprint {
	var fp dedupe.Fingerprint
	fp[0], fp[1] = byte(i), byte(i>>8)
	fp[len(fp)-1] = 1
	return fp
}

// batchOf is the Batch a BatchHandler would get for the attempt's
// messages at the indexes given.
func (s *setup) batchOf(index ...int) *Batch {
	msgs := make([]*kafkaoncetype.Message, len(index))
	for k, i := range index {
		msgs[k] = &s.a.items[i].msg
	}
	return &Batch{Messages: msgs, index: index}
}

// handled is what claimFirst's handle step reports for a transaction over
// the first end messages, with b the BatchHandler's Batch (or nil).
func handledOver(end int, b *Batch) *handled {
	return &handled{batch: b, end: end, cut: -1}
}
