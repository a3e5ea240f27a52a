package claims_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/kafkaonce/kafkaonce/dedupe"
	"github.com/kafkaonce/kafkaonce/internal/store/claims"
	"github.com/kafkaonce/kafkaonce/internal/testenv"
)

// oddIDs are message ids with every character the packed layout's
// separators and Postgres's array and text syntax could trip on.
var oddIDs = []string{
	"a,b", `{"x"}`, `back\slash`, "tab\there", " spaced ", "ünïcødé 日本", "NULL", "'quoted'",
	"carriage\rreturn", strings.Repeat("x", 512), "e",
}

// claimAt returns claims for ids at the given ascending offsets.
func claimAt(ids []string, offsets []int64) []claims.Claim {
	out := make([]claims.Claim, len(ids))
	for i, id := range ids {
		out[i] = claims.Claim{MessageID: id, Fingerprint: dedupe.FingerprintOf([]byte("k"+id), []byte(id)), Offset: offsets[i]}
	}
	return out
}

// requireStored checks that every claim is stored with its own fingerprint
// and offset.
func requireStored(t *testing.T, s *claims.Store, db *testenv.DB, consumer, topic string, partition int, cs []claims.Claim) {
	t.Helper()
	ids := make([]string, len(cs))
	for i := range cs {
		ids[i] = cs[i].MessageID
	}
	recs, err := s.Lookup(context.Background(), db.Pool, consumer, ids)
	require.NoError(t, err)
	require.Len(t, recs, len(cs))
	for _, c := range cs {
		r, ok := recs[c.MessageID]
		require.True(t, ok, "id %q not stored", c.MessageID)
		require.Equal(t, c.Fingerprint, r.Fingerprint, "fingerprint of %q", c.MessageID)
		require.Equal(t, c.Offset, r.Offset, "offset of %q", c.MessageID)
		require.Equal(t, topic, r.Topic)
		require.Equal(t, partition, r.Partition)
		require.Equal(t, dedupe.StatusApplied, r.Status)
	}
}

func TestClaimStoresIDsWithAnyCharacterExactly(t *testing.T) {
	t.Parallel()
	db, s := newStore(t)
	ctx := context.Background()
	offsets := make([]int64, len(oddIDs))
	for i := range offsets {
		offsets[i] = int64(i) * (math.MaxInt64 / int64(len(oddIDs)))
	}
	offsets[len(offsets)-1] = math.MaxInt64
	cs := claimAt(oddIDs, offsets)

	tx, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	got, err := s.Claim(ctx, tx, "c", "t", 3, cs)
	require.NoError(t, err)
	require.Equal(t, []bool{true, true, true, true, true, true, true, true, true, true, true}, got)
	require.NoError(t, tx.Commit(ctx))
	requireStored(t, s, db, "c", "t", 3, cs)

	tx, err = db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx)
	got, err = s.Claim(ctx, tx, "c", "t", 3, cs)
	require.NoError(t, err)
	require.Equal(t, make([]bool, len(cs)), got, "every id is taken the second time")
}

// An id holding a newline cannot be packed; its batch is claimed the other
// way, with the same result.
func TestClaimOfAnIDWithANewline(t *testing.T) {
	t.Parallel()
	db, s := newStore(t)
	ctx := context.Background()
	cs := claimAt([]string{"first\nsecond", "plain", "\n"}, []int64{7, 8, 9})

	tx, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	got, err := s.Claim(ctx, tx, "c", "t", 0, cs)
	require.NoError(t, err)
	require.Equal(t, []bool{true, true, true}, got)
	require.NoError(t, tx.Commit(ctx))
	requireStored(t, s, db, "c", "t", 0, cs)

	tx, err = db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx)
	got, err = s.Claim(ctx, tx, "c", "t", 0, append(claimAt([]string{"new"}, []int64{6}), cs...))
	require.NoError(t, err)
	require.Equal(t, []bool{true, false, false, false}, got)
}

func TestQueueClaimNew(t *testing.T) {
	t.Parallel()
	db, s := newStore(t)
	ctx := context.Background()
	for _, ids := range [][]string{{"a", "b"}, {"c\nd", "e"}} { // packed, and not
		t.Run(fmt.Sprintf("%q", ids), func(t *testing.T) {
			cs := claimAt(ids, []int64{1, 2})
			tx, err := db.Pool.Begin(ctx)
			require.NoError(t, err)
			var claimed bool
			b := &pgx.Batch{}
			s.QueueClaimNew(b, "c", "t", 0, cs, &claimed)
			require.NoError(t, tx.SendBatch(ctx, b).Close())
			require.True(t, claimed)
			require.NoError(t, tx.Commit(ctx))
			requireStored(t, s, db, "c", "t", 0, cs)

			// A taken id fails the statement, and claimed stays false.
			tx, err = db.Pool.Begin(ctx)
			require.NoError(t, err)
			defer tx.Rollback(ctx)
			claimed = false
			b = &pgx.Batch{}
			s.QueueClaimNew(b, "c", "t", 0, append(claimAt([]string{"new " + ids[0]}, []int64{0}), cs[1:]...), &claimed)
			err = tx.SendBatch(ctx, b).Close()
			var pgErr *pgconn.PgError
			require.True(t, errors.As(err, &pgErr), "got %v", err)
			require.Equal(t, "23505", pgErr.Code)
			require.False(t, claimed)
		})
	}
}

// The packed claim's buffer is reused once its statement's result is read.
// Sending the same batch again must fail, not claim whatever another
// statement has since written into that buffer.
func TestASentClaimCannotBeSentAgain(t *testing.T) {
	t.Parallel()
	db, s := newStore(t)
	ctx := context.Background()
	tx, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx)
	b := &pgx.Batch{}
	claimed := make([]bool, 2)
	s.QueueClaim(b, "c", "t", 0, newClaims("a", "b"), claimed)
	require.NoError(t, tx.SendBatch(ctx, b).Close())
	require.Equal(t, []bool{true, true}, claimed)
	require.Error(t, tx.SendBatch(ctx, b).Close())
}

// Many workers claiming at once share the pool of packed buffers: every row
// must still carry its own message's fingerprint and offset.
func TestConcurrentPackedClaimsKeepTheirOwnData(t *testing.T) {
	t.Parallel()
	db, s := newStore(t)
	ctx := context.Background()
	const workers, batches, size = 6, 15, 200
	all := make([][]claims.Claim, workers)
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for b := range batches {
				ids := make([]string, size)
				offsets := make([]int64, size)
				for i := range ids {
					ids[i] = fmt.Sprintf("w%d-b%d-%s", w, b, uuid.NewString()[:8+i%20])
					offsets[i] = int64(b*size + i)
				}
				cs := claimAt(ids, offsets)
				all[w] = append(all[w], cs...)
				err := pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
					got, err := s.Claim(ctx, tx, "c", "t", w, cs)
					for i := range got {
						if err == nil && !got[i] {
							err = fmt.Errorf("worker %d batch %d: %q not claimed", w, b, ids[i])
						}
					}
					return err
				})
				if err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	for w := range workers {
		requireStored(t, s, db, "c", "t", w, all[w])
	}
}

// BenchmarkClaimEncoding claims batches of 1,000 new UUID ids packed into
// one parameter and, for comparison, as arrays (one id of each batch holds
// a newline, which cannot be packed). Compare ns/op (mostly the server's
// work) and B/op: go test ./internal/store/claims -run X -bench ClaimEncoding -benchtime 300x
func BenchmarkClaimEncoding(b *testing.B) {
	db, s := newStore(b)
	for _, way := range []string{"packed", "arrays", "packed", "arrays"} {
		b.Run(way, func(b *testing.B) { benchmarkClaims(b, db, s, "c-"+way, way == "arrays") })
	}
}

// benchmarkClaims claims b.N batches of 1,000 new UUIDv7 ids under
// consumer, one transaction each, on one connection; unpackable puts a
// newline into one id of each batch, which sends it as arrays.
func benchmarkClaims(b *testing.B, db *testenv.DB, s *claims.Store, consumer string, unpackable bool) {
	ctx := context.Background()
	batches := make([][]claims.Claim, b.N)
	for n := range batches {
		ids := make([]string, 1000)
		offsets := make([]int64, len(ids))
		for i := range ids {
			ids[i] = uuid.Must(uuid.NewV7()).String()
			offsets[i] = int64(n*len(ids) + i)
		}
		if unpackable {
			ids[0] += "\n"
		}
		batches[n] = claimAt(ids, offsets)
	}
	conn, err := db.Pool.Acquire(ctx)
	require.NoError(b, err)
	defer conn.Release()
	claimed := make([]bool, 1000)
	b.ReportAllocs()
	b.ResetTimer()
	for n := range b.N {
		batch := &pgx.Batch{}
		batch.Queue("BEGIN")
		s.QueueClaim(batch, consumer, "t", 0, batches[n], claimed)
		batch.Queue("COMMIT")
		if err := conn.SendBatch(ctx, batch).Close(); err != nil {
			b.Fatal(err)
		}
	}
}
