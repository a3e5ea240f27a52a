package main

import (
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/kafkaonce/kafkaonce/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// The share cells count what every mode reports per message (a share
// member calls no batch hooks), and check each run against the database:
// each message's effect once, every offset claimed once, nothing set
// aside.
func TestShareCells(t *testing.T) {
	k := testenv.NewKafka(t)
	testenv.RequireShareGroups(t, k.Brokers)
	ctx := testenv.Context(t, 2*time.Minute)
	e, err := startEnv(ctx, slog.New(slog.DiscardHandler), strings.Join(k.Brokers, ","), testenv.PostgresServer(t).URL, 24)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.close)
	if err := setupTables(ctx, e.db); err != nil {
		t.Fatal(err)
	}
	const messages = 40
	for _, mode := range []string{"kafkaonce-share-4", "kafkaonce-cg"} {
		t.Run(mode+" counts every message, each applied once", func(t *testing.T) {
			r, err := runShareOne(ctx, e, shareCell, mode, messages, 1, 1, options{})
			if err != nil {
				t.Fatal(err)
			}
			if r.Messages != messages || r.MsgsPerSec <= 0 || r.Correct != "once each" {
				t.Fatalf("%d messages counted at %.1f msgs/s, check %q; want %d, a rate, once each", r.Messages, r.MsgsPerSec, r.Correct, messages)
			}
		})
	}
	t.Run("a claim missing or a letter written fails the check", func(t *testing.T) {
		b := backlog{total: messages}
		if _, err := runShareOne(ctx, e, shareCell, "kafkaonce-share-1", messages, 1, 2, options{}); err != nil {
			t.Fatal(err)
		}
		if err := claimedOnce(ctx, e.db, b); err != nil {
			t.Fatalf("the run's own claims: %v", err)
		}
		if _, err := e.db.Exec(ctx, `DELETE FROM `+emptySchema+`.processed_messages WHERE kafka_offset = 7`); err != nil {
			t.Fatal(err)
		}
		if err := claimedOnce(ctx, e.db, b); err == nil {
			t.Fatal("a missing claim passed the check")
		}
		b.total--
		if err := claimedOnce(ctx, e.db, b); err != nil {
			t.Fatalf("the claims left: %v", err)
		}
		if _, err := e.db.Exec(ctx, `INSERT INTO `+emptySchema+`.dead_letters
	(consumer, topic, partition, kafka_offset, message_id, error_class, error, attempts, first_failed_at, last_failed_at)
VALUES ('c', 't', 0, 7, 'm', 'permanent', 'e', 1, now(), now())`); err != nil {
			t.Fatal(err)
		}
		if err := claimedOnce(ctx, e.db, b); err == nil {
			t.Fatal("a message set aside passed the check")
		}
	})
}
