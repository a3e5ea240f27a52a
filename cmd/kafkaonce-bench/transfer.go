package main

import (
	"context"
	"encoding/binary"
	"slices"
	"strconv"

	"github.com/jackc/pgx/v5"
)

// The transfer effect is the hot-rows workload: each message moves 1 unit
// from one account to another, both drawn from the cell's few hot accounts
// (cell.Accounts), so that every partition's transactions want the same
// rows. Every mode locks a transfer's accounts in id order (lower first),
// as anyone writing transfers by hand learns to: then two transactions can
// wait for each other's rows but never deadlock, unless a transaction goes
// on to lock more rows after it, as a batch of per-message transfers does.
//
// A transfer conserves the balance sum, which therefore cannot show a
// transfer applied twice; each one also adds 1 to the postings of both
// accounts, which can (see check).

// transferBytes is the part of the value a transfer needs: the message's
// sequence number (distinct content, as for the other effects), then the
// debited and the credited account, 4 bytes each.
const transferBytes = 16

// transfer makes the key and value of the generator's next transfer. The
// key names the transfer, not an account, so that the transfers spread
// over all partitions: keyed by account, 5 hot accounts would fill at
// most 5 partitions, and the contention between partitions is what the
// cells measure.
func (g *generator) transfer() (key, value []byte) {
	from := g.rng.IntN(g.c.Accounts)
	to := g.rng.IntN(g.c.Accounts - 1)
	if to >= from {
		to++ // distinct from the debited account, uniform over the others
	}
	value = make([]byte, max(g.c.Size, transferBytes))
	copy(value, g.pad)
	binary.BigEndian.PutUint64(value, uint64(g.seq))
	binary.BigEndian.PutUint32(value[8:], uint32(from))
	binary.BigEndian.PutUint32(value[12:], uint32(to))
	return []byte("xfer-" + strconv.Itoa(g.seq)), value
}

// transferOf reads the debited and the credited account from a value.
func transferOf(value []byte) (from, to int32) {
	return int32(binary.BigEndian.Uint32(value[8:])), int32(binary.BigEndian.Uint32(value[12:]))
}

// transferOneSQL is one account's half of a transfer, in the per-message
// form.
const transferOneSQL = `UPDATE ` + benchSchema + `.accounts SET balance = balance + $2, postings = postings + 1 WHERE id = $1`

// applyTransfer is the per-message form: two statements, the lower id's
// first, so the two rows are locked in id order.
func applyTransfer(ctx context.Context, tx pgx.Tx, value []byte) error {
	from, to := transferOf(value)
	lo, loDelta, hi, hiDelta := from, -1, to, 1
	if to < from {
		lo, loDelta, hi, hiDelta = to, 1, from, -1
	}
	if _, err := tx.Exec(ctx, transferOneSQL, lo, loDelta); err != nil {
		return err
	}
	_, err := tx.Exec(ctx, transferOneSQL, hi, hiDelta)
	return err
}

// The set-based form runs two statements in one transaction: the first
// locks every account the batch touches, in id order (ORDER BY sorts
// before FOR UPDATE locks, so the rows are locked in that order); the
// second applies the batch's net change to each of them, with nothing
// left to wait for.
const transferLockSQL = `SELECT id FROM ` + benchSchema + `.accounts WHERE id = ANY($1::int[]) ORDER BY id FOR UPDATE`

// transferSetSQL returns the set-based UPDATE over the transfers of
// messages, a FROM item with columns src and dst: each transfer posts -1
// to src and +1 to dst, summed per account.
func transferSetSQL(messages string) string {
	return `UPDATE ` + benchSchema + `.accounts AS a SET balance = a.balance + d.delta, postings = a.postings + d.n
FROM (SELECT p.id, sum(p.delta) AS delta, count(*) AS n
      FROM ` + messages + `
      CROSS JOIN LATERAL (VALUES (m.src, -1), (m.dst, 1)) AS p(id, delta)
      GROUP BY p.id) AS d
WHERE a.id = d.id`
}

// transferBatchSQL is the set-based UPDATE of a batch whose messages are
// all to be applied (a BatchHandler's: the consumer claimed them).
var transferBatchSQL = transferSetSQL(`unnest($1::int[], $2::int[]) AS m(src, dst)`)

// transferSet gathers a batch's transfers into the set-based statements'
// arguments.
type transferSet struct {
	src, dst []int32
}

func (t *transferSet) reset() { t.src, t.dst = t.src[:0], t.dst[:0] }

func (t *transferSet) add(value []byte) {
	from, to := transferOf(value)
	t.src, t.dst = append(t.src, from), append(t.dst, to)
}

// accounts are the distinct accounts the transfers touch, in id order:
// the lock statement's argument.
func (t *transferSet) accounts() []int32 {
	ids := slices.Concat(t.src, t.dst)
	slices.Sort(ids)
	return slices.Compact(ids)
}
