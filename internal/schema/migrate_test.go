package schema_test

import (
	"context"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kafkaonce/kafkaonce/dedupe"
	"github.com/kafkaonce/kafkaonce/internal/schema"
	"github.com/kafkaonce/kafkaonce/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

func TestMigrateIsIdempotent(t *testing.T) {
	t.Parallel()
	db := testenv.NewEmptyDB(t)
	ctx := context.Background()

	v, err := schema.Migrate(ctx, db.Pool, db.Schema)
	require.NoError(t, err)
	require.Equal(t, schema.LatestVersion(), v)
	require.NoError(t, schema.RequireLatest(ctx, db.Pool, db.Schema))

	tablesBefore := tableList(t, db)
	require.Contains(t, tablesBefore, "processed_messages")
	require.Contains(t, tablesBefore, "consumer_offsets")

	v, err = schema.Migrate(ctx, db.Pool, db.Schema)
	require.NoError(t, err)
	require.Equal(t, schema.LatestVersion(), v)
	require.Equal(t, tablesBefore, tableList(t, db))
	require.EqualValues(t, schema.LatestVersion(), db.Int(t, `SELECT count(*) FROM `+db.Table("schema_migrations")))
}

func TestMigrateConcurrentStartups(t *testing.T) {
	t.Parallel()
	db := testenv.NewEmptyDB(t, testenv.MaxConns(10))
	// A schema that does not exist yet: concurrent CREATE SCHEMA is the
	// classic race the advisory lock must prevent.
	name := db.Schema + "_fresh"
	t.Cleanup(func() { db.Exec(t, `DROP SCHEMA IF EXISTS `+name+` CASCADE`) })

	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for i := 0; i < 8; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := schema.Migrate(context.Background(), db.Pool, name)
			errs <- err
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	require.EqualValues(t, schema.LatestVersion(), db.Int(t, `SELECT count(*) FROM `+schema.Table(name, "schema_migrations")))
}

func TestRequireLatestExplainsWhatToDo(t *testing.T) {
	t.Parallel()
	db := testenv.NewEmptyDB(t)
	ctx := context.Background()

	err := schema.RequireLatest(ctx, db.Pool, db.Schema)
	require.ErrorContains(t, err, "version 0")
	require.ErrorContains(t, err, "Migrate")

	_, err = schema.Migrate(ctx, db.Pool, db.Schema)
	require.NoError(t, err)
	db.Exec(t, `INSERT INTO `+db.Table("schema_migrations")+` (version, name) VALUES (9999, 'from_the_future')`)
	require.ErrorContains(t, schema.RequireLatest(ctx, db.Pool, db.Schema), "upgrade kafkaonce")
	_, err = schema.Migrate(ctx, db.Pool, db.Schema)
	require.ErrorContains(t, err, "upgrade kafkaonce")
}

func TestValidateName(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		ok   bool
	}{
		{"kafkaonce", true},
		{"_private", true},
		{"ledger_v2", true},
		{"", false},
		{"2fast", false},
		{"Upper", false},
		{"has-dash", false},
		{"has space", false},
		{`quo"te`, false},
		{"semi;colon", false},
		{"pg_catalog", false},
		{strings.Repeat("a", 63), true},
		{strings.Repeat("a", 64), false},
		{"naïve", false},
	} {
		err := schema.ValidateName(tc.name)
		if tc.ok {
			require.NoError(t, err, "name %q", tc.name)
		} else {
			require.Error(t, err, "name %q", tc.name)
		}
	}
}

func FuzzValidateNameQuotesSafely(f *testing.F) {
	for _, s := range []string{"kafkaonce", `a"b`, "a;DROP TABLE x", "\x00", "ü"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, name string) {
		if schema.ValidateName(name) != nil {
			return
		}
		// Every accepted name is a plain identifier: quoting changes nothing
		// but the surrounding quotes.
		q := schema.Table(name, "t")
		if q != `"`+name+`"."t"` {
			t.Fatalf("accepted name %q quoted as %s", name, q)
		}
	})
}

func tableList(t *testing.T, db *testenv.DB) []string {
	t.Helper()
	rows, err := db.Pool.Query(context.Background(), `SELECT table_name FROM information_schema.tables WHERE table_schema = $1 ORDER BY 1`, db.Schema)
	require.NoError(t, err)
	var out []string
	for rows.Next() {
		var s string
		require.NoError(t, rows.Scan(&s))
		out = append(out, s)
	}
	require.NoError(t, rows.Err())
	return out
}

// A schema made by an older release keeps its claims through migration 007
// (the table is made again, naming consumers by number, with ids compared
// as bytes), with what was granted on it, and they still refuse the same
// ids.
func TestMigrateKeepsClaimsOfAnOlderSchema(t *testing.T) {
	t.Parallel()
	db := testenv.NewEmptyDB(t)
	ctx := context.Background()

	v, err := schema.MigrateTo(ctx, db.Pool, db.Schema, 6)
	require.NoError(t, err)
	require.Equal(t, 6, v)
	require.Error(t, schema.RequireLatest(ctx, db.Pool, db.Schema))
	ids := []string{"b", "a", "B", "é", "e", "ss", "ß"}
	claims := db.Table("processed_messages")
	db.Exec(t, `INSERT INTO `+claims+` (consumer, message_id, fingerprint, topic, partition, kafka_offset, status, attempts)
SELECT c, id, sha256(id::bytea), 'transfers', 0, n, 'dead_lettered', 3
FROM unnest($1::text[]) WITH ORDINALITY AS u(id, n), unnest(ARRAY['ledger', 'mailer']) AS c`, ids)
	role := db.Schema + "_reader"
	db.Exec(t, `DROP ROLE IF EXISTS `+role)
	db.Exec(t, `CREATE ROLE `+role)
	t.Cleanup(func() { _, _ = db.Pool.Exec(context.Background(), `DROP OWNED BY `+role+`; DROP ROLE `+role) })
	db.Exec(t, `GRANT SELECT ON `+claims+` TO `+role)

	v, err = schema.Migrate(ctx, db.Pool, db.Schema)
	require.NoError(t, err)
	require.Equal(t, schema.LatestVersion(), v)
	require.NoError(t, schema.RequireLatest(ctx, db.Pool, db.Schema))
	for _, c := range []string{"ledger", "mailer"} {
		require.EqualValues(t, len(ids), db.Int(t, `SELECT count(*) FROM `+claims+` WHERE `+db.ConsumerIs("$1")+`
AND message_id = ANY($2::text[]) AND topic = 'transfers' AND status = 'dead_lettered' AND attempts = 3 AND kafka_offset BETWEEN 1 AND $3
AND fingerprint = sha256(message_id::bytea)`, c, ids, len(ids)), c)
	}
	tag, err := db.Pool.Exec(ctx, `INSERT INTO `+claims+` (consumer_id, message_id, fingerprint, topic, partition, kafka_offset)
SELECT `+schema.Table(db.Schema, "consumer_id")+`('ledger'), id, sha256(id::bytea), 'transfers', 0, 100 FROM unnest($1::text[]) AS id
ON CONFLICT (consumer_id, message_id) DO NOTHING`, append(ids, "new"))
	require.NoError(t, err)
	require.EqualValues(t, 1, tag.RowsAffected(), "only the id not claimed before is new")
	require.EqualValues(t, 1, db.Int(t, `SELECT count(*) FROM information_schema.role_table_grants
WHERE grantee = $1 AND table_schema = $2 AND table_name = 'processed_messages' AND privilege_type = 'SELECT'`, role, db.Schema),
		"what was granted on the table is granted on the new one")
}

// Migration 008 gives every dead letter the fingerprint of its message's
// content, computed in SQL exactly as dedupe.FingerprintOf computes it in
// Go (a NULL key or value is the same as an empty one), and every
// partition run an identity of its own.
func TestMigrateFingerprintsTheLettersAndNumbersTheRunsOfAnOlderSchema(t *testing.T) {
	t.Parallel()
	db := testenv.NewEmptyDB(t)
	ctx := context.Background()

	_, err := schema.MigrateTo(ctx, db.Pool, db.Schema, 7)
	require.NoError(t, err)
	contents := []struct{ key, value []byte }{
		{[]byte("k"), []byte("v")},
		{nil, []byte("v")},
		{[]byte{}, []byte("v")},
		{[]byte("k"), nil},
		{nil, nil},
		{[]byte("kv"), []byte{}},
		{[]byte{0, 0xff, 0x10}, []byte(strings.Repeat("x", 100_000))},
	}
	letters := db.Table("dead_letters")
	for i, c := range contents {
		db.Exec(t, `INSERT INTO `+letters+` (consumer, topic, partition, kafka_offset, message_id, message_key, message_value,
	error_class, error, attempts, first_failed_at, last_failed_at)
VALUES ('ledger', 'transfers', 0, $1, NULLIF($2, ''), $3, $4, 'permanent', 'boom', 1, now(), now())`, i, []string{"a", ""}[i%2], c.key, c.value)
	}
	runs := db.Table("partition_runs")
	db.Exec(t, `INSERT INTO `+runs+` (consumer, topic, partition, start_offset, starts) VALUES ('ledger', 'transfers', 0, 5, 2), ('ledger', 'transfers', 1, 5, 1)`)

	_, err = schema.Migrate(ctx, db.Pool, db.Schema)
	require.NoError(t, err)
	require.NoError(t, schema.RequireLatest(ctx, db.Pool, db.Schema))
	for i, c := range contents {
		var fp []byte
		require.NoError(t, db.Pool.QueryRow(ctx, `SELECT fingerprint FROM `+letters+` WHERE kafka_offset = $1`, i).Scan(&fp))
		want := dedupe.FingerprintOf(c.key, c.value)
		require.Equal(t, want[:], fp, "letter %d (key %q)", i, c.key)
	}
	require.EqualValues(t, 2, db.Int(t, `SELECT count(DISTINCT run) FROM `+runs+` WHERE run IS NOT NULL`))
	require.EqualValues(t, 2, db.Int(t, `SELECT starts FROM `+runs+` WHERE partition = 0`), "the counts are kept")
}

// Find lists the schemas Migrate made, and not a schema whose tables only
// share names with kafkaonce's (another migration tool's schema_migrations).
func TestFindListsTheSchemasMigrateMade(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	decoy := testenv.NewEmptyDB(t)
	decoy.Exec(t, `CREATE TABLE `+decoy.Table("schema_migrations")+` (version bigint PRIMARY KEY, dirty boolean NOT NULL)`)
	decoy.Exec(t, `CREATE TABLE `+decoy.Table("consumer_offsets")+` (consumer text)`)
	empty := testenv.NewEmptyDB(t)

	found, err := schema.Find(context.Background(), db.Pool)
	require.NoError(t, err)
	require.Contains(t, found, db.Schema)
	require.NotContains(t, found, decoy.Schema)
	require.NotContains(t, found, empty.Schema)
	require.IsIncreasing(t, found)
}
