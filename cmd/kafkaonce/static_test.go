package main

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kafkaonce/kafkaonce/consumer"
	"github.com/kafkaonce/kafkaonce/internal/kafkaadmin"
	"github.com/kafkaonce/kafkaonce/internal/kafkaclient"
)

// A static member (Config.InstanceID) stays in its group after its worker
// stops cleanly, until its session timeout: everything is stopped, and the
// group still has a member. replay and positions name it, say why and
// what to do, and remove it when asked.
func TestStoppedStaticMembers(t *testing.T) {
	t.Parallel()
	w := newWorld(t, 1)
	w.produce(10, "s")
	static := func(cfg *consumer.Config) {
		cfg.InstanceID = "ledger-0"
		cfg.SessionTimeout = 2 * time.Minute // outlasts the test: only a removal ends it
	}
	w.consumeWith(static, 10)
	members := func() []kafkaadmin.Member {
		admin, err := kafkaadmin.New(kafkaclient.Config{Brokers: w.kafka.Brokers})
		require.NoError(t, err)
		defer admin.Close()
		g, err := admin.DescribeGroup(context.Background(), w.name)
		require.NoError(t, err)
		return g.Members
	}
	require.Len(t, members(), 1, "the stopped static member is still in the group")
	require.Equal(t, "ledger-0", members()[0].InstanceID)

	t.Run("replay and positions name the member and the way out", func(t *testing.T) {
		for _, args := range [][]string{
			{"replay", "--consumer", w.name, "--yes"},
			{"positions", "reset", "--consumer", w.name, "--to", "earliest", "--yes"},
		} {
			out, errOut, code := w.cli(args...)
			require.Equal(t, 2, code, errOut)
			require.Contains(t, out, "1 active members, static: ledger-0", "the plan's heading")
			require.Contains(t, errOut, "group "+w.name+" has 1 active member(s), 1 of them static: instance ledger-0 (client ")
			require.Contains(t, errOut, "until its session timeout")
			require.Contains(t, errOut, "pass --remove-static-members to remove them now")
		}
		out, errOut, code := w.cli("--json", "replay", "--consumer", w.name, "--dry-run")
		require.Equal(t, 0, code, errOut)
		var plan replayPlan
		require.NoError(t, json.Unmarshal([]byte(out), &plan))
		require.Equal(t, []string{"ledger-0"}, plan.Static)
		require.Len(t, members(), 1, "a dry run removes nothing")
	})

	t.Run("--remove-static-members removes them, then acts", func(t *testing.T) {
		out, errOut, code := w.cli("replay", "--consumer", w.name, "--yes", "--remove-static-members")
		require.Equal(t, 0, code, errOut)
		require.Contains(t, out, "removed static member(s) ledger-0 from group "+w.name)
		require.Contains(t, out, "group "+w.name+" rewound on "+w.topic)
		require.Empty(t, members())

		w.consumeWith(static, 10)
		w.requireEffectsOnce(10)
	})

	t.Run("a running dynamic member blocks as before, and is not removed", func(t *testing.T) {
		admin, err := kafkaadmin.New(kafkaclient.Config{Brokers: w.kafka.Brokers})
		require.NoError(t, err)
		defer admin.Close()
		if len(members()) > 0 { // the static member of the last subtest, if it stayed
			require.NoError(t, admin.RemoveStatic(context.Background(), w.name, []string{"ledger-0"}))
		}
		c, err := consumer.New(w.db.Pool, w.consumerConfig())
		require.NoError(t, err)
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- c.Run(ctx) }()
		defer func() { cancel(); require.NoError(t, <-done) }()
		waitUntil(t, time.Minute, "the dynamic member to join", func() bool { return len(members()) == 1 })

		_, errOut, code := w.cli("replay", "--consumer", w.name, "--yes", "--remove-static-members")
		require.Equal(t, 2, code, errOut)
		require.Contains(t, errOut, "has 1 active member(s): stop the consumers first")
		require.Len(t, members(), 1, "nothing removed")
	})
}

// The gate's decision, member by member: static members alone pass with
// --remove-static-members; any dynamic one blocks without --force.
func TestClearToActWithMembers(t *testing.T) {
	t.Parallel()
	static := kafkaadmin.Member{ID: "m-1", InstanceID: "ledger-0", ClientID: "kafkaonce-ledger", Host: "/10.0.0.1"}
	dynamic := kafkaadmin.Member{ID: "m-2", ClientID: "kafkaonce-ledger", Host: "/10.0.0.2"}
	for _, c := range []struct {
		name    string
		members []kafkaadmin.Member
		flags   actFlags
		want    string // the error's text; "" when the command acts
	}{
		{"no members", nil, actFlags{yes: true}, ""},
		{"a dynamic member", []kafkaadmin.Member{dynamic}, actFlags{yes: true}, "has 1 active member(s): stop the consumers first (or pass --force; risk)"},
		{"a dynamic member, forced", []kafkaadmin.Member{dynamic}, actFlags{yes: true, force: true}, ""},
		{"a static member", []kafkaadmin.Member{static}, actFlags{yes: true}, "1 of them static: instance ledger-0 (client kafkaonce-ledger, host /10.0.0.1)"},
		{"a static member, removed", []kafkaadmin.Member{static}, actFlags{yes: true, removeStatic: true}, ""},
		{"static and dynamic, removing", []kafkaadmin.Member{static, dynamic}, actFlags{yes: true, removeStatic: true},
			"1 of them dynamic (member m-2 (client kafkaonce-ledger, host /10.0.0.2)): --remove-static-members removes only static ones"},
		{"static and dynamic", []kafkaadmin.Member{static, dynamic}, actFlags{yes: true}, "2 active member(s), 1 of them static"},
		{"a static member, a dry run", []kafkaadmin.Member{static}, actFlags{dryRun: true}, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := &settings{}
			_, err := s.clearToAct(c.flags, actGate{group: "g", members: c.members, forced: "risk", verb: "act"})
			if c.want == "" {
				require.NoError(t, err)
				return
			}
			require.ErrorContains(t, err, c.want)
		})
	}
}
