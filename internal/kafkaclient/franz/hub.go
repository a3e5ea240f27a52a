package franz

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kafkaonce/kafkaonce/internal/kafkaclient"
)

// hub fetches every partition the engine opened, with one kgo client that
// consumes partitions directly (no group), in shared fetch requests, and
// hands each partition's records to its feed. It reads committed records
// only, and never resets an offset by itself: an offset outside the log
// comes back as an error for the Fetcher to explain.
//
// One goroutine polls, and it alone adds and removes partitions, between
// polls: a partition removed and added again at another offset then never
// gets records fetched for the old one, since kgo drops what it buffered
// for a removed partition before the next poll.
type hub struct {
	cl        *kgo.Client
	maxBytes  int
	stopPoll  context.CancelFunc
	pollEnded chan struct{}

	// feeds are the partitions fetched; only the poller uses them.
	feeds map[kafkaclient.TopicPartition]*feed

	mu sync.Mutex
	// todo are changes to the partitions fetched, made by the poller
	// before its next poll; pollCancel interrupts the poll in progress.
	todo       []func()
	pollCancel context.CancelFunc
}

// fetchMaxWait is how long a fetch waits for records on the broker before
// it answers empty. A partition resumed after a pause joins the next fetch
// to its broker, after the one in flight, which an idle partition on the
// same broker keeps waiting: this bounds that wait, at the price of an
// empty fetch answered this often per broker when every partition is idle.
const fetchMaxWait = 100 * time.Millisecond

func (c *Client) fetchHub() (*hub, error) {
	c.hubOnce.Do(func() {
		partBytes := max(c.cfg.FetchMaxBytes, 1<<10)
		opts := append(c.base[:len(c.base):len(c.base)],
			kgo.FetchIsolationLevel(kgo.ReadCommitted()),
			// Markers are handed to the Fetcher, which accounts for their
			// offsets (and hands out none): a partition's position moves
			// past a transaction's commit marker, as Kafka's own consumers'
			// does, and a topic written by transactional producers does
			// not show a lag of one for ever.
			kgo.KeepControlRecords(),
			// An offset outside the log is an error, never a jump.
			kgo.ConsumeResetOffset(kgo.NoResetOffset()),
			kgo.FetchMaxWait(fetchMaxWait),
			kgo.FetchMaxPartitionBytes(int32(partBytes)),
			// A fetch request covers every partition on a broker: room
			// for a number of them at once.
			kgo.FetchMaxBytes(int32(max(min(int64(partBytes)*16, 64<<20), int64(partBytes)))),
		)
		cl, err := kgo.NewClient(opts...)
		if err != nil {
			c.hubErr = fmt.Errorf("franz: %w", err)
			return
		}
		ctx, cancel := context.WithCancel(context.Background())
		h := &hub{cl: cl, maxBytes: max(c.cfg.FetchMaxBytes, 1<<20), stopPoll: cancel,
			pollEnded: make(chan struct{}), feeds: map[kafkaclient.TopicPartition]*feed{}}
		go h.poll(ctx)
		c.hub = h
	})
	return c.hub, c.hubErr
}

// Open implements kafkaclient.Client.
func (c *Client) Open(cfg kafkaclient.FetchConfig) (*kafkaclient.Fetcher, error) {
	h, err := c.fetchHub()
	if err != nil {
		return nil, err
	}
	f := h.open(kafkaclient.TopicPartition{Topic: cfg.Topic, Partition: cfg.Partition}, cfg.TopicID, cfg.Start, max(cfg.MaxBatch, 1))
	return kafkaclient.NewFetcher(cfg, &feedSource{feed: f}, func(ctx context.Context) (kafkaclient.Bounds, error) {
		return c.Bounds(ctx, cfg.Topic, cfg.Partition)
	}), nil
}

// open starts fetching tp at start into a new feed, in place of the feed
// fetching it so far, if any: what a poll brings for tp before the change
// goes to the old feed, closed by then, and is dropped. id is the topic's
// id start was decided for (zero: the first fetch's stands).
func (h *hub) open(tp kafkaclient.TopicPartition, id kafkaclient.TopicID, start int64, maxBatch int) *feed {
	f := &feed{hub: h, tp: tp, maxBatch: maxBatch, wake: make(chan struct{}, 1), topicID: id, resumeAt: start}
	h.change(func() {
		if old := h.feeds[tp]; old != nil {
			h.remove(old)
		}
		h.feeds[tp] = f
		h.cl.AddConsumePartitions(map[string]map[int32]kgo.Offset{tp.Topic: {int32(tp.Partition): kgo.NewOffset().At(start)}})
	})
	return f
}

// change runs fn on the poller before its next poll, interrupting the poll
// in progress.
func (h *hub) change(fn func()) {
	h.mu.Lock()
	h.todo = append(h.todo, fn)
	if h.pollCancel != nil {
		h.pollCancel()
	}
	h.mu.Unlock()
}

// remove stops fetching f's partition; it runs on the poller.
func (h *hub) remove(f *feed) {
	if h.feeds[f.tp] != f {
		return
	}
	delete(h.feeds, f.tp)
	h.cl.RemoveConsumePartitions(map[string][]int32{f.tp.Topic: {int32(f.tp.Partition)}})
	// A pause would outlive the feed and hold back the next one.
	h.cl.ResumeFetchPartitions(map[string][]int32{f.tp.Topic: {int32(f.tp.Partition)}})
	f.close()
}

func (h *hub) poll(ctx context.Context) {
	defer close(h.pollEnded)
	for {
		h.mu.Lock()
		todo := h.todo
		h.todo = nil
		pollCtx, cancel := context.WithCancel(ctx)
		h.pollCancel = cancel
		h.mu.Unlock()
		for _, fn := range todo {
			fn()
		}
		fetches := h.cl.PollFetches(pollCtx)
		cancel()
		if ctx.Err() != nil {
			return
		}
		ids := topicIDs{hub: h, ctx: ctx}
		for i := range fetches {
			for _, t := range fetches[i].Topics {
				for _, p := range t.Partitions {
					f := h.feeds[kafkaclient.TopicPartition{Topic: t.Topic, Partition: int(p.Partition)}]
					if f == nil {
						continue
					}
					if ids.stale(f, kafkaclient.TopicID(t.TopicID), p.Err) {
						continue // fetched again, with the topic's id, after the refresh
					}
					f.push(kafkaclient.TopicID(t.TopicID), &p)
				}
			}
		}
		ids.refresh()
	}
}

// close stops polling and closes the fetching client.
func (h *hub) close() {
	h.stopPoll()
	<-h.pollEnded
	h.cl.Close()
}

// feed holds the records fetched for one partition until its Fetcher takes
// them. When it holds two batches' worth (MaxBatch records, or
// FetchMaxBytes, twice), the partition is paused until half of them are
// handed out: memory stays
// bounded by about two batches per partition, and a partition whose worker
// is busy does not slow the fetches of the others.
type feed struct {
	hub      *hub
	tp       kafkaclient.TopicPartition
	maxBatch int
	wake     chan struct{}

	// records and bytes count what the feed holds and what its source
	// took from it but did not hand out yet; paused is set while the
	// partition is paused for them.
	records, bytes atomic.Int64
	paused         atomic.Bool

	mu     sync.Mutex
	chunks []chunk
	closed bool
	// err ends the feed once the records before it are taken; lost is
	// set when the records taken but not handed out may be gone too.
	err  error
	lost atomic.Bool
	// topicID is the id of the topic the partition was opened for, or
	// else the one the first fetch came from.
	topicID kafkaclient.TopicID
	// resumeAt is where fetching starts again if kgo must be told of the
	// partition anew (see topicIDs): the offset after the last record
	// pushed, or the start. Only the poller uses it.
	resumeAt int64
}

// chunk is the records one fetch brought for the partition.
type chunk struct {
	records  []*kgo.Record
	bytes    int
	logStart int64
	hwm      int64
}

// push adds what one fetch brought; it runs on the poller.
func (f *feed) push(id kafkaclient.TopicID, p *kgo.FetchPartition) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed || f.err != nil {
		return
	}
	if f.topicID.Differs(id) {
		f.fail(&kafkaclient.RecreatedError{Topic: f.tp.Topic, Partition: f.tp.Partition, Expected: f.topicID, Found: id})
		return
	}
	if f.topicID.IsZero() {
		f.topicID = id
	}
	if len(p.Records) > 0 {
		f.resumeAt = p.Records[len(p.Records)-1].Offset + 1
		c := chunk{records: p.Records, logStart: p.LogStartOffset, hwm: p.HighWatermark}
		for _, r := range p.Records {
			c.bytes += len(r.Key) + len(r.Value)
		}
		f.chunks = append(f.chunks, c)
		records, bytes := f.records.Add(int64(len(c.records))), f.bytes.Add(int64(c.bytes))
		if !f.paused.Load() && (records >= 2*int64(f.maxBatch) || bytes >= 2*int64(f.hub.maxBytes)) {
			f.paused.Store(true)
			f.hub.cl.PauseFetchPartitions(map[string][]int32{f.tp.Topic: {int32(f.tp.Partition)}})
		}
	}
	if p.Err != nil {
		f.fail(f.fetchError(p.Err))
	}
	f.signal()
}

// fetchError says what a fetch's error means for the feed.
func (f *feed) fetchError(err error) error {
	var loss *kgo.ErrDataLoss
	switch {
	case errors.As(err, &loss):
		// The broker lost records kgo had fetched (an unclean leader
		// election): what is buffered may be among them, and kgo goes back
		// to where the log diverged, below offsets already handed out,
		// whose new records would be dropped as repeats. Nothing more is
		// handed out.
		f.chunks = nil
		f.lost.Store(true)
		return &kafkaclient.AheadError{Topic: f.tp.Topic, Partition: f.tp.Partition, Expected: loss.ConsumedTo, LogEnd: -1,
			Why: fmt.Sprintf("the broker lost records from offset %d on (%v)", loss.ResetTo, err)}
	case errors.Is(err, kerr.UnknownTopicID):
		return &kafkaclient.RecreatedError{Topic: f.tp.Topic, Partition: f.tp.Partition, Expected: f.topicID}
	case errors.Is(err, kerr.OffsetOutOfRange):
		return fmt.Errorf("%w: %w", kafkaclient.ErrOutOfRange, err)
	}
	return err
}

// nextOffset is the offset after the records the feed holds, or -1.
func (f *feed) nextOffset() int64 {
	if n := len(f.chunks); n > 0 {
		rs := f.chunks[n-1].records
		return rs[len(rs)-1].Offset + 1
	}
	return -1
}

func (f *feed) fail(err error) {
	if f.err == nil {
		f.err = err
	}
}

func (f *feed) signal() {
	select {
	case f.wake <- struct{}{}:
	default:
	}
}

func (f *feed) close() {
	f.mu.Lock()
	f.closed, f.chunks = true, nil
	f.mu.Unlock()
	f.signal()
}

// errFeedClosed is what a feed closed by a newer Open of its partition
// says (the engine opens one Fetcher per partition at a time).
var errFeedClosed = errors.New("franz: the partition was opened again")

// feedSource is a feed as a kafkaclient.Source. It takes a chunk at a
// time from the feed, so that a batch costs the feed's lock once per fetch
// rather than once per record.
type feedSource struct {
	feed    *feed
	headers kafkaclient.HeaderArena
	// taken is the rest of the chunk taken from the feed.
	taken chunk
}

func (s *feedSource) Next(ctx context.Context) (kafkaclient.Record, int64, error) {
	for len(s.taken.records) == 0 {
		if err := s.take(ctx); err != nil {
			return kafkaclient.Record{}, 0, err
		}
	}
	if s.feed.lost.Load() {
		// The broker lost records kgo had fetched, and these may be among
		// them: the feed's error says so, and nothing more goes out.
		s.taken = chunk{}
		return s.Next(ctx)
	}
	c := &s.taken
	r := c.records[0]
	c.records[0] = nil
	c.records = c.records[1:]
	s.feed.handedOut(len(r.Key) + len(r.Value))
	if r.Attrs.IsControl() {
		return kafkaclient.Record{Topic: r.Topic, Partition: int(r.Partition), Offset: r.Offset, HighWaterMark: c.hwm, Marker: true}, c.logStart, nil
	}
	return kafkaclient.Record{Topic: r.Topic, Partition: int(r.Partition), Offset: r.Offset, Key: r.Key, Value: r.Value,
		Headers: kafkaclient.CopyHeaders(&s.headers, r.Headers, header), Time: r.Timestamp, HighWaterMark: c.hwm}, c.logStart, nil
}

// take waits for the feed's next chunk and takes it whole.
func (s *feedSource) take(ctx context.Context) error {
	f := s.feed
	for {
		f.mu.Lock()
		if len(f.chunks) > 0 {
			s.taken = f.chunks[0]
			f.chunks[0] = chunk{}
			f.chunks = f.chunks[1:]
			f.mu.Unlock()
			return nil
		}
		err, closed := f.err, f.closed
		f.mu.Unlock()
		switch {
		case closed:
			return errFeedClosed
		case err != nil:
			return err
		}
		select {
		case <-f.wake:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

func header(h *kgo.RecordHeader) (string, []byte) { return h.Key, h.Value }

// handedOut counts a record of size bytes handed out, and resumes the
// partition once the feed and its source hold no more than a batch.
func (f *feed) handedOut(size int) {
	records, bytes := f.records.Add(-1), f.bytes.Add(-int64(size))
	if !f.paused.Load() || records > int64(f.maxBatch) || bytes > int64(f.hub.maxBytes) {
		return
	}
	f.mu.Lock()
	if f.paused.Load() && !f.closed {
		f.paused.Store(false)
		f.hub.cl.ResumeFetchPartitions(map[string][]int32{f.tp.Topic: {int32(f.tp.Partition)}})
	}
	f.mu.Unlock()
}

// MoveTo implements kafkaclient.Source: a new feed takes the old one's place.
func (s *feedSource) MoveTo(offset int64) error {
	old := s.feed
	old.mu.Lock()
	id := old.topicID
	old.mu.Unlock()
	s.feed, s.taken = old.hub.open(old.tp, id, offset, old.maxBatch), chunk{}
	old.close()
	return nil
}

func (s *feedSource) Close() {
	f := s.feed
	f.hub.change(func() { f.hub.remove(f) })
}
