package outbox

import (
	"context"
	"errors"
	"fmt"

	"github.com/kafkaonce/kafkaonce/internal/kafkaclient"
	"github.com/kafkaonce/kafkaonce/internal/permanent"
	"github.com/kafkaonce/kafkaonce/kafkaoncetype"
)

// publish writes the rows to Kafka through the client's Publish, in calls
// of one topic each, made one after the other in the rows' order, and
// keeps each key's order:
//
//   - Publish writes none of a key's records after one that failed (see
//     kafkaclient.Client);
//   - a key's rows in the calls pending at once go to one topic (a key
//     that has a row for another topic waits for those calls first);
//   - once a row of a key failed, the key's later rows are held: not
//     sent in this round, and then held back by the waiting row.
//
// A message larger than a record may be (kafkaclient.MaxRecordBytes) never
// goes, and one the broker rejects as too large alone never will: both
// are parked at once with the reason. (A message without a key goes to any
// partition, so such messages have no order in Kafka.)
func (r *Relay) publish(ctx context.Context, rows []row, outcomes []outcome) {
	failed := map[string]bool{}
	var topics []string         // of the pending calls, in the order they began
	calls := map[string][]int{} // topic -> its rows
	topicOf := map[string]string{}
	flush := func() {
		for _, t := range topics {
			r.write(ctx, rows, outcomes, t, calls[t], failed)
		}
		topics = topics[:0]
		clear(calls)
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
		if t, ok := topicOf[k]; ok && t != rw.dest {
			flush()
			if failed[k] {
				outcomes[i] = outcome{held: true}
				continue
			}
		}
		if _, ok := calls[rw.dest]; !ok {
			topics = append(topics, rw.dest)
		}
		topicOf[k] = rw.dest
		calls[rw.dest] = append(calls[rw.dest], i)
	}
	flush()
}

// kafkaRecord is the record of a row.
func (r *Relay) kafkaRecord(rw *row) kafkaclient.Record {
	rec := kafkaclient.Record{Key: rw.key, Value: rw.val}
	for _, h := range rw.headers {
		rec.Headers = append(rec.Headers, kafkaoncetype.Header{Key: h.Key, Value: h.Value})
	}
	rec.Headers = append(rec.Headers, kafkaoncetype.Header{Key: r.cfg.MessageIDHeader, Value: []byte(rw.id)})
	return rec
}

// write makes one Publish call of topic's rows idx and judges them; failed
// collects the keys of rows that failed. The records the broker rejected
// as too large in a call of several are sent again one at a time, in
// order, to learn which one can never fit: it may have been only their
// batch that was too large, and none of it was appended.
func (r *Relay) write(ctx context.Context, rows []row, outcomes []outcome, topic string, idx []int, failed map[string]bool) {
	recs := make([]kafkaclient.Record, len(idx))
	for j, i := range idx {
		recs[j] = r.kafkaRecord(&rows[i])
	}
	wctx, cancel := context.WithTimeout(ctx, r.cfg.DeliveryTimeout)
	err := r.client.Publish(wctx, topic, recs)
	timedOut := wctx.Err() != nil && ctx.Err() == nil
	cancel()
	var each kafkaclient.PublishErrors
	perRecord := errors.As(err, &each) && len(each) == len(recs)
	var alone []int // positions in idx
	for j, i := range idx {
		e := err
		if perRecord {
			e = each[j]
		}
		switch {
		case errors.Is(e, kafkaclient.ErrHeldBack):
			// Not sent: a row of its key before it failed.
			outcomes[i] = outcome{held: true}
			continue
		case errors.Is(e, kafkaclient.ErrTooLarge) && kafkaclient.RecordBytes(&recs[j]) > kafkaclient.MaxRecordBytes:
			e = withClass(FailureTooLarge, permanent.Mark(fmt.Errorf("outbox: message of %d bytes is larger than the %d bytes a record the relay sends to Kafka may have; it can never be published: make it smaller",
				kafkaclient.RecordBytes(&recs[j]), kafkaclient.MaxRecordBytes)))
		case errors.Is(e, kafkaclient.ErrTooLarge) && len(idx) > 1:
			alone = append(alone, j)
			continue
		case errors.Is(e, kafkaclient.ErrTooLarge):
			// Sent alone: it can never fit.
			e = withClass(FailureTooLarge, permanent.Mark(fmt.Errorf("outbox: the broker rejects the message as larger than the topic's max.message.bytes (or its segment.bytes); it can never be published: make it smaller, or raise the topic's limit and retry the row: %w", e)))
		case e != nil && timedOut:
			e = withClass(FailureTimeout, fmt.Errorf("outbox: the write to Kafka exceeded DeliveryTimeout (%v): %w", r.cfg.DeliveryTimeout, e))
		}
		outcomes[i] = r.judge(&rows[i], e)
		if e != nil {
			failed[string(rows[i].key)] = true
		}
	}
	for _, j := range alone {
		i := idx[j]
		if failed[string(rows[i].key)] {
			outcomes[i] = outcome{held: true}
			continue
		}
		r.write(ctx, rows, outcomes, topic, []int{i}, failed)
	}
}
