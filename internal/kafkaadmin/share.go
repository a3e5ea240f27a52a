package kafkaadmin

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"

	"github.com/kafkaonce/kafkaonce/internal/kafkaclient"
	"github.com/kafkaonce/kafkaonce/internal/kafkaclient/franz"
)

// ShareSettings are the settings of a share group (KIP-932) the engine
// depends on. Each is the group's own config where it has one, else the
// broker's default for share groups.
type ShareSettings struct {
	// DeliveryLimit is how many times a record is delivered before the
	// broker archives it, settled or not: the engine must not assume 5.
	DeliveryLimit int
	// LockDuration is how long a member holds a record it was handed
	// before the broker delivers it again.
	LockDuration time.Duration
	// Start is where the group starts reading a partition it has no state
	// for: "latest" (Kafka's default) or "earliest", or "by_duration:..."
	// (see SetShareStart).
	Start string
	// Isolation is the group's isolation level: read_committed or
	// read_uncommitted (Kafka's default).
	Isolation string
}

// The group configs, and the broker configs that are their defaults.
var shareConfigs = []struct{ group, broker, fallback string }{
	{"share.delivery.count.limit", "group.share.delivery.count.limit", "5"},
	{"share.record.lock.duration.ms", "group.share.record.lock.duration.ms", "30000"},
	{"share.auto.offset.reset", "", "latest"},
	{"share.isolation.level", "", "read_uncommitted"},
}

// ShareSettings reads a share group's settings. A group that does not
// exist yet has those it will start with.
//
// Brokers differ on an unset group config: Kafka describes it with the
// broker's default, kfake without a value. Without one, the default is
// read from a broker's own configs (describing one broker, not the
// cluster-wide dynamic configs, which hold only what was altered).
func (a *Admin) ShareSettings(ctx context.Context, group string) (ShareSettings, error) {
	ctx, cancel := kafkaclient.Bounded(ctx)
	defer cancel()
	gcs, err := franz.GroupConfigs(ctx, a.client.Kgo(), group)
	if err != nil {
		return ShareSettings{}, err
	}
	values := map[string]string{}
	var brokerCfgs map[string]string
	for _, c := range shareConfigs {
		if v := gcs[c.group]; v != nil && *v != "" {
			values[c.group] = *v
			continue
		}
		values[c.group] = c.fallback
		if c.broker == "" {
			continue
		}
		if brokerCfgs == nil {
			if brokerCfgs, err = a.brokerConfigs(ctx); err != nil {
				return ShareSettings{}, err
			}
		}
		if v, ok := brokerCfgs[c.broker]; ok && v != "" {
			values[c.group] = v
		}
	}
	limit, err := strconv.Atoi(values["share.delivery.count.limit"])
	if err != nil {
		return ShareSettings{}, fmt.Errorf("kafka: share group %s: delivery count limit: %w", group, err)
	}
	lockMs, err := strconv.ParseInt(values["share.record.lock.duration.ms"], 10, 64)
	if err != nil {
		return ShareSettings{}, fmt.Errorf("kafka: share group %s: record lock duration: %w", group, err)
	}
	return ShareSettings{DeliveryLimit: limit, LockDuration: time.Duration(lockMs) * time.Millisecond,
		Start: values["share.auto.offset.reset"], Isolation: values["share.isolation.level"]}, nil
}

// brokerConfigs returns the configs of one broker of the cluster.
func (a *Admin) brokerConfigs(ctx context.Context) (map[string]string, error) {
	brokers, err := a.adm.ListBrokers(ctx)
	if err != nil {
		return nil, fmt.Errorf("kafka: list brokers: %w", err)
	}
	if len(brokers) == 0 {
		return nil, errors.New("kafka: list brokers: none")
	}
	rcs, err := a.adm.DescribeBrokerConfigs(ctx, brokers[0].NodeID)
	if err != nil {
		return nil, fmt.Errorf("kafka: describe configs of broker %d: %w", brokers[0].NodeID, err)
	}
	out := map[string]string{}
	for _, rc := range rcs {
		if rc.Err != nil {
			return nil, fmt.Errorf("kafka: describe configs of broker %s: %w", rc.Name, rc.Err)
		}
		for _, c := range rc.Configs {
			out[c.Key] = c.MaybeValue()
		}
	}
	return out, nil
}

// SetShareStart sets where share group starts reading a partition it has
// no state for (share.auto.offset.reset): "earliest", "latest", or
// "by_duration:<ISO-8601 duration>". It applies to partitions the group
// meets afterwards; those it already reads keep their place.
func (a *Admin) SetShareStart(ctx context.Context, group, start string) error {
	ctx, cancel := kafkaclient.Bounded(ctx)
	defer cancel()
	return franz.SetGroupConfigs(ctx, a.client.Kgo(), group, map[string]string{"share.auto.offset.reset": start})
}

// ShareGroup is a share group as the broker describes it (ShareGroupDescribe).
type ShareGroup struct {
	// State is the group's state (Empty, Stable, Dead for a group the
	// broker does not know).
	State   string
	Members []ShareMember
}

// ShareMember is a member of a share group.
type ShareMember struct {
	ID string
	// ClientID and Host say where the member runs.
	ClientID, Host string
	// Epoch is the member's epoch.
	Epoch int32
	// Assigned counts the partitions the broker assigned to the member
	// (in a share group, any number of members share one).
	Assigned int
}

// DescribeShareGroup returns a share group's state and members.
func (a *Admin) DescribeShareGroup(ctx context.Context, group string) (ShareGroup, error) {
	ctx, cancel := kafkaclient.Bounded(ctx)
	defer cancel()
	resp, err := a.adm.DescribeShareGroups(ctx, group)
	if err != nil && len(resp) == 0 {
		// A broker that speaks no share groups has none.
		if errors.Is(err, kerr.UnsupportedVersion) {
			return ShareGroup{State: "Dead"}, nil
		}
		return ShareGroup{}, fmt.Errorf("kafka: describe share group %s: %w", group, err)
	}
	g, ok := resp[group]
	if !ok || errors.Is(g.Err, kerr.GroupIDNotFound) || g.GroupState == "Dead" {
		return ShareGroup{State: "Dead"}, nil
	}
	if g.Err != nil {
		return ShareGroup{}, fmt.Errorf("kafka: describe share group %s: %w", group, g.Err)
	}
	out := ShareGroup{State: g.GroupState}
	for _, m := range g.Members {
		n := 0
		for _, ps := range m.Assignment {
			n += len(ps)
		}
		out.Members = append(out.Members, ShareMember{ID: m.MemberID, ClientID: m.ClientID, Host: m.ClientHost, Epoch: m.MemberEpoch, Assigned: n})
	}
	slices.SortFunc(out.Members, func(x, y ShareMember) int { return cmp.Compare(x.ID, y.ID) })
	return out, nil
}

// SharePartition is a share-partition's state: where the group starts
// (the share-partition start offset: every record below it is settled)
// and its share lag (records not yet delivered and settled), -1 where the
// broker gives none (a partition the group has not read, or a broker
// before KIP-1226's lag).
type SharePartition struct {
	Start, Lag int64
}

// ShareOffsets returns, for the partitions of topic the group has state
// for, their share-partition start offsets and lag
// (DescribeShareGroupOffsets). A partition the group never read is absent.
func (a *Admin) ShareOffsets(ctx context.Context, group, topic string) (map[int]SharePartition, error) {
	ctx, cancel := kafkaclient.Bounded(ctx)
	defer cancel()
	resp, err := a.adm.DescribeShareGroupOffsets(ctx, group)
	if err != nil {
		return nil, fmt.Errorf("kafka: describe the offsets of share group %s: %w", group, err)
	}
	g, ok := resp[group]
	if !ok || errors.Is(g.Err, kerr.GroupIDNotFound) {
		return map[int]SharePartition{}, nil
	}
	if g.Err != nil {
		return nil, fmt.Errorf("kafka: describe the offsets of share group %s: %w", group, g.Err)
	}
	out := map[int]SharePartition{}
	for p, o := range g.Offsets[topic] {
		if o.Err != nil {
			return nil, fmt.Errorf("kafka: describe the offsets of share group %s, partition %s/%d: %w", group, topic, p, o.Err)
		}
		if o.StartOffset < 0 {
			continue
		}
		out[int(p)] = SharePartition{Start: o.StartOffset, Lag: o.Lag}
	}
	return out, nil
}

// SetShareStarts resets a share group's start offsets on topic
// (AlterShareGroupOffsets): the group delivers every record from there
// again, and forgets the records in flight and their delivery counts.
// Kafka refuses it while the group has members (kerr.NonEmptyGroup).
// Partitions Kafka refused are in the error, by partition.
func (a *Admin) SetShareStarts(ctx context.Context, group, topic string, starts map[int]int64) error {
	ctx, cancel := kafkaclient.Bounded(ctx)
	defer cancel()
	os := kadm.Offsets{}
	for p, at := range starts {
		os.Add(kadm.Offset{Topic: topic, Partition: int32(p), At: at, LeaderEpoch: -1})
	}
	resp, err := a.adm.AlterShareGroupOffsets(ctx, group, os)
	if err != nil {
		return fmt.Errorf("kafka: reset share group %s on %s: %w", group, topic, err)
	}
	var failed []string
	for p, perr := range resp[topic] {
		if perr != nil {
			failed = append(failed, fmt.Sprintf("%s/%d: %v", topic, p, perr))
		}
	}
	if len(failed) > 0 {
		slices.Sort(failed)
		return fmt.Errorf("kafka: reset share group %s: refused on %s", group, strings.Join(failed, ", "))
	}
	return nil
}
