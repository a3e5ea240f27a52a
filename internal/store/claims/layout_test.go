package claims_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/kafkaonce/kafkaonce/internal/store/claims"
	"github.com/kafkaonce/kafkaonce/internal/testenv"
)

// Message ids compare as bytes whatever the database's collation (migration
// 007), and lookups still find their rows through the primary key: a
// parameter of the database's collation meeting a column of another must
// not cost the index, nor must looking the consumer's number up.
func TestClaimKeysCompareAsBytes(t *testing.T) {
	t.Parallel()
	db, s := newStore(t)
	ctx := context.Background()

	var coll string
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT c.collname FROM pg_attribute a JOIN pg_collation c ON c.oid = a.attcollation
WHERE a.attrelid = $1::regclass AND a.attname = 'message_id'`, db.Table("processed_messages")).Scan(&coll))
	require.Equal(t, "C", coll, "processed_messages.message_id")
	_, err := s.NumberConsumer(ctx, db.Pool, "c")
	require.NoError(t, err)

	tx, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, `SET LOCAL enable_seqscan = off`)
	require.NoError(t, err)
	rows, err := tx.Query(ctx, `EXPLAIN SELECT message_id FROM `+db.Table("processed_messages")+` WHERE `+db.ConsumerIs("$1")+` AND message_id = ANY($2::text[])`, "c", []string{"a"})
	require.NoError(t, err)
	plan, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Contains(t, plan[0], "processed_messages_pkey", "the lookup by id must use the primary key: %v", plan)

	// Ids that a locale sorts apart from their bytes, or calls alike, are
	// claimed and told apart as before.
	ids := []string{"a", "A", "b", "é", "e", "e\u0301", "ß", "ss"}
	got, err := s.Claim(ctx, tx, "c", "t", 0, newClaims(ids...))
	require.NoError(t, err)
	require.Equal(t, []bool{true, true, true, true, true, true, true, true}, got)
	got, err = s.Claim(ctx, tx, "c", "t", 0, newClaims(ids...))
	require.NoError(t, err)
	require.Equal(t, make([]bool, len(ids)), got)
}

// A consumer's name gets one number, whoever asks first: NumberConsumer at
// start-up, or the first claim under a name never numbered, even when two
// transactions claim under it at once.
func TestConsumersAreNumberedOnce(t *testing.T) {
	t.Parallel()
	db, s := newStore(t)
	ctx := context.Background()

	ledger, err := s.NumberConsumer(ctx, db.Pool, "ledger")
	require.NoError(t, err)
	again, err := s.NumberConsumer(ctx, db.Pool, "ledger")
	require.NoError(t, err)
	require.Equal(t, ledger, again)

	// Two transactions claim under a new name; the second waits for the
	// first's number and uses it once the first commits.
	first, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = first.Rollback(ctx) }()
	_, err = s.Claim(ctx, first, "mailer", "t", 0, newClaims("m-1"))
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() {
		second, err := db.Pool.Begin(ctx)
		if err == nil {
			_, err = s.Claim(ctx, second, "mailer", "t", 1, newClaims("m-2"))
			if err == nil {
				err = second.Commit(ctx)
			}
		}
		done <- err
	}()
	require.Eventually(t, func() bool { return db.Sessions(t, "active") > 0 }, 5*time.Second, 10*time.Millisecond, "the second claim waits for the first's number")
	require.NoError(t, first.Commit(ctx))
	require.NoError(t, <-done)

	mailer, err := s.NumberConsumer(ctx, db.Pool, "mailer")
	require.NoError(t, err)
	require.NotEqual(t, ledger, mailer)
	require.EqualValues(t, 1, db.Int(t, `SELECT count(*) FROM `+db.Table("consumers")+` WHERE name = 'mailer'`))
	require.EqualValues(t, 2, db.Int(t, `SELECT count(*) FROM `+db.Table("processed_messages")+` WHERE consumer_id = $1`, mailer))
}

// BenchmarkClaimCollation claims batches of 1,000 new UUIDv7 ids into the
// table as migrated (key columns in byte order) and, for comparison, into
// one whose key columns use ICU's en-US collation, as they did before
// migration 007 in a database created with that collation. Compare ns/op:
//
//	go test ./internal/store/claims -run X -bench ClaimCollation -benchtime 300x
func BenchmarkClaimCollation(b *testing.B) {
	ctx := context.Background()
	type table struct {
		name string
		s    *claims.Store
		db   *testenv.DB
	}
	var tables []table
	for _, coll := range []string{"C", "en-US-x-icu"} {
		db, s := newStore(b)
		if coll != "C" {
			var ok bool
			require.NoError(b, db.Pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_collation WHERE collname = $1)`, coll).Scan(&ok))
			if !ok {
				b.Skipf("this server has no collation %s (built without ICU)", coll)
			}
			db.Exec(b, `ALTER TABLE `+db.Table("processed_messages")+` ALTER COLUMN message_id TYPE text COLLATE "`+coll+`"`)
		}
		tables = append(tables, table{map[string]string{"C": "bytes", "en-US-x-icu": "en-US"}[coll], s, db})
	}
	for _, t := range append(tables, tables...) {
		b.Run(t.name, func(b *testing.B) { benchmarkClaims(b, t.db, t.s, "ledger", false) })
	}
}
