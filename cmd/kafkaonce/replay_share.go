package main

import (
	"context"
	"errors"
	"fmt"

	"github.com/twmb/franz-go/pkg/kerr"

	"github.com/kafkaonce/kafkaonce/internal/kafkaadmin"
	"github.com/kafkaonce/kafkaonce/internal/kafkaclient"
)

// shareReplay is replay for a consumer whose group is a share group
// (GroupType ShareGroup): it resets the group's start offsets
// (AlterShareGroupOffsets), so the broker delivers every record from the
// target again. There are no stored positions: each record delivered
// again is found claimed and accepted without its handler, or, when its
// claim was pruned or never written, applied; the plan counts which.
type shareReplay struct {
	s               *settings
	consumer, group string
	topic           string
	parts           []int
	bounds          map[int]kafkaadmin.Bounds
	targets         map[int]int64
	members         []kafkaadmin.Member
	ids             idChoice
	idErr           error
	act             actFlags
}

func (r shareReplay) run(ctx context.Context, c *conn) error {
	s, admin := r.s, c.admin
	starts, err := admin.ShareOffsets(ctx, r.group, r.topic)
	if err != nil {
		return err
	}
	plan := replayPlan{planHead: newPlanHead(r.consumer, s.schema, r.group, r.topic, r.members), GroupType: "share"}
	for _, p := range r.parts {
		start := int64(-1)
		if sp, ok := starts[p]; ok {
			start = sp.Start
		}
		// No stored position: Stored -1 makes countPlan look every message
		// from the target up by its claim.
		plan.Partitions = append(plan.Partitions, replayPartition{Partition: p, Committed: start, Target: r.targets[p], Stored: -1})
	}
	// shareGroup set: a record whose only trace is a provisional letter
	// (its last delivery died) has no claim, and is applied when
	// delivered again, not skipped.
	a := &auditor{pool: c.pool, admin: admin, schema: s.schema, consumer: r.consumer, topic: r.topic, id: r.ids.rule,
		shareGroup: r.group, progress: newProgress(s.st, "counting the messages")}
	if err := countPlan(ctx, a, &plan, r.bounds, r.idErr == nil); err != nil {
		return err
	}
	// A target past the group's start offset skips the messages in
	// between: the group never delivers them.
	for i := range plan.Partitions {
		rp := &plan.Partitions[i]
		if rp.Committed < 0 || rp.Target <= rp.Committed {
			continue
		}
		ap := auditPartition{Partition: rp.Partition, From: rp.Committed, To: min(rp.Target, r.bounds[rp.Partition].End), Stored: -1}
		if ap.From >= ap.To {
			continue
		}
		err := a.scan(ctx, &ap, func(chunk []kafkaclient.Record) error {
			ap.Read += int64(len(chunk))
			return nil
		})
		if err != nil {
			return fmt.Errorf("count the messages of %s/%d: %w", r.topic, rp.Partition, err)
		}
		rp.SkippedForGood, rp.Unread = ap.Read, rp.Unread+ap.Unread
	}
	if r.idErr != nil {
		plan.ClaimsNotCounted = r.idErr.Error()
	} else {
		plan.ClaimsCountedBy = describeRule(auditReport{Consumer: r.consumer, MessageIDRule: r.ids.rule.String(), MessageIDRuleFrom: r.ids.from})
	}
	if !s.json {
		printReplayPlan(s.st.out, plan)
	}
	switch {
	case r.act.dryRun:
		return s.emitJSONOnly(plan)
	case len(r.members) > 0:
		// --force does not help: Kafka refuses to reset a share group
		// with members, and a member would go on from where it is.
		return fmt.Errorf("share group %s has %d member(s): %s: stop the consumers first (Kafka refuses to reset a share group with members)",
			r.group, len(r.members), describeMembers(r.members))
	case !r.act.yes && !s.st.terminal():
		return errors.New("not a terminal: pass --yes to rewind without a confirmation")
	case !r.act.yes && !confirm(s.st, "Rewind the share group? [y/N] "):
		return errors.New("not confirmed; nothing changed")
	}
	if err := admin.SetShareStarts(ctx, r.group, r.topic, r.targets); err != nil {
		if errors.Is(err, kerr.NonEmptyGroup) {
			return fmt.Errorf("%w: a member joined since the plan; nothing changed: stop the consumers and run replay again", err)
		}
		return fmt.Errorf("%w; Kafka may have reset some partitions: run replay again with the same --to", err)
	}
	plan.Executed = true
	if !s.json {
		fmt.Fprintf(s.st.out, "share group %s rewound on %s; start the consumers to replay\n", r.group, r.topic)
	}
	return s.emitJSONOnly(plan)
}

// shareMembers names a share group's members as the group commands name a
// consumer group's: a share group has no static members.
func shareMembers(g kafkaadmin.ShareGroup) []kafkaadmin.Member {
	out := make([]kafkaadmin.Member, 0, len(g.Members))
	for _, m := range g.Members {
		out = append(out, kafkaadmin.Member{ID: m.ID, ClientID: m.ClientID, Host: m.Host})
	}
	return out
}
