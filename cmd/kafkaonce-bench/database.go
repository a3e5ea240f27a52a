package main

import (
	"context"
	"crypto/md5"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kafkaonce/kafkaonce/consumer"
	"github.com/kafkaonce/kafkaonce/internal/store/claims"
)

// The benchmark's own tables live in schema kafkaonce_bench: the accounts
// the UPDATE effect changes, and the dedupe table of the hand-written loops
// (the minimal one a hand-writer would make: consumer and id). kafkaonce
// runs in schema kafkaonce_bench_empty (re-created per run, so it starts
// empty) or kafkaonce_bench_prefilled.
const (
	benchSchema     = "kafkaonce_bench"
	emptySchema     = "kafkaonce_bench_empty"
	prefilledSchema = "kafkaonce_bench_prefilled"
)

func openPool(ctx context.Context, url string, wire *wireCounters, conns int) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("database url: %w", err)
	}
	cfg.MaxConns = int32(conns)
	cfg.ConnConfig.DialFunc = wire.pgDial
	return pgxpool.NewWithConfig(ctx, cfg)
}

// setupTables creates the benchmark's tables; the accounts start at 0.
// postings counts the transfers applied to an account (see transfer.go).
func setupTables(ctx context.Context, db *pgxpool.Pool) error {
	_, err := db.Exec(ctx, `
CREATE SCHEMA IF NOT EXISTS `+benchSchema+`;
DROP TABLE IF EXISTS `+benchSchema+`.accounts;
CREATE TABLE `+benchSchema+`.accounts (id int PRIMARY KEY, balance bigint NOT NULL DEFAULT 0, postings bigint NOT NULL DEFAULT 0);
INSERT INTO `+benchSchema+`.accounts (id) SELECT generate_series(0, `+fmt.Sprint(accounts-1)+`);`)
	return err
}

// handTable returns a fresh dedupe table for a hand-written loop, or the
// pre-filled one.
func handTable(ctx context.Context, db *pgxpool.Pool, prefilled bool) (string, error) {
	if prefilled {
		return benchSchema + ".hand_processed_prefilled", nil
	}
	t := benchSchema + ".hand_processed"
	_, err := db.Exec(ctx, `DROP TABLE IF EXISTS `+t+`; CREATE TABLE `+t+` (consumer text NOT NULL, message_id text NOT NULL, PRIMARY KEY (consumer, message_id))`)
	return t, err
}

// kafkaonceSchema returns the schema for a kafkaonce run: a freshly
// migrated one, or the pre-filled one.
func kafkaonceSchema(ctx context.Context, db *pgxpool.Pool, prefilled bool) (string, error) {
	if prefilled {
		return prefilledSchema, nil
	}
	if _, err := db.Exec(ctx, `DROP SCHEMA IF EXISTS `+emptySchema+` CASCADE`); err != nil {
		return "", err
	}
	if _, err := consumer.Migrate(ctx, db, emptySchema); err != nil {
		return "", err
	}
	return emptySchema, nil
}

// prefill puts rows processed_messages rows (UUIDv7-shaped ids, under
// another consumer name, so they never collide with a run's ids) into the
// pre-filled kafkaonce schema, claimed by the consumer's own statement, and
// the same ids into the hand-written loops' pre-filled table. It keeps what
// an earlier invocation filled.
func prefill(ctx context.Context, db *pgxpool.Pool, rows int, log *slog.Logger) error {
	if _, err := consumer.Migrate(ctx, db, prefilledSchema); err != nil {
		return err
	}
	hand := benchSchema + ".hand_processed_prefilled"
	if _, err := db.Exec(ctx, `CREATE TABLE IF NOT EXISTS `+hand+` (consumer text NOT NULL, message_id text NOT NULL, PRIMARY KEY (consumer, message_id))`); err != nil {
		return err
	}
	store, err := claims.NewStore(prefilledSchema)
	if err != nil {
		return err
	}
	stats, err := store.Stats(ctx, db, prefillConsumer)
	if err != nil {
		return err
	}
	var handHas int64
	if err := db.QueryRow(ctx, `SELECT count(*) FROM `+hand+` WHERE consumer = $1`, prefillConsumer).Scan(&handHas); err != nil {
		return err
	}
	for _, t := range []struct {
		table  string
		has    int64
		insert func(cs []claims.Claim, ids []string) error
	}{
		{prefilledSchema + ".processed_messages", stats.Total, func(cs []claims.Claim, _ []string) error {
			b := &pgx.Batch{}
			var claimed bool
			store.QueueClaimNew(b, prefillConsumer, "prefill", 0, cs, &claimed)
			return db.SendBatch(ctx, b).Close()
		}},
		{hand, handHas, func(_ []claims.Claim, ids []string) error {
			_, err := db.Exec(ctx, `INSERT INTO `+hand+` (consumer, message_id) SELECT $1, unnest($2::text[])`, prefillConsumer, ids)
			return err
		}},
	} {
		began := time.Now()
		const chunk = 100000
		for from := t.has; from < int64(rows); from += chunk {
			to := min(from+chunk, int64(rows)) - 1
			cs, ids := prefillClaims(from, to)
			if err := t.insert(cs, ids); err != nil {
				return fmt.Errorf("prefill %s: %w", t.table, err)
			}
			if (to+1)%1000000 == 0 || to+1 == int64(rows) {
				log.Info("prefilling", "table", t.table, "rows", to+1, "of", rows, "elapsed", time.Since(began).Round(time.Second))
			}
		}
	}
	// One statement each: VACUUM cannot run in the implicit transaction of
	// a multi-statement query.
	for _, t := range []string{prefilledSchema + ".processed_messages", hand} {
		if _, err := db.Exec(ctx, `VACUUM ANALYZE `+t); err != nil {
			return err
		}
	}
	return nil
}

// prefillConsumer names the pre-filled rows' consumer.
const prefillConsumer = "prefill"

// prefillClaims returns the claims of the made-up messages from to to, and
// their ids. Message n is at offset n, and its id has the UUIDv7 shape: a
// millisecond timestamp prefix that grows with n, then random-looking bits,
// so the index sees what time-ordered ids give it. Its content's
// fingerprint is the SHA-256 of n in decimal.
func prefillClaims(from, to int64) ([]claims.Claim, []string) {
	cs := make([]claims.Claim, 0, to-from+1)
	ids := make([]string, 0, to-from+1)
	for n := from; n <= to; n++ {
		decimal := []byte(strconv.FormatInt(n, 10))
		h := md5.Sum(decimal)
		x := hex.EncodeToString(h[:])
		id := fmt.Sprintf("%012x-7%s-8%s-%s", 1700000000000+n, x[0:3], x[3:6], x[6:18])
		cs = append(cs, claims.Claim{MessageID: id, Fingerprint: sha256.Sum256(decimal), Offset: n})
		ids = append(ids, id)
	}
	return cs, ids
}

// settle puts Postgres in the same state before every run: the dead row
// versions the previous run left in accounts vacuumed, and its dirty pages
// written out, so that no run pays for its predecessor's clean-up.
func settle(ctx context.Context, db *pgxpool.Pool) error {
	for _, sql := range []string{`VACUUM ` + benchSchema + `.accounts`, `CHECKPOINT`} {
		if _, err := db.Exec(ctx, sql); err != nil {
			return fmt.Errorf("%s: %w", sql, err)
		}
	}
	return nil
}

// totals are the sums over all accounts, to check that a run applied each
// message's effect once.
type totals struct{ balance, postings int64 }

func accountTotals(ctx context.Context, db *pgxpool.Pool) (totals, error) {
	var t totals
	err := db.QueryRow(ctx, `SELECT sum(balance), sum(postings) FROM `+benchSchema+`.accounts`).Scan(&t.balance, &t.postings)
	return t, err
}

// Effect SQL. The per-message form is what a per-message handler runs; the
// set form applies a whole batch's effect in one statement.
const (
	updateOneSQL = `UPDATE ` + benchSchema + `.accounts SET balance = balance + 1 WHERE id = $1`
	updateSetSQL = `UPDATE ` + benchSchema + `.accounts AS a SET balance = a.balance + d.n
FROM (SELECT id, count(*) AS n FROM unnest($1::int[]) AS id GROUP BY id) AS d WHERE a.id = d.id`
)

// applyOne is the per-message effect of a message with this key and value.
func applyOne(ctx context.Context, tx pgx.Tx, e effect, key, value []byte) error {
	switch e {
	case effectUpdate:
		_, err := tx.Exec(ctx, updateOneSQL, accountOf(key))
		return err
	case effectTransfer:
		return applyTransfer(ctx, tx, value)
	case effectWait:
		time.Sleep(2 * time.Millisecond)
	case effectPartner:
		time.Sleep(20 * time.Millisecond)
		_, err := tx.Exec(ctx, updateOneSQL, accountOf(key))
		return err
	}
	return nil
}
