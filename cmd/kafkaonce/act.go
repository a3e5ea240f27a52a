package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/spf13/cobra"
	"github.com/twmb/franz-go/pkg/kerr"

	"github.com/kafkaonce/kafkaonce/internal/consumerstatus"
	"github.com/kafkaonce/kafkaonce/internal/kafkaadmin"
)

// actFlags are the flags of a command that changes where a consumer group
// reads (replay, positions): it shows its plan, then acts only once the
// group is stopped and the operator agreed. One set of checks, so that no
// such command is laxer than another.
type actFlags struct {
	yes, force, dryRun bool
	// removeStatic removes the group's static members before acting.
	removeStatic bool
}

// register adds --yes, --force (force says what it risks), --dry-run and
// --remove-static-members.
func (f *actFlags) register(cmd *cobra.Command, force string) {
	cmd.Flags().BoolVar(&f.yes, "yes", false, "do not ask for confirmation")
	cmd.Flags().BoolVar(&f.force, "force", false, force)
	cmd.Flags().BoolVar(&f.dryRun, "dry-run", false, "only show what would happen")
	cmd.Flags().BoolVar(&f.removeStatic, "remove-static-members", false,
		"remove the group's static members (Config.InstanceID) before acting, once their workers are stopped: they stay in the group until their session timeout otherwise")
}

// planHead is what the plan of a command that acts on a group (replay,
// positions) says first: whose, where, and the group's members.
type planHead struct {
	Consumer string `json:"consumer"`
	Schema   string `json:"schema"`
	Group    string `json:"group"`
	Topic    string `json:"topic"`
	Members  int    `json:"active_members"`
	// Static are the instance ids of the static members among them.
	Static []string `json:"static_members,omitempty"`
}

func newPlanHead(consumerName, schemaName, group, topic string, members []kafkaadmin.Member) planHead {
	return planHead{Consumer: consumerName, Schema: schemaName, Group: group, Topic: topic, Members: len(members), Static: instanceIDs(members)}
}

// actGate is what a command checks once its plan is shown.
type actGate struct {
	group string
	// members are the group's active members.
	members []kafkaadmin.Member
	// forced says, after "or pass --force", what --force does here.
	forced string
	// verb names the change for the --yes error ("rewind"), question asks
	// for it on a terminal.
	verb, question string
}

// clearToAct reports whether the command acts on its plan: not with
// --dry-run; not while the group has active members (they would go on
// from where they are, or Kafka refuses), unless --force, or unless every
// one is a static member and --remove-static-members removes them first
// (see removeStatic); and only with --yes or a confirmation on a terminal.
func (s *settings) clearToAct(f actFlags, g actGate) (bool, error) {
	static := staticOf(g.members)
	switch {
	case f.dryRun:
		return false, nil
	case len(g.members) > 0 && !f.force && !(f.removeStatic && len(static) == len(g.members)):
		return false, activeMembersError(g, static, f.removeStatic)
	case !f.yes && !s.st.terminal():
		return false, fmt.Errorf("not a terminal: pass --yes to %s without a confirmation", g.verb)
	case !f.yes && !confirm(s.st, g.question):
		return false, errors.New("not confirmed; nothing changed")
	}
	return true, nil
}

// activeMembersError refuses a change while the group has members, and
// says what to do. A static member is still a member after its worker
// stopped cleanly (franz-go, like Kafka's own clients, does not leave the
// group for it, so that a restart within the session timeout gets its
// partitions back without a rebalance): everything may be stopped and
// the group still have members. The error names them, and the way out.
func activeMembersError(g actGate, static []kafkaadmin.Member, removing bool) error {
	msg := fmt.Sprintf("group %s has %d active member(s)", g.group, len(g.members))
	switch {
	case len(static) == 0 && consumerGroup(g.members):
		// The consumer group protocol's members are named with their
		// epochs and partitions: the classic describe did not list them
		// before kafkaonce asked ConsumerGroupDescribe too.
		return fmt.Errorf("%s, %s: stop the consumers first (or pass --force; %s)", msg, describeMembers(g.members), g.forced)
	case len(static) == 0:
		return fmt.Errorf("%s: stop the consumers first (or pass --force; %s)", msg, g.forced)
	case len(static) < len(g.members) && removing:
		return fmt.Errorf("%s, %d of them dynamic (%s): --remove-static-members removes only static ones; stop the consumers first (or pass --force; %s)",
			msg, len(g.members)-len(static), describeMembers(dynamicOf(g.members)), g.forced)
	}
	return fmt.Errorf("%s, %d of them static: %s. A static member stays in the group after its worker stops, until its session timeout "+
		"(%s, 45s by default) passes without a heartbeat. If their workers are stopped, wait that long, or pass "+
		"--remove-static-members to remove them now (a worker still running with one of these instance ids is fenced); otherwise "+
		"stop the consumers first (or pass --force; %s)", msg, len(static), describeMembers(static), sessionTimeoutOf(static), g.forced)
}

// sessionTimeoutOf names the setting that bounds how long static members
// stay: a classic member's own, a consumer-protocol member's group's.
func sessionTimeoutOf(static []kafkaadmin.Member) string {
	var names []string
	for _, m := range static {
		name := "Config.SessionTimeout"
		if m.Type == kafkaadmin.ConsumerProtocol {
			name = "under the consumer group protocol, the group's consumer.session.timeout.ms"
		}
		if !slices.Contains(names, name) {
			names = append(names, name)
		}
	}
	return strings.Join(names, "; ")
}

// consumerGroup reports whether ms are the members of a consumer group
// of the consumer group protocol (KIP-848): they have epochs.
func consumerGroup(ms []kafkaadmin.Member) bool {
	return slices.ContainsFunc(ms, func(m kafkaadmin.Member) bool { return m.Type == kafkaadmin.ConsumerProtocol || m.Epoch != 0 })
}

// removeStatic removes the gate's static members from the group, when
// asked and the gate let the command through, and checks that the group
// has no member left: a worker that started meanwhile (or was running)
// must not find its positions changed under it.
func (s *settings) removeStatic(ctx context.Context, admin *kafkaadmin.Admin, f actFlags, g actGate) error {
	static := staticOf(g.members)
	if !f.removeStatic || len(static) == 0 || len(static) < len(g.members) {
		return nil
	}
	ids := instanceIDs(static)
	if err := admin.RemoveStatic(ctx, g.group, ids); err != nil {
		if consumerGroup(static) && errors.Is(err, kerr.UnknownMemberID) {
			// Kafka 4.x removes a consumer-protocol static member by its
			// instance id; a broker that does not (kfake) says it knows no
			// such member, though it just described one.
			return fmt.Errorf("%w; nothing changed: the broker does not remove a static member of the consumer group protocol by its instance id; "+
				"once their workers are stopped, wait for the group's consumer.session.timeout.ms to pass, or pass --force", err)
		}
		return fmt.Errorf("%w; nothing changed", err)
	}
	after, err := admin.DescribeGroup(ctx, g.group)
	if err != nil {
		return fmt.Errorf("%w; the static members were removed, nothing else changed: run the command again", err)
	}
	if len(after.Members) > 0 {
		return fmt.Errorf("group %s has %d member(s) again after its static members were removed (%s): a worker is running; nothing changed",
			g.group, len(after.Members), describeMembers(after.Members))
	}
	if !s.json {
		fmt.Fprintf(s.st.out, "removed static member(s) %s from group %s\n", strings.Join(ids, ", "), g.group)
	}
	return nil
}

// instanceIDs are the instance ids of the static members among ms.
func instanceIDs(ms []kafkaadmin.Member) []string {
	var out []string
	for _, m := range staticOf(ms) {
		out = append(out, m.InstanceID)
	}
	return out
}

// staticNote names the static members in a plan's heading.
func staticNote(ids []string) string {
	if len(ids) == 0 {
		return ""
	}
	return ", static: " + strings.Join(ids, ", ")
}

func staticOf(ms []kafkaadmin.Member) []kafkaadmin.Member {
	var out []kafkaadmin.Member
	for _, m := range ms {
		if m.InstanceID != "" {
			out = append(out, m)
		}
	}
	return out
}

func dynamicOf(ms []kafkaadmin.Member) []kafkaadmin.Member {
	var out []kafkaadmin.Member
	for _, m := range ms {
		if m.InstanceID == "" {
			out = append(out, m)
		}
	}
	return out
}

// describeMembers names members for an operator: instance id (if static),
// client id and host; and in a consumer-protocol group, each member's
// protocol, epoch and partitions.
func describeMembers(ms []kafkaadmin.Member) string {
	consumer := consumerGroup(ms)
	parts := make([]string, len(ms))
	for i, m := range ms {
		where := fmt.Sprintf("client %s, host %s", orDash(m.ClientID), orDash(m.Host))
		if consumer {
			where += fmt.Sprintf(", %s protocol, epoch %d, assigned %s", m.Type, m.Epoch, consumerstatus.AssignedText(m.Assigned))
		}
		if m.InstanceID != "" {
			parts[i] = fmt.Sprintf("instance %s (%s)", m.InstanceID, where)
			continue
		}
		parts[i] = fmt.Sprintf("member %s (%s)", m.ID, where)
	}
	return strings.Join(parts, "; ")
}
