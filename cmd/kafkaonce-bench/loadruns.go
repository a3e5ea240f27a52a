package main

import (
	"context"
	"fmt"
	"math"
	"time"

	"github.com/segmentio/kafka-go"
)

// latencyRuns measures end-to-end latency (producer clock to commit) on
// the base cell's workload, produced at a share (-latency-load, default
// half) of each mode's maximum load, for 15 seconds. (Not raw: half of its
// maximum is more than one producer on this machine can send.)
//
// Two maxima, each with its latency run:
//   - capacity: the highest rate a producer can send at while the mode
//     keeps up, found by a ramp (see capacityRun). Producer, broker,
//     database and consumer share the machine's two cores, so this is the
//     most load the machine can be offered.
//   - drain: the mode's msgs/s on the base cell, from a backlog produced
//     beforehand. It leaves out the producer's and the broker's share of
//     the CPU, so half of it is a heavier load: reported too, as the
//     stricter figure, and the one closer to a deployment where the
//     producer and the broker have machines of their own.
func latencyRuns(ctx context.Context, e *env, results []result, o options) ([]result, error) {
	var out []result
	for _, name := range []string{"optimum", "kafkaonce", "kafkaonce-batch"} {
		drain := medianOf(pick(results, name, base))
		if drain == 0 {
			continue
		}
		m := modeNamed(name)
		capacity, err := capacityRun(ctx, e, m, base, drain)
		if err != nil {
			return nil, fmt.Errorf("capacity of %s: %w", name, err)
		}
		e.log.Info("capacity", "mode", name, "msgs/s", int(capacity.MsgsPerSec), "drain msgs/s", int(drain))
		out = append(out, capacity)
		for _, max := range []struct {
			of   string
			rate float64
		}{{ofCapacity, capacity.MsgsPerSec}, {ofDrain, drain}} {
			load := max.rate * o.loadShare
			if load == 0 {
				// Not even the ramp's first step was kept up with: there is no
				// load to take half of.
				e.log.Warn("no latency run: no capacity measured", "mode", name)
				continue
			}
			r, err := latencyRun(ctx, e, m, base, load, o.loadShare)
			if err != nil {
				return nil, fmt.Errorf("latency of %s: %w", name, err)
			}
			r.Mode += " " + max.of
			e.log.Info("latency", "mode", r.Mode, "load msgs/s", int(load), "p50 ms", r.P50ms, "p99 ms", r.P99ms)
			out = append(out, r)
		}
	}
	return out, nil
}

const (
	// latencySeconds is how long a latency run produces.
	latencySeconds = 15
	// A capacity ramp starts at rampFrom of the drain rate and climbs by
	// rampStep of it every rampHold, up to rampTo.
	rampFrom, rampStep, rampTo = 0.4, 0.1, 1.3
	rampHold                   = 4 * time.Second
	// A step is kept up with when, at its end, fewer messages than
	// rampLagLimit's worth at its rate are waiting.
	rampLagLimit = 250 * time.Millisecond

	ofCapacity = "of capacity"
	ofDrain    = "of drain"
)

// capacityRun finds the highest rate at which the mode keeps up with a
// producer running at the same time: one consumer, one topic, and a
// producer whose rate climbs in steps (rampFrom to rampTo of drain, each
// held for rampHold). A step is kept up with when the producer managed its
// rate and, at the step's end, less than rampLagLimit's worth of messages
// is waiting; the result's msgs/s is the rate of the last such step (0
// when none was).
func capacityRun(ctx context.Context, e *env, m mode, c cell, drain float64) (result, error) {
	r := result{Mode: m.name + "@capacity", Cell: c, Correct: "-"}
	_, _, err := withLoad(ctx, e, m, c, math.MaxInt32, func(ctx context.Context, topic string, rec *recorder, warm int) error {
		sent := 0
		for share := rampFrom; share <= rampTo+1e-9; share += rampStep {
			rate := drain * share
			n := int(rate * rampHold.Seconds())
			began := time.Now()
			if err := produceAt(ctx, e.brokers, topic, c, n, rate); err != nil {
				return err
			}
			took := time.Since(began)
			sent += n
			waiting := sent - int(rec.done.Load()-int64(warm))
			kept := took <= rampHold+rampHold/10 && float64(waiting) <= rate*rampLagLimit.Seconds()
			e.log.Info("capacity step", "mode", m.name, "rate", int(rate), "produced in", took.Round(time.Millisecond), "waiting", waiting, "kept up", kept)
			if !kept {
				break
			}
			r.MsgsPerSec = rate
		}
		return nil
	})
	return r, err
}

// latencyRun runs m while a producer sends latencySeconds of messages at
// load per second (share of the mode's maximum), and records each
// message's time from produce to commit.
func latencyRun(ctx context.Context, e *env, m mode, c cell, load, share float64) (result, error) {
	r := result{Mode: fmt.Sprintf("%s@%.0f%%", m.name, 100*share), Cell: c, LoadMsgsPerSec: load, Correct: "-"}
	total := int(load * latencySeconds)
	rec, snap, err := withLoad(ctx, e, m, c, total, func(ctx context.Context, topic string, rec *recorder, _ int) error {
		rec.mu.Lock()
		rec.latency = true
		rec.mu.Unlock()
		if err := produceAt(ctx, e.brokers, topic, c, total, load); err != nil {
			return err
		}
		select {
		case <-rec.doneCh:
		case <-ctx.Done():
		}
		return nil
	})
	if snap != nil {
		snap.finish(e, &r, rec)
	}
	return r, err
}

// withLoad runs m on a new topic of c's partitions, waits until it has
// taken one warm-up message per partition (so it is in its group and
// caught up), then calls load, which produces into the topic; when load
// returns, m is stopped and the topic deleted. want is the number of
// messages, warm-up not included, after which m may stop by itself. It
// returns the run's recorder, and a snapshot of the counters taken before
// m started, for snapshot.finish.
func withLoad(ctx context.Context, e *env, m mode, c cell, want int,
	load func(ctx context.Context, topic string, rec *recorder, warm int) error) (*recorder, *snapshot, error) {
	// As before every throughput run: no run pays for the clean-up and
	// dirty pages of the runs before it.
	if err := settle(ctx, e.db); err != nil {
		return nil, nil, err
	}
	topic := fmt.Sprintf("bench-load-%s-%d", m.name, time.Now().UnixNano())
	if err := createTopic(ctx, e, topic, c.Partitions); err != nil {
		return nil, nil, err
	}
	warm := c.Partitions
	rec := newRecorder(want + warm)
	snap := takeSnapshot(e, rec)
	rctx, cancel := context.WithTimeout(ctx, 4*time.Minute)
	defer cancel()
	errs := make(chan error, 1)
	go func() { errs <- m.run(rctx, e, c, backlog{topic: topic, total: want + warm, unique: want + warm}, rec) }()
	err := func() error {
		if _, err := produce(rctx, e.brokers, topic, c, warm, 1); err != nil {
			return err
		}
		for rec.done.Load() < int64(warm) {
			if rctx.Err() != nil {
				return fmt.Errorf("the consumer did not take the warm-up messages: %w", rctx.Err())
			}
			time.Sleep(10 * time.Millisecond)
		}
		return load(rctx, topic, rec, warm)
	}()
	cancel()
	if rerr := <-errs; err == nil {
		err = rerr
	}
	if derr := deleteTopic(ctx, e, topic); err == nil {
		err = derr
	}
	return rec, snap, err
}

// produceAt produces n messages at about rate per second, in slices every
// 10 ms, each stamped with the time it is sent.
func produceAt(ctx context.Context, brokers []string, topic string, c cell, n int, rate float64) error {
	w := newWriter(brokers, topic)
	defer w.Close()
	g := newGenerator(c, uint64(time.Now().UnixNano()))
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	began := time.Now()
	sent := 0
	for sent < n {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
		due := min(n, int(time.Since(began).Seconds()*rate))
		msgs := make([]kafka.Message, 0, due-sent)
		for ; sent < due; sent++ {
			m := g.next()
			m.Headers = append(m.Headers[:len(m.Headers):len(m.Headers)], kafka.Header{Key: sentHeader, Value: stamp(time.Now())})
			msgs = append(msgs, m)
		}
		if len(msgs) > 0 {
			if err := w.WriteMessages(ctx, msgs...); err != nil {
				return err
			}
		}
	}
	return nil
}

// memoryRuns measures kafkaonce's peak RSS draining a backlog of 1M and of
// 10M messages (no-op effect): memory must not grow with the backlog.
func memoryRuns(ctx context.Context, e *env, o options) ([]result, error) {
	var out []result
	c := base
	c.Effect = effectNoop
	for _, n := range []int{1_000_000, 10_000_000} {
		topic := fmt.Sprintf("bench-memory-%d-%d", n, time.Now().UnixNano())
		if err := createTopic(ctx, e, topic, c.Partitions); err != nil {
			return nil, err
		}
		e.log.Info("producing the backlog for the memory run", "messages", n)
		b, err := produce(ctx, e.brokers, topic, c, n, uint64(n))
		if err != nil {
			return nil, err
		}
		r, err := runOne(ctx, e, modeNamed("kafkaonce"), c, b, 1, o)
		if err != nil {
			return nil, err
		}
		if err := deleteTopic(ctx, e, topic); err != nil {
			return nil, err
		}
		r.Mode = fmt.Sprintf("kafkaonce backlog %dM", n/1_000_000)
		e.log.Info("memory", "backlog", n, "peak RSS MiB", int(r.PeakRSSMiB), "msgs/s", int(r.MsgsPerSec))
		out = append(out, r)
	}
	return out, nil
}
