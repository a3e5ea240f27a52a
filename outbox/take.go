package outbox

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"

	"github.com/jackc/pgx/v5"
)

// ready is the condition on a row of outbox o that the relay may attempt
// now: due, and its key not waiting for a retry. A key is its message_key
// (a NULL key and an empty one are the same key, as they are to the Go
// side, and share bucket 0), within the relay's destinations. While one of
// its rows waits, none of the key's other rows goes: not those behind it,
// nor one that sorts before it but committed after it was first attempted
// (a transaction that was still open then), so nothing reaches the
// receiver ahead of the row it already saw first. The waiting rows are few
// (those that failed and are not parked) and read through
// outbox_waiting_idx. $1 is the relay's destinations, or NULL for all.
const ready = `o.failed_at IS NULL AND o.next_attempt_at <= now() AND ($1::text[] IS NULL OR o.destination = ANY($1))
	AND NOT EXISTS (SELECT 1 FROM waiting w WHERE w.k = coalesce(o.message_key, ''))`

// waiting is the CTE of the keys with a waiting row in the buckets the
// condition bucketCond (on w) allows.
func (r *Relay) waiting(bucketCond string) string {
	return `WITH waiting AS MATERIALIZED (SELECT DISTINCT coalesce(w.message_key, '') AS k FROM ` + r.table + ` w
	WHERE ` + bucketCond + ` AND w.failed_at IS NULL AND w.next_attempt_at > '-infinity' AND w.next_attempt_at > now()
	AND ($1::text[] IS NULL OR w.destination = ANY($1))) `
}

func (r *Relay) destinations() []string {
	if len(r.cfg.Destinations) == 0 {
		return nil
	}
	return r.cfg.Destinations
}

// lockBuckets takes transaction-scoped advisory locks on some buckets with
// rows ready, picked at random so several relays share the work. A bucket
// whose only rows wait, or are held back by a waiting row, is not picked:
// with nothing ready the relay sleeps.
func (r *Relay) lockBuckets(ctx context.Context, tx pgx.Tx) ([]int32, error) {
	// One ordered probe of outbox_pending_idx per bucket, stopping at the
	// bucket's first ready row: the cost is the buckets, and the held-back
	// rows ahead of that row, not the backlog.
	sql := r.waiting(`true`) + `SELECT b FROM generate_series(0, ` + fmt.Sprint(Buckets-1) + `) b
	CROSS JOIN LATERAL (SELECT 1 FROM ` + r.table + ` o WHERE o.key_bucket = b AND ` + ready + ` ORDER BY o.seq LIMIT 1) first`
	rows, err := tx.Query(ctx, sql, r.destinations())
	if err != nil {
		return nil, fmt.Errorf("outbox: find work: %w", err)
	}
	candidates, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	if err != nil {
		return nil, fmt.Errorf("outbox: find work: %w", err)
	}
	rand.Shuffle(len(candidates), func(i, j int) { candidates[i], candidates[j] = candidates[j], candidates[i] })
	candidates = candidates[:min(len(candidates), r.cfg.LockBuckets)]
	if len(candidates) == 0 {
		return nil, nil
	}
	var locked []int32
	err = tx.QueryRow(ctx, `SELECT coalesce(array_agg(b), '{}') FROM unnest($1::int[]) b WHERE pg_try_advisory_xact_lock(hashtext($2), b)`,
		candidates, "kafkaonce.outbox:"+r.table).Scan(&locked)
	if err != nil {
		return nil, fmt.Errorf("outbox: lock buckets: %w", err)
	}
	return locked, nil
}

// take reads the buckets' ready rows in order and locks them. Rows held back
// by a waiting row of their key are not read, so they cannot fill the batch
// and keep the bucket's other keys out.
func (r *Relay) take(ctx context.Context, tx pgx.Tx, buckets []int32) ([]row, error) {
	sql := r.waiting(`w.key_bucket = ANY($2)`) + `SELECT o.seq, o.id, o.destination, o.message_key, o.message_value, o.headers, o.attempts, o.created_at
	FROM ` + r.table + ` o WHERE o.key_bucket = ANY($2) AND ` + ready + `
	ORDER BY o.seq LIMIT $3 FOR UPDATE OF o SKIP LOCKED`
	rs, err := tx.Query(ctx, sql, r.destinations(), buckets, r.cfg.BatchSize)
	if err != nil {
		return nil, fmt.Errorf("outbox: take rows: %w", err)
	}
	var out []row
	var rw row
	var headers []byte
	_, err = pgx.ForEachRow(rs, []any{&rw.seq, &rw.id, &rw.dest, &rw.key, &rw.val, &headers, &rw.attempts, &rw.createdAt}, func() error {
		rw.headers = nil
		if err := json.Unmarshal(headers, &rw.headers); err != nil {
			return fmt.Errorf("outbox: headers of row %s: %w", rw.id, err)
		}
		out = append(out, rw)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("outbox: take rows: %w", err)
	}
	return out, nil
}
