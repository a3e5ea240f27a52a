package consumer_test

import (
	"context"
	"errors"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kafkaonce/kafkaonce/consumer"
	"github.com/kafkaonce/kafkaonce/deadletter"
	"github.com/kafkaonce/kafkaonce/internal/devenv"
	"github.com/kafkaonce/kafkaonce/internal/kafkaclient"
	"github.com/kafkaonce/kafkaonce/internal/kafkaclient/franz"
	"github.com/kafkaonce/kafkaonce/internal/testenv"
)

// shareLock is the acquisition lock of the share tests' groups: short, so
// that a lock running out is seen in seconds. Kafka takes it as the
// group's share.record.lock.duration.ms, within the broker's bounds
// (scripts/kafka-broker.sh lowers the floor to 1 s); kfake reads only the
// broker's group.share.record.lock.duration.ms.
const shareLock = 1500 * time.Millisecond

// shareEnv is a share test's world: env on a one-partition topic whose
// group is a share group that starts at the log's start and holds its
// locks for shareLock.
type shareEnv struct {
	*env
	// fake is the test's own kfake; nil on KAFKA_BROKERS's broker.
	fake *kfake.Cluster
	// calls counts handler calls per message id, over every member.
	mu    sync.Mutex
	calls map[string]int
}

// shareOptions are a share test's settings beyond the short lock.
type shareOptions struct {
	// deliveryLimit is the group's delivery count limit (0: the broker's).
	deliveryLimit int
	// fakeOnly, when set, says why the test needs kfake (it steers the
	// broker's answers): on KAFKA_BROKERS's broker it is skipped, saying so.
	fakeOnly string
	// partitions is the topic's partition count (0: one).
	partitions int
}

// setupShare gives the test its share group, on a topic of one partition
// unless o says otherwise. With KAFKA_BROKERS set the broker is that one
// (the test is skipped when it has no share groups), and the lock and the
// delivery limit are the group's own configs, which Kafka honours; else it
// is a kfake of the test's own, and they are its broker configs, since
// kfake takes a group's lock and delivery limit from those alone.
func setupShare(t *testing.T, o shareOptions) *shareEnv {
	t.Helper()
	lockMs := strconv.Itoa(int(shareLock.Milliseconds()))
	partitions := max(o.partitions, 1)
	if os.Getenv("KAFKA_BROKERS") != "" {
		if o.fakeOnly != "" {
			t.Skipf("on kfake only: %s", o.fakeOnly)
		}
		k := testenv.NewKafka(t)
		testenv.RequireShareGroups(t, k.Brokers)
		e := &shareEnv{env: setupOn(t, partitions, k), calls: map[string]int{}}
		configs := map[string]string{"share.auto.offset.reset": "earliest", "share.record.lock.duration.ms": lockMs}
		if o.deliveryLimit > 0 {
			configs["share.delivery.count.limit"] = strconv.Itoa(o.deliveryLimit)
		}
		require.NoError(t, franz.SetGroupConfigs(testenv.Context(t, 10*time.Second), k.Client(t), e.group, configs))
		return e
	}
	bc := map[string]string{
		"group.share.record.lock.duration.ms": lockMs,
		"share.record.lock.sweep.interval.ms": "100",
	}
	if o.deliveryLimit > 0 {
		bc["group.share.delivery.count.limit"] = strconv.Itoa(o.deliveryLimit)
	}
	k, err := devenv.StartFakeKafka(kfake.BrokerConfigs(bc))
	require.NoError(t, err)
	t.Cleanup(func() { _ = k.Close() })
	e := &shareEnv{env: setupOn(t, partitions, &testenv.Kafka{Kafka: k}), fake: k.Fake, calls: map[string]int{}}
	admin := testenv.Admin(t, k.Brokers)
	require.NoError(t, admin.SetShareStart(testenv.Context(t, 10*time.Second), e.group, "earliest"))
	return e
}

// shareConfig is a member's config, applying each message once after
// check passed it (see checkedConfig), counting the calls.
func (e *shareEnv) shareConfig(batched bool, check func(*consumer.Message) error) *consumer.Config {
	cfg := e.checkedConfig(batched, func(m *consumer.Message) error {
		e.mu.Lock()
		e.calls[m.ID]++
		e.mu.Unlock()
		if check == nil {
			return nil
		}
		return check(m)
	})
	cfg.GroupType, cfg.KafkaClient = consumer.ShareGroup, consumer.FranzGo
	return cfg
}

func (e *shareEnv) callsOf(id string) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.calls[id]
}

// Each record of a share group is applied once, whichever member takes
// it, with both handler shapes.
func TestShareGroupAppliesEachRecordOnce(t *testing.T) {
	bothWays(t, [2]string{"Handler", "BatchHandler"}, func(t *testing.T, batched bool) {
		e := setupShare(t, shareOptions{})
		ids := e.produceIDs("m", 300)
		for range 3 {
			cfg := e.shareConfig(batched, nil)
			cfg.MaxBatch = 20
			e.start(cfg)
		}
		e.waitEffects(len(ids), 60*time.Second)
		stillFor(t, shareLock, "no effect applied twice", func() bool { return e.effects() == int64(len(ids)) })
		e.requireExactlyOnce(ids)
		require.Empty(t, e.storedPositions(), "a share group stores no positions")
	})
}

// An accept lost after the COMMIT (the broker never answers it) leaves the
// record to be delivered again: found claimed, it is accepted without its
// handler, and applied once.
func TestShareGroupLostAcceptFindsTheClaim(t *testing.T) {
	bothWays(t, [2]string{"Handler", "BatchHandler"}, func(t *testing.T, batched bool) {
		e := setupShare(t, shareOptions{fakeOnly: "the accept is lost by kfake's answer to it being cut"})
		var dropped atomic.Bool
		// The first acknowledgement is lost: the connection is cut
		// instead of an answer.
		e.fake.ControlKey(int16(kmsg.ShareAcknowledge), func(kmsg.Request) (kmsg.Response, error, bool) {
			e.fake.KeepControl()
			if dropped.CompareAndSwap(false, true) {
				return nil, errors.New("accept lost"), true
			}
			return nil, nil, false
		})
		e.fake.ControlKey(int16(kmsg.ShareFetch), func(kr kmsg.Request) (kmsg.Response, error, bool) {
			e.fake.KeepControl()
			req := kr.(*kmsg.ShareFetchRequest)
			for _, tp := range req.Topics {
				for _, p := range tp.Partitions {
					if len(p.AcknowledgementBatches) > 0 && dropped.CompareAndSwap(false, true) {
						return nil, errors.New("accept lost"), true
					}
				}
			}
			return nil, nil, false
		})
		ids := e.produceIDs("m", 5)
		e.start(e.shareConfig(batched, nil))
		e.waitEffects(len(ids), 30*time.Second)
		require.Eventually(t, dropped.Load, 10*time.Second, 50*time.Millisecond, "an acknowledgement was lost")
		waitFor(t, 20*time.Second, "a record delivered again found claimed", func() bool {
			return e.events.snapshot().skipped[consumer.SkipAlreadyClaimed] > 0
		})
		stillFor(t, shareLock, "no effect applied twice", func() bool { return e.effects() == int64(len(ids)) })
		e.requireExactlyOnce(ids)
	})
}

// A handler that runs past the acquisition lock has its record renewed:
// the record is not handed to another member meanwhile.
func TestShareGroupRenewsTheLockOfASlowHandler(t *testing.T) {
	bothWays(t, [2]string{"Handler", "BatchHandler"}, func(t *testing.T, batched bool) {
		e := setupShare(t, shareOptions{})
		ids := e.produceIDs("m", 3)
		slow := ids[1]
		var once sync.Once
		started := make(chan struct{})
		check := func(m *consumer.Message) error {
			if m.ID == slow {
				once.Do(func() { close(started) })
				time.Sleep(3 * shareLock)
			}
			return nil
		}
		e.start(e.shareConfig(batched, check))
		<-started
		// The other members join while the slow one holds the record.
		e.start(e.shareConfig(batched, check))
		e.start(e.shareConfig(batched, check))
		e.waitEffects(len(ids), 30*time.Second)
		stillFor(t, shareLock, "no effect applied twice", func() bool { return e.effects() == int64(len(ids)) })
		e.requireExactlyOnce(ids)
		require.Equal(t, 1, e.callsOf(slow), "the slow record was handed to one member only")
		require.Zero(t, e.events.snapshot().skipped[consumer.SkipAlreadyClaimed], "no member met the slow record again")
	})
}

// A message that fails every time is set aside in dead_letters after
// Retry.MaxAttempts, on its first delivery, and rejected: it is not
// delivered again.
func TestShareGroupSetsAsideAPoisonRecord(t *testing.T) {
	bothWays(t, [2]string{"Handler", "BatchHandler"}, func(t *testing.T, batched bool) {
		e := setupShare(t, shareOptions{deliveryLimit: 4})
		ids := e.produceIDs("m", 4)
		poison := ids[2]
		cfg := e.shareConfig(batched, func(m *consumer.Message) error {
			if m.ID == poison {
				return errors.New("partner says no")
			}
			return nil
		})
		cfg.Retry.MaxAttempts = 3
		e.start(cfg)
		waitFor(t, 30*time.Second, "the poison record set aside", func() bool { _, ok := e.letters()[poison]; return ok })
		e.waitEffects(len(ids)-1, 30*time.Second)
		l := e.letters()[poison]
		require.Contains(t, l.Error, "partner says no")
		require.Contains(t, l.Error, "share group delivery 1 of 4")
		require.Equal(t, 3, l.Attempts)
		calls := e.callsOf(poison)
		stillFor(t, 2*shareLock, "the rejected record not delivered again", func() bool { return e.callsOf(poison) == calls })
		require.Equal(t, int64(len(ids)-1), e.effects())
	})
}

// When the consumer's own closing statements are refused for their data
// (here the poison record's dead letter, by a constraint an operator
// added), every delivery of the record would be refused the same way:
// the member stops, Run returns the refusal, and the record goes back to
// the group unsettled, neither accepted nor rejected. Once the cause is
// gone a member sets it aside as it should.
func TestShareGroupMemberStopsWhenItsOwnStatementsAreRefused(t *testing.T) {
	bothWays(t, [2]string{"Handler", "BatchHandler"}, func(t *testing.T, batched bool) {
		e := setupShare(t, shareOptions{deliveryLimit: 10})
		e.db.Exec(t, `ALTER TABLE `+e.db.Table("dead_letters")+` ADD CONSTRAINT no_partner_refusals CHECK (error NOT LIKE '%partner says no%')`)
		ids := e.produceIDs("m", 3)
		poison := ids[1]
		config := func() *consumer.Config {
			return e.shareConfig(batched, func(m *consumer.Message) error {
				if m.ID == poison {
					return consumer.Permanent(errors.New("partner says no"))
				}
				return nil
			})
		}
		c, err := consumer.New(e.db.Pool, config())
		require.NoError(t, err)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		done := make(chan error, 1)
		go func() { done <- c.Run(ctx) }()
		select {
		case err := <-done:
			require.Error(t, err)
			require.Contains(t, err.Error(), "were refused, and would be again")
			require.Contains(t, err.Error(), "no_partner_refusals")
		case <-time.After(30 * time.Second):
			t.Fatal("Run did not return: the refused statements were retried on and on")
		}
		require.Empty(t, e.letters(), "nothing set aside")

		e.db.Exec(t, `ALTER TABLE `+e.db.Table("dead_letters")+` DROP CONSTRAINT no_partner_refusals`)
		e.start(config())
		waitFor(t, 30*time.Second, "the record, delivered again, set aside", func() bool { _, ok := e.letters()[poison]; return ok })
		e.waitEffects(len(ids)-1, 30*time.Second)
		stillFor(t, shareLock, "no effect applied twice", func() bool { return e.effects() == int64(len(ids)-1) })
	})
}

// A record whose handler kills its process on every delivery is archived
// by the broker after its last delivery without a word. Its letter,
// written before the handler ran on that last delivery, stays: the whole
// message, why, and the delivery it died on, open to redrive; the broker
// does not deliver the record again. Earlier deliveries, delivered again
// when they die, leave no letter.
func TestShareGroupRecordThatKillsItsProcessReachesDeadLetters(t *testing.T) {
	t.Parallel()
	e := setupShare(t, shareOptions{deliveryLimit: 2})
	poison := kafka.Message{Key: []byte("k-poison"), Value: []byte("v-poison"), Headers: []kafka.Header{
		{Key: consumer.DefaultMessageIDHeader, Value: []byte("poison")}, {Key: "trace", Value: []byte{0, 1, 2}}}}
	e.kafka.Produce(t, e.topic, poison)
	spec := childSpec{DatabaseURL: e.db.URL, Schema: e.db.Schema, Brokers: e.kafka.Brokers, Topic: e.topic, Group: e.group, Name: e.name,
		KillOn: "poison", Share: true}

	t.Run("the first delivery dies without a letter", func(t *testing.T) {
		e.runChildUntilKilled(spec, 30*time.Second)
		require.Empty(t, e.letters())
	})
	t.Run("the last delivery dies with its letter written", func(t *testing.T) {
		e.runChildUntilKilled(spec, 30*time.Second)
		l, ok := e.letters()["poison"]
		require.True(t, ok, "a letter for the record")
		require.Equal(t, deadletter.ClassCrashed, l.Class)
		require.Equal(t, []byte("k-poison"), l.Key)
		require.Equal(t, []byte("v-poison"), l.Value)
		require.Contains(t, l.Headers, deadletter.Header{Key: "trace", Value: []byte{0, 1, 2}})
		require.Contains(t, l.Error, "share group delivery 2 of 2 did not finish")
		require.Equal(t, 2, l.Attempts)
		require.Nil(t, l.RedrivenAt)
		require.Zero(t, e.effects())
	})
	t.Run("the broker does not deliver it again and the letter redrives it", func(t *testing.T) {
		c, err := consumer.New(e.db.Pool, e.shareConfig(false, nil))
		require.NoError(t, err)
		e.run(c)
		after := e.produceIDs("after", 1)
		e.waitEffects(1, 30*time.Second)
		stillFor(t, 2*shareLock, "the archived record not delivered again", func() bool { return e.callsOf("poison") == 0 })
		e.requireExactlyOnce(after)
		res, err := c.Redrive(testenv.Context(t, 30*time.Second), consumer.RedriveFilter{})
		require.NoError(t, err)
		require.Equal(t, 1, res.Applied)
		e.requireExactlyOnce(append(after, "poison"))
	})
}

// With a delivery limit of 2 and every record delivered once already (and
// released), every delivery the consumer gets is a record's last, and each
// record gets its provisional letter before its handler runs: the
// transaction that applies a record removes it, and the one that sets a
// record aside puts its final letter in its place. (A limit of 1 would
// need no first delivery, but Kafka refuses a group limit below 2.)
func TestShareGroupLastDeliveryLettersGoWhenTheRecordIsSettled(t *testing.T) {
	bothWays(t, [2]string{"Handler", "BatchHandler"}, func(t *testing.T, batched bool) {
		e := setupShare(t, shareOptions{deliveryLimit: 2})
		ids := e.produceIDs("m", 20)
		e.deliverAndRelease(len(ids))
		poison := ids[7]
		// Seen from outside the handler's transaction: the letters
		// written before it ran.
		var provisional atomic.Int64
		e.start(e.shareConfig(batched, func(m *consumer.Message) error {
			if m.ID == ids[0] {
				var n int64
				if err := e.db.Pool.QueryRow(context.Background(), `SELECT count(*) FROM `+e.db.Table("dead_letters")+` WHERE provisional`).Scan(&n); err == nil {
					provisional.Store(n)
				}
			}
			if m.ID == poison {
				return consumer.Permanent(errors.New("partner says no"))
			}
			return nil
		}))
		e.waitEffects(len(ids)-1, 30*time.Second)
		require.Positive(t, provisional.Load(), "provisional letters were written before the handlers ran: the records were on their last delivery")
		waitFor(t, 10*time.Second, "the poison set aside", func() bool { return e.letters()[poison].Class == deadletter.ClassPermanent })
		letters := e.letters()
		require.Equal(t, 1, len(letters), "no provisional letter left behind")
		require.Equal(t, deadletter.ClassPermanent, letters[poison].Class)
		require.Contains(t, letters[poison].Error, "partner says no")
		require.Zero(t, e.db.Int(t, `SELECT count(*) FROM `+e.db.Table("dead_letters")+` WHERE provisional`))
	})
}

// deliverAndRelease has the topic's first n records delivered once, to
// members of the group that are not consumers, and released: their next
// delivery is their second. Each member holds what it polled, unsettled,
// so that none is handed a record released already; then each releases
// its records and leaves.
func (e *shareEnv) deliverAndRelease(n int) {
	e.t.Helper()
	cl, err := franz.New(kafkaclient.Config{Brokers: e.kafka.Brokers})
	require.NoError(e.t, err)
	defer cl.Close()
	ctx := testenv.Context(e.t, 30*time.Second)
	var members []kafkaclient.ShareMember
	var held [][]kafkaclient.RecordID
	for got := 0; got < n; {
		m, err := cl.JoinShare(ctx, kafkaclient.ShareConfig{Group: e.group, Topics: []string{e.topic}})
		require.NoError(e.t, err)
		rs, err := m.Poll(ctx)
		require.NoError(e.t, err)
		var ids []kafkaclient.RecordID
		for _, r := range rs {
			require.Equal(e.t, 1, r.DeliveryCount, "a record's first delivery")
			ids = append(ids, r.RecordID)
		}
		members, held = append(members, m), append(held, ids)
		got += len(rs)
	}
	for i, m := range members {
		require.NoError(e.t, m.Settle(kafkaclient.Release, held[i]...))
		require.NoError(e.t, m.Flush(ctx))
		require.NoError(e.t, m.Close(ctx))
	}
}

// A member whose lock renewals the broker refuses no longer holds its
// records: it stops working on them, saying so, and gives them back,
// rather than retrying a record another member may hold meanwhile. A
// record that fails every time so goes through its deliveries, each given
// up at the first refused renewal, and is set aside on its last; a member
// that went on retrying it would stay on its first delivery for
// MaxAttempts.
func TestShareGroupMemberStopsWorkingOnRecordsWhoseRenewalIsRefused(t *testing.T) {
	bothWays(t, [2]string{"Handler", "BatchHandler"}, func(t *testing.T, batched bool) {
		e := setupShare(t, shareOptions{deliveryLimit: 3, fakeOnly: "the renewals are refused by kfake's answer to them"})
		var refused atomic.Int64
		e.fake.ControlKey(int16(kmsg.ShareAcknowledge), func(kr kmsg.Request) (kmsg.Response, error, bool) {
			e.fake.KeepControl()
			req := kr.(*kmsg.ShareAcknowledgeRequest)
			renew := false
			resp := req.ResponseKind().(*kmsg.ShareAcknowledgeResponse)
			for _, tp := range req.Topics {
				rt := kmsg.NewShareAcknowledgeResponseTopic()
				rt.TopicID = tp.TopicID
				for _, p := range tp.Partitions {
					for _, b := range p.AcknowledgementBatches {
						renew = renew || slices.Contains(b.AcknowledgeTypes, 4)
					}
					rp := kmsg.NewShareAcknowledgeResponseTopicPartition()
					rp.Partition, rp.ErrorCode = p.Partition, kerr.InvalidRecordState.Code
					rt.Partitions = append(rt.Partitions, rp)
				}
				resp.Topics = append(resp.Topics, rt)
			}
			if !renew {
				return nil, nil, false
			}
			refused.Add(1)
			return resp, nil, true
		})
		ids := e.produceIDs("m", 3)
		poison := ids[1]
		cfg := e.shareConfig(batched, func(m *consumer.Message) error {
			if m.ID == poison {
				return errors.New("partner down")
			}
			return nil
		})
		cfg.Retry.MaxAttempts = 1000
		e.start(cfg)
		// Its provisional letter comes first, then the final one.
		waitFor(t, 20*time.Second, "the poison set aside on its last delivery", func() bool {
			return strings.Contains(e.letters()[poison].Error, "partner down")
		})
		require.Positive(t, refused.Load(), "renewals were refused")
		l := e.letters()[poison]
		require.Contains(t, l.Error, "partner down")
		require.Contains(t, l.Error, "share group delivery 3 of 3")
		e.waitEffects(len(ids)-1, 10*time.Second)
		stillFor(t, shareLock, "no effect applied twice", func() bool { return e.effects() == int64(len(ids)-1) })
	})
}
