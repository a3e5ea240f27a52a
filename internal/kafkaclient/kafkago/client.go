// Package kafkago is the kafka-go Kafka client behind the engine's seam:
// kafka-go's ConsumerGroup for membership (eager rebalancing: every
// rebalance revokes every partition), a Reader per partition, and its
// Client for log bounds.
//
// kafka-go cannot keep every part of the promise, and this client refuses
// what it cannot do rather than guessing:
//
//   - Its message reader ignores the transaction bits of a record batch and
//     the fetch response's list of aborted transactions. Reading with
//     ReadCommitted keeps records of open transactions from being handed
//     out, but records of aborted transactions are handed out like any
//     other, and so are transaction markers. A marker it is handed stops
//     the partition with a *TransactionalError naming franz-go as the fix;
//     records of an aborted transaction before that first marker have been
//     processed by then.
//   - It has no static membership and no cooperative rebalancing.
//   - It hands out a re-created topic's records once they reach the old
//     position, without a sign that the topic changed; the log's end is
//     read while the partition is idle (FetchConfig.IdleCheck), so a new
//     log still below the old position is reported.
package kafkago

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/kafkaonce/kafkaonce/internal/kafkaclient"
)

// Client is the kafka-go client. Use New.
type Client struct {
	cfg    kafkaclient.Config
	dialer *kafka.Dialer
	tr     *kafka.Transport
	admin  *kafka.Client
	log    *slog.Logger
	// writers publish (see Publish).
	writers writers
	// ids reads topic ids (see topicID).
	ids topicIDs

	mu sync.Mutex
	// gen is the generation this member is in, the one its commits go
	// through (nil outside one), and committed the group's offsets of the
	// partitions it assigned, read once for all of them (see genOffsets).
	gen       *kafka.Generation
	committed *genOffsets
}

// New returns a client for cfg. dialer, when not nil, opens every
// connection instead of one made from cfg's TLS and SASL (kafka-go users
// bring theirs).
func New(cfg kafkaclient.Config, dialer *kafka.Dialer) (*Client, error) {
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if cfg.Dials == nil {
		cfg.Dials = kafkaclient.NewDials(log, cfg.TLS != nil || (dialer != nil && dialer.TLS != nil))
	}
	dialer, tr := Connection(cfg, dialer)
	return &Client{cfg: cfg, dialer: dialer, tr: tr, log: log,
		admin: &kafka.Client{Addr: kafka.TCP(cfg.Brokers...), Timeout: 15 * time.Second, Transport: tr}}, nil
}

// Connection returns the kafka-go dialer and transport for cfg's TLS and
// SASL, or for dialer's when it is not nil.
//
// Both open connections through kafkaclient.DialFunc, which does the TLS
// handshake (kafka-go's own is then off) and tells cfg.Dials how each
// connection went (see watchedConn): kafka-go hides the dial errors of
// its groups and readers in retries. A dialer of the user's is copied,
// never changed.
func Connection(cfg kafkaclient.Config, dialer *kafka.Dialer) (*kafka.Dialer, *kafka.Transport) {
	if dialer == nil {
		dialer = &kafka.Dialer{Timeout: kafkaclient.DialTimeout, DualStack: true, TLS: cfg.TLS, ClientID: cfg.ClientID}
		if cfg.SASL != nil {
			dialer.SASLMechanism = mechanism{cfg.SASL}
		}
	} else {
		own := *dialer
		dialer = &own
	}
	var base func(ctx context.Context, network, addr string) (net.Conn, error)
	if dialer.DialFunc != nil {
		base = dialer.DialFunc
	} else {
		base = (&net.Dialer{LocalAddr: dialer.LocalAddr, FallbackDelay: dialer.FallbackDelay, KeepAlive: dialer.KeepAlive}).DialContext
	}
	open := kafkaclient.DialFunc(base, dialer.TLS)
	dial := func(ctx context.Context, network, addr string) (net.Conn, error) {
		conn, err := open(ctx, network, addr)
		if err != nil {
			cfg.Dials.Report(addr, err)
			return nil, err
		}
		return &watchedConn{Conn: conn, report: func(err error) { cfg.Dials.Report(addr, err) }}, nil
	}
	dialer.DialFunc, dialer.TLS = dial, nil
	tr := &kafka.Transport{Dial: dial, SASL: dialer.SASLMechanism, ClientID: dialer.ClientID, MetadataTTL: time.Second}
	if dialer.Timeout > 0 {
		tr.DialTimeout = dialer.Timeout
	}
	return dialer, tr
}

// Dialer is the dialer the client opens connections with.
func (c *Client) Dialer() *kafka.Dialer { return c.dialer }

// Transport is the transport of the client's requests (bounds, metadata).
func (c *Client) Transport() *kafka.Transport { return c.tr }

// RunGroup implements kafkaclient.Client. Every generation assigns all of
// the member's partitions at once and revokes them all when it ends:
// kafka-go waits for the function started with the generation (which waits
// for m.Revoked) before it joins the next generation or leaves, so the
// last offset commits still go out in the generation (see Commit).
//
// The group's topics are watched (see missing.go): one that stays missing
// ends the run with a *MissingTopicError, and one that comes back makes
// the member leave and join again, since kafka-go does not assign a topic
// created after its last assignment.
func (c *Client) RunGroup(ctx context.Context, m kafkaclient.Membership) error {
	g := c.cfg.Group
	if g.InstanceID != "" {
		return errors.New("kafkago: static membership (an instance id) is not supported by kafka-go; use the franz-go client")
	}
	runCtx, endRun := context.WithCancelCause(ctx)
	defer endRun(nil)
	w := &topicWatch{complaints: make(chan struct{}, 1), rejoin: make(chan struct{}, 1)}
	go c.watchTopics(runCtx, g.Topics, w, func(e *MissingTopicError) { endRun(e) })
	for {
		rejoin, err := c.runGroupOnce(runCtx, m, w)
		if err != nil {
			return err
		}
		if !rejoin {
			break
		}
		c.log.Info("consumer group: a topic of the group exists again; leaving and joining the group so that it is assigned")
	}
	var missing *MissingTopicError
	if cause := context.Cause(runCtx); errors.As(cause, &missing) && ctx.Err() == nil {
		return missing
	}
	return nil
}

// runGroupOnce runs one kafka-go ConsumerGroup until ctx is done (false),
// or until w asks for a rejoin (true).
func (c *Client) runGroupOnce(ctx context.Context, m kafkaclient.Membership, w *topicWatch) (bool, error) {
	g := c.cfg.Group
	watch := c.cfg.MetadataMaxAge
	errorLog := logger(c.log, slog.LevelWarn)
	group, err := kafka.NewConsumerGroup(kafka.ConsumerGroupConfig{
		ID:                     g.ID,
		Brokers:                c.cfg.Brokers,
		Dialer:                 c.dialer,
		Topics:                 g.Topics,
		SessionTimeout:         g.SessionTimeout,
		RebalanceTimeout:       g.RebalanceTimeout,
		HeartbeatInterval:      g.HeartbeatInterval,
		JoinGroupBackoff:       joinGroupBackoff,
		StartOffset:            kafka.FirstOffset,
		WatchPartitionChanges:  watch > 0,
		PartitionWatchInterval: watch,
		Logger:                 logger(c.log, slog.LevelDebug),
		// kafka-go's complaints wake the watch of the group's topics.
		ErrorLogger: kafka.LoggerFunc(func(msg string, args ...any) {
			errorLog.Printf(msg, args...)
			w.complain()
		}),
	})
	if err != nil {
		return false, fmt.Errorf("kafkago: %w", err)
	}
	groupCtx, endGroup := context.WithCancel(ctx)
	defer endGroup()
	rejoined := make(chan bool, 1)
	go func() {
		select {
		case <-w.rejoin:
			endGroup()
			rejoined <- true
		case <-groupCtx.Done():
			rejoined <- false
		}
	}()
	for {
		gen, err := group.Next(groupCtx)
		if err != nil {
			if groupCtx.Err() != nil || errors.Is(err, kafka.ErrGroupClosed) {
				break
			}
			c.log.Warn("consumer group: waiting for a generation", slog.String("error", err.Error()))
			continue
		}
		var tps []kafkaclient.TopicPartition
		committed := &genOffsets{parts: map[string][]int{}}
		for topic, ps := range gen.Assignments {
			for _, p := range ps {
				tps = append(tps, kafkaclient.TopicPartition{Topic: topic, Partition: p.ID})
				committed.parts[topic] = append(committed.parts[topic], p.ID)
			}
		}
		c.setGeneration(gen, committed)
		c.log.Info("consumer group: generation started", slog.Int("generation", int(gen.ID)), slog.String("member", gen.MemberID), slog.Int("partitions", len(tps)))
		m.Assigned(ctx, tps)
		// The generation ends when this function returns, so it returns
		// only once the generation is over, also for a member assigned
		// nothing: one returning at once would rebalance the group again
		// and again.
		gen.Start(func(genCtx context.Context) {
			<-genCtx.Done()
			m.Revoked(context.WithoutCancel(ctx), tps)
		})
	}
	// Close ends the current generation, waits until its function has
	// returned (the partitions are revoked and their offsets committed),
	// then leaves the group so the partitions move to other members at
	// once.
	if err := group.Close(); err != nil {
		c.log.Warn("consumer group: close", slog.String("error", err.Error()))
	}
	c.setGeneration(nil, nil)
	endGroup()
	return <-rejoined && ctx.Err() == nil, nil
}

// Member implements kafkaclient.Group.
func (c *Client) Member() kafkaclient.Member {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.gen == nil {
		return kafkaclient.Member{}
	}
	return kafkaclient.Member{ID: c.gen.MemberID, Generation: c.gen.ID}
}

func (c *Client) setGeneration(gen *kafka.Generation, committed *genOffsets) {
	c.mu.Lock()
	c.gen, c.committed = gen, committed
	c.mu.Unlock()
}

// TopicCommitted implements kafkaclient.Client.
func (c *Client) TopicCommitted(ctx context.Context, topic string, partitions int) ([]int64, error) {
	ctx, cancel := kafkaclient.Bounded(ctx)
	defer cancel()
	ps := make([]int, partitions)
	out := make([]int64, partitions)
	for p := range ps {
		ps[p], out[p] = p, -1
	}
	resp, err := c.admin.OffsetFetch(ctx, &kafka.OffsetFetchRequest{GroupID: c.cfg.Group.ID, Topics: map[string][]int{topic: ps}})
	if err != nil {
		return nil, fmt.Errorf("kafkago: committed offsets of group %s: %w", c.cfg.Group.ID, err)
	}
	if resp.Error != nil && !errors.Is(resp.Error, kafka.GroupIdNotFound) {
		return nil, fmt.Errorf("kafkago: committed offsets of group %s: %w", c.cfg.Group.ID, resp.Error)
	}
	for _, p := range resp.Topics[topic] {
		if p.Error != nil {
			return nil, fmt.Errorf("kafkago: committed offset of %s/%d: %w", topic, p.Partition, p.Error)
		}
		if p.Partition >= 0 && p.Partition < partitions {
			out[p.Partition] = max(p.CommittedOffset, -1)
		}
	}
	return out, nil
}

// Committed implements kafkaclient.Client: the offset and metadata the
// group has committed for a partition of the generation.
func (c *Client) Committed(ctx context.Context, tp kafkaclient.TopicPartition) (kafkaclient.CommittedOffset, error) {
	c.mu.Lock()
	committed := c.committed
	c.mu.Unlock()
	if committed == nil {
		return kafkaclient.CommittedOffset{}, fmt.Errorf("%w: %s/%d is not assigned to this member", kafkaclient.ErrFenced, tp.Topic, tp.Partition)
	}
	return committed.read(ctx, c, tp)
}

// Commit implements kafkaclient.Client. kafka-go's Generation.CommitOffsets
// sends no metadata, so the commit goes out through the client's
// OffsetCommit, which does, with the generation's id and member id: the
// broker fences it exactly as it would the generation's own.
func (c *Client) Commit(ctx context.Context, offsets []kafkaclient.Offset) error {
	c.mu.Lock()
	gen := c.gen
	c.mu.Unlock()
	if gen == nil {
		return fmt.Errorf("%w (no generation)", kafkaclient.ErrFenced)
	}
	byTopic := map[string][]kafka.OffsetCommit{}
	for _, o := range offsets {
		byTopic[o.Topic] = append(byTopic[o.Topic], kafka.OffsetCommit{Partition: o.Partition, Offset: o.Next, Metadata: o.Metadata})
	}
	ctx, cancel := kafkaclient.Bounded(ctx)
	defer cancel()
	resp, err := c.admin.OffsetCommit(ctx, &kafka.OffsetCommitRequest{
		GroupID: gen.GroupID, GenerationID: int(gen.ID), MemberID: gen.MemberID, Topics: byTopic,
	})
	if err == nil {
		var errs []error
		var gone *kafkaclient.TopicGoneError
		for topic, ps := range resp.Topics {
			for _, p := range ps {
				switch {
				case p.Error == nil:
				case errors.Is(p.Error, kafka.UnknownTopicOrPartition), errors.Is(p.Error, kafka.UnknownTopicID):
					gone = kafkaclient.AddGone(gone, kafkaclient.TopicPartition{Topic: topic, Partition: p.Partition}, p.Error)
				default:
					errs = append(errs, fmt.Errorf("%s/%d: %w", topic, p.Partition, p.Error))
				}
			}
		}
		if gone != nil {
			errs = append(errs, gone)
		}
		err = errors.Join(errs...)
	}
	if err != nil && fenced(err) {
		return fmt.Errorf("%w: %w", kafkaclient.ErrFenced, err)
	}
	if err != nil {
		return fmt.Errorf("kafkago: commit offsets of group %s: %w", gen.GroupID, err)
	}
	return nil
}

// fenced reports errors that mean this member can no longer commit in its
// generation.
func fenced(err error) bool {
	return errors.Is(err, kafka.IllegalGeneration) ||
		errors.Is(err, kafka.UnknownMemberId) ||
		errors.Is(err, kafka.RebalanceInProgress) ||
		errors.Is(err, kafka.FencedInstanceID)
}

// Close implements kafkaclient.Client.
func (c *Client) Close() {
	c.closeWriters()
	c.closeTopicIDs()
	c.tr.CloseIdleConnections()
}

// Bounds implements kafkaclient.Client: the log start and end, and the
// last stable offset (a second request, read committed).
func (c *Client) Bounds(ctx context.Context, topic string, partition int) (kafkaclient.Bounds, error) {
	ctx, cancel := kafkaclient.Bounded(ctx)
	defer cancel()
	id, err := c.topicID(ctx, topic)
	if err != nil {
		return kafkaclient.Bounds{}, err
	}
	bs, err := c.bounds(ctx, topic, id, []int{partition})
	if err != nil {
		return kafkaclient.Bounds{}, err
	}
	return bs[0], nil
}

// TopicBounds implements kafkaclient.Client.
func (c *Client) TopicBounds(ctx context.Context, topic string) ([]kafkaclient.Bounds, error) {
	ctx, cancel := kafkaclient.Bounded(ctx)
	defer cancel()
	id, n, err := c.topicMetadata(ctx, topic)
	if err != nil {
		return nil, err
	}
	parts := make([]int, n)
	for i := range parts {
		parts[i] = i
	}
	return c.bounds(ctx, topic, id, parts)
}

// bounds reads the bounds of partitions of the topic of id, read just
// before, which must number 0 to len(partitions)-1 when there are several,
// in two requests.
func (c *Client) bounds(ctx context.Context, topic string, id kafkaclient.TopicID, partitions []int) ([]kafkaclient.Bounds, error) {
	var reqs, stable []kafka.OffsetRequest
	for _, p := range partitions {
		reqs = append(reqs, kafka.FirstOffsetOf(p), kafka.LastOffsetOf(p))
		stable = append(stable, kafka.LastOffsetOf(p))
	}
	all, err := c.admin.ListOffsets(ctx, &kafka.ListOffsetsRequest{Topics: map[string][]kafka.OffsetRequest{topic: reqs}})
	if err != nil {
		return nil, fmt.Errorf("kafkago: log bounds of %s: %w", topic, err)
	}
	committed, err := c.admin.ListOffsets(ctx, &kafka.ListOffsetsRequest{Topics: map[string][]kafka.OffsetRequest{topic: stable}, IsolationLevel: kafka.ReadCommitted})
	if err != nil {
		return nil, fmt.Errorf("kafkago: last stable offsets of %s: %w", topic, err)
	}
	out := make([]kafkaclient.Bounds, len(partitions))
	index := map[int]int{}
	for i, p := range partitions {
		index[p] = i
		out[i] = kafkaclient.Bounds{Start: -1, TopicID: id}
	}
	for _, po := range all.Topics[topic] {
		if po.Error != nil {
			return nil, fmt.Errorf("kafkago: log bounds of %s/%d: %w", topic, po.Partition, po.Error)
		}
		if i, ok := index[po.Partition]; ok {
			out[i].Start, out[i].End, out[i].Stable = po.FirstOffset, po.LastOffset, po.LastOffset
		}
	}
	for _, po := range committed.Topics[topic] {
		if po.Error != nil {
			return nil, fmt.Errorf("kafkago: last stable offset of %s/%d: %w", topic, po.Partition, po.Error)
		}
		if i, ok := index[po.Partition]; ok && po.LastOffset >= 0 && po.LastOffset < out[i].Stable {
			out[i].Stable = po.LastOffset
		}
	}
	for i, b := range out {
		if b.Start < 0 {
			return nil, fmt.Errorf("kafkago: log bounds of %s/%d: no answer", topic, partitions[i])
		}
	}
	return out, nil
}

// joinGroupBackoff is the pause before rejoining the group after a failed
// join: long enough that members failing together do not churn the
// coordinator, short enough not to matter after an outage.
const joinGroupBackoff = time.Second

// levelChatter is below Debug: kafka-go logs every fetch at its info
// level, which would drown a debug log.
const levelChatter = slog.LevelDebug - 4

// logger routes kafka-go's printf logging into slog at one level.
func logger(l *slog.Logger, level slog.Level) kafka.Logger {
	l = l.With(slog.String("component", "kafka-go"))
	return kafka.LoggerFunc(func(msg string, args ...any) {
		if l.Enabled(context.Background(), level) {
			l.Log(context.Background(), level, fmt.Sprintf(msg, args...))
		}
	})
}
