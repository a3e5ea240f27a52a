package consumertest_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"strconv"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/kafkaonce/kafkaonce/consumer"
	"github.com/kafkaonce/kafkaonce/consumer/consumertest"
	"github.com/kafkaonce/kafkaonce/internal/testenv"
)

func ledger(t *testing.T) (*testenv.DB, consumer.Config, []*consumer.Message) {
	db := testenv.NewEmptyDB(t)
	db.Exec(t, `CREATE TABLE `+db.Table("balances")+` (account text PRIMARY KEY, amount bigint NOT NULL)`)
	db.Exec(t, `INSERT INTO `+db.Table("balances")+` VALUES ('a', 100), ('b', 100)`)
	cfg := consumer.Config{
		Name:   "ledger",
		Schema: db.Schema,
		Handler: consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
			amount, _ := strconv.Atoi(string(m.Value))
			_, err := tx.Exec(ctx, `UPDATE `+db.Table("balances")+` SET amount = amount + CASE account WHEN 'a' THEN -$1::bigint ELSE $1::bigint END`, amount)
			return err
		}),
	}
	var msgs []*consumer.Message
	for i := range 20 {
		msgs = append(msgs, consumertest.NewMessage([]byte(strconv.Itoa(i)), consumertest.WithID("t-"+strconv.Itoa(i)), consumertest.WithPosition("", i%2, 0)))
	}
	return db, cfg, msgs
}

func TestReplayTwicePassesForAStableHandler(t *testing.T) {
	t.Parallel()
	db, cfg, msgs := ledger(t)
	consumertest.ReplayTwice(t, db.Pool, cfg, msgs, []string{db.Schema + ".balances"})
	require.EqualValues(t, 100-190, db.Int(t, `SELECT amount FROM `+db.Table("balances")+` WHERE account = 'a'`))
}

func TestReplayTwiceCatchesAnUnstableMessageID(t *testing.T) {
	t.Parallel()
	db, cfg, msgs := ledger(t)
	// A producer-side bug in miniature: the id is made up at delivery time.
	cfg.MessageID = func(*consumer.Message) (string, error) {
		var b [8]byte
		_, _ = rand.Read(b[:])
		return hex.EncodeToString(b[:]), nil
	}
	rec := &recordingTB{TB: t}
	consumertest.ReplayTwice(rec, db.Pool, cfg, msgs, []string{db.Schema + ".balances"})
	require.Len(t, rec.errors, 1)
	require.Contains(t, rec.errors[0], "changed table "+db.Schema+".balances")
	require.Contains(t, rec.errors[0], "is its message id stable")
}

// recordingTB keeps the errors reported instead of failing the test.
type recordingTB struct {
	testing.TB
	errors []string
}

func (r *recordingTB) Errorf(format string, args ...any) {
	r.errors = append(r.errors, fmt.Sprintf(format, args...))
}
