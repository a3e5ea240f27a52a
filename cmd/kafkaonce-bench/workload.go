package main

import (
	"context"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/segmentio/kafka-go"

	"github.com/kafkaonce/kafkaonce/consumer"
	"github.com/kafkaonce/kafkaonce/internal/kafkaclient"

	"github.com/kafkaonce/kafkaonce/internal/devenv"
)

// cell is one point of the benchmark's axes.
type cell struct {
	Partitions int     `json:"partitions"`
	Prefilled  bool    `json:"prefilled"` // processed_messages holds the pre-filled rows
	IDs        idKind  `json:"ids"`
	Dups       float64 `json:"duplicates"` // fraction of messages that re-send an earlier one
	Effect     effect  `json:"effect"`
	Size       int     `json:"size"` // message value bytes
	MaxBatch   int     `json:"max_batch"`
	// Accounts is how many hot accounts the transfer effect moves units
	// between (0 for the other effects, which spread over all accounts).
	// Omitted when 0, so cells saved before it existed read back equal.
	Accounts int `json:"accounts,omitempty"`
	// Traceparent means every message carries a W3C traceparent of its own (the
	// tracing cells).
	Traceparent bool `json:"traceparent,omitempty"`
}

func (c cell) String() string {
	table := "empty"
	if c.Prefilled {
		table = "prefilled"
	}
	s := fmt.Sprintf("p=%d %s ids=%s dup=%d%% %s %dB batch=%d", c.Partitions, table, c.IDs, int(c.Dups*100+0.5), c.Effect, c.Size, c.MaxBatch)
	if c.Accounts > 0 {
		// Only then: the cells without hot accounts keep the names their
		// saved results have.
		s += fmt.Sprintf(" accounts=%d", c.Accounts)
	}
	if c.Traceparent {
		s += " traced"
	}
	return s
}

// hot reports whether the cell's messages contend for a few hot rows.
func (c cell) hot() bool { return c.Effect == effectTransfer }

type idKind string

const (
	idUUIDv7   idKind = "uuidv7"
	idUUIDv4   idKind = "uuidv4"
	idPosition idKind = "position"
)

type effect string

const (
	effectNoop   effect = "noop"
	effectUpdate effect = "update"
	effectWait   effect = "wait2ms"
	// effectPartner waits 20 ms on a partner per message, then records
	// the answer (the UPDATE's one-row change, which the check counts):
	// the workload share groups exist for (see share.go).
	effectPartner effect = "partner20ms"
	// effectTransfer moves 1 unit between two of the cell's hot accounts
	// (see transfer.go).
	effectTransfer effect = "transfer"
)

// accounts is how many rows the UPDATE effect spreads over.
const accounts = 10000

// sentHeader carries the producer's clock (unix nanoseconds) for the
// end-to-end latency.
const sentHeader = "sent-ns"

// backlog is what was produced for one run.
type backlog struct {
	topic  string
	total  int // messages in the log
	unique int // distinct ids among them
	// perPartition counts the messages of each partition (nil when not
	// known beforehand, as in latency runs).
	perPartition []int
}

// runNames hands out the consumer names the modes claim ids under: one per
// run, all of the same length. The hand-written loops store the name in
// every claimed row and in its index (kafkaonce stored it twice, until its
// rows named the consumer by number), so names of different lengths
// (topic + "/" + mode, as they once were: eight bytes longer for
// kafkaonce-batch than for optimum) would weigh on one mode more than
// another; and a short name is what a real consumer has ("ledger"). Unique per run, and from a random start per process (a
// database may be reused), so no run finds another's claims.
var (
	runNameBase = rand.Uint32()
	runNames    atomic.Uint32
)

func nextConsumerName() string { return fmt.Sprintf("run-%08x", runNameBase+runNames.Add(1)) }

// newWriter returns a writer that puts each message on the partition
// already set in it.
func newWriter(brokers []string, topic string) *kafka.Writer {
	return &kafka.Writer{
		Addr:         kafka.TCP(brokers...),
		Topic:        topic,
		Balancer:     kafka.BalancerFunc(func(m kafka.Message, _ ...int) int { return m.Partition }),
		BatchSize:    2000,
		BatchBytes:   4 << 20,
		BatchTimeout: time.Millisecond,
		RequiredAcks: kafka.RequireOne,
		// A transport of its own with a short metadata TTL: the topic was
		// just created, and a shared transport may still cache metadata
		// from before it existed.
		Transport: &kafka.Transport{MetadataTTL: time.Second},
	}
}

// generator makes the messages of one workload: ids of the cell's kind,
// keys over the accounts, and a share of re-sends of earlier messages
// (same id, same content — what a producer retry delivers).
type generator struct {
	c    cell
	rng  *rand.Rand
	sent []kafka.Message // earlier messages, for re-sends
	seq  int
	pad  []byte
}

func newGenerator(c cell, seed uint64) *generator {
	pad := make([]byte, c.Size)
	for i := range pad {
		pad[i] = 'a' + byte(i%26)
	}
	return &generator{c: c, rng: rand.New(rand.NewPCG(seed, 7)), pad: pad}
}

func (g *generator) next() kafka.Message {
	if g.c.Dups > 0 && len(g.sent) > 0 && g.rng.Float64() < g.c.Dups {
		m := g.sent[g.rng.IntN(len(g.sent))]
		m.Partition = g.partitionOf(m.Key)
		return m
	}
	g.seq++
	var key, value []byte
	if g.c.Effect == effectTransfer {
		key, value = g.transfer()
	} else {
		n := g.rng.IntN(accounts)
		if g.c.Effect == effectPartner {
			// An account per message (for the first 10,000): a partner's
			// answer is recorded in a transaction held open for 20 ms per
			// message, and two such transactions of share members sharing
			// an account would wait on each other, or deadlock, measuring
			// Postgres's row locks instead of the partner.
			n = g.seq % accounts
		}
		key = []byte("acct-" + strconv.Itoa(n))
		value = make([]byte, g.c.Size)
		copy(value, g.pad)
		binary.BigEndian.PutUint64(value, uint64(g.seq)) // distinct content per message
	}
	m := kafka.Message{Key: key, Value: value, Partition: g.partitionOf(key)}
	switch g.c.IDs {
	case idUUIDv7:
		m.Headers = []kafka.Header{{Key: "message-id", Value: []byte(uuid.Must(uuid.NewV7()).String())}}
	case idUUIDv4:
		m.Headers = []kafka.Header{{Key: "message-id", Value: []byte(uuid.New().String())}}
	}
	if g.c.Dups > 0 && len(g.sent) < 100000 {
		g.sent = append(g.sent, m)
	}
	return m
}

func (g *generator) partitionOf(key []byte) int {
	var h uint32 = 2166136261
	for _, b := range key {
		h = (h ^ uint32(b)) * 16777619
	}
	return int(h % uint32(g.c.Partitions))
}

// produce writes n messages of the cell's workload to a new topic.
// Position ids make every message unique (a re-send lands at a new
// offset), so duplicates only exist for header ids. The backlog counts the
// messages of each partition, for the longest stall (see stalls).
func produce(ctx context.Context, brokers []string, topic string, c cell, n int, seed uint64) (backlog, error) {
	w := newWriter(brokers, topic)
	defer w.Close()
	g := newGenerator(c, seed)
	ids := map[string]struct{}{}
	buf := make([]kafka.Message, 0, 5000)
	perPartition := make([]int, c.Partitions)
	for i := 0; i < n; i++ {
		m := g.next()
		perPartition[m.Partition]++
		m.Headers = append(m.Headers[:len(m.Headers):len(m.Headers)], kafka.Header{Key: sentHeader, Value: stamp(time.Now())})
		if c.Traceparent {
			m.Headers = append(m.Headers, kafka.Header{Key: "traceparent", Value: newTraceparent()})
		}
		// Without re-sends every id is new (UUIDs); the set is only kept
		// when there are duplicates to count, so that a 10M backlog does not
		// leave a 10M-entry map behind in the consumer's process.
		if c.IDs != idPosition && c.Dups > 0 {
			ids[string(m.Headers[0].Value)] = struct{}{}
		}
		buf = append(buf, m)
		if len(buf) == cap(buf) || i == n-1 {
			if err := w.WriteMessages(ctx, buf...); err != nil {
				return backlog{}, fmt.Errorf("produce to %s: %w", topic, err)
			}
			buf = buf[:0]
		}
	}
	b := backlog{topic: topic, total: n, unique: len(ids), perPartition: perPartition}
	if c.IDs == idPosition || c.Dups == 0 {
		b.unique = n
	}
	return b, nil
}

// stamp is the value of the sentHeader for t.
func stamp(t time.Time) []byte {
	return binary.BigEndian.AppendUint64(nil, uint64(t.UnixNano()))
}

// createTopic creates a topic for one run.
func createTopic(ctx context.Context, e *env, topic string, partitions int) error {
	return devenv.CreateTopic(ctx, e.brokers, topic, partitions)
}

// deleteTopic drops a topic once its runs are over: the in-process broker
// keeps every message in memory, and a full run's backlogs (gigabytes by
// the end) would otherwise weigh on every later run, its collector taking
// CPU from them.
func deleteTopic(ctx context.Context, e *env, topic string) error {
	return devenv.DeleteTopic(ctx, e.brokers, topic)
}

// sentAt reads the producer's clock from a message.
func sentAt[H kafka.Header | consumer.Header](headers []H) (time.Time, bool) {
	for _, h := range headers {
		if h := kafka.Header(h); h.Key == sentHeader && len(h.Value) == 8 {
			return time.Unix(0, int64(binary.BigEndian.Uint64(h.Value))), true
		}
	}
	return time.Time{}, false
}

// accountOf is the account a message's effect updates.
func accountOf(key []byte) int32 {
	n, _ := strconv.Atoi(string(key[len("acct-"):]))
	return int32(n)
}

// headerID is the message-id header's value, or the log position.
func messageID(kind idKind, m *kafkaclient.Record) string {
	if kind == idPosition {
		return m.Topic + "/" + strconv.Itoa(m.Partition) + "/" + strconv.FormatInt(m.Offset, 10)
	}
	for _, h := range m.Headers {
		if h.Key == "message-id" {
			return string(h.Value)
		}
	}
	return ""
}
