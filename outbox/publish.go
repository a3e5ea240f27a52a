package outbox

import (
	"context"
	"errors"
	"fmt"

	"github.com/segmentio/kafka-go"

	"github.com/kafkaonce/kafkaonce/internal/permanent"
)

// maxBatchBytes bounds the bytes of one write to Kafka: kafka-go's default
// BatchBytes, under the broker's default message.max.bytes (1048588). A
// message larger than this is never sent.
const maxBatchBytes = 1 << 20

// publish writes the rows to Kafka, in calls made one after the other in
// the rows' order, and keeps each key's order by construction:
//
//   - kafka-go splits a call's messages into one batch per partition,
//     unless they pass BatchBytes; each call holds at most BatchBytes, so
//     a key's messages in a call are one batch, which the broker appends or
//     rejects as a whole;
//   - a key's messages in one call go to one topic (a key that has a row
//     for another topic starts a new call);
//   - once a row of a key failed, the key's later rows are held: not
//     sent in this round, and then held back by the waiting row.
//
// A message larger than BatchBytes never goes (kafka-go rejects the whole
// call), and one the broker rejects as too large alone never will: both
// are parked at once with the reason. (A message without a key goes to any
// partition, so such messages have no order in Kafka.)
func (r *Relay) publish(ctx context.Context, rows []row, outcomes []outcome) {
	failed := map[string]bool{}
	var idx []int
	var msgs []kafka.Message
	var bytes int64
	topicOf := map[string]string{} // key -> topic, in the current call
	flush := func() {
		if len(msgs) > 0 {
			r.write(ctx, rows, outcomes, idx, msgs, failed)
		}
		idx, msgs, bytes = idx[:0], msgs[:0], 0
		clear(topicOf)
	}
	for i := range rows {
		rw := &rows[i]
		k := string(rw.key)
		if failed[k] {
			outcomes[i] = outcome{held: true}
			continue
		}
		if !outcomes[i].pending() {
			continue
		}
		m := kafka.Message{Topic: rw.dest, Key: rw.key, Value: rw.val}
		for _, h := range rw.headers {
			m.Headers = append(m.Headers, kafka.Header{Key: h.Key, Value: h.Value})
		}
		m.Headers = append(m.Headers, kafka.Header{Key: r.cfg.MessageIDHeader, Value: []byte(rw.id)})
		size := messageBytes(&m)
		if size > maxBatchBytes {
			// Earlier rows of the key in the current call go first; this one
			// can never go.
			flush()
			if failed[k] {
				outcomes[i] = outcome{held: true}
				continue
			}
			outcomes[i] = outcome{park: true, err: withClass(FailureTooLarge, fmt.Errorf("outbox: message of %d bytes is larger than the %d bytes the relay sends to Kafka in one request; it can never be published: make it smaller",
				size, maxBatchBytes))}
			failed[k] = true
			continue
		}
		if t, ok := topicOf[k]; (ok && t != rw.dest) || bytes+size > maxBatchBytes {
			flush()
			if failed[k] {
				outcomes[i] = outcome{held: true}
				continue
			}
		}
		topicOf[k] = rw.dest
		idx, msgs, bytes = append(idx, i), append(msgs, m), bytes+size
	}
	flush()
}

// write makes one WriteMessages call and judges its rows; failed collects
// the keys of rows that failed. The messages the broker rejected as too
// large in a batch of several are sent again one at a time, in order, to
// learn which one can never fit: none of them was appended.
func (r *Relay) write(ctx context.Context, rows []row, outcomes []outcome, idx []int, msgs []kafka.Message, failed map[string]bool) {
	wctx, cancel := context.WithTimeout(ctx, r.cfg.DeliveryTimeout)
	err := r.writer.WriteMessages(wctx, msgs...)
	if err != nil && wctx.Err() != nil && ctx.Err() == nil {
		err = withClass(FailureTimeout, fmt.Errorf("outbox: the write to Kafka exceeded DeliveryTimeout (%v): %w", r.cfg.DeliveryTimeout, err))
	}
	timedOut := wctx.Err() != nil
	cancel()
	var perMessage kafka.WriteErrors
	isPer := errors.As(err, &perMessage) && len(perMessage) == len(msgs)
	if err != nil && !isPer && !timedOut && ctx.Err() == nil && r.splitByTopic(ctx, rows, outcomes, idx, msgs, failed) {
		return
	}
	var alone []int // positions in msgs
	for j, i := range idx {
		e := err
		if isPer {
			e = perMessage[j]
		}
		if tooLarge(e) && len(msgs) > 1 {
			alone = append(alone, j)
			continue
		}
		r.judgeKafka(&rows[i], &outcomes[i], e, failed)
	}
	for _, j := range alone {
		i := idx[j]
		if failed[string(rows[i].key)] {
			outcomes[i] = outcome{held: true}
			continue
		}
		r.write(ctx, rows, outcomes, []int{i}, msgs[j:j+1], failed)
	}
}

// splitByTopic sends a call that failed as a whole again one topic at a
// time, and says whether it did: kafka-go fails a whole call when it cannot
// look up one of its topics (one that does not exist, say), and that error
// is no other topic's. A key's messages in a call are of one topic, so
// each key's order holds.
func (r *Relay) splitByTopic(ctx context.Context, rows []row, outcomes []outcome, idx []int, msgs []kafka.Message, failed map[string]bool) bool {
	var topics []string
	byTopic := map[string][]int{} // positions in msgs
	for j := range msgs {
		t := msgs[j].Topic
		if _, ok := byTopic[t]; !ok {
			topics = append(topics, t)
		}
		byTopic[t] = append(byTopic[t], j)
	}
	if len(topics) < 2 {
		return false
	}
	for _, t := range topics {
		var sub []int
		var subMsgs []kafka.Message
		for _, j := range byTopic[t] {
			sub, subMsgs = append(sub, idx[j]), append(subMsgs, msgs[j])
		}
		r.write(ctx, rows, outcomes, sub, subMsgs, failed)
	}
	return true
}

// judgeKafka records the result of one message's write.
func (r *Relay) judgeKafka(rw *row, o *outcome, err error, failed map[string]bool) {
	if tooLarge(err) {
		// Sent alone: it can never fit.
		err = withClass(FailureTooLarge, permanent.Mark(fmt.Errorf("outbox: the broker rejects the message as larger than the topic's max.message.bytes (or its segment.bytes); it can never be published: make it smaller, or raise the topic's limit and retry the row: %w", err)))
	}
	*o = r.judge(rw, err)
	if err != nil {
		failed[string(rw.key)] = true
	}
}

// tooLarge reports whether the broker refused a write for its size: a
// batch larger than the topic's max.message.bytes, or than its
// segment.bytes (which no retry mends either).
func tooLarge(err error) bool {
	return err != nil && (errors.Is(err, kafka.MessageSizeTooLarge) || errors.Is(err, kafka.RecordListTooLarge))
}

// messageBytes is the size kafka-go counts a message as against BatchBytes
// (kafka.Message's unexported totalSize).
func messageBytes(m *kafka.Message) int64 {
	n := int64(4 + 1 + 1 + 4 + len(m.Key) + 4 + len(m.Value) + 8)
	n += int64(varIntLen(len(m.Headers)))
	for _, h := range m.Headers {
		n += int64(varIntLen(len(h.Key)) + len(h.Key) + varIntLen(len(h.Value)) + len(h.Value))
	}
	return n
}

func varIntLen(i int) int {
	u := uint64(int64(i)<<1) ^ uint64(int64(i)>>63) // zig-zag
	n := 1
	for ; u >= 0x80; u >>= 7 {
		n++
	}
	return n
}
