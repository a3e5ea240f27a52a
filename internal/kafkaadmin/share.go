package kafkaadmin

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

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
