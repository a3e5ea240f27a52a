package recorded_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kafkaonce/kafkaonce/internal/store/recorded"
	"github.com/kafkaonce/kafkaonce/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

func TestRecordThenLoad(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	s, err := recorded.NewStore(db.Schema)
	require.NoError(t, err)
	ctx := context.Background()

	_, ok, err := s.Load(ctx, db.Pool, "ledger")
	require.NoError(t, err)
	require.False(t, ok, "nothing recorded yet")
	known, err := s.Known(ctx, db.Pool, "ledger")
	require.NoError(t, err)
	require.False(t, known)

	// Numbered by a claim or an older worker: known, but nothing recorded.
	db.Exec(t, `SELECT `+db.Table("consumer_id")+`('ledger')`)
	_, ok, err = s.Load(ctx, db.Pool, "ledger")
	require.NoError(t, err)
	require.False(t, ok)
	known, err = s.Known(ctx, db.Pool, "ledger")
	require.NoError(t, err)
	require.True(t, known)

	first := recorded.Settings{Consumer: "ledger", MessageIDRule: "json:event_id", GroupID: "ledger-v2", GroupType: recorded.ShareGroup, Topics: []string{"transfers", "refunds"},
		Brokers: []string{"kafka-1:9092", "kafka-2:9092"}, KafkaTLS: true, KafkaSASL: "SCRAM-SHA-512", RecordedBy: "worker-1 (pid 7, instance ledger-0)"}
	before := time.Now()
	require.NoError(t, s.Record(ctx, db.Pool, first))
	got, ok, err := s.Load(ctx, db.Pool, "ledger")
	require.NoError(t, err)
	require.True(t, ok)
	require.WithinDuration(t, before, got.RecordedAt, 5*time.Second)
	got.RecordedAt = time.Time{}
	require.Equal(t, first, got)

	// A later start replaces the record, and keeps the consumer's number.
	number := db.Int(t, `SELECT id FROM `+db.Table("consumers")+` WHERE name = 'ledger'`)
	second := recorded.Settings{Consumer: "ledger", MessageIDRule: recorded.Custom, GroupID: "ledger", Topics: []string{"transfers"}, Brokers: []string{"kafka:9092"}}
	require.NoError(t, s.Record(ctx, db.Pool, second))
	got, ok, err = s.Load(ctx, db.Pool, "ledger")
	require.NoError(t, err)
	require.True(t, ok)
	got.RecordedAt = time.Time{}
	// No group type recorded is a consumer group, all there was before
	// share groups.
	second.GroupType = recorded.ConsumerGroup
	require.Equal(t, second, got)
	db.Exec(t, `UPDATE `+db.Table("consumers")+` SET settings_group_type = NULL WHERE name = 'ledger'`)
	got, _, err = s.Load(ctx, db.Pool, "ledger")
	require.NoError(t, err)
	require.Equal(t, recorded.ConsumerGroup, got.GroupType, "a record written before migration 028")
	require.Equal(t, number, db.Int(t, `SELECT id FROM `+db.Table("consumers")+` WHERE name = 'ledger'`))

	// A consumer that never ran here has no record.
	_, ok, err = s.Load(ctx, db.Pool, "mailer")
	require.NoError(t, err)
	require.False(t, ok)

	mailer := recorded.Settings{Consumer: "mailer", MessageIDRule: "position", GroupID: "mail", GroupType: recorded.ConsumerGroup, Topics: []string{"orders"}, Brokers: []string{"kafka:9092"}}
	require.NoError(t, s.Record(ctx, db.Pool, mailer))
	db.Exec(t, `SELECT `+db.Table("consumer_id")+`('numbered-only')`)
	all, err := s.List(ctx, db.Pool)
	require.NoError(t, err)
	require.Len(t, all, 2, "consumers without a record are left out")
	for i := range all {
		all[i].RecordedAt = time.Time{}
	}
	require.Equal(t, []recorded.Settings{second, mailer}, all)
}

func TestRecordRefusesAnEmptyRule(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	s, err := recorded.NewStore(db.Schema)
	require.NoError(t, err)
	err = s.Record(context.Background(), db.Pool, recorded.Settings{Consumer: "ledger", GroupID: "ledger", Topics: []string{"t"}, Brokers: []string{"k:9092"}})
	require.ErrorContains(t, err, "recorded.Custom")
}

// The settings are set together or not at all: a half record would send a
// tool to defaults for the rest without saying so.
func TestTheTableRefusesAHalfRecord(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	_, err := db.Pool.Exec(context.Background(), `INSERT INTO `+db.Table("consumers")+` (name, message_id_rule, settings_recorded_at) VALUES ('ledger', 'hash', now())`)
	require.ErrorContains(t, err, "consumers_settings_check")
}
