package consumerstatus

import (
	"context"
	"time"

	"github.com/kafkaonce/kafkaonce/internal/kafkaadmin"
	"github.com/kafkaonce/kafkaonce/internal/store/recorded"
)

// ShareView is what the broker says of a share group (KIP-932): its
// members, as the broker reports them, and the group's settings. A share
// group has no committed offsets and kafkaonce stores no positions for
// it; each partition's share-partition start and share lag are in
// Partition.ShareStart and ShareLag.
type ShareView struct {
	// State is the group's state: Stable, Empty, or Dead for a group the
	// broker does not know (no member has joined it yet).
	State   string            `json:"state,omitempty"`
	Members []ShareMemberView `json:"members"`
	// Settings are the group's settings the engine depends on; absent when
	// Kafka did not give them (see Error).
	Settings *ShareSettingsView `json:"settings,omitempty"`
	// Error says what Kafka did not give of the group, and why: "" when
	// it gave everything.
	Error string `json:"error,omitempty"`
}

// ShareMemberView is a member of a share group.
type ShareMemberView struct {
	ID       string `json:"member_id"`
	ClientID string `json:"client_id"`
	Host     string `json:"host"`
	Epoch    int32  `json:"epoch"`
	// Assigned counts the partitions assigned to it; any number of
	// members share one.
	Assigned int `json:"assigned_partitions"`
}

// ShareSettingsView shows kafkaadmin.ShareSettings.
type ShareSettingsView struct {
	DeliveryLimit int    `json:"delivery_limit"`
	LockDuration  string `json:"lock_duration"`
	Start         string `json:"start"`
	Isolation     string `json:"isolation"`
}

// IsShare reports whether rec names a share group.
func IsShare(rec *recorded.Settings) bool {
	return rec != nil && rec.GroupType == recorded.ShareGroup
}

// readShare reads a share group's members and settings; down names the
// topic Kafka already failed for, when it did: the group is then not
// asked.
func readShare(ctx context.Context, admin *kafkaadmin.Admin, group, down string) *ShareView {
	v := &ShareView{Members: []ShareMemberView{}}
	if down != "" {
		v.Error = "not asked after Kafka failed for topic " + down
		return v
	}
	g, err := admin.DescribeShareGroup(ctx, group)
	if err != nil {
		v.Error = err.Error()
		return v
	}
	v.State = g.State
	for _, m := range g.Members {
		v.Members = append(v.Members, ShareMemberView{ID: m.ID, ClientID: m.ClientID, Host: m.Host, Epoch: m.Epoch, Assigned: m.Assigned})
	}
	s, err := admin.ShareSettings(ctx, group)
	if err != nil {
		v.Error = err.Error()
		return v
	}
	v.Settings = &ShareSettingsView{DeliveryLimit: s.DeliveryLimit, LockDuration: s.LockDuration.Round(time.Millisecond).String(), Start: s.Start, Isolation: s.Isolation}
	return v
}
