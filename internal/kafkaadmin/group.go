package kafkaadmin

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"

	"github.com/kafkaonce/kafkaonce/internal/kafkaclient"
)

// Group is a consumer group's state.
type Group struct {
	State   string
	Members []Member
}

// Member is a member of a consumer group, as Kafka describes it.
type Member struct {
	ID string
	// InstanceID is a static member's Config.InstanceID; "" for a dynamic
	// member.
	InstanceID string
	// ClientID and Host say where the member runs.
	ClientID, Host string
}

// DescribeGroup returns a group's state and members.
func (a *Admin) DescribeGroup(ctx context.Context, group string) (Group, error) {
	ctx, cancel := kafkaclient.Bounded(ctx)
	defer cancel()
	resp, err := a.adm.DescribeGroups(ctx, group)
	if err != nil {
		return Group{}, fmt.Errorf("kafka: describe group %s: %w", group, err)
	}
	g, ok := resp[group]
	if !ok || errors.Is(g.Err, kerr.GroupIDNotFound) {
		return Group{State: "Dead"}, nil
	}
	if g.Err != nil {
		return Group{}, fmt.Errorf("kafka: describe group %s: %w", group, g.Err)
	}
	out := Group{State: g.State}
	for _, m := range g.Members {
		mem := Member{ID: m.MemberID, ClientID: m.ClientID, Host: m.ClientHost}
		if m.InstanceID != nil {
			mem.InstanceID = *m.InstanceID
		}
		out.Members = append(out.Members, mem)
	}
	slices.SortFunc(out.Members, func(x, y Member) int {
		return cmp.Or(cmp.Compare(x.InstanceID, y.InstanceID), cmp.Compare(x.ID, y.ID))
	})
	return out, nil
}

// RemoveStatic removes static members from group by their instance ids,
// as KIP-345 lets an administrator do: a member whose worker stopped
// leaves at once rather than at its session timeout. A worker still
// running with one of the ids is fenced by the group when it next talks
// to it. Kafka answers each id on its own; the error names those it
// refused.
func (a *Admin) RemoveStatic(ctx context.Context, group string, instanceIDs []string) error {
	ctx, cancel := kafkaclient.Bounded(ctx)
	defer cancel()
	resp, err := a.adm.LeaveGroup(ctx, kadm.LeaveGroup(group).InstanceIDs(instanceIDs...).Reason("kafkaonce: removed by an operator's command"))
	if err != nil {
		return fmt.Errorf("kafka: remove static members %q from group %s: %w", instanceIDs, group, err)
	}
	var refused []error
	for _, l := range resp.Sorted() {
		if l.Err != nil {
			refused = append(refused, fmt.Errorf("instance %s: %w", l.InstanceID, l.Err))
		}
	}
	if len(refused) > 0 {
		return fmt.Errorf("kafka: remove static members from group %s: %w", group, errors.Join(refused...))
	}
	return nil
}
