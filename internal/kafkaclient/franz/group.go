package franz

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kafkaonce/kafkaonce/internal/cleanup"
	"github.com/kafkaonce/kafkaonce/internal/kafkaclient"
)

// RunGroup implements kafkaclient.Client with a kgo group member that
// rebalances cooperatively. kgo calls the Membership from its group
// management goroutine and waits for it: a revocation returns only once
// the partitions' work is done and committed, while the member's other
// partitions go on. The member never fetches: the engine fetches each
// partition it is given through the hub, from the offset it decides.
func (c *Client) RunGroup(ctx context.Context, m kafkaclient.Membership) error {
	g := c.cfg.Group
	if g.ConsumerProtocol {
		if err := CheckConsumerProtocolServed(ctx, c.admin); err != nil {
			return err
		}
	}
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	// confirmed is closed once the confirmation ended: at once under the
	// classic protocol, and under the consumer protocol once the group
	// coordinator described the member as a consumer-protocol member
	// (confirmErr says why not; see protocol.go).
	confirmed := make(chan struct{})
	var confirmErr error
	// calls is one Membership call at a time: kgo's callbacks, the
	// confirmation's hand-over, and the drain at the end.
	var calls sync.Mutex
	owned := map[kafkaclient.TopicPartition]bool{}
	// Until the member is confirmed (mayTake), what kgo assigns waits in
	// waiting, and the confirmation hands it over. kgo's callback does
	// not wait for the confirmation: kgo's group goroutine waits for the
	// callback, and is the only one that rejoins, so a member the broker
	// forgot while the describe went unanswered would never be listed.
	// stopped is set by the drain: nothing is handed over after it.
	// (assignedWhileWaiting: kgo assigned, if only nothing, which makes
	// the member one of its group.)
	waiting := map[kafkaclient.TopicPartition]bool{}
	assignedWhileWaiting := false
	mayTake := !g.ConsumerProtocol
	stopped := false
	take := func(cl *kgo.Client, tps []kafkaclient.TopicPartition) {
		c.fetchCommitted(cl, tps)
		for _, tp := range tps {
			owned[tp] = true
		}
		m.Assigned(ctx, tps)
	}
	gone := func(ps map[string][]int32, report func([]kafkaclient.TopicPartition)) {
		calls.Lock()
		defer calls.Unlock()
		var tps []kafkaclient.TopicPartition
		for _, tp := range partitions(ps) {
			delete(waiting, tp)
			if owned[tp] {
				delete(owned, tp)
				tps = append(tps, tp)
			}
		}
		if len(tps) > 0 {
			report(tps)
		}
	}
	// clientCtx is the member's kgo client's: cancelled once its leave
	// has had its time (see below), which fails its requests in flight.
	clientCtx, kill := context.WithCancel(context.WithoutCancel(ctx))
	defer kill()
	opts := append(slices.Clone(c.base),
		kgo.WithContext(clientCtx),
		kgo.ConsumerGroup(g.ID),
		kgo.ConsumeTopics(g.Topics...),
		kgo.DisableAutoCommit(),
		kgo.SessionTimeout(g.SessionTimeout),
		kgo.RebalanceTimeout(g.RebalanceTimeout),
		kgo.HeartbeatInterval(g.HeartbeatInterval),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.OnPartitionsAssigned(func(_ context.Context, cl *kgo.Client, ps map[string][]int32) {
			calls.Lock()
			defer calls.Unlock()
			if stopped || runCtx.Err() != nil {
				return
			}
			// Classic: kgo calls this once per generation, with what it
			// adds.
			tps := partitions(ps)
			member, gen := cl.GroupMetadata()
			if g.ConsumerProtocol {
				// kgo calls this as each reconciliation adds partitions.
				c.log.Info("consumer group: partitions assigned", slog.String("protocol", "consumer"), slog.Int("epoch", int(gen)), slog.String("member", member), slog.Int("added", len(tps)))
			} else {
				c.log.Info("consumer group: generation started", slog.Int("generation", int(gen)), slog.String("member", member), slog.Int("added", len(tps)))
			}
			if !mayTake {
				assignedWhileWaiting = true
				for _, tp := range tps {
					waiting[tp] = true
				}
				return
			}
			take(cl, tps)
		}),
		kgo.OnPartitionsRevoked(func(_ context.Context, _ *kgo.Client, ps map[string][]int32) {
			gone(ps, func(tps []kafkaclient.TopicPartition) { m.Revoked(context.WithoutCancel(ctx), tps) })
		}),
		kgo.OnPartitionsLost(func(_ context.Context, _ *kgo.Client, ps map[string][]int32) {
			gone(ps, func(tps []kafkaclient.TopicPartition) { m.Lost(context.WithoutCancel(ctx), tps) })
		}),
	)
	opts = append(opts, balancing(g.ConsumerProtocol)...)
	if g.InstanceID != "" {
		opts = append(opts, kgo.InstanceID(g.InstanceID))
	}
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return fmt.Errorf("franz: %w", err)
	}
	// The member fetches nothing: the hub does. (A fetch made before this
	// pause is dropped by the poll below.)
	cl.PauseFetchTopics(g.Topics...)
	c.setGroup(cl)
	if g.ConsumerProtocol {
		go func() {
			defer close(confirmed)
			if confirmErr = confirmConsumerMember(runCtx, cl, g.ID, c.log); confirmErr != nil {
				stop()
				return
			}
			calls.Lock()
			defer calls.Unlock()
			mayTake = true
			if stopped || runCtx.Err() != nil || !assignedWhileWaiting {
				return
			}
			var tps []kafkaclient.TopicPartition
			for tp := range waiting {
				tps = append(tps, tp)
			}
			clear(waiting)
			take(cl, tps)
		}()
	} else {
		close(confirmed)
	}
	c.pollGroup(runCtx, cl)
	// The confirmation ends with the run (it retries until it has an
	// answer), before the client it asks through is closed.
	stop()
	<-confirmed
	// Revoke everything, which commits the last offsets, before leaving:
	// kgo revokes again as it leaves, which then finds nothing owned. A
	// static member does not leave: its partitions wait for it until its
	// session times out.
	calls.Lock()
	stopped = true
	var tps []kafkaclient.TopicPartition
	for tp := range owned {
		tps = append(tps, tp)
		delete(owned, tp)
	}
	if len(tps) > 0 {
		m.Revoked(context.WithoutCancel(ctx), tps)
	}
	calls.Unlock()
	// The leave has two seconds of its own, as a share group member's:
	// kgo retries a leave the coordinator does not answer for its retry
	// timeout (30 s), and Close waits for it. Once they are up the
	// client's context is cancelled, so the leave and Close end at once;
	// a member that could not leave is left to its session timeout.
	member, _ := cl.GroupMetadata()
	leaveCtx, cancelLeave := cleanup.Context(context.WithoutCancel(ctx))
	defer cancelLeave()
	unlink := context.AfterFunc(leaveCtx, kill)
	// (A static consumer-protocol member's leave from kgo is refused by
	// Kafka, and sent again whole below.)
	staticConsumer := g.ConsumerProtocol && g.InstanceID != ""
	if err := cl.LeaveGroupContext(leaveCtx); err != nil && !staticConsumer {
		c.log.Warn("consumer group: leaving the group failed; the member's partitions wait for its session to end", slog.String("error", err.Error()))
	}
	cl.Close()
	unlink()
	if staticConsumer {
		c.leaveStatic(leaveCtx, member)
	}
	c.setGroup(nil)
	if confirmErr != nil && !errors.Is(confirmErr, context.Canceled) {
		return confirmErr
	}
	return nil
}

// balancing is how the member's partitions are assigned. Under the classic
// protocol: cooperative first, and range as well, which kafka-go's members
// speak too: a group of kafkaonce members rebalances cooperatively, and
// one that kafka-go members still share (a migration under way) agrees on
// range and rebalances eagerly until they are gone. Under the consumer
// protocol the broker assigns, with its uniform assignor (the one kgo asks
// for when its first balancer is sticky), and moves only the partitions
// that change owner.
func balancing(consumerProtocol bool) []kgo.Opt {
	if consumerProtocol {
		return []kgo.Opt{kgo.ServerSideBalancer(), kgo.Balancers(kgo.CooperativeStickyBalancer())}
	}
	return []kgo.Opt{kgo.Balancers(kgo.CooperativeStickyBalancer(), kgo.RangeBalancer())}
}

// pollGroup polls the member until ctx is done: kgo hands out the group's
// errors (a coordinator that cannot be reached, refused credentials) as
// fetches, which would pile up unpolled. They are logged; kgo rejoins by
// itself. Records it fetched before its topics were paused are dropped:
// the hub fetches what the engine processes.
func (c *Client) pollGroup(ctx context.Context, cl *kgo.Client) {
	for {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			return
		}
		fs.EachError(func(topic string, partition int32, err error) {
			c.log.Warn("consumer group: "+err.Error(), slog.String("topic", topic), slog.Int("partition", int(partition)))
		})
		if fs.IsClientClosed() {
			return
		}
	}
}

func (c *Client) setGroup(cl *kgo.Client) {
	c.mu.Lock()
	c.group = cl
	if cl == nil {
		clear(c.committed)
	}
	c.mu.Unlock()
}

func partitions(ps map[string][]int32) []kafkaclient.TopicPartition {
	var out []kafkaclient.TopicPartition
	for topic, parts := range ps {
		for _, p := range parts {
			out = append(out, kafkaclient.TopicPartition{Topic: topic, Partition: int(p)})
		}
	}
	return out
}

// Commit implements kafkaclient.Client. kgo commits with the member's
// current member id and generation, and holds a commit back while the
// member is between joining and syncing, so a commit is never sent with a
// generation the member is leaving.
func (c *Client) Commit(ctx context.Context, offsets []kafkaclient.Offset) error {
	c.mu.Lock()
	cl := c.group
	c.mu.Unlock()
	if cl == nil {
		return fmt.Errorf("%w (not in the group)", kafkaclient.ErrFenced)
	}
	toCommit := map[string]map[int32]kgo.EpochOffset{}
	metadata := map[kafkaclient.TopicPartition]string{}
	for _, o := range offsets {
		if toCommit[o.Topic] == nil {
			toCommit[o.Topic] = map[int32]kgo.EpochOffset{}
		}
		toCommit[o.Topic][int32(o.Partition)] = kgo.EpochOffset{Epoch: -1, Offset: o.Next}
		metadata[o.TopicPartition] = o.Metadata
	}
	// kgo commits the member id as every partition's metadata; the
	// engine's mark takes its place just before the request is sent.
	ctx = kgo.PreCommitFnContext(ctx, func(req *kmsg.OffsetCommitRequest) error {
		for i := range req.Topics {
			t := &req.Topics[i]
			for j := range t.Partitions {
				p := &t.Partitions[j]
				if m, ok := metadata[kafkaclient.TopicPartition{Topic: t.Topic, Partition: int(p.Partition)}]; ok {
					p.Metadata = kmsg.StringPtr(m)
				}
			}
		}
		return nil
	})
	var errs []error
	var gone *kafkaclient.TopicGoneError
	cl.CommitOffsetsSync(ctx, toCommit, func(_ *kgo.Client, _ *kmsg.OffsetCommitRequest, resp *kmsg.OffsetCommitResponse, err error) {
		if err != nil {
			errs = append(errs, err)
			return
		}
		for _, t := range resp.Topics {
			for _, p := range t.Partitions {
				perr := kerr.ErrorForCode(p.ErrorCode)
				switch {
				case perr == nil:
				case errors.Is(perr, kerr.UnknownTopicID), errors.Is(perr, kerr.UnknownTopicOrPartition):
					gone = kafkaclient.AddGone(gone, kafkaclient.TopicPartition{Topic: t.Topic, Partition: int(p.Partition)}, perr)
				default:
					errs = append(errs, fmt.Errorf("%s/%d: %w", t.Topic, p.Partition, perr))
				}
			}
		}
	})
	if gone != nil {
		errs = append(errs, gone)
	}
	err := errors.Join(errs...)
	if err != nil && fenced(err) {
		return fmt.Errorf("%w: %w", kafkaclient.ErrFenced, err)
	}
	return err
}

// Member implements kafkaclient.Group.
func (c *Client) Member() kafkaclient.Member {
	c.mu.Lock()
	cl := c.group
	c.mu.Unlock()
	if cl == nil {
		return kafkaclient.Member{}
	}
	id, gen := cl.GroupMetadata()
	return kafkaclient.Member{ID: id, Generation: max(gen, 0)}
}

// fenced reports errors that mean this member can no longer commit in its
// generation (classic protocol) or epoch (consumer protocol).
func fenced(err error) bool {
	return errors.Is(err, kerr.IllegalGeneration) ||
		errors.Is(err, kerr.UnknownMemberID) ||
		errors.Is(err, kerr.RebalanceInProgress) ||
		errors.Is(err, kerr.FencedInstanceID) ||
		errors.Is(err, kerr.StaleMemberEpoch) ||
		errors.Is(err, kerr.FencedMemberEpoch)
}

// committedFetch is one read of the group's committed offsets, made when
// partitions are assigned, that the partitions' workers wait on: one
// request for the whole assignment, outside kgo's callback.
type committedFetch struct {
	done    chan struct{}
	offsets kadm.OffsetResponses
	err     error
}

func (c *Client) fetchCommitted(cl *kgo.Client, tps []kafkaclient.TopicPartition) {
	f := &committedFetch{done: make(chan struct{})}
	c.mu.Lock()
	for _, tp := range tps {
		c.committed[tp] = f
	}
	c.mu.Unlock()
	go func() {
		defer close(f.done)
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		defer cancel()
		f.offsets, f.err = kadm.NewClient(cl).FetchOffsets(ctx, c.cfg.Group.ID)
	}()
}

// Committed implements kafkaclient.Client: from the read made at
// assignment, or, when that failed, a read of its own.
func (c *Client) Committed(ctx context.Context, tp kafkaclient.TopicPartition) (kafkaclient.CommittedOffset, error) {
	c.mu.Lock()
	f, cl := c.committed[tp], c.group
	c.mu.Unlock()
	if cl == nil {
		return kafkaclient.CommittedOffset{}, fmt.Errorf("%w (not in the group)", kafkaclient.ErrFenced)
	}
	if f != nil {
		select {
		case <-f.done:
		case <-ctx.Done():
			return kafkaclient.CommittedOffset{}, ctx.Err()
		}
		if f.err == nil {
			return committedOf(f.offsets, tp)
		}
	}
	offsets, err := kadm.NewClient(cl).FetchOffsets(ctx, c.cfg.Group.ID)
	if err != nil {
		return kafkaclient.CommittedOffset{}, fmt.Errorf("franz: committed offsets of group %s: %w", c.cfg.Group.ID, err)
	}
	return committedOf(offsets, tp)
}

func committedOf(offsets kadm.OffsetResponses, tp kafkaclient.TopicPartition) (kafkaclient.CommittedOffset, error) {
	o, ok := offsets.Lookup(tp.Topic, int32(tp.Partition))
	if !ok {
		return kafkaclient.CommittedOffset{Offset: -1}, nil
	}
	if o.Err != nil {
		return kafkaclient.CommittedOffset{}, fmt.Errorf("franz: committed offset of %s/%d: %w", tp.Topic, tp.Partition, o.Err)
	}
	if o.At < 0 {
		return kafkaclient.CommittedOffset{Offset: -1}, nil
	}
	return kafkaclient.CommittedOffset{Offset: o.At, Metadata: o.Metadata}, nil
}

// TopicCommitted implements kafkaclient.Client.
func (c *Client) TopicCommitted(ctx context.Context, topic string, partitions int) ([]int64, error) {
	ctx, cancel := kafkaclient.Bounded(ctx)
	defer cancel()
	offsets, err := kadm.NewClient(c.admin).FetchOffsets(ctx, c.cfg.Group.ID)
	if err != nil && !errors.Is(err, kerr.GroupIDNotFound) {
		return nil, fmt.Errorf("franz: committed offsets of group %s: %w", c.cfg.Group.ID, err)
	}
	out := make([]int64, partitions)
	for p := range out {
		o, err := committedOf(offsets, kafkaclient.TopicPartition{Topic: topic, Partition: p})
		if err != nil {
			return nil, err
		}
		out[p] = o.Offset
	}
	return out, nil
}
