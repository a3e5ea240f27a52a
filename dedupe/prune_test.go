package dedupe_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kafkaonce/kafkaonce/dedupe"
	"github.com/kafkaonce/kafkaonce/internal/store/claims"
)

func TestPruneDeletesOldSettledClaimsInBatches(t *testing.T) {
	t.Parallel()
	db, s := newStore(t)
	ctx := context.Background()
	writer, err := claims.NewStore(db.Schema)
	require.NoError(t, err)
	number := func(name string) string {
		n, err := writer.NumberConsumer(ctx, db.Pool, name)
		require.NoError(t, err)
		return strconv.Itoa(int(n))
	}
	c, other := number("c"), number("other")
	db.Exec(t, `INSERT INTO `+db.Table("processed_messages")+` (consumer_id, message_id, fingerprint, topic, partition, kafka_offset, status, processed_at)
SELECT `+c+`, 'old-' || i, sha256(i::text::bytea), 't', 0, i, 'applied', now() - interval '8 days' FROM generate_series(1, 25) i`)
	db.Exec(t, `INSERT INTO `+db.Table("processed_messages")+` (consumer_id, message_id, fingerprint, topic, partition, kafka_offset, status, processed_at)
SELECT `+c+`, 'new-' || i, sha256(i::text::bytea), 't', 0, 100 + i, 'applied', now() FROM generate_series(1, 5) i`)
	db.Exec(t, `INSERT INTO `+db.Table("processed_messages")+` (consumer_id, message_id, fingerprint, topic, partition, kafka_offset, status, processed_at)
VALUES (`+c+`, 'letter', sha256('x'), 't', 0, 500, 'dead_lettered', now() - interval '30 days'),
       (`+other+`, 'old-1', sha256('y'), 't', 0, 1, 'applied', now() - interval '30 days')`)

	before := time.Now().Add(-dedupe.DefaultRetention)
	n, err := s.CountBefore(ctx, db.Pool, "c", before)
	require.NoError(t, err)
	require.EqualValues(t, 25, n)

	var deleted []int64
	for {
		n, err := s.Prune(ctx, db.Pool, "c", before, 10)
		require.NoError(t, err)
		deleted = append(deleted, n)
		if n < 10 {
			break
		}
	}
	require.Equal(t, []int64{10, 10, 5}, deleted)
	st, err := s.Stats(ctx, db.Pool, "c")
	require.NoError(t, err)
	require.EqualValues(t, 6, st.Total, "the recent claims and the pending dead letter's claim remain")
	require.EqualValues(t, 1, st.DeadLettered)
	require.EqualValues(t, 1, db.Int(t, `SELECT count(*) FROM `+db.Table("processed_messages")+` WHERE `+db.ConsumerIs("'other'")), "other consumers are untouched")
}
