package notx

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"
)

// Every way a handler can reach a transaction fails with ErrNotOpen and
// is recorded, including the results of what it returns.
func TestEveryUseFailsAndIsRecorded(t *testing.T) {
	ctx := context.Background()
	uses := map[string]func(tx *Tx) error{
		"Begin":    func(tx *Tx) error { _, err := tx.Begin(ctx); return err },
		"Commit":   func(tx *Tx) error { return tx.Commit(ctx) },
		"Rollback": func(tx *Tx) error { return tx.Rollback(ctx) },
		"CopyFrom": func(tx *Tx) error {
			_, err := tx.CopyFrom(ctx, pgx.Identifier{"t"}, []string{"a"}, pgx.CopyFromRows(nil))
			return err
		},
		"SendBatch": func(tx *Tx) error { return tx.SendBatch(ctx, &pgx.Batch{}).Close() },
		"SendBatch Exec": func(tx *Tx) error {
			_, err := tx.SendBatch(ctx, &pgx.Batch{}).Exec()
			return err
		},
		"Prepare": func(tx *Tx) error { _, err := tx.Prepare(ctx, "s", "SELECT 1"); return err },
		"Exec":    func(tx *Tx) error { _, err := tx.Exec(ctx, "SELECT 1"); return err },
		"Query": func(tx *Tx) error {
			rows, err := tx.Query(ctx, "SELECT 1")
			defer rows.Close() // usable even on error, as pgx's are
			if rows.Next() {
				return errors.New("rows had a row")
			}
			if !errors.Is(rows.Err(), ErrNotOpen) {
				return errors.New("rows.Err is not ErrNotOpen")
			}
			return err
		},
		"QueryRow": func(tx *Tx) error { var v int; return tx.QueryRow(ctx, "SELECT 1").Scan(&v) },
		"Conn": func(tx *Tx) error {
			if tx.Conn() != nil {
				return errors.New("a connection")
			}
			return ErrNotOpen
		},
	}
	for name, use := range uses {
		tx := &Tx{}
		if tx.Used() {
			t.Fatalf("%s: used before any call", name)
		}
		if err := use(tx); !errors.Is(err, ErrNotOpen) {
			t.Errorf("%s: got %v, want ErrNotOpen", name, err)
		}
		if !tx.Used() {
			t.Errorf("%s: not recorded", name)
		}
	}
}

func TestRefusingFailsWithItsOwnError(t *testing.T) {
	over := errors.New("over")
	tx := Refusing(over)
	if _, err := tx.Exec(context.Background(), "SELECT 1"); !errors.Is(err, over) {
		t.Fatalf("got %v, want the Tx's own error", err)
	}
	if !tx.Used() {
		t.Fatal("not recorded")
	}
}
