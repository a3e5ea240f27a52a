package kafkaadmin

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kafkaonce/kafkaonce/internal/kafkaclient"
)

// The group protocols: a classic group's, and the consumer group protocol
// (KIP-848), where the broker assigns partitions.
const (
	ClassicProtocol  = "classic"
	ConsumerProtocol = "consumer"
)

// Group is a consumer group's state.
type Group struct {
	State string
	// Protocol is ClassicProtocol, or ConsumerProtocol for a consumer
	// group; "" for a group the broker does not know (State Dead).
	Protocol string
	// Epoch is a consumer group's group epoch; 0 for a classic group.
	Epoch   int32
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
	// Type is the protocol the member speaks: ClassicProtocol, or
	// ConsumerProtocol. A consumer group migrating from the classic
	// protocol (or back) lists its classic members too.
	Type string
	// Epoch is the member's epoch in a consumer group (-2 for a static
	// member whose worker stopped, until its session timeout); 0 in a
	// classic group, which has generations instead.
	Epoch int32
	// Assigned are the partitions the member holds, per topic, as the
	// broker reports them: a consumer group's member assignment, a
	// classic group's as its leader made it.
	Assigned map[string][]int
}

// DescribeGroup returns a group's state and members, whichever protocol
// the group speaks. The classic describe (DescribeGroups) is asked first,
// as most groups are classic and a broker before Kafka 4.0 may serve
// nothing else; only when it lists no member is the consumer group
// describe (ConsumerGroupDescribe) asked too: Kafka answers the classic
// describe of a consumer group, and of a group migrating, with
// GROUP_ID_NOT_FOUND, and kfake with no members.
func (a *Admin) DescribeGroup(ctx context.Context, group string) (Group, error) {
	ctx, cancel := kafkaclient.Bounded(ctx)
	defer cancel()
	classic, err := a.describeClassic(ctx, group)
	if err != nil || len(classic.Members) > 0 {
		return classic, err
	}
	g, ok, err := a.describeConsumer(ctx, group)
	if err != nil || !ok {
		return classic, err
	}
	return g, nil
}

func (a *Admin) describeClassic(ctx context.Context, group string) (Group, error) {
	resp, err := a.adm.DescribeGroups(ctx, group)
	if err != nil {
		return Group{}, fmt.Errorf("kafka: describe group %s: %w", group, err)
	}
	g, ok := resp[group]
	if !ok || errors.Is(g.Err, kerr.GroupIDNotFound) || g.State == "Dead" {
		return Group{State: "Dead"}, nil
	}
	if g.Err != nil {
		return Group{}, fmt.Errorf("kafka: describe group %s: %w", group, g.Err)
	}
	out := Group{State: g.State, Protocol: ClassicProtocol}
	for _, m := range g.Members {
		mem := Member{ID: m.MemberID, ClientID: m.ClientID, Host: m.ClientHost, Type: ClassicProtocol}
		if m.InstanceID != nil {
			mem.InstanceID = *m.InstanceID
		}
		if c, ok := m.Assigned.AsConsumer(); ok {
			for _, t := range c.Topics {
				mem.assign(t.Topic, t.Partitions)
			}
		}
		out.Members = append(out.Members, mem)
	}
	sortMembers(out.Members)
	return out, nil
}

// describeConsumer describes group as a consumer group; ok is false when
// the broker has no such consumer group (a classic group, or none), or
// serves no consumer groups: Kafka 3.9 answers UNSUPPORTED_VERSION, and
// to a broker that does not advertise ConsumerGroupDescribe at all (before
// 3.9) kgo sends nothing and fails the request.
func (a *Admin) describeConsumer(ctx context.Context, group string) (Group, bool, error) {
	req := kmsg.NewPtrConsumerGroupDescribeRequest()
	req.Groups = []string{group}
	resp, err := req.RequestWith(ctx, a.client.Kgo())
	if err != nil {
		if served, verr := a.serves(ctx, kmsg.ConsumerGroupDescribe); verr == nil && !served {
			return Group{}, false, nil
		}
		return Group{}, false, fmt.Errorf("kafka: describe consumer group %s: %w", group, err)
	}
	var rg *kmsg.ConsumerGroupDescribeResponseGroup
	for i := range resp.Groups {
		if resp.Groups[i].Group == group {
			rg = &resp.Groups[i]
		}
	}
	if rg == nil {
		return Group{}, false, nil
	}
	switch err := kerr.ErrorForCode(rg.ErrorCode); {
	case errors.Is(err, kerr.GroupIDNotFound), errors.Is(err, kerr.UnsupportedVersion):
		return Group{}, false, nil
	case err != nil:
		return Group{}, false, fmt.Errorf("kafka: describe consumer group %s: %w", group, err)
	}
	names, err := a.topicNames(ctx, rg)
	if err != nil {
		return Group{}, false, fmt.Errorf("kafka: describe consumer group %s: %w", group, err)
	}
	out := Group{State: rg.State, Protocol: ConsumerProtocol, Epoch: rg.Epoch}
	for _, m := range rg.Members {
		// MemberType is 0 for a classic member, 1 for a consumer-protocol
		// one; -1 (not known: version 0, before any migration) is the
		// latter.
		mem := Member{ID: m.MemberID, ClientID: m.ClientID, Host: m.ClientHost, Type: ConsumerProtocol, Epoch: m.MemberEpoch}
		if m.MemberType == 0 {
			mem.Type = ClassicProtocol
		}
		if m.InstanceID != nil {
			mem.InstanceID = *m.InstanceID
		}
		for _, tp := range m.Assignment.TopicPartitions {
			mem.assign(names[tp.TopicID], tp.Partitions)
		}
		out.Members = append(out.Members, mem)
	}
	sortMembers(out.Members)
	return out, true, nil
}

// topicNames names the topics of rg's assignments by their ids. Kafka
// names them in the answer; kfake gives only the ids, which the topics'
// metadata then names.
func (a *Admin) topicNames(ctx context.Context, rg *kmsg.ConsumerGroupDescribeResponseGroup) (map[[16]byte]string, error) {
	names := map[[16]byte]string{}
	unnamed := false
	for _, m := range rg.Members {
		for _, tp := range m.Assignment.TopicPartitions {
			if tp.Topic != "" {
				names[tp.TopicID] = tp.Topic
			} else if _, ok := names[tp.TopicID]; !ok {
				unnamed = true
			}
		}
	}
	if !unnamed {
		return names, nil
	}
	tds, err := a.adm.ListTopics(ctx)
	if err != nil {
		return nil, fmt.Errorf("naming the assigned topics: %w", err)
	}
	for _, td := range tds {
		if _, ok := names[td.ID]; !ok {
			names[td.ID] = td.Topic
		}
	}
	return names, nil
}

// serves reports whether a broker advertises key in its API versions.
func (a *Admin) serves(ctx context.Context, key kmsg.Key) (bool, error) {
	resp, err := kmsg.NewPtrApiVersionsRequest().RequestWith(ctx, a.client.Kgo())
	if err == nil {
		err = kerr.ErrorForCode(resp.ErrorCode)
	}
	if err != nil {
		return false, err
	}
	for _, k := range resp.ApiKeys {
		if k.ApiKey == key.Int16() {
			return true, nil
		}
	}
	return false, nil
}

func (m *Member) assign(topic string, partitions []int32) {
	if m.Assigned == nil {
		m.Assigned = map[string][]int{}
	}
	for _, p := range partitions {
		m.Assigned[topic] = append(m.Assigned[topic], int(p))
	}
	slices.Sort(m.Assigned[topic])
}

func sortMembers(ms []Member) {
	slices.SortFunc(ms, func(x, y Member) int {
		return cmp.Or(cmp.Compare(x.InstanceID, y.InstanceID), cmp.Compare(x.ID, y.ID))
	})
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
