package dedupe

import (
	"context"
	"fmt"
	"time"
)

// Retention bounds for pruning processed_messages.
const (
	// DefaultRetention is how long claims are kept by default. Pruning is
	// safe for replays of the log (the stored positions cover them); it only
	// narrows the window in which a producer's re-send of an old message is
	// recognised as a duplicate, so the default is generous.
	DefaultRetention = 7 * 24 * time.Hour
	// MinRetention is the shortest retention tools accept without being
	// forced: producers that retry for longer than this would get
	// duplicates applied.
	MinRetention = 24 * time.Hour
	// DefaultPruneBatch is how many rows one prune statement deletes.
	DefaultPruneBatch = 5000
)

// Prune deletes up to limit claims of consumer made before before, and
// returns how many it deleted; call it until it returns less than limit.
// Only settled claims go: applied messages and skipped suspect duplicates.
// A dead-lettered message keeps its claim until it is redriven (which makes
// it applied), so that a later copy of it is not applied behind the dead
// letter's back. Rows locked by a running transaction are skipped, so
// pruning never waits on (or holds up) message processing.
func (s *Store) Prune(ctx context.Context, q Querier, consumer string, before time.Time, limit int) (int64, error) {
	tag, err := q.Exec(ctx, `DELETE FROM `+s.table+` WHERE (consumer_id, message_id) IN (
	SELECT consumer_id, message_id FROM `+s.table+`
	WHERE consumer_id = `+s.numbered+` AND processed_at < $2 AND status IN ('applied', 'suspect_duplicate')
	LIMIT $3 FOR UPDATE SKIP LOCKED)`, consumer, before, limit)
	if err != nil {
		return 0, fmt.Errorf("dedupe: prune: %w", err)
	}
	return tag.RowsAffected(), nil
}

// CountBefore counts the claims of consumer made before before (for
// progress reports).
func (s *Store) CountBefore(ctx context.Context, q Querier, consumer string, before time.Time) (int64, error) {
	var n int64
	err := q.QueryRow(ctx, `SELECT count(*) FROM `+s.table+` WHERE consumer_id = `+s.numbered+` AND processed_at < $2 AND status IN ('applied', 'suspect_duplicate')`,
		consumer, before).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("dedupe: count: %w", err)
	}
	return n, nil
}

// Stats summarises a consumer's claims.
type Stats struct {
	Total             int64      `json:"total"`
	Applied           int64      `json:"applied"`
	DeadLettered      int64      `json:"dead_lettered"`
	SuspectDuplicates int64      `json:"suspect_duplicates"`
	Oldest            *time.Time `json:"oldest"`
	Newest            *time.Time `json:"newest"`
}

// Stats returns a consumer's claim counts.
func (s *Store) Stats(ctx context.Context, q Querier, consumer string) (Stats, error) {
	var st Stats
	err := q.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE status = 'applied'), count(*) FILTER (WHERE status = 'dead_lettered'),
	count(*) FILTER (WHERE status = 'suspect_duplicate'), min(processed_at), max(processed_at)
FROM `+s.table+` WHERE consumer_id = `+s.numbered, consumer).Scan(&st.Total, &st.Applied, &st.DeadLettered, &st.SuspectDuplicates, &st.Oldest, &st.Newest)
	if err != nil {
		return Stats{}, fmt.Errorf("dedupe: stats: %w", err)
	}
	return st, nil
}
