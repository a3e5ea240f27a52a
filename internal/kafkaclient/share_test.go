package kafkaclient_test

import (
	"cmp"
	"context"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kafkaonce/kafkaonce/internal/kafkaadmin"
	"github.com/kafkaonce/kafkaonce/internal/kafkaclient"
	"github.com/kafkaonce/kafkaonce/internal/kafkaclient/franz"
	"github.com/kafkaonce/kafkaonce/internal/testenv"
)

// shareLock is the acquisition lock of the share tests' groups: short, so
// that a lock running out is seen in seconds. Kafka takes it as the group's
// share.record.lock.duration.ms, which must lie within the broker's
// group.share.min.record.lock.duration.ms (15 s unless lowered, as
// scripts/kafka-broker.sh does, to 1 s, its own floor) and its max; kfake
// reads only the broker's group.share.record.lock.duration.ms.
const shareLock = 1500 * time.Millisecond

// shareSetup bundles a share test's broker, topic, group and clients.
type shareSetup struct {
	t       *testing.T
	brokers []string
	// real is set for KAFKA_BROKERS's broker, clear for a kfake.
	real   bool
	topic  string
	group  string
	client *franz.Client
	admin  *kafkaadmin.Admin
}

// shareOptions are a share test's settings beyond the short lock.
type shareOptions struct {
	// deliveryLimit is the group's delivery count limit (0: the broker's).
	deliveryLimit int
	// lock is the group's acquisition lock (0: shareLock).
	lock time.Duration
}

// newShareSetup gives the test a one-partition topic and a share group
// that starts at the earliest offset and holds its locks for shareLock.
//
// With KAFKA_BROKERS set the broker is that one, and the settings are
// the group's own configs (the test is skipped when the broker has no
// share groups); else it is a kfake of the test's own, and the settings
// are its broker configs, since kfake takes a group's lock and delivery
// limit from those alone.
func newShareSetup(t *testing.T, o shareOptions) *shareSetup {
	t.Helper()
	s := &shareSetup{t: t, group: testenv.Name(t, "share")}
	lockMs := strconv.Itoa(int(cmp.Or(o.lock, shareLock).Milliseconds()))
	groupConfigs := map[string]string{"share.auto.offset.reset": "earliest"}
	if os.Getenv("KAFKA_BROKERS") != "" {
		k := testenv.NewKafka(t)
		testenv.RequireShareGroups(t, k.Brokers)
		s.brokers, s.real = k.Brokers, true
		s.topic = k.Topic(t, 1)
		groupConfigs["share.record.lock.duration.ms"] = lockMs
		if o.deliveryLimit > 0 {
			groupConfigs["share.delivery.count.limit"] = strconv.Itoa(o.deliveryLimit)
		}
	} else {
		bc := map[string]string{
			"group.share.record.lock.duration.ms": lockMs,
			"share.record.lock.sweep.interval.ms": "100",
		}
		if o.deliveryLimit > 0 {
			bc["group.share.delivery.count.limit"] = strconv.Itoa(o.deliveryLimit)
		}
		s.topic = "t"
		s.brokers = fakeKafka(t, kfake.SeedTopics(1, s.topic), kfake.BrokerConfigs(bc))
	}
	cfg := kafkaclient.Config{Brokers: s.brokers}
	var err error
	s.client, err = franz.New(cfg)
	require.NoError(t, err)
	t.Cleanup(s.client.Close)
	s.admin, err = kafkaadmin.New(cfg)
	require.NoError(t, err)
	t.Cleanup(s.admin.Close)
	require.NoError(t, franz.SetGroupConfigs(testenv.Context(t, 10*time.Second), s.client.Kgo(), s.group, groupConfigs))
	return s
}

// member joins the group as a new member, left at the test's end.
func (s *shareSetup) member() kafkaclient.ShareMember {
	s.t.Helper()
	return s.memberOf(0)
}

// memberOf joins as member() does, acquiring at most maxRecords a poll (0:
// the default).
func (s *shareSetup) memberOf(maxRecords int) kafkaclient.ShareMember {
	s.t.Helper()
	m, err := s.client.JoinShare(testenv.Context(s.t, 10*time.Second), kafkaclient.ShareConfig{Group: s.group, Topics: []string{s.topic}, MaxRecords: maxRecords})
	require.NoError(s.t, err)
	s.t.Cleanup(func() { _ = m.Close(context.Background()) })
	return m
}

// produce writes values to the topic, in one batch.
func (s *shareSetup) produce(values ...string) {
	s.t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(s.brokers...), kgo.DefaultProduceTopic(s.topic))
	require.NoError(s.t, err)
	defer cl.Close()
	var rs []*kgo.Record
	for _, v := range values {
		rs = append(rs, kgo.StringRecord(v))
	}
	require.NoError(s.t, cl.ProduceSync(testenv.Context(s.t, 10*time.Second), rs...).FirstErr())
}

// poll waits for m's next records and requires n of them.
func (s *shareSetup) poll(m kafkaclient.ShareMember, n int) []kafkaclient.ShareRecord {
	s.t.Helper()
	rs, err := m.Poll(testenv.Context(s.t, 15*time.Second))
	require.NoError(s.t, err)
	require.Len(s.t, rs, n)
	return rs
}

// nothing requires that m is handed nothing for d.
func (s *shareSetup) nothing(m kafkaclient.ShareMember, d time.Duration) {
	s.t.Helper()
	rs, err := m.Poll(testenv.Context(s.t, d))
	require.Empty(s.t, rs)
	require.ErrorIs(s.t, err, context.DeadlineExceeded)
}

// settle settles rs and flushes, requiring the broker took every one.
func (s *shareSetup) settle(m kafkaclient.ShareMember, how kafkaclient.Settlement, rs ...kafkaclient.ShareRecord) {
	s.t.Helper()
	require.NoError(s.t, m.Settle(how, ids(rs)...))
	require.NoError(s.t, m.Flush(testenv.Context(s.t, 10*time.Second)))
}

func ids(rs []kafkaclient.ShareRecord) []kafkaclient.RecordID {
	out := make([]kafkaclient.RecordID, len(rs))
	for i, r := range rs {
		out[i] = r.RecordID
	}
	return out
}

func values(rs []kafkaclient.ShareRecord) []string {
	out := make([]string, len(rs))
	for i, r := range rs {
		out[i] = string(r.Value)
	}
	return out
}

// beyondLock is long enough for a lost settlement's record to come back:
// the lock, the sweep, and a fetch.
const beyondLock = 2*shareLock + time.Second

func TestShareSettlements(t *testing.T) {
	t.Parallel()
	t.Run("AcceptedRecordsAreNotDeliveredAgain", func(t *testing.T) {
		t.Parallel()
		s := newShareSetup(t, shareOptions{})
		s.produce("a", "b", "c")
		m := s.member()
		rs := s.poll(m, 3)
		require.Equal(t, []string{"a", "b", "c"}, values(rs))
		for _, r := range rs {
			require.Equal(t, 1, r.DeliveryCount)
			require.True(t, r.LockedUntil.After(time.Now()), "the lock runs into the future")
		}
		s.settle(m, kafkaclient.Accept, rs...)
		s.nothing(m, beyondLock)
	})
	t.Run("AReleasedRecordIsDeliveredAgainWithDeliveryCountTwo", func(t *testing.T) {
		t.Parallel()
		s := newShareSetup(t, shareOptions{})
		s.produce("a", "b")
		m := s.member()
		rs := s.poll(m, 2)
		s.settle(m, kafkaclient.Accept, rs[0])
		s.settle(m, kafkaclient.Release, rs[1])
		again := s.poll(m, 1)
		require.Equal(t, rs[1].RecordID, again[0].RecordID)
		require.Equal(t, 2, again[0].DeliveryCount)
		s.settle(m, kafkaclient.Accept, again...)
	})
	t.Run("ARejectedRecordIsNeverDeliveredAgain", func(t *testing.T) {
		t.Parallel()
		s := newShareSetup(t, shareOptions{})
		s.produce("a")
		m := s.member()
		s.settle(m, kafkaclient.Reject, s.poll(m, 1)...)
		s.nothing(m, beyondLock)
	})
	t.Run("ARecordIsArchivedAfterTheGroupsDeliveryLimit", func(t *testing.T) {
		t.Parallel()
		s := newShareSetup(t, shareOptions{deliveryLimit: 3})
		settings, err := s.admin.ShareSettings(testenv.Context(t, 10*time.Second), s.group)
		require.NoError(t, err)
		require.Equal(t, 3, settings.DeliveryLimit)
		s.produce("a")
		m := s.member()
		for n := 1; n <= settings.DeliveryLimit; n++ {
			rs := s.poll(m, 1)
			require.Equal(t, n, rs[0].DeliveryCount)
			s.settle(m, kafkaclient.Release, rs...)
		}
		s.nothing(m, beyondLock)
	})
}

func TestShareLocks(t *testing.T) {
	t.Parallel()
	t.Run("ARenewedRecordOutlivesItsLockAndStaysWithItsMember", func(t *testing.T) {
		t.Parallel()
		s := newShareSetup(t, shareOptions{})
		s.produce("a")
		first, second := s.member(), s.member()
		rs := s.poll(first, 1)
		renewed := make(chan error, 1)
		go func() {
			// Renew at a third of the lock, for three locks' time.
			for end := time.Now().Add(3 * shareLock); time.Now().Before(end); {
				time.Sleep(shareLock / 3)
				if err := first.Settle(kafkaclient.Renew, rs[0].RecordID); err != nil {
					renewed <- err
					return
				}
				if err := first.Flush(context.Background()); err != nil {
					renewed <- err
					return
				}
			}
			renewed <- nil
		}()
		s.nothing(second, 3*shareLock)
		require.NoError(t, <-renewed)
		s.settle(first, kafkaclient.Accept, rs...)
		s.nothing(second, beyondLock)
	})
	t.Run("ARecordWhoseLockRanOutGoesToAnotherMemberAndTheLateAcceptFails", func(t *testing.T) {
		t.Parallel()
		s := newShareSetup(t, shareOptions{})
		s.produce("a")
		first, second := s.member(), s.member()
		rs := s.poll(first, 1)
		again := s.poll(second, 1)
		require.Equal(t, rs[0].RecordID, again[0].RecordID)
		require.Equal(t, 2, again[0].DeliveryCount)

		require.NoError(t, first.Settle(kafkaclient.Accept, rs[0].RecordID))
		err := first.Flush(testenv.Context(t, 10*time.Second))
		var settleErr *kafkaclient.SettleError
		require.ErrorAs(t, err, &settleErr)
		require.Len(t, settleErr.Failed, 1)
		require.Equal(t, rs[0].RecordID, settleErr.Failed[0].Record)
		require.Equal(t, kafkaclient.Accept, settleErr.Failed[0].Settlement)
		require.ErrorIs(t, err, kerr.InvalidRecordState)
		require.Contains(t, err.Error(), rs[0].RecordID.String())

		s.settle(second, kafkaclient.Accept, again...)
	})
	t.Run("AnAcceptBesideOneWhoseLockRanOutIsRefusedWithIt", func(t *testing.T) {
		// Kafka 4.3 and kfake alike take or refuse a partition's
		// acknowledgements whole: a's accept, on time, is refused with
		// b's, and a is delivered again.
		t.Parallel()
		s := newShareSetup(t, shareOptions{})
		s.produce("a", "b")
		first, second := s.member(), s.member()
		rs := s.poll(first, 2)
		stop, renewed := make(chan struct{}), make(chan error, 1)
		go func() {
			// Keep a's lock while b's runs out and second takes b.
			for {
				select {
				case <-stop:
					renewed <- nil
					return
				case <-time.After(shareLock / 3):
				}
				if err := first.Settle(kafkaclient.Renew, rs[0].RecordID); err != nil {
					renewed <- err
					return
				}
				if err := first.Flush(context.Background()); err != nil {
					renewed <- err
					return
				}
			}
		}()
		again := s.poll(second, 1)
		close(stop)
		require.NoError(t, <-renewed)
		require.Equal(t, []string{"b"}, values(again))

		require.NoError(t, first.Settle(kafkaclient.Accept, ids(rs)...))
		err := first.Flush(testenv.Context(t, 10*time.Second))
		var settleErr *kafkaclient.SettleError
		require.ErrorAs(t, err, &settleErr)
		require.Equal(t, ids(rs), []kafkaclient.RecordID{settleErr.Failed[0].Record, settleErr.Failed[1].Record}, "both named")
		require.ErrorIs(t, err, kerr.InvalidRecordState)

		s.settle(second, kafkaclient.Accept, again...)
		a := s.poll(second, 1)
		require.Equal(t, rs[0].RecordID, a[0].RecordID, "a's accept was not taken")
		require.Equal(t, 2, a[0].DeliveryCount)
		s.settle(second, kafkaclient.Accept, a...)
	})
	t.Run("AClosedMembersUnsettledRecordsGoToAnotherBeforeTheirLockRunsOut", func(t *testing.T) {
		t.Parallel()
		const lock = 30 * time.Second
		s := newShareSetup(t, shareOptions{lock: lock})
		s.produce("a")
		first, second := s.member(), s.member()
		rs := s.poll(first, 1)
		require.NoError(t, first.Close(testenv.Context(t, 10*time.Second)))
		again, err := second.Poll(testenv.Context(t, lock/2))
		require.NoError(t, err)
		require.Equal(t, ids(rs), ids(again))
		s.settle(second, kafkaclient.Accept, again...)
	})
	t.Run("APollAcquiresNoMoreThanMaxRecords", func(t *testing.T) {
		// The records past MaxRecords are left for other members, not
		// locked in a buffer until their lock runs out.
		t.Parallel()
		const lock = 30 * time.Second
		s := newShareSetup(t, shareOptions{lock: lock})
		s.produce("a", "b", "c", "d", "e")
		first, second := s.memberOf(2), s.member()
		rs := s.poll(first, 2)
		rest, err := second.Poll(testenv.Context(t, lock/2))
		require.NoError(t, err)
		require.Len(t, rest, 3)
		s.settle(first, kafkaclient.Accept, rs...)
		s.settle(second, kafkaclient.Accept, rest...)
	})
}

func TestShareMemberRefuses(t *testing.T) {
	t.Parallel()
	t.Run("APollWhileRecordsOfTheLastAreUnsettledOrUnflushed", func(t *testing.T) {
		t.Parallel()
		s := newShareSetup(t, shareOptions{})
		s.produce("a", "b")
		m := s.member()
		rs := s.poll(m, 2)
		ctx := testenv.Context(t, 10*time.Second)
		_, err := m.Poll(ctx)
		require.ErrorIs(t, err, kafkaclient.ErrUnsettled, "nothing settled")

		require.NoError(t, m.Settle(kafkaclient.Accept, rs[0].RecordID))
		require.NoError(t, m.Settle(kafkaclient.Renew, rs[1].RecordID))
		require.NoError(t, m.Flush(ctx))
		_, err = m.Poll(ctx)
		require.ErrorIs(t, err, kafkaclient.ErrUnsettled, "a renewed record is unsettled")

		require.NoError(t, m.Settle(kafkaclient.Accept, rs[1].RecordID))
		_, err = m.Poll(ctx)
		require.ErrorIs(t, err, kafkaclient.ErrUnsettled, "settled, not flushed")

		require.NoError(t, m.Flush(ctx))
		s.nothing(m, beyondLock)
	})
	t.Run("ASecondSettlementOrOneOfARecordNotPolled", func(t *testing.T) {
		t.Parallel()
		s := newShareSetup(t, shareOptions{})
		s.produce("a")
		m := s.member()
		rs := s.poll(m, 1)
		require.NoError(t, m.Settle(kafkaclient.Reject, rs[0].RecordID))
		require.Error(t, m.Settle(kafkaclient.Accept, rs[0].RecordID), "settled already")
		other := rs[0].RecordID
		other.Offset++
		require.Error(t, m.Settle(kafkaclient.Accept, other), "not polled")
		require.NoError(t, m.Flush(testenv.Context(t, 10*time.Second)))
	})
}

func TestShareReadsCommittedRecordsOnly(t *testing.T) {
	t.Parallel()
	s := newShareSetup(t, shareOptions{})
	ctx := testenv.Context(t, 15*time.Second)
	tx, err := kgo.NewClient(kgo.SeedBrokers(s.brokers...), kgo.DefaultProduceTopic(s.topic), kgo.TransactionalID(testenv.Name(t, "tx")))
	require.NoError(t, err)
	defer tx.Close()
	for _, end := range []kgo.TransactionEndTry{kgo.TryAbort, kgo.TryCommit} {
		require.NoError(t, tx.BeginTransaction())
		v := "aborted"
		if end == kgo.TryCommit {
			v = "committed"
		}
		require.NoError(t, tx.ProduceSync(ctx, kgo.StringRecord(v)).FirstErr())
		require.NoError(t, tx.EndTransaction(ctx, end))
	}

	m := s.member()
	settings, err := s.admin.ShareSettings(ctx, s.group)
	require.NoError(t, err)
	require.Equal(t, "read_committed", settings.Isolation, "joining set the group's isolation")
	rs := s.poll(m, 1)
	require.Equal(t, []string{"committed"}, values(rs))
	s.settle(m, kafkaclient.Accept, rs...)
	s.nothing(m, beyondLock)
}

func TestShareSettingsAreTheGroupsOrTheBrokersDefaults(t *testing.T) {
	t.Parallel()
	s := newShareSetup(t, shareOptions{})
	ctx := testenv.Context(t, 10*time.Second)
	settings, err := s.admin.ShareSettings(ctx, s.group)
	require.NoError(t, err)
	require.Equal(t, kafkaadmin.ShareSettings{DeliveryLimit: 5, LockDuration: shareLock, Start: "earliest", Isolation: "read_uncommitted"}, settings)

	require.NoError(t, s.admin.SetShareStart(ctx, s.group, "latest"))
	settings, err = s.admin.ShareSettings(ctx, s.group)
	require.NoError(t, err)
	require.Equal(t, "latest", settings.Start)
}
