package consumer_test

import (
	"testing"
	"time"

	"github.com/kafkaonce/kafkaonce/consumer"
)

// New refuses the zero MessageIDRule ("derives no id") and takes a nil
// MessageIDFunc for the default ("it would otherwise panic on every
// message"), but takes a nil *MessageIDRule, which the MessageIDSource
// interface lets through and ruleOf handles only when non-nil: every
// message then panics in MessageID (a nil pointer dereference), the engine
// recovers it as an invalid id, and every message of the topic is set
// aside as a dead letter (invalid_id), none applied. The record says
// "custom", so audit also asks for --id.
func TestAdversaryANilMessageIDRulePointerDeadLettersEveryMessage(t *testing.T) {
	t.Parallel()
	e := setup(t, 1)
	ids := e.produceIDs("n", 3)
	cfg := e.config(e.applyHandler())
	var rule *consumer.MessageIDRule
	cfg.MessageID = rule
	if _, err := consumer.New(e.db.Pool, cfg); err != nil {
		return // refused, as the zero rule is: fine
	}
	r := e.start(cfg)
	letters := func() int64 {
		return e.db.Int(t, `SELECT count(*) FROM `+e.db.Table("dead_letters")+` WHERE consumer = $1`, e.name)
	}
	waitFor(t, 30*time.Second, "every message settled", func() bool { return e.distinctEffects()+letters() >= int64(len(ids)) })
	r.stop()
	if n := letters(); n > 0 {
		t.Errorf("New accepted a nil *MessageIDRule, and %d of %d messages were dead-lettered for their ids (a nil MessageIDFunc is taken for the default header; the zero rule is refused)", n, len(ids))
	}
}
