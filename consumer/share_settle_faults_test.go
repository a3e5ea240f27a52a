package consumer_test

import (
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kafkaonce/kafkaonce/consumer"
)

// The acknowledgement types on the wire (KIP-932; renew is KIP-1222's).
const (
	ackAccept int8 = 1
	ackRenew  int8 = 4
)

// carries reports whether a share acknowledgement (standalone, or carried
// by a share fetch) settles any record as ackType.
func carries(kr kmsg.Request, ackType int8) bool {
	switch req := kr.(type) {
	case *kmsg.ShareAcknowledgeRequest:
		for _, tp := range req.Topics {
			for _, p := range tp.Partitions {
				for _, b := range p.AcknowledgementBatches {
					if slices.Contains(b.AcknowledgeTypes, ackType) {
						return true
					}
				}
			}
		}
	case *kmsg.ShareFetchRequest:
		for _, tp := range req.Topics {
			for _, p := range tp.Partitions {
				for _, b := range p.AcknowledgementBatches {
					if slices.Contains(b.AcknowledgeTypes, ackType) {
						return true
					}
				}
			}
		}
	}
	return false
}

// holdAccepts has the broker hold every request that accepts records,
// unanswered, until the returned func is called (or the test ends).
func (e *shareEnv) holdAccepts() (letAnswer func()) {
	letAnswer, _ = e.holdSettlements(ackAccept)
	return letAnswer
}

// holdSettlements has the broker hold every request that settles records
// as ackType, unanswered, until letAnswer is called (or the test ends);
// held is closed once it holds one.
func (e *shareEnv) holdSettlements(ackType int8) (letAnswer func(), held <-chan struct{}) {
	answer, holding := make(chan struct{}), make(chan struct{})
	var once, heldOnce sync.Once
	letAnswer = func() { once.Do(func() { close(answer) }) }
	e.t.Cleanup(letAnswer)
	for _, key := range []kmsg.Key{kmsg.ShareAcknowledge, kmsg.ShareFetch} {
		e.fake.ControlKey(int16(key), func(kr kmsg.Request) (kmsg.Response, error, bool) {
			e.fake.KeepControl()
			if carries(kr, ackType) {
				heldOnce.Do(func() { close(holding) })
				e.fake.SleepControl(func() { <-answer })
			}
			return nil, nil, false
		})
	}
	return letAnswer, holding
}

// A broker that answers a member's accepts only after the member stopped
// waiting for them (its flush outlasts the bound of a request) answers
// them all the same, later: the member, which polls again only once every
// settlement of its last poll is flushed, must flush them again before its
// next poll, and go on taking records once the broker answers, not
// refuse to poll for good.
func TestShareGroupMemberPollsAgainAfterAFlushOutlastsItsBound(t *testing.T) {
	if testing.Short() {
		t.Skip("waits out a request's 15 s bound; runs without -short")
	}
	e := setupShare(t, shareOptions{fakeOnly: "the broker holds its answer to the accepts by kfake's control"})
	letAnswer := e.holdAccepts()
	first := e.produceIDs("first", 3)
	cfg := e.shareConfig(false, nil)
	var flushFailed <-chan struct{}
	cfg.Logger, flushFailed = watchLog(cfg.Logger, "could not flush settlements; records not taken are delivered again and found claimed")
	e.start(cfg)
	e.waitEffects(len(first), 30*time.Second)
	select {
	case <-flushFailed:
	case <-time.After(60 * time.Second):
		t.Fatal("the member's flush of its accepts did not give up")
	}
	letAnswer()
	// The broker answers now: the member takes the next records.
	later := e.produceIDs("later", 3)
	e.waitEffects(len(first)+len(later), 30*time.Second)
	e.requireExactlyOnce(append(first, later...))
}

// A broker that stops answering a member's settlements holds no shutdown:
// the member's flushes, its accepts' and its renewals' alike, end with the
// shutdown's grace (ShutdownTimeout), and the leave with its own two
// seconds, after which the client's requests in flight are cut; so Run
// returns within those and some slack (and leaves no goroutine behind:
// goleak looks after the package). Nothing is lost: a settlement the
// broker never answered leaves its record to be delivered again (found
// claimed, if it was applied), and a member started once the broker
// answers again applies every record, each once.
func TestShareGroupMemberStopsWhileTheBrokerHoldsItsSettlements(t *testing.T) {
	const fakeOnly = "the broker holds its answers by kfake's control"
	// stop stops r, whose ShutdownTimeout is cfg's, within its bound: a
	// request's own bound (15 s) or kgo's retries of an unanswered
	// acknowledgement (30 s) would overshoot it.
	stop := func(t *testing.T, r *running, cfg *consumer.Config) {
		stopsWithin(t, r, cfg.ShutdownTimeout+2*time.Second+5*time.Second)
	}
	// appliesEachOnce has a new member, once the broker answers, apply
	// ids and records produced since, each once.
	appliesEachOnce := func(t *testing.T, e *shareEnv, letAnswer func(), ids []string) {
		letAnswer()
		ids = append(ids, e.produceIDs("later", 3)...)
		e.start(e.shareConfig(false, nil))
		e.waitEffects(len(ids), 30*time.Second)
		stillFor(t, shareLock, "no effect applied twice", func() bool { return e.effects() == int64(len(ids)) })
		e.requireExactlyOnce(ids)
	}

	t.Run("its accepts", func(t *testing.T) {
		e := setupShare(t, shareOptions{fakeOnly: fakeOnly})
		letAnswer := e.holdAccepts()
		ids := e.produceIDs("m", 3)
		cfg := e.shareConfig(false, nil)
		cfg.ShutdownTimeout = time.Second
		r := e.start(cfg)
		e.waitEffects(len(ids), 30*time.Second)
		stop(t, r, cfg)
		appliesEachOnce(t, e, letAnswer, ids)
	})

	t.Run("its lock renewals", func(t *testing.T) {
		e := setupShare(t, shareOptions{fakeOnly: fakeOnly})
		letAnswer, held := e.holdSettlements(ackRenew)
		ids := e.produceIDs("m", 1)
		// The handler outlasts half the lock, so the member renews it,
		// and the broker holds the renewal: the member's loop, done with
		// the record, waits for the renewal's flush to settle it.
		cfg := e.shareConfig(false, func(*consumer.Message) error {
			<-held
			return nil
		})
		cfg.ShutdownTimeout = time.Second
		r := e.start(cfg)
		e.waitEffects(len(ids), 30*time.Second)
		stop(t, r, cfg)
		appliesEachOnce(t, e, letAnswer, ids)
	})
}
