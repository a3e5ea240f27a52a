package engine

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kafkaonce/kafkaonce/internal/kafkaadmin"
	"github.com/kafkaonce/kafkaonce/internal/kafkaclient"
	"github.com/kafkaonce/kafkaonce/kafkaoncetype"
)

// fakeShare is a ShareMember whose Flush answers what the test says.
type fakeShare struct {
	flush   error
	settled []kafkaclient.Settlement
}

func (f *fakeShare) Poll(context.Context) ([]kafkaclient.ShareRecord, error) { return nil, nil }
func (f *fakeShare) Close(context.Context) error                             { return nil }
func (f *fakeShare) Flush(context.Context) error                             { return f.flush }

func (f *fakeShare) Settle(how kafkaclient.Settlement, _ ...kafkaclient.RecordID) error {
	f.settled = append(f.settled, how)
	return nil
}

// shareEvents is a share member on m whose share hooks record into got.
func shareEvents(m kafkaclient.ShareMember) (*shareMember, *[]kafkaoncetype.ShareEvent) {
	var got []kafkaoncetype.ShareEvent
	d := &deps{log: slog.New(slog.DiscardHandler), health: &health{}, hooks: Hooks{Share: []func(context.Context, kafkaoncetype.ShareEvent){
		func(_ context.Context, e kafkaoncetype.ShareEvent) { got = append(got, e) },
	}}}
	s := &shareMember{deps: d, m: m, settings: kafkaadmin.ShareSettings{DeliveryLimit: 5, LockDuration: time.Minute}}
	s.locks = newShareLocks(s)
	return s, &got
}

var shareRec = kafkaclient.RecordID{TopicPartition: kafkaclient.TopicPartition{Topic: "jobs", Partition: 2}, Offset: 7}

func kinds(es []kafkaoncetype.ShareEvent) []kafkaoncetype.ShareEventKind {
	out := []kafkaoncetype.ShareEventKind{}
	for _, e := range es {
		out = append(out, e.Kind)
	}
	return out
}

// What the broker's answers to a settlement or a renewal are reported as:
// only what costs a delivery or the record's lock, not a release (the
// record goes back either way) nor a renewal merely unanswered (it may
// have been taken; the next one is tried before the lock runs out).
func TestShareEventsOfTheBrokersAnswers(t *testing.T) {
	refused := errors.New("INVALID_RECORD_STATE")
	notTaken := func(how kafkaclient.Settlement, err error) error {
		return &kafkaclient.SettleError{Failed: []kafkaclient.SettleFailure{{Record: shareRec, Settlement: how, Err: err}}}
	}
	cases := []struct {
		name  string
		how   kafkaclient.Settlement
		flush error
		want  []kafkaoncetype.ShareEventKind
		lost  bool
	}{
		{"an accept taken", kafkaclient.Accept, nil, nil, false},
		{"an accept refused", kafkaclient.Accept, notTaken(kafkaclient.Accept, refused), []kafkaoncetype.ShareEventKind{kafkaoncetype.ShareSettlementLost}, false},
		{"an accept unanswered", kafkaclient.Accept, notTaken(kafkaclient.Accept, kafkaclient.ErrNoAnswer), []kafkaoncetype.ShareEventKind{kafkaoncetype.ShareSettlementLost}, false},
		{"a reject refused", kafkaclient.Reject, notTaken(kafkaclient.Reject, refused), []kafkaoncetype.ShareEventKind{kafkaoncetype.ShareSettlementLost}, false},
		{"a release refused", kafkaclient.Release, notTaken(kafkaclient.Release, refused), nil, false},
		{"a renewal taken", kafkaclient.Renew, nil, nil, false},
		{"a renewal refused", kafkaclient.Renew, notTaken(kafkaclient.Renew, refused), []kafkaoncetype.ShareEventKind{kafkaoncetype.ShareRenewalRefused}, true},
		{"a renewal unanswered", kafkaclient.Renew, notTaken(kafkaclient.Renew, kafkaclient.ErrNoAnswer), nil, false},
		{"a flush that failed whole", kafkaclient.Accept, errors.New("connection reset"), nil, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s, got := shareEvents(&fakeShare{flush: c.flush})
			if c.how == kafkaclient.Renew {
				s.locks.unsettled[shareRec] = time.Now().Add(time.Minute)
				s.locks.renew(t.Context())
			} else {
				s.locks.settle(t.Context(), c.how, shareRec)
			}
			require.Equal(t, append([]kafkaoncetype.ShareEventKind{}, c.want...), kinds(*got))
			for _, e := range *got {
				require.Equal(t, "jobs", e.Topic)
				require.Equal(t, 2, e.Partition)
				require.EqualValues(t, 7, e.Offset)
				require.Error(t, e.Err, "the broker's answer comes with the event")
			}
			if c.how == kafkaclient.Renew {
				require.Equal(t, c.lost, s.locks.lostLocks([]kafkaclient.RecordID{shareRec})[shareRec], "the member no longer holds the record")
			}
		})
	}
}

// A record whose lock the member lost is reported once, when the member
// gives it up and releases it; the records it still holds are not.
func TestShareEventsOfALostLock(t *testing.T) {
	t.Run("a refused renewal", func(t *testing.T) {
		f := &fakeShare{}
		s, got := shareEvents(f)
		other := shareRec
		other.Offset = 8
		r := &shareRun{recs: []kafkaclient.ShareRecord{{RecordID: shareRec}, {RecordID: other}}, items: make([]item, 2)}
		s.locks.unsettled[shareRec] = time.Now().Add(time.Minute)
		s.locks.unsettled[other] = time.Now().Add(time.Minute)
		s.locks.lost[shareRec] = struct{}{}
		s.dropLost(t.Context(), r)
		require.Equal(t, []kafkaoncetype.ShareEventKind{kafkaoncetype.ShareLockLost}, kinds(*got))
		require.EqualValues(t, 7, (*got)[0].Offset)
		require.Len(t, r.recs, 1, "the member works on the record it holds")
		require.True(t, slices.Contains(f.settled, kafkaclient.Release), "the lost record released")
		s.dropLost(t.Context(), r)
		require.Len(t, *got, 1, "reported once")
	})
	t.Run("a lock run out with no renewal taken", func(t *testing.T) {
		s, got := shareEvents(&fakeShare{})
		r := &shareRun{recs: []kafkaclient.ShareRecord{{RecordID: shareRec}}, items: make([]item, 1)}
		s.locks.unsettled[shareRec] = time.Now().Add(-time.Second)
		s.dropLost(t.Context(), r)
		require.Equal(t, []kafkaoncetype.ShareEventKind{kafkaoncetype.ShareLockLost}, kinds(*got))
		require.Empty(t, r.recs)
	})
	t.Run("a lock held", func(t *testing.T) {
		s, got := shareEvents(&fakeShare{})
		r := &shareRun{recs: []kafkaclient.ShareRecord{{RecordID: shareRec}}, items: make([]item, 1)}
		s.locks.unsettled[shareRec] = time.Now().Add(time.Minute)
		s.dropLost(t.Context(), r)
		require.Empty(t, *got)
		require.Len(t, r.recs, 1)
	})
}

// Each record a poll hands the member is reported with its delivery
// count, which Kafka reports nowhere else.
func TestShareEventsOfADelivery(t *testing.T) {
	s, got := shareEvents(&fakeShare{})
	other := shareRec
	other.Offset = 8
	s.delivered(t.Context(), []kafkaclient.ShareRecord{{RecordID: shareRec, DeliveryCount: 1}, {RecordID: other, DeliveryCount: 3}})
	require.Equal(t, []kafkaoncetype.ShareEventKind{kafkaoncetype.ShareDelivered, kafkaoncetype.ShareDelivered}, kinds(*got))
	require.Equal(t, 1, (*got)[0].DeliveryCount)
	require.Equal(t, 3, (*got)[1].DeliveryCount)
	require.EqualValues(t, 8, (*got)[1].Offset)
	require.NoError(t, (*got)[1].Err)
}
