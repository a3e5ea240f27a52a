package main

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kafkaonce/kafkaonce/consumer"
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
// pre-filled kafkaonce schema and the same count into the hand-written
// loops' pre-filled table. It keeps what an earlier invocation filled.
func prefill(ctx context.Context, db *pgxpool.Pool, rows int, log *slog.Logger) error {
	if _, err := consumer.Migrate(ctx, db, prefilledSchema); err != nil {
		return err
	}
	hand := benchSchema + ".hand_processed_prefilled"
	if _, err := db.Exec(ctx, `CREATE TABLE IF NOT EXISTS `+hand+` (consumer text NOT NULL, message_id text NOT NULL, PRIMARY KEY (consumer, message_id))`); err != nil {
		return err
	}
	// UUIDv7 shape: a millisecond timestamp prefix that grows with n, then
	// random bits, so the index sees what time-ordered ids give it.
	id := `lpad(to_hex(1700000000000 + n), 12, '0') || '-7' || substr(md5(n::text), 1, 3) || '-8' || substr(md5(n::text), 4, 3) || '-' || substr(md5(n::text), 7, 12)`
	// kafkaonce's rows name their consumer by number.
	number := `(SELECT ` + prefilledSchema + `.consumer_id('prefill'))`
	for _, t := range []struct{ table, insert, count string }{
		{prefilledSchema + ".processed_messages", `INSERT INTO ` + prefilledSchema + `.processed_messages (consumer_id, message_id, fingerprint, topic, partition, kafka_offset)
SELECT ` + number + `, ` + id + `, sha256(n::text::bytea), 'prefill', 0, n FROM generate_series($1::bigint, $2::bigint) AS n`,
			`SELECT count(*) FROM ` + prefilledSchema + `.processed_messages WHERE consumer_id = ` + number},
		{hand, `INSERT INTO ` + hand + ` (consumer, message_id) SELECT 'prefill', ` + id + ` FROM generate_series($1::bigint, $2::bigint) AS n`,
			`SELECT count(*) FROM ` + hand + ` WHERE consumer = 'prefill'`},
	} {
		var have int64
		if err := db.QueryRow(ctx, t.count).Scan(&have); err != nil {
			return err
		}
		began := time.Now()
		const chunk = 1000000
		for from := have; from < int64(rows); from += chunk {
			to := min(from+chunk, int64(rows)) - 1
			if _, err := db.Exec(ctx, t.insert, from, to); err != nil {
				return fmt.Errorf("prefill %s: %w", t.table, err)
			}
			log.Info("prefilling", "table", t.table, "rows", to+1, "of", rows, "elapsed", time.Since(began).Round(time.Second))
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
	}
	return nil
}
