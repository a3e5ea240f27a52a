package consumerstatus

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/kafkaonce/kafkaonce/internal/kafkaadmin"
)

// GroupView is what the broker says of a consumer group: its protocol,
// state and members. A consumer group of the consumer group protocol
// (KIP-848) has a group epoch, and each member its own.
type GroupView struct {
	// State is the group's state: Stable, Empty, or Dead for a group the
	// broker does not know.
	State string `json:"state,omitempty"`
	// Protocol is "classic", or "consumer" for the consumer group
	// protocol; "" for a group the broker does not know.
	Protocol string `json:"protocol,omitempty"`
	// Epoch is a consumer-protocol group's group epoch.
	Epoch   int32             `json:"epoch,omitempty"`
	Members []GroupMemberView `json:"members"`
	// Error says why Kafka did not describe the group: "" when it did.
	Error string `json:"error,omitempty"`
}

// GroupMemberView is a member of a consumer group.
type GroupMemberView struct {
	ID string `json:"member_id"`
	// InstanceID is a static member's Config.InstanceID.
	InstanceID string `json:"instance_id,omitempty"`
	ClientID   string `json:"client_id"`
	Host       string `json:"host"`
	// Type is the protocol the member speaks, "classic" or "consumer": a
	// consumer group migrating lists classic members too.
	Type string `json:"type"`
	// Epoch is its member epoch in a consumer-protocol group.
	Epoch int32 `json:"epoch,omitempty"`
	// Assigned are the partitions it holds, per topic, as the broker
	// reports them.
	Assigned map[string][]int `json:"assigned"`
}

// readGroup describes a consumer group; down names the topic Kafka
// already failed for, when it did: the group is then not asked.
func readGroup(ctx context.Context, admin *kafkaadmin.Admin, group, down string) *GroupView {
	v := &GroupView{Members: []GroupMemberView{}}
	if down != "" {
		v.Error = "not asked after Kafka failed for topic " + down
		return v
	}
	g, err := admin.DescribeGroup(ctx, group)
	if err != nil {
		v.Error = err.Error()
		return v
	}
	v.State, v.Protocol, v.Epoch = g.State, g.Protocol, g.Epoch
	for _, m := range g.Members {
		v.Members = append(v.Members, GroupMemberView{ID: m.ID, InstanceID: m.InstanceID, ClientID: m.ClientID, Host: m.Host,
			Type: m.Type, Epoch: m.Epoch, Assigned: m.Assigned})
	}
	return v
}

// AssignedText shows a member's partitions: "orders 0,1; refunds 3", or
// "none".
func AssignedText(assigned map[string][]int) string {
	topics := make([]string, 0, len(assigned))
	for t := range assigned {
		topics = append(topics, t)
	}
	slices.Sort(topics)
	var parts []string
	for _, t := range topics {
		ps := make([]string, len(assigned[t]))
		for i, p := range assigned[t] {
			ps[i] = fmt.Sprint(p)
		}
		parts = append(parts, t+" "+strings.Join(ps, ","))
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, "; ")
}
