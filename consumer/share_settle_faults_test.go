package consumer_test

import (
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kmsg"
)

// acceptsIn reports whether a share acknowledgement (standalone, or
// carried by a share fetch) accepts any record.
func acceptsIn(kr kmsg.Request) bool {
	const accept = 1
	switch req := kr.(type) {
	case *kmsg.ShareAcknowledgeRequest:
		for _, tp := range req.Topics {
			for _, p := range tp.Partitions {
				for _, b := range p.AcknowledgementBatches {
					if slices.Contains(b.AcknowledgeTypes, accept) {
						return true
					}
				}
			}
		}
	case *kmsg.ShareFetchRequest:
		for _, tp := range req.Topics {
			for _, p := range tp.Partitions {
				for _, b := range p.AcknowledgementBatches {
					if slices.Contains(b.AcknowledgeTypes, accept) {
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
	answer := make(chan struct{})
	var once sync.Once
	letAnswer = func() { once.Do(func() { close(answer) }) }
	e.t.Cleanup(letAnswer)
	for _, key := range []kmsg.Key{kmsg.ShareAcknowledge, kmsg.ShareFetch} {
		e.fake.ControlKey(int16(key), func(kr kmsg.Request) (kmsg.Response, error, bool) {
			e.fake.KeepControl()
			if acceptsIn(kr) {
				e.fake.SleepControl(func() { <-answer })
			}
			return nil, nil, false
		})
	}
	return letAnswer
}

// A broker that answers a member's accepts only after the member stopped
// waiting for them (its flush outlasts the bound of a request) answers
// them all the same, later: the member, which polls again only once every
// settlement of its last poll is flushed, must flush them again before its
// next poll, and go on taking records once the broker answers, not
// refuse to poll for good.
func TestShareGroupMemberPollsAgainAfterAFlushOutlastsItsBound(t *testing.T) {
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
// Run returns promptly all the same (the harness's stop fails when it does
// not); the accepts it never answered leave their records to be delivered
// again and found claimed.
func TestShareGroupMemberStopsWhileTheBrokerHoldsItsSettlements(t *testing.T) {
	e := setupShare(t, shareOptions{fakeOnly: "the broker holds its answers by kfake's control"})
	e.holdAccepts()
	ids := e.produceIDs("m", 3)
	r := e.start(e.shareConfig(false, nil))
	e.waitEffects(len(ids), 30*time.Second)
	r.stop()
}
