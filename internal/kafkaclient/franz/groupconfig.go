package franz

import (
	"context"
	"fmt"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// Group configs (KIP-848, KIP-932) are set per group with
// IncrementalAlterConfigs and read with DescribeConfigs, on the GROUP
// resource; kadm has no calls for them (v1.18), so these speak kmsg. Any
// broker answers them.

// GroupConfigs reads a group's configs: the value of each, nil for one the
// broker describes without a value (unset, on brokers that do not fill in
// the default).
func GroupConfigs(ctx context.Context, cl *kgo.Client, group string) (map[string]*string, error) {
	req := kmsg.NewPtrDescribeConfigsRequest()
	res := kmsg.NewDescribeConfigsRequestResource()
	res.ResourceType = kmsg.ConfigResourceTypeGroupConfig
	res.ResourceName = group
	req.Resources = append(req.Resources, res)
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		return nil, fmt.Errorf("kafka: describe configs of group %s: %w", group, err)
	}
	if len(resp.Resources) != 1 {
		return nil, fmt.Errorf("kafka: describe configs of group %s: %d resources in the answer", group, len(resp.Resources))
	}
	r := resp.Resources[0]
	if err := kerr.ErrorForCode(r.ErrorCode); err != nil {
		return nil, fmt.Errorf("kafka: describe configs of group %s: %w", group, err)
	}
	out := make(map[string]*string, len(r.Configs))
	for _, c := range r.Configs {
		out[c.Name] = c.Value
	}
	return out, nil
}

// SetGroupConfigs sets configs of a group, leaving its others as they are.
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
	return nil
}
