package main

import (
	"context"
	"fmt"
	"time"

	"github.com/segmentio/kafka-go"
)

// latencyRuns measures end-to-end latency (producer clock to commit) with
// the base cell's workload produced at a share (-latency-load, default
// half) of each mode's measured maximum, for 15 seconds. (Not raw: half of
// its maximum is more than one producer on this machine can send.)
func latencyRuns(ctx context.Context, e *env, results []result, o options) ([]result, error) {
	var out []result
	for _, name := range []string{"optimum", "kafkaonce", "kafkaonce-batch"} {
		max := medianOf(pick(results, name, base))
		if max == 0 {
			continue
		}
		load := max * o.loadShare
		// As before every throughput run: no latency run pays for the
		// clean-up and dirty pages of the runs before it.
		if err := settle(ctx, e.db); err != nil {
			return nil, err
		}
		r, err := latencyRun(ctx, e, modeNamed(name), base, load, o.loadShare, 15*time.Second)
		if err != nil {
			return nil, fmt.Errorf("latency of %s: %w", name, err)
		}
		e.log.Info("latency", "mode", name, "load msgs/s", int(load), "p50 ms", r.P50ms, "p99 ms", r.P99ms)
		out = append(out, r)
	}
	return out, nil
}

func latencyRun(ctx context.Context, e *env, m mode, c cell, load, share float64, d time.Duration) (result, error) {
	topic := fmt.Sprintf("bench-latency-%s-%d", m.name, time.Now().UnixNano())
	if err := createTopic(ctx, e, topic, c.Partitions); err != nil {
		return result{}, err
	}
	total := int(load * d.Seconds())
	// One message per partition first, to wait for until the consumer is
	// in its group and caught up; they are not counted.
	warm := c.Partitions
	b := backlog{topic: topic, total: warm + total, unique: warm + total}
	rec := newRecorder(warm + total)
	r := result{Mode: fmt.Sprintf("%s@%.0f%%", m.name, 100*share), Cell: c, LoadMsgsPerSec: load}
	rctx, cancel := context.WithTimeout(ctx, d+2*time.Minute)
	defer cancel()
	snap := takeSnapshot(e, rec)
	errs := make(chan error, 1)
	go func() { errs <- m.run(rctx, e, c, b, rec) }()
	if _, err := produce(rctx, e.brokers, topic, c, warm, 1); err != nil {
		return r, err
	}
	for rec.done.Load() < int64(warm) {
		if rctx.Err() != nil {
			return r, fmt.Errorf("the consumer did not take the warm-up messages: %w", rctx.Err())
		}
		time.Sleep(10 * time.Millisecond)
	}
	rec.mu.Lock()
	rec.latency = true
	rec.mu.Unlock()
	if err := produceAt(rctx, e.brokers, topic, c, total, load); err != nil {
		return r, err
	}
	select {
	case <-rec.doneCh:
	case <-rctx.Done():
	}
	cancel()
	err := <-errs
	if derr := deleteTopic(ctx, e, topic); err == nil {
		err = derr
	}
	snap.finish(e, &r, rec)
	r.Correct = "-"
	return r, err
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
