package main

import (
	"context"
	"sync"
	"time"

	"github.com/kafkaonce/kafkaonce/internal/kafkaclient"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/segmentio/kafka-go"
)

// runOptimum is the best loop we know how to write by hand for this job,
// with nothing kafkaonce does beyond it (no fingerprints, no positions, no
// failure handling): per partition, a batch of up to MaxBatch messages or
// 5 ms; ids made unique within the batch in Go; one round trip that claims
// them with INSERT … SELECT unnest(…) ON CONFLICT DO NOTHING RETURNING and
// applies the effect for the new ones in the same statement (autocommit);
// offsets committed asynchronously, all partitions in one request. For
// transfers the batch is a transaction of its own, sent in one round trip
// too (see claimAndTransfer).
func runOptimum(ctx context.Context, e *env, c cell, b backlog, rec *recorder) error {
	table, err := handTable(ctx, e.db, c.Prefilled)
	if err != nil {
		return err
	}
	claimSQL := `INSERT INTO ` + table + ` (consumer, message_id) SELECT $1, unnest($2::text[]) ON CONFLICT DO NOTHING`
	claimUpdateSQL := `WITH claimed AS (` + claimSQL + ` RETURNING message_id)
UPDATE ` + benchSchema + `.accounts AS a SET balance = a.balance + d.n
FROM (SELECT m.account AS id, count(*) AS n FROM unnest($2::text[], $3::int[]) AS m(message_id, account)
      JOIN claimed USING (message_id) GROUP BY m.account) AS d
WHERE a.id = d.id`
	claimTransferSQL := `WITH claimed AS (` + claimSQL + ` RETURNING message_id)
` + transferSetSQL(`unnest($2::text[], $3::int[], $4::int[]) AS m(message_id, src, dst) JOIN claimed USING (message_id)`)
	name := nextConsumerName()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	com := newAsyncCommitter(e.kafkaClient(), b.topic+"-optimum", b.topic)
	go com.run(ctx)

	// Scratch space per partition, reused batch after batch.
	type scratch struct {
		ids  []string
		accs []int32
		seen map[string]struct{}
		t    transferSet
	}
	scratches := make([]scratch, c.Partitions)
	return eachPartition(ctx, e, c, b, rec, c.MaxBatch, func(ctx context.Context, p int, batch []kafkaclient.Record) error {
		s := &scratches[p]
		if s.seen == nil {
			s.seen = map[string]struct{}{}
		}
		s.ids, s.accs = s.ids[:0], s.accs[:0]
		s.t.reset()
		clear(s.seen)
		for i := range batch {
			id := messageID(c.IDs, &batch[i])
			if _, dup := s.seen[id]; dup {
				continue
			}
			s.seen[id] = struct{}{}
			s.ids = append(s.ids, id)
			if c.Effect == effectTransfer {
				s.t.add(batch[i].Value)
			} else {
				s.accs = append(s.accs, accountOf(batch[i].Key))
			}
		}
		var err error
		switch c.Effect {
		case effectNoop:
			_, err = e.db.Exec(ctx, claimSQL, name, s.ids)
		case effectUpdate:
			_, err = e.db.Exec(ctx, claimUpdateSQL, name, s.ids, s.accs)
		case effectTransfer:
			err = claimAndTransfer(ctx, e, claimTransferSQL, name, s.ids, &s.t)
		case effectWait:
			err = claimAndWait(ctx, e, claimSQL, name, s.ids)
		}
		if err != nil {
			return err
		}
		com.mark(p, batch[len(batch)-1].Offset+1)
		return nil
	})
}

// claimAndWait is the optimum for a slow effect: BEGIN and the claim in one
// round trip, the effect (2 ms) for each new id, COMMIT.
func claimAndWait(ctx context.Context, e *env, claimSQL, name string, ids []string) error {
	conn, err := e.db.Acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	var b pgx.Batch
	b.Queue("BEGIN")
	var inserted int64
	b.Queue(claimSQL, name, ids).Exec(func(tag pgconn.CommandTag) error { inserted = tag.RowsAffected(); return nil })
	if err := conn.SendBatch(ctx, &b).Close(); err != nil {
		_, _ = conn.Exec(context.WithoutCancel(ctx), "ROLLBACK")
		return err
	}
	time.Sleep(time.Duration(inserted) * 2 * time.Millisecond)
	_, err = conn.Exec(ctx, "COMMIT")
	return err
}

// claimAndTransfer is the optimum for transfers: BEGIN, the batch's
// accounts locked in id order, the claim and the net change of each
// account for the claimed ids, COMMIT, pipelined in one round trip. The
// lock must come first and be a statement of its own: the UPDATE alone
// would lock its rows in whatever order its plan meets them.
func claimAndTransfer(ctx context.Context, e *env, claimTransferSQL, name string, ids []string, t *transferSet) error {
	conn, err := e.db.Acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	var b pgx.Batch
	b.Queue("BEGIN")
	b.Queue(transferLockSQL, t.accounts())
	b.Queue(claimTransferSQL, name, ids, t.src, t.dst)
	b.Queue("COMMIT")
	if err := conn.SendBatch(ctx, &b).Close(); err != nil {
		_, _ = conn.Exec(context.WithoutCancel(ctx), "ROLLBACK")
		return err
	}
	return nil
}

// asyncCommitter commits the newest offset of every partition in the
// background, one request at a time for all partitions: offset commits
// never wait on the processing loop, nor it on them.
type asyncCommitter struct {
	client       *kafka.Client
	group, topic string
	mu           sync.Mutex
	next         map[int]int64
	wake         chan struct{}
}

func newAsyncCommitter(client *kafka.Client, group, topic string) *asyncCommitter {
	return &asyncCommitter{client: client, group: group, topic: topic, next: map[int]int64{}, wake: make(chan struct{}, 1)}
}

func (a *asyncCommitter) mark(p int, next int64) {
	a.mu.Lock()
	a.next[p] = next
	a.mu.Unlock()
	select {
	case a.wake <- struct{}{}:
	default:
	}
}

func (a *asyncCommitter) run(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-a.wake:
		}
		a.mu.Lock()
		next := a.next
		a.next = map[int]int64{}
		a.mu.Unlock()
		if len(next) > 0 {
			_ = commitOffsets(ctx, a.client, a.group, a.topic, next)
		}
	}
}
