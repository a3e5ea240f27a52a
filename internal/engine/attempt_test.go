package engine

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/kafkaonce/kafkaonce/internal/recent"
	"github.com/kafkaonce/kafkaonce/kafkaoncetype"
)

// TestOneTripEligible covers which attempts may run in one round trip:
// only those whose plain plan a BatchHandler can apply without reading
// from the database first.
func TestOneTripEligible(t *testing.T) {
	t.Parallel()
	sighting := &recent.Sighting{MessageID: "other", Offset: 7, At: time.Now()}
	cases := []struct {
		name   string
		change func(a *txAttempt)
		want   bool
	}{
		{"a plain batch", func(*txAttempt) {}, true},
		{"a Handler, not a BatchHandler", func(a *txAttempt) {
			a.cfg.HandleBatch = nil
			a.cfg.Handle = func(context.Context, pgx.Tx, *kafkaoncetype.Message) error { return nil }
		}, false},
		{"Config.ClaimFirst", func(a *txAttempt) { a.cfg.ClaimFirst = true }, false},
		{"the BatchHandler used Batch.Tx", func(a *txAttempt) { a.batchUsesTx.Store(true) }, false},
		{"no stored position yet", func(a *txAttempt) { a.positionKnown = false }, false},
		{"serialized behind the gate", func(a *txAttempt) { a.serialized = true }, false},
		{"racing other partitions", func(a *txAttempt) { a.racing = true }, true},
		{"savepoints after a failure", func(a *txAttempt) { a.p.savepointFrom = 1 }, false},
		{"a message to set aside", func(a *txAttempt) {
			a.p.deadLetter = map[int]*failure{1: newFailure(classPermanent, "", errors.New("x"))}
		}, false},
		{"attempt rows to clear", func(a *txAttempt) { a.p.clearAttempts = true }, false},
		{"the previous batch held duplicates", func(a *txAttempt) { a.sawDuplicates = true }, false},
		{"a message without a valid id", func(a *txAttempt) { a.items[2].idErr = errors.New("no id") }, false},
		{"a suspect to skip", func(a *txAttempt) {
			a.cfg.SuspectDuplicates = kafkaoncetype.SkipSuspects
			a.items[1].suspect = sighting
		}, false},
		{"a suspect only reported", func(a *txAttempt) {
			a.cfg.SuspectDuplicates = kafkaoncetype.ReportSuspects
			a.items[1].suspect = sighting
		}, true},
		{"a foreseen re-send", func(a *txAttempt) { a.items[0].repeatOf = firstOffset - 50 }, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := newSetup(t, 3)
			tc.change(s.a)
			require.Equal(t, tc.want, s.a.oneTripEligible())
		})
	}
}
