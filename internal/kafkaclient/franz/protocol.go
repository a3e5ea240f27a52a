package franz

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kafkaonce/kafkaonce/internal/kafkaclient"
	"github.com/kafkaonce/kafkaonce/kafkaoncetype"
)

// The consumer group protocol (KIP-848) is asked for, never assumed: kgo
// takes kgo.ServerSideBalancer as a wish, and speaks the classic protocol
// without a word when a broker does not advertise ConsumerGroupHeartbeat
// v1 or answers it UNSUPPORTED_VERSION (a 4.x broker whose
// group.coordinator.rebalance.protocols leaves "consumer" out). A member
// that asked for the consumer protocol therefore checks twice, each time
// against what a broker says: before joining, that the cluster serves the
// protocol (so that a member that cannot have it does not join the group
// as a classic member and rebalance the others); and once it has joined,
// that the group coordinator describes it as a consumer-protocol member,
// before it takes any partition.

// consumerProtocolVersion is the ConsumerGroupHeartbeat version kgo speaks
// the protocol in (v1, Kafka 4.0: member ids the client makes, and the
// protocol generally available).
const consumerProtocolVersion = 1

// ErrConsumerProtocolUnavailable is wrapped by RunGroup's error when the
// member asked for the consumer group protocol and the cluster does not
// give it.
var ErrConsumerProtocolUnavailable = kafkaoncetype.ErrConsumerProtocolUnavailable

// CheckConsumerProtocolServed asks a broker which versions of
// ConsumerGroupHeartbeat it serves: nil when it serves the version kgo
// speaks, else an error wrapping ErrConsumerProtocolUnavailable that says
// what the broker serves (or the request's own error). Exported for the
// benchmark, which leaves the consumer protocol's rows out on such a
// broker.
func CheckConsumerProtocolServed(ctx context.Context, cl *kgo.Client) error {
	ctx, cancel := kafkaclient.Bounded(ctx)
	defer cancel()
	resp, err := kmsg.NewPtrApiVersionsRequest().RequestWith(ctx, cl)
	if err != nil {
		return fmt.Errorf("franz: asking a broker for its API versions: %w", err)
	}
	if err := kerr.ErrorForCode(resp.ErrorCode); err != nil {
		return fmt.Errorf("franz: asking a broker for its API versions: %w", err)
	}
	served := int16(-1)
	for _, k := range resp.ApiKeys {
		if k.ApiKey == int16(kmsg.ConsumerGroupHeartbeat) {
			served = k.MaxVersion
		}
	}
	if served >= consumerProtocolVersion {
		return nil
	}
	what := "does not serve ConsumerGroupHeartbeat"
	if served >= 0 {
		what = fmt.Sprintf("serves ConsumerGroupHeartbeat only up to version %d", served)
	}
	return fmt.Errorf("franz: %w: GroupProtocol ConsumerProtocol needs Kafka 4.0 or later (4.3 or later recommended), and the broker %s (version %d is needed); upgrade the brokers, or leave GroupProtocol at ClassicProtocol", ErrConsumerProtocolUnavailable, what, consumerProtocolVersion)
}

// confirmConsumerMember waits until cl has joined its group, then asks the
// group coordinator how it describes the member, until it has an answer:
// nil for a consumer-protocol member of a consumer group, the error that
// says why not, or ctx's error. A describe that fails (a coordinator
// moving, a request timing out), or one that does not list the member yet
// (it rejoined under a new id meanwhile), is asked again.
func confirmConsumerMember(ctx context.Context, cl *kgo.Client, group string, log *slog.Logger) error {
	wait := 100 * time.Millisecond
	for {
		member, err := joinedAs(ctx, cl)
		if err != nil {
			return err
		}
		answer, err := describeMember(ctx, cl, group, member)
		if err == nil {
			return answer
		}
		log.Warn("consumer group: asking the group coordinator about this member failed; asking again", slog.String("error", err.Error()))
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(wait):
		}
		wait = min(2*wait, 5*time.Second)
	}
}

// describeMember asks the group coordinator about member: answer is nil
// for a consumer-protocol member, or says why the member is not one; err
// is a describe that did not answer the question.
func describeMember(ctx context.Context, cl *kgo.Client, group, member string) (answer, err error) {
	ctx, cancel := kafkaclient.Bounded(ctx)
	defer cancel()
	described, err := kadm.NewClient(cl).DescribeConsumerGroups(ctx, group)
	if err == nil {
		err = described.Error()
	}
	switch {
	case errors.Is(err, kerr.GroupIDNotFound), errors.Is(err, kerr.UnsupportedVersion):
		return fmt.Errorf("franz: %w: the group coordinator does not describe group %s as a consumer group (%w): the broker speaks the classic protocol to this member (Kafka 4.x with \"consumer\" left out of group.coordinator.rebalance.protocols?); leave GroupProtocol at ClassicProtocol or enable the protocol on the brokers", ErrConsumerProtocolUnavailable, group, err), nil
	case err != nil:
		return nil, fmt.Errorf("franz: describe consumer group %s: %w", group, err)
	}
	for _, m := range described[group].Members {
		if m.MemberID != member {
			continue
		}
		if m.MemberType == 0 {
			return fmt.Errorf("franz: %w: the group coordinator describes member %s of group %s as a classic member; leave GroupProtocol at ClassicProtocol or enable the protocol on the brokers", ErrConsumerProtocolUnavailable, member, group), nil
		}
		return nil, nil
	}
	return nil, fmt.Errorf("franz: the group coordinator does not list member %s among group %s's members yet", member, group)
}

// joinedAs waits until cl is a member of its group in an epoch (or, had kgo
// fallen back, a generation) and returns its member id.
func joinedAs(ctx context.Context, cl *kgo.Client) (string, error) {
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		if member, epoch := cl.GroupMetadata(); member != "" && epoch > 0 {
			return member, nil
		}
		select {
		case <-ctx.Done():
			return "", ctx.Err()
		case <-tick.C:
		}
	}
}

// leaveStatic leaves the group for a while as the static member member,
// which the consumer protocol asks of a static member that stops (a
// heartbeat at epoch -2, naming its instance id): the broker keeps its
// partitions for it, and the member that restarts with the instance id
// takes them back at once. kgo sends that heartbeat as it closes without
// the instance id, which Kafka refuses (INVALID_REQUEST: "InstanceId can't
// be null"; kfake takes it), and drops the error: the restarted member
// would then be refused (UNRELEASED_INSTANCE_ID) until the old one's
// session ends, and its partitions would move to the other members. So
// the member sends it again, whole, from the client that outlives it,
// once kgo has stopped heartbeating for it, within what is left of ctx
// (the leave's own bound).
func (c *Client) leaveStatic(ctx context.Context, member string) {
	if member == "" {
		return
	}
	g := c.cfg.Group
	req := kmsg.NewPtrConsumerGroupHeartbeatRequest()
	req.Group = g.ID
	req.MemberID = member
	req.MemberEpoch = -2
	req.InstanceID = kmsg.StringPtr(g.InstanceID)
	resp, err := req.RequestWith(ctx, c.admin)
	if err == nil {
		err = kerr.ErrorForCode(resp.ErrorCode)
	}
	// A member the broker no longer knows (its session ended, or kgo's
	// own leave went through) has nothing left to leave.
	if err != nil && !errors.Is(err, kerr.UnknownMemberID) && !errors.Is(err, kerr.GroupIDNotFound) {
		c.log.Warn("consumer group: leaving as a static member failed; the instance's partitions wait for its session to end",
			slog.String("instance", g.InstanceID), slog.String("error", err.Error()))
	}
}
