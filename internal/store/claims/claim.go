package claims

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/kafkaonce/kafkaonce/dedupe"
	"github.com/kafkaonce/kafkaonce/internal/pgarray"
)

// Claim is one message id to claim, with where the message came from.
type Claim struct {
	MessageID   string
	Fingerprint dedupe.Fingerprint
	Offset      int64
	// Status is dedupe.StatusApplied when empty.
	Status dedupe.Status
	// Attempts is 1 when zero.
	Attempts int
}

// QueueClaim adds the claim of a batch to b. When b's results are read,
// claimed[i] is set for every claims[i] that this transaction inserted; the
// others were already present (claimed by an earlier or concurrent
// transaction that committed). claims must be in ascending offset order, as
// a partition's messages are, with distinct message ids; claimed must have
// len(claims).
//
// Queueing instead of executing lets the caller send the claim in the same
// round trip as other statements.
func (s *Store) QueueClaim(b *pgx.Batch, consumer, topic string, partition int, claims []Claim, claimed []bool) {
	plain := true // every claim is a plain "applied" one, attempt 1
	for i := range claims {
		plain = plain && (claims[i].Status == "" || claims[i].Status == dedupe.StatusApplied) && claims[i].Attempts <= 1
	}
	var q *pgx.QueuedQuery
	var packed *packedClaims
	if plain {
		// The common case leaves status and attempts to their defaults.
		q, packed = queuePlain(b, s.claimPackedSQL, s.claimPlainSQL, consumer, topic, partition, claims)
	} else {
		ids, fps, offsets := claimArrays(claims)
		statuses := make(pgarray.Array[pgarray.Text], len(claims))
		attempts := make([]int32, len(claims))
		for i := range claims {
			statuses[i] = pgarray.Text(dedupe.StatusApplied)
			if claims[i].Status != "" {
				statuses[i] = pgarray.Text(claims[i].Status)
			}
			attempts[i] = int32(max(claims[i].Attempts, 1))
		}
		q = b.Queue(s.claimSQL, consumer, topic, partition, ids, fps, offsets, statuses, attempts)
	}
	q.Query(func(rows pgx.Rows) error {
		var off int64
		_, err := pgx.ForEachRow(rows, []any{&off}, func() error {
			i := indexOfOffset(claims, off)
			if i < 0 {
				return fmt.Errorf("dedupe: claim returned offset %d that was not in the batch", off)
			}
			claimed[i] = true
			return nil
		})
		return err
	})
	releaseAfter(q, packed)
}

// QueueClaimNew adds to b the claim of a batch expected to hold only new
// message ids: plain, "applied", first-attempt claims. If any id is already
// claimed (or appears twice in claims) the statement fails with a unique
// violation of the primary key, which stops a pipelined transaction before
// its COMMIT; the caller then claims the batch with QueueClaim, which sorts
// out which ids were new. *claimed is set to true when the statement
// succeeds.
func (s *Store) QueueClaimNew(b *pgx.Batch, consumer, topic string, partition int, claims []Claim, claimed *bool) {
	q, packed := queuePlain(b, s.claimNewPackedSQL, s.claimNewSQL, consumer, topic, partition, claims)
	q.Exec(func(pgconn.CommandTag) error { *claimed = true; return nil })
	releaseAfter(q, packed)
}

// queuePlain queues a plain claim: packedSQL with the claims packed when
// they can be (the caller hands packed to releaseAfter once it has set the
// result callback), else arraySQL with them as arrays.
func queuePlain(b *pgx.Batch, packedSQL, arraySQL, consumer, topic string, partition int, claims []Claim) (*pgx.QueuedQuery, *packedClaims) {
	if packed, idsAt, offsetsAt, ok := packClaims(claims); ok {
		return b.Queue(packedSQL, consumer, topic, partition, packed.buf, idsAt, offsetsAt), packed
	}
	ids, fps, offsets := claimArrays(claims)
	return b.Queue(arraySQL, consumer, topic, partition, ids, fps, offsets), nil
}

// claimArrays are the array parameters of the claim statements.
func claimArrays(claims []Claim) (pgarray.Array[pgarray.Text], pgarray.Array[pgarray.Bytes], pgarray.Array[pgarray.Int8]) {
	ids := make(pgarray.Array[pgarray.Text], len(claims))
	fps := make(pgarray.Array[pgarray.Bytes], len(claims))
	offsets := make(pgarray.Array[pgarray.Int8], len(claims))
	for i := range claims {
		ids[i] = pgarray.Text(claims[i].MessageID)
		fps[i] = claims[i].Fingerprint[:]
		offsets[i] = pgarray.Int8(claims[i].Offset)
	}
	return ids, fps, offsets
}

// Claim runs QueueClaim's statement on its own and returns which claims were
// inserted.
func (s *Store) Claim(ctx context.Context, tx pgx.Tx, consumer, topic string, partition int, claims []Claim) ([]bool, error) {
	claimed := make([]bool, len(claims))
	b := &pgx.Batch{}
	s.QueueClaim(b, consumer, topic, partition, claims, claimed)
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		return nil, fmt.Errorf("dedupe: claim: %w", err)
	}
	return claimed, nil
}

// indexOfOffset finds off in claims, which are in ascending offset order as
// a partition's batch is.
func indexOfOffset(claims []Claim, off int64) int {
	lo, hi := 0, len(claims)
	for lo < hi {
		mid := (lo + hi) / 2
		switch {
		case claims[mid].Offset == off:
			return mid
		case claims[mid].Offset < off:
			lo = mid + 1
		default:
			hi = mid
		}
	}
	return -1
}
