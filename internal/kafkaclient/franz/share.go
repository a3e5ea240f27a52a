package franz

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kafkaonce/kafkaonce/internal/kafkaclient"
)

// isolationConfig is the share group's isolation level. A share fetch
// carries none of its own: the group's config decides, and its default is
// read_uncommitted, which hands out records of aborted transactions.
const isolationConfig = "share.isolation.level"

// JoinShare joins a share group as a new member, on a kgo client of its
// own. It first makes sure the group reads committed records only (setting
// share.isolation.level when it is not so), and fails if it cannot:
// records of aborted transactions must never be handed out.
func (c *Client) JoinShare(ctx context.Context, cfg kafkaclient.ShareConfig) (kafkaclient.ShareMember, error) {
	if cfg.Group == "" || len(cfg.Topics) == 0 {
		return nil, errors.New("franz: a share member needs a group and topics")
	}
	ctx, cancel := kafkaclient.Bounded(ctx)
	defer cancel()
	if err := readCommitted(ctx, c.admin, cfg.Group); err != nil {
		return nil, err
	}
	maxRecords := cfg.MaxRecords
	if maxRecords <= 0 {
		maxRecords = 500
	}
	// The client's own context, which Close cancels once its bound is
	// over (see Close); a context of the caller's would end it too soon.
	clientCtx, kill := context.WithCancel(context.WithoutCancel(ctx))
	m := &shareMember{max: maxRecords, held: map[kafkaclient.RecordID]*heldRecord{}, kill: kill}
	opts := append(slices.Clip(c.base),
		kgo.WithContext(clientCtx),
		kgo.ShareGroup(cfg.Group),
		kgo.ConsumeTopics(cfg.Topics...),
		kgo.ShareMaxRecords(int32(min(maxRecords, 1<<30))), //nolint:gosec // bounded just above
		// Strict: the broker acquires at most maxRecords a fetch, and
		// fetches are made for a poll only, so no lock runs down while
		// its record waits in kgo's buffer.
		kgo.ShareMaxRecordsStrict(),
		kgo.ShareAckCallback(m.answer),
	)
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		kill()
		return nil, fmt.Errorf("franz: %w", err)
	}
	m.cl = cl
	return m, nil
}

// readCommitted makes group read committed records only, as every broker
// sees it: a broker that has not yet applied the change would hand out
// records under the old isolation level.
func readCommitted(ctx context.Context, cl *kgo.Client, group string) error {
	want := map[string]string{isolationConfig: "read_committed"}
	if ok, err := GroupConfigsEverywhere(ctx, cl, group, want); err == nil && ok {
		return nil
	}
	if err := SetGroupConfigs(ctx, cl, group, want); err != nil {
		return fmt.Errorf("franz: share group %s must read committed records only (%s), and could not be made to: %w", group, isolationConfig, err)
	}
	return nil
}

// shareMember is the franz-go ShareMember.
//
// kgo acknowledges per record but answers per partition: its ack callback
// tells, for each partition of an acknowledgement it sent, whether the
// broker took all of it (the broker takes or refuses a partition's acks
// whole). So a Flush counts a settlement taken when every answer for its
// partition since the last Flush was a success, and failed otherwise: a
// refusal may name a settlement the broker took alongside one it did not,
// never the reverse. A settlement whose partition got no answer at all is
// failed too (ErrNoAnswer).
type shareMember struct {
	cl  *kgo.Client
	max int
	// kill cancels cl's context: every request of cl's in flight fails at
	// once (see Close).
	kill context.CancelFunc

	// mu guards what the ack callback, on kgo's goroutine, shares with the
	// member's user.
	mu sync.Mutex
	// held are the records of the last poll.
	held map[kafkaclient.RecordID]*heldRecord
	// unflushed are the settlements made since the last Flush.
	unflushed map[kafkaclient.RecordID]kafkaclient.Settlement
	// answers are kgo's answers since the last Flush, by partition.
	answers map[kafkaclient.TopicPartition][]error
}

// heldRecord is a record of the last poll.
type heldRecord struct {
	r *kgo.Record
	// settled is the record's final settlement (0 while it has none), and
	// flushed whether a Flush has since brought kgo's answer for it.
	settled kafkaclient.Settlement
	flushed bool
}

var ackStatus = map[kafkaclient.Settlement]kgo.AckStatus{
	kafkaclient.Accept:  kgo.AckAccept,
	kafkaclient.Release: kgo.AckRelease,
	kafkaclient.Reject:  kgo.AckReject,
	kafkaclient.Renew:   kgo.AckRenew,
}

// answer is kgo's ShareAckCallback.
func (m *shareMember) answer(_ *kgo.Client, results kgo.ShareAckResults) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.answers == nil {
		m.answers = map[kafkaclient.TopicPartition][]error{}
	}
	for _, r := range results {
		tp := kafkaclient.TopicPartition{Topic: r.Topic, Partition: int(r.Partition)}
		m.answers[tp] = append(m.answers[tp], r.Err)
	}
}

// Poll implements kafkaclient.ShareMember.
func (m *shareMember) Poll(ctx context.Context) ([]kafkaclient.ShareRecord, error) {
	m.mu.Lock()
	var unsettled, unflushed int
	for _, h := range m.held {
		switch {
		case h.settled == 0:
			unsettled++
		case !h.flushed:
			unflushed++
		}
	}
	if unsettled > 0 || unflushed > 0 {
		m.mu.Unlock()
		return nil, fmt.Errorf("%w: %d unsettled, %d settled and not flushed", kafkaclient.ErrUnsettled, unsettled, unflushed)
	}
	clear(m.held)
	m.mu.Unlock()

	// kgo accepts, on this poll, every record of the last one it holds
	// unacknowledged. None should be; should one be all the same, release
	// it: a delivery again is safe, an accept before its transaction
	// committed is not.
	m.cl.MarkAcks(kgo.AckRelease)

	fetches := m.cl.PollRecords(ctx, m.max)
	var (
		out  []kafkaclient.ShareRecord
		errs []error
		hs   kafkaclient.HeaderArena
	)
	fetches.EachError(func(topic string, partition int32, err error) {
		errs = append(errs, fmt.Errorf("%s/%d: %w", topic, partition, err))
	})
	m.mu.Lock()
	defer m.mu.Unlock()
	fetches.EachRecord(func(r *kgo.Record) {
		id := kafkaclient.RecordID{TopicPartition: kafkaclient.TopicPartition{Topic: r.Topic, Partition: int(r.Partition)}, Offset: r.Offset}
		m.held[id] = &heldRecord{r: r}
		out = append(out, kafkaclient.ShareRecord{RecordID: id, Key: r.Key, Value: r.Value,
			Headers: kafkaclient.CopyHeaders(&hs, r.Headers, header), Time: r.Timestamp,
			DeliveryCount: int(r.DeliveryCount()), LockedUntil: r.AcquisitionDeadline()})
	})
	if len(out) > 0 {
		return out, nil
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if len(errs) > 0 {
		return nil, fmt.Errorf("franz: share poll: %w", errors.Join(errs...))
	}
	return nil, nil
}

// Settle implements kafkaclient.ShareMember.
func (m *shareMember) Settle(s kafkaclient.Settlement, ids ...kafkaclient.RecordID) error {
	status, ok := ackStatus[s]
	if !ok {
		return fmt.Errorf("franz: settle: unknown settlement %v", s)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, id := range ids {
		h := m.held[id]
		if h == nil {
			return fmt.Errorf("franz: %s of %s: not a record of the last poll", s, id)
		}
		if h.settled != 0 {
			return fmt.Errorf("franz: %s of %s: already settled (%s)", s, id, h.settled)
		}
	}
	if m.unflushed == nil {
		m.unflushed = map[kafkaclient.RecordID]kafkaclient.Settlement{}
	}
	for _, id := range ids {
		h := m.held[id]
		h.r.Ack(status)
		if s.Final() {
			h.settled = s
		}
		m.unflushed[id] = s
	}
	return nil
}

// Flush implements kafkaclient.ShareMember.
func (m *shareMember) Flush(ctx context.Context) error {
	ctx, cancel := kafkaclient.Bounded(ctx)
	defer cancel()
	// On an error the settlements stay unflushed: their answers are still
	// to come, and the next Flush waits for them.
	if err := m.cl.FlushAcks(ctx); err != nil {
		return fmt.Errorf("franz: flush settlements: %w", err)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	var failed []kafkaclient.SettleFailure
	for id, s := range m.unflushed {
		answers, ok := m.answers[id.TopicPartition]
		err := kafkaclient.ErrNoAnswer
		if ok {
			err = errors.Join(answers...)
		}
		if err != nil {
			failed = append(failed, kafkaclient.SettleFailure{Record: id, Settlement: s, Err: err})
		}
		if h := m.held[id]; h != nil && h.settled != 0 {
			h.flushed = true
		}
	}
	m.unflushed, m.answers = nil, nil
	if len(failed) > 0 {
		slices.SortFunc(failed, func(a, b kafkaclient.SettleFailure) int { return compareIDs(a.Record, b.Record) })
		return &kafkaclient.SettleError{Failed: failed}
	}
	return nil
}

func compareIDs(a, b kafkaclient.RecordID) int {
	return cmp.Or(cmp.Compare(a.Topic, b.Topic), cmp.Compare(a.Partition, b.Partition), cmp.Compare(a.Offset, b.Offset))
}

// Close implements kafkaclient.ShareMember. kgo releases the records of
// the last poll that were not acknowledged as it leaves.
//
// Close returns about when ctx ends, whatever the broker does. kgo's leave
// first waits for its share source loops, and one of them may be waiting
// on an acknowledgement the broker does not answer, which kgo retries on
// the client's context for up to its retry timeout (30 s); kgo's Close
// waits for the leave. So once ctx ends, Close cancels the client's
// context: the requests in flight fail at once, and the leave and Close
// finish without waiting on the broker, every kgo goroutine with them.
// What the leave did not send is left to the broker: records unsettled
// are delivered again once their locks run out, and an accept not sent is
// delivered again and found claimed. Nothing is accepted that was not
// settled so: kgo releases, never accepts, what was not acknowledged.
func (m *shareMember) Close(ctx context.Context) error {
	ctx, cancel := kafkaclient.Bounded(ctx)
	defer cancel()
	unlink := context.AfterFunc(ctx, m.kill)
	defer unlink()
	defer m.kill()
	err := m.cl.LeaveGroupContext(ctx)
	m.cl.Close()
	if err != nil {
		return fmt.Errorf("franz: leave share group: %w", err)
	}
	return nil
}
