package engine

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kafkaonce/kafkaonce/internal/kafkaclient"
)

// The committer and the membership are tested against a scripted group
// (scriptGroup) in place of a Kafka client, and scripted workers in place
// of ones that need Postgres. What happens is written to one groupLog, in
// order: the group's calls and commits, the workers' batches and stops.
// A test compares the log with what must happen, in that order.

// groupLog is the order of what happens to a member: each event a line,
// with the processed positions the "database" holds, against which every
// commit is checked as it is made.
type groupLog struct {
	mu     sync.Mutex
	events []string
	// stored is the next offset of each partition the database has
	// committed: a commit past it would be ahead of the database.
	stored map[kafkaclient.TopicPartition]int64
	// changed is closed, and replaced, at every event (see waitFor).
	changed chan struct{}
}

func newGroupLog() *groupLog {
	return &groupLog{stored: map[kafkaclient.TopicPartition]int64{}, changed: make(chan struct{})}
}

func (l *groupLog) add(format string, args ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.addLocked(fmt.Sprintf(format, args...))
}

func (l *groupLog) addLocked(event string) {
	l.events = append(l.events, event)
	close(l.changed)
	l.changed = make(chan struct{})
}

// store records that a batch's database transaction committed every
// message of tp below next.
func (l *groupLog) store(tp kafkaclient.TopicPartition, next int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.stored[tp] = max(l.stored[tp], next)
	l.addLocked(fmt.Sprintf("stored %s", offsetText(kafkaclient.Offset{TopicPartition: tp, Next: next})))
}

// list is the events so far.
func (l *groupLog) list() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.events)
}

// waitFor waits until event has happened, or ctx is done; it says which.
func (l *groupLog) waitFor(ctx context.Context, event string) bool {
	return l.waitForTimes(ctx, event, 1)
}

// waitForTimes waits until event has happened n times, or ctx is done; it
// says which.
func (l *groupLog) waitForTimes(ctx context.Context, event string, n int) bool {
	for {
		l.mu.Lock()
		seen, changed := 0, l.changed
		for _, e := range l.events {
			if e == event {
				seen++
			}
		}
		l.mu.Unlock()
		if seen >= n {
			return true
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return false
		}
	}
}

// requireEvent fails t unless event happens within a few seconds.
func (l *groupLog) requireEvent(t *testing.T, event string) {
	t.Helper()
	l.requireEventTimes(t, event, 1)
}

// requireEventTimes fails t unless event has happened n times within a
// few seconds.
func (l *groupLog) requireEventTimes(t *testing.T, event string, n int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if !l.waitForTimes(ctx, event, n) {
		t.Fatalf("%q did not happen %d time(s); the log is:\n%s", event, n, strings.Join(l.list(), "\n"))
	}
}

// lingerUntil is a batch in flight that takes a while: it ends when
// event happens, or after linger. Code that must wait for the batch before
// event (a callback's return) shows it when it does not: event then comes
// first, and the batch's own events after it. The linger is only the
// batch's length, no wait for an outcome: a test that passes takes it.
func (l *groupLog) lingerUntil(event string) {
	ctx, cancel := context.WithTimeout(context.Background(), linger)
	defer cancel()
	l.waitFor(ctx, event)
}

// linger is how long a batch in flight takes to end when nothing ends it
// earlier (see lingerUntil): only a wrong order of the code under test
// makes it shorter, so a passing test takes it every time.
const linger = 50 * time.Millisecond

// part is partition p of topic t, the topic of every test here.
func part(p int) kafkaclient.TopicPartition {
	return kafkaclient.TopicPartition{Topic: "t", Partition: p}
}

func partsText(parts []kafkaclient.TopicPartition) string {
	s := make([]string, len(parts))
	for i, p := range parts {
		s[i] = fmt.Sprintf("%s/%d", p.Topic, p.Partition)
	}
	sort.Strings(s)
	return strings.Join(s, " ")
}

func offsetText(o kafkaclient.Offset) string {
	s := fmt.Sprintf("%s/%d@%d", o.Topic, o.Partition, o.Next)
	if o.Metadata != "" {
		s += "[" + o.Metadata + "]"
	}
	return s
}

// scriptGroup is a kafkaclient.Group that plays a script. RunGroup makes
// the membership calls of calls, one after the other; Commit writes each
// commit to the log, answers it as the test said (answers), and refuses
// it as fenced once the member's generation has ended (by a loss, until
// the next assignment), as a broker does.
type scriptGroup struct {
	log   *groupLog
	calls []groupCall

	mu sync.Mutex
	// answers answer the next commits, one each, in order: nil, or none
	// left, accepts. An answer may block (a commit in flight).
	answers []func(ctx context.Context) error
	// ended is set by a loss, and cleared by the next assignment: the
	// member's generation is over.
	ended bool
}

// groupCall is a membership call RunGroup makes once after has happened
// ("" for at once).
type groupCall struct {
	kind  callKind
	parts []kafkaclient.TopicPartition
	after string
}

type callKind int

const (
	assign callKind = iota
	revoke
	lose
)

var _ kafkaclient.Group = (*scriptGroup)(nil)

// answer adds answers for the next commits.
func (g *scriptGroup) answer(a ...func(ctx context.Context) error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.answers = append(g.answers, a...)
}

// refuse is an answer that refuses a commit with err.
func refuse(err error) func(context.Context) error {
	return func(context.Context) error { return err }
}

// RunGroup makes the script's calls, then, once ctx is done, revokes what
// is still assigned, as a client does.
func (g *scriptGroup) RunGroup(ctx context.Context, m kafkaclient.Membership) error {
	assigned := map[kafkaclient.TopicPartition]bool{}
	for _, c := range g.calls {
		if c.after != "" && !g.log.waitFor(ctx, c.after) {
			break
		}
		g.call(ctx, m, c.kind, c.parts)
		for _, p := range c.parts {
			assigned[p] = c.kind == assign
		}
	}
	<-ctx.Done()
	var left []kafkaclient.TopicPartition
	for p, in := range assigned {
		if in {
			left = append(left, p)
		}
	}
	if len(left) > 0 {
		g.call(ctx, m, revoke, left)
	}
	return nil
}

func (g *scriptGroup) call(ctx context.Context, m kafkaclient.Membership, kind callKind, parts []kafkaclient.TopicPartition) {
	switch kind {
	case assign:
		g.mu.Lock()
		g.ended = false
		g.mu.Unlock()
		// Before the call: the workers it starts log from then on.
		g.log.add("assigning %s", partsText(parts))
		m.Assigned(ctx, parts)
	case revoke:
		g.log.add("revoking %s", partsText(parts))
		m.Revoked(ctx, parts)
		g.log.add("revoked %s", partsText(parts))
	case lose:
		g.mu.Lock()
		g.ended = true
		g.mu.Unlock()
		g.log.add("losing %s", partsText(parts))
		m.Lost(ctx, parts)
		g.log.add("lost %s", partsText(parts))
	}
}

// Commit writes the commit to the log, marking a commit ahead of the
// database or in an ended generation, and answers it.
func (g *scriptGroup) Commit(ctx context.Context, offsets []kafkaclient.Offset) error {
	offsets = slices.Clone(offsets)
	sort.Slice(offsets, func(i, j int) bool { return offsetText(offsets[i]) < offsetText(offsets[j]) })
	text := make([]string, len(offsets))
	for i, o := range offsets {
		text[i] = offsetText(o)
	}
	event := "commit " + strings.Join(text, " ")
	g.log.mu.Lock()
	for _, o := range offsets {
		if stored := g.log.stored[o.TopicPartition]; o.Next > stored {
			event += fmt.Sprintf(" AHEAD OF THE DATABASE (%s/%d has %d)", o.Topic, o.Partition, stored)
		}
	}
	g.log.mu.Unlock()
	g.mu.Lock()
	ended := g.ended
	var answer func(context.Context) error
	if len(g.answers) > 0 {
		answer, g.answers = g.answers[0], g.answers[1:]
	}
	g.mu.Unlock()
	var err error
	switch {
	case ended:
		event += " IN AN ENDED GENERATION"
		err = fmt.Errorf("script: %w", kafkaclient.ErrFenced)
	case answer != nil:
		err = answer(ctx)
	}
	if err != nil {
		event += ": refused"
	}
	g.log.add("%s", event)
	return err
}

var errNotScripted = errors.New("script: not part of the script")

func (g *scriptGroup) Committed(context.Context, kafkaclient.TopicPartition) (kafkaclient.CommittedOffset, error) {
	return kafkaclient.CommittedOffset{}, errNotScripted
}

func (g *scriptGroup) Member() kafkaclient.Member { return kafkaclient.Member{} }

func (g *scriptGroup) TopicCommitted(context.Context, string, int) ([]int64, error) {
	return nil, errNotScripted
}
