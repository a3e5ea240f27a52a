package engine

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kafkaonce/kafkaonce/kafkaoncetype"
)

// healthDBTimeout bounds Health's own question to Postgres, and
// healthDBFresh is how long an answer (or a batch committed) stands for
// one: a probe never waits on a slow database for longer, and probes
// coming often ask it at most once a second.
const (
	healthDBTimeout = time.Second
	healthDBFresh   = time.Second
)

// progress is when a worker last moved, for the liveness check: the worker
// writes it, Health reads it from another goroutine.
type progress struct {
	at atomic.Int64 // unix nanoseconds of the last step
	// waiting is set in a wait that is no stall: at the log's end with
	// nothing to fetch, paused, or parked after a stop.
	waiting, paused atomic.Bool
	// stopped is why the partition stopped, once it has (see worker.run).
	stopped atomic.Pointer[string]
}

func newProgress() *progress {
	p := &progress{}
	p.step()
	return p
}

// step records that the worker moved. It does nothing on nil, so code
// that runs without a worker (the engine's table tests) need not set one.
func (p *progress) step() {
	if p != nil {
		p.at.Store(time.Now().UnixNano())
	}
}

// wait records the start (on) or the end of a wait that is no stall.
func (p *progress) wait(on bool) {
	if p != nil {
		p.waiting.Store(on)
		p.step()
	}
}

// stop records that the worker stopped for why, and is parked: a wait
// that is no stall.
func (p *progress) stop(why string) {
	if p != nil {
		p.stopped.Store(&why)
		p.wait(true)
	}
}

// stalledFor is how long the worker has not moved while it had work, 0
// when it is in a wait that is no stall.
func (p *progress) stalledFor(now time.Time) time.Duration {
	if p.waiting.Load() {
		return 0
	}
	return now.Sub(time.Unix(0, p.at.Load()))
}

// health is what Health reads besides the workers.
type health struct {
	member atomic.Pointer[membership]
	// inGroup is set by each generation the member joins, and cleared when
	// it loses its partitions or Run ends; outSince is when it was last
	// cleared (or Run started), in unix nanoseconds.
	inGroup  atomic.Bool
	outSince atomic.Int64
	// committed is when a batch last committed (unix nanoseconds): a
	// database that just committed answers, and needs no question.
	committed atomic.Int64
	// pollFailing is, for a share group member, since when its polls
	// fail (unix nanoseconds; 0 while they succeed), and pollError the
	// last failure: a member that cannot poll is in its group in name
	// only.
	pollFailing atomic.Int64
	pollError   atomic.Pointer[string]
	// shareHeld and shareLast are, for a share group member, the records
	// of its last poll not settled yet, and those of them on their last
	// delivery (see shareLocks.publish).
	shareHeld, shareLast atomic.Int64

	mu      sync.Mutex
	dbAt    time.Time
	dbError string
}

// Health reports whether the consumer is live and ready (see
// kafkaoncetype.Health). It asks Postgres at most once a second, and never
// for longer than healthDBTimeout; with askDB false it does not ask it at
// all (a liveness probe: a database that is down is no reason to restart),
// and Ready then leaves the database out.
func (c *Consumer) Health(ctx context.Context, askDB bool) kafkaoncetype.Health {
	now := time.Now()
	h := kafkaoncetype.Health{CheckedAt: now, Running: c.running.Load() && !c.finished.Load(), InGroup: c.health.inGroup.Load(), Problems: []string{}, Stopped: []string{}}
	if m := c.health.member.Load(); m != nil {
		member := m.group.Member()
		h.Group = &kafkaoncetype.GroupHealth{Protocol: c.cfg.GroupProtocol.String(), MemberID: member.ID, Generation: member.Generation}
		h.Problems = append(h.Problems, m.stalls(now, c.cfg.StallAfter, &h)...)
		// The group loop: a member that cannot get into its group for
		// StallAfter is as wedged as a partition that cannot fetch.
		if out := now.Sub(time.Unix(0, c.health.outSince.Load())); !h.InGroup && out > c.cfg.StallAfter {
			h.Problems = append(h.Problems, fmt.Sprintf("not in consumer group %s for %v (Config.StallAfter is %v): the group's coordinator does not answer, or the member cannot join", c.cfg.GroupID, out.Round(time.Second), c.cfg.StallAfter))
		}
	}
	share := c.cfg.GroupType == kafkaoncetype.ShareGroup
	var pollFailing time.Duration
	if share && h.Running {
		// A share member's group loop: joining, then polling. Either one
		// failing for StallAfter is as wedged as a partition that cannot
		// fetch.
		out := now.Sub(time.Unix(0, c.health.outSince.Load()))
		if !h.InGroup && out > c.cfg.StallAfter {
			h.Problems = append(h.Problems, fmt.Sprintf("not in share group %s for %v (Config.StallAfter is %v): the group's coordinator does not answer, or the member cannot join", c.cfg.GroupID, out.Round(time.Second), c.cfg.StallAfter))
		}
		if since := c.health.pollFailing.Load(); h.InGroup && since != 0 {
			pollFailing = now.Sub(time.Unix(0, since))
			if pollFailing > c.cfg.StallAfter {
				h.Problems = append(h.Problems, fmt.Sprintf("share group %s: polls have failed for %v (Config.StallAfter is %v): %s", c.cfg.GroupID, pollFailing.Round(time.Second), c.cfg.StallAfter, c.pollError()))
			}
		}
	}
	h.Live = len(h.Problems) == 0
	kind := "consumer group"
	if share {
		kind = "share group"
		h.Share = &kafkaoncetype.ShareHealth{Held: int(c.health.shareHeld.Load()), OnLastDelivery: int(c.health.shareLast.Load())}
	}
	failing := c.dials.Failing()
	if failing != nil {
		h.LastDialError = &kafkaoncetype.DialError{Broker: failing.Broker, Cause: failing.Cause.Explain(), Error: failing.Err.Error(),
			Since: failing.Since, At: failing.At, Attempts: failing.Attempts}
	}
	switch {
	case !h.Running:
		h.Problems = append(h.Problems, "not running: Run has not started, or has returned")
	case !h.InGroup && h.LastDialError != nil:
		// Why it cannot join, rather than that it is trying.
		h.Problems = append(h.Problems, fmt.Sprintf("not in %s %s: cannot connect to the brokers: %s", kind, c.cfg.GroupID, failing))
	case !h.InGroup && share:
		h.Problems = append(h.Problems, fmt.Sprintf("not in share group %s: joining", c.cfg.GroupID))
	case !h.InGroup:
		h.Problems = append(h.Problems, fmt.Sprintf("not in consumer group %s: joining, or rejoining after losing its partitions", c.cfg.GroupID))
	case pollFailing > 0 && pollFailing <= c.cfg.StallAfter:
		// In the group, but not polling: not ready, and not yet stalled.
		h.Problems = append(h.Problems, fmt.Sprintf("share group %s: its polls fail since %v: %s", c.cfg.GroupID, pollFailing.Round(time.Millisecond), c.pollError()))
	}
	if askDB {
		if h.DatabaseError = c.checkDatabase(ctx, now); h.DatabaseError != "" {
			h.Problems = append(h.Problems, "postgres: "+h.DatabaseError)
		}
	}
	h.Ready = h.Live && h.Running && h.InGroup && pollFailing == 0 && h.DatabaseError == ""
	return h
}

// checkDatabase is "" when Postgres answered within the last second (a
// batch committed, or a ping), else asks it, within healthDBTimeout, and
// returns the failure. The answer stands for the next probes, so it is
// the database's alone: the question does not end with the probe that
// asked it (a kubelet that hung up would make the next probes unready).
func (c *Consumer) checkDatabase(ctx context.Context, now time.Time) string {
	if now.Sub(time.Unix(0, c.health.committed.Load())) < healthDBFresh {
		return ""
	}
	c.health.mu.Lock()
	defer c.health.mu.Unlock()
	if now.Sub(c.health.dbAt) < healthDBFresh {
		return c.health.dbError
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), healthDBTimeout)
	defer cancel()
	c.health.dbError = ""
	conn, err := c.db.Acquire(ctx)
	if err == nil {
		err = conn.Ping(ctx)
		conn.Release()
	}
	if err != nil {
		c.health.dbError = fmt.Sprintf("no answer within %v: %v", healthDBTimeout, err)
	}
	c.health.dbAt = time.Now()
	return c.health.dbError
}

// stalls names the partitions whose workers have not moved for bound
// while they had work, and counts the partitions into h.
func (m *membership) stalls(now time.Time, bound time.Duration, h *kafkaoncetype.Health) []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []string
	for tp, r := range m.runs {
		h.Partitions++
		if r.progress.paused.Load() {
			h.Paused++
		}
		if why := r.progress.stopped.Load(); why != nil {
			h.Stopped = append(h.Stopped, fmt.Sprintf("%s/%d: %s", tp.Topic, tp.Partition, *why))
		}
		if d := r.progress.stalledFor(now); d > bound {
			out = append(out, fmt.Sprintf("partition %s/%d: no progress for %v with messages waiting (no fetch returned, no transaction tried; Config.StallAfter is %v)",
				tp.Topic, tp.Partition, d.Round(time.Second), bound))
		}
	}
	sort.Strings(out)
	sort.Strings(h.Stopped)
	return out
}

// Name is the consumer's Config.Name.
func (c *Consumer) Name() string { return c.cfg.Name }

// polled records how a share member's poll went: a failure starts (or
// continues) its polls failing, a success ends it.
func (h *health) polled(err error) {
	if h == nil {
		return
	}
	if err == nil {
		h.pollFailing.Store(0)
		return
	}
	why := err.Error()
	h.pollError.Store(&why)
	h.pollFailing.CompareAndSwap(0, time.Now().UnixNano())
}

func (c *Consumer) pollError() string {
	if e := c.health.pollError.Load(); e != nil {
		return *e
	}
	return ""
}
