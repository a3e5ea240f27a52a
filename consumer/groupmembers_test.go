package consumer_test

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/kafkaonce/kafkaonce/consumer"
)

// The machinery of the tests that change a group's members under steady
// load: the load, the members with what each holds, and when the group
// has settled.

// steadyLoad produces one message to every partition of the test's topic
// every 50 ms until stop, so that every handover happens under load.
type steadyLoad struct {
	mu    sync.Mutex
	ids   []string
	stopc chan struct{}
	done  chan struct{}
}

func (e *env) startLoad() *steadyLoad {
	l := &steadyLoad{stopc: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(l.done)
		w := e.kafka.Writer(e.topic)
		defer w.Close()
		for round := 0; ; round++ {
			select {
			case <-l.stopc:
				return
			case <-time.After(50 * time.Millisecond):
			}
			msgs := make([]kafka.Message, e.parts)
			batch := make([]string, e.parts)
			for p := range e.parts {
				batch[p] = "r" + strconv.Itoa(round) + "-" + strconv.Itoa(p)
				msgs[p] = msg(p, batch[p], "v")
			}
			if err := w.WriteMessages(context.Background(), msgs...); err != nil {
				e.t.Errorf("produce: %v", err)
				return
			}
			l.mu.Lock()
			l.ids = append(l.ids, batch...)
			l.mu.Unlock()
		}
	}()
	return l
}

// stop ends the load and returns the ids whose produce the broker
// acknowledged.
func (l *steadyLoad) stop() []string {
	close(l.stopc)
	<-l.done
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.ids)
}

// partitionHolder is a hook that keeps, per member, the partitions it
// holds and how often each was assigned and revoked: a worker's hooks'
// context ends when it returns, so an assignment's context ending is its
// revocation. With owners set it also reports to the group's ownership.
type partitionHolder struct {
	mu       sync.Mutex
	held     map[int]bool
	assigned int
	revoked  int
	name     string
	owners   *ownership
}

func newPartitionHolder() *partitionHolder { return &partitionHolder{held: map[int]bool{}} }

func (h *partitionHolder) OnPartitionAssigned(ctx context.Context, a consumer.PartitionAssignment) {
	h.mu.Lock()
	h.held[a.Partition] = true
	h.assigned++
	h.mu.Unlock()
	if h.owners != nil {
		h.owners.assigned(a, h.name)
	}
	go func() {
		<-ctx.Done()
		if h.owners != nil {
			h.owners.revoked(a.Partition, h.name)
		}
		h.mu.Lock()
		delete(h.held, a.Partition)
		h.revoked++
		h.mu.Unlock()
	}()
}

// state returns the partitions held, sorted, and the counts so far.
func (h *partitionHolder) state() (held []int, assigned, revoked int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for p := range h.held {
		held = append(held, p)
	}
	slices.Sort(held)
	return held, h.assigned, h.revoked
}

// ownership is who holds each partition of a group, across its members:
// a partition assigned to a member while another still holds it had two
// owners at once (which the database, not the group, then keeps from
// applying anything twice). It keeps every assignment, with where the
// member started it.
type ownership struct {
	mu          sync.Mutex
	owners      map[int][]string
	overlaps    []string
	assignments []consumer.PartitionAssignment
}

func (o *ownership) assigned(a consumer.PartitionAssignment, name string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	p := a.Partition
	o.assignments = append(o.assignments, a)
	if len(o.owners[p]) > 0 {
		o.overlaps = append(o.overlaps, fmt.Sprintf("partition %d assigned to %s while %v held it", p, name, o.owners[p]))
	}
	o.owners[p] = append(o.owners[p], name)
}

func (o *ownership) revoked(p int, name string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.owners[p] = slices.DeleteFunc(o.owners[p], func(n string) bool { return n == name })
}

// twoOwners returns every moment so far at which a partition had two.
func (o *ownership) twoOwners() []string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return slices.Clone(o.overlaps)
}

// starts returns every assignment so far.
func (o *ownership) starts() []consumer.PartitionAssignment {
	o.mu.Lock()
	defer o.mu.Unlock()
	return slices.Clone(o.assignments)
}

// groupMembers are the running members of the test's group, by name.
type groupMembers struct {
	t       testing.TB
	e       *env
	members []*member
	owners  *ownership
	runs    int
}

type member struct {
	name   string
	holder *partitionHolder
	run    *running
}

func (e *env) groupMembers(t testing.TB) *groupMembers {
	return &groupMembers{t: t, e: e, owners: &ownership{owners: map[int][]string{}}}
}

// start starts a member named name with cfg, and a partitionHolder of its
// own among its hooks. Each run is its own owner (name#run), so that a
// member stopped and started again never overlaps itself.
func (g *groupMembers) start(name string, cfg *consumer.Config) {
	g.t.Helper()
	g.runs++
	h := newPartitionHolder()
	h.name, h.owners = name+"#"+strconv.Itoa(g.runs), g.owners
	cfg.Hooks = append(slices.Clone(cfg.Hooks), h)
	g.members = append(g.members, &member{name: name, holder: h, run: g.e.start(cfg)})
}

// stop stops the member named name (Run returns nil), and forgets it.
func (g *groupMembers) stop(name string) {
	g.t.Helper()
	i := slices.IndexFunc(g.members, func(m *member) bool { return m.name == name })
	if i < 0 {
		g.t.Fatalf("no member %s running", name)
	}
	g.members[i].run.stop()
	g.members = slices.Delete(g.members, i, i+1)
}

// stopAll stops every member.
func (g *groupMembers) stopAll() {
	g.t.Helper()
	for _, m := range g.members {
		m.run.stop()
	}
	g.members = nil
}

// snapshot is what a member held, and had been assigned and revoked, when
// the group settled.
type snapshot struct {
	held              []int
	assigned, revoked int
}

// settled waits until the running members hold every partition once, as
// evenly as the count allows, and returns what each holds.
func (g *groupMembers) settled(what string) map[string]snapshot {
	g.t.Helper()
	out := map[string]snapshot{}
	waitFor(g.t, 90*time.Second, what, func() bool {
		clear(out)
		seen := map[int]bool{}
		least, most := g.e.parts, 0
		for _, m := range g.members {
			held, a, r := m.holder.state()
			for _, p := range held {
				if seen[p] {
					return false
				}
				seen[p] = true
			}
			least, most = min(least, len(held)), max(most, len(held))
			out[m.name] = snapshot{held, a, r}
		}
		return len(seen) == g.e.parts && most-least <= 1
	})
	return out
}

// move is what a change did to a member that ran before and after it: the
// partitions it gave up and gained, and how many revocations and
// assignments it went through to get there. A cooperative move revokes
// just what is lost and assigns just what is gained; an eager one revokes
// everything the member held and assigns what it ends up with.
type move struct {
	lost, gained      int
	revoked, assigned int
	before, after     []int
}

func (m move) cooperative() bool { return m.revoked == m.lost && m.assigned == m.gained }

// moves returns the move of each member settled both before and after a
// change.
func moves(before, after map[string]snapshot) map[string]move {
	out := map[string]move{}
	for name, a := range after {
		b, ok := before[name]
		if !ok {
			continue
		}
		m := move{revoked: a.revoked - b.revoked, assigned: a.assigned - b.assigned, before: b.held, after: a.held}
		for _, p := range b.held {
			if !slices.Contains(a.held, p) {
				m.lost++
			}
		}
		for _, p := range a.held {
			if !slices.Contains(b.held, p) {
				m.gained++
			}
		}
		out[name] = m
	}
	return out
}
