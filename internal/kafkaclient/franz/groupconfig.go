package franz

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// Group configs (KIP-848, KIP-932) are set per group with
// IncrementalAlterConfigs and read with DescribeConfigs, on the GROUP
// resource; kadm has no calls for them (v1.18), so these speak kmsg. Any
// broker answers them.
//
// Kafka answers an alter once its controller has the change; each broker
// applies it to its own copy of the metadata afterwards, so for a moment a
// broker still describes, and acts on, the old value: on a fresh Kafka 4.3
// broker under load, a describe right after the alter's answer was seen to
// miss it, and a share partition read then would start where the old
// share.auto.offset.reset says, or hand out records under the old
// share.isolation.level. kfake changes at once. SetGroupConfigs therefore
// returns only once every broker describes the new values.

// GroupConfigs reads a group's configs, from any broker: the value of
// each, nil for one the broker describes without a value. Kafka describes
// an unset config with the broker's default for it; kfake describes only
// the configs set.
func GroupConfigs(ctx context.Context, cl *kgo.Client, group string) (map[string]*string, error) {
	return describeGroupConfigs(ctx, cl, group)
}

// describeGroupConfigs reads a group's configs through r: a client (any
// broker) or one broker.
func describeGroupConfigs(ctx context.Context, r kmsg.Requestor, group string) (map[string]*string, error) {
	req := kmsg.NewPtrDescribeConfigsRequest()
	res := kmsg.NewDescribeConfigsRequestResource()
	res.ResourceType = kmsg.ConfigResourceTypeGroupConfig
	res.ResourceName = group
	req.Resources = append(req.Resources, res)
	resp, err := req.RequestWith(ctx, r)
	if err != nil {
		return nil, fmt.Errorf("kafka: describe configs of group %s: %w", group, err)
	}
	if len(resp.Resources) != 1 {
		return nil, fmt.Errorf("kafka: describe configs of group %s: %d resources in the answer", group, len(resp.Resources))
	}
	rs := resp.Resources[0]
	if err := kerr.ErrorForCode(rs.ErrorCode); err != nil {
		return nil, fmt.Errorf("kafka: describe configs of group %s: %w", group, err)
	}
	out := make(map[string]*string, len(rs.Configs))
	for _, c := range rs.Configs {
		out[c.Name] = c.Value
	}
	return out, nil
}

// SetGroupConfigs sets configs of a group, leaving its others as they are,
// and waits until every broker describes the group with them (see above).
// Kafka refuses a value outside the broker's bounds for it (INVALID_CONFIG:
// a share group's lock within group.share.min/max.record.lock.duration.ms,
// its delivery limit within group.share.min/max.delivery.count.limit);
// kfake takes any.
func SetGroupConfigs(ctx context.Context, cl *kgo.Client, group string, configs map[string]string) error {
	req := kmsg.NewPtrIncrementalAlterConfigsRequest()
	res := kmsg.NewIncrementalAlterConfigsRequestResource()
	res.ResourceType = kmsg.ConfigResourceTypeGroupConfig
	res.ResourceName = group
	for k, v := range configs {
		c := kmsg.NewIncrementalAlterConfigsRequestResourceConfig()
		c.Name = k
		c.Op = kmsg.IncrementalAlterConfigOpSet
		c.Value = kmsg.StringPtr(v)
		res.Configs = append(res.Configs, c)
	}
	req.Resources = append(req.Resources, res)
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		return fmt.Errorf("kafka: set configs of group %s: %w", group, err)
	}
	for _, r := range resp.Resources {
		if err := kerr.ErrorForCode(r.ErrorCode); err != nil {
			msg := ""
			if r.ErrorMessage != nil {
				msg = ": " + *r.ErrorMessage
			}
			return fmt.Errorf("kafka: set configs %v of group %s: %w%s", configs, group, err, msg)
		}
	}
	for wait := 5 * time.Millisecond; ; wait = min(2*wait, 200*time.Millisecond) {
		seen, err := GroupConfigsEverywhere(ctx, cl, group, configs)
		if err != nil {
			return fmt.Errorf("kafka: configs %v of group %s set: %w", configs, group, err)
		}
		if seen {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("kafka: configs %v of group %s set, and not yet seen by every broker: %w", configs, group, ctx.Err())
		case <-time.After(wait):
		}
	}
}

// GroupConfigsEverywhere reports whether every broker of the cluster
// describes group with the values of configs.
func GroupConfigsEverywhere(ctx context.Context, cl *kgo.Client, group string, configs map[string]string) (bool, error) {
	meta := kmsg.NewPtrMetadataRequest()
	meta.Topics = []kmsg.MetadataRequestTopic{} // none: brokers only
	mresp, err := meta.RequestWith(ctx, cl)
	if err != nil {
		return false, fmt.Errorf("kafka: list brokers: %w", err)
	}
	if len(mresp.Brokers) == 0 {
		return false, errors.New("kafka: list brokers: none")
	}
	for _, b := range mresp.Brokers {
		got, err := describeGroupConfigs(ctx, cl.Broker(int(b.NodeID)), group)
		if err != nil {
			return false, fmt.Errorf("broker %d: %w", b.NodeID, err)
		}
		for k, v := range configs {
			if g := got[k]; g == nil || *g != v {
				return false, nil
			}
		}
	}
	return true, nil
}
