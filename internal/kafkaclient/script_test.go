package kafkaclient_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kafkaonce/kafkaonce/internal/kafkaclient"
)

// scriptSource is a Source that hands out a script: records, then errors,
// then waits. MoveTo records where it was asked to go and switches to the
// script given for that offset.
type scriptSource struct {
	mu      sync.Mutex
	items   []scriptItem
	onMove  map[int64][]scriptItem
	movedTo []int64
}

type scriptItem struct {
	rec      kafkaclient.Record
	logStart int64
	err      error
}

func (s *scriptSource) Next(ctx context.Context) (kafkaclient.Record, int64, error) {
	s.mu.Lock()
	if len(s.items) > 0 {
		it := s.items[0]
		s.items = s.items[1:]
		s.mu.Unlock()
		return it.rec, it.logStart, it.err
	}
	s.mu.Unlock()
	<-ctx.Done()
	return kafkaclient.Record{}, 0, ctx.Err()
}

func (s *scriptSource) MoveTo(offset int64) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.movedTo = append(s.movedTo, offset)
	s.items = s.onMove[offset]
	return nil
}

func (s *scriptSource) Close() {}

func records(from, to, logStart int64) []scriptItem {
	var out []scriptItem
	for o := from; o < to; o++ {
		out = append(out, scriptItem{rec: kafkaclient.Record{Topic: "t", Offset: o, Value: []byte(fmt.Sprint(o))}, logStart: logStart})
	}
	return out
}

// A fetch that goes out of range in the middle of a batch is explained
// from the offset after the records the batch already holds, not the one
// it started at: the Fetcher expects offset 5 and takes 5 .. 19 into one
// batch (MaxBatch 100); the source then says offset 20 is out of range
// (retention deleted everything below 50). The deletion reported starts at
// 20: 5 .. 19 go out in the batch before it, and reporting them deleted
// would tell the operator that messages the engine applied are gone.
func TestAnOutOfRangeAfterRecordsOfTheBatchIsExplainedFromThem(t *testing.T) {
	t.Parallel()
	src := &scriptSource{items: append(records(5, 20, 0), scriptItem{err: fmt.Errorf("%w: offset 20", kafkaclient.ErrOutOfRange)})}
	f := kafkaclient.NewFetcher(kafkaclient.FetchConfig{Topic: "t", Start: 5, MaxBatch: 100, Linger: time.Second},
		src, func(context.Context) (kafkaclient.Bounds, error) {
			return kafkaclient.Bounds{Start: 50, End: 60, Stable: 60}, nil
		})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	batch, err := f.Next(ctx, nil)
	require.NoError(t, err)
	require.Len(t, batch, 15, "the records before the failure go out first")
	require.Equal(t, int64(19), batch[14].Offset)
	_, err = f.Next(ctx, nil)
	var d *kafkaclient.DeletedError
	require.ErrorAs(t, err, &d)
	require.Equal(t, kafkaclient.DeletedError{Topic: "t", Partition: 0, From: 20, LogStart: 50}, *d,
		"the deletion reported starts at the first offset not handed out")
}
