package kafkago

import (
	"context"
	"net"
	"strconv"

	kgosasl "github.com/segmentio/kafka-go/sasl"
	"github.com/twmb/franz-go/pkg/sasl"
)

// mechanism lets kafka-go authenticate with a franz-go SASL mechanism, so
// that both clients speak every mechanism kafkaonce offers from one
// implementation of each.
type mechanism struct{ m sasl.Mechanism }

func (m mechanism) Name() string { return m.m.Name() }

func (m mechanism) Start(ctx context.Context) (kgosasl.StateMachine, []byte, error) {
	host := ""
	if md := kgosasl.MetadataFromContext(ctx); md != nil {
		host = net.JoinHostPort(md.Host, strconv.Itoa(md.Port))
	}
	sess, first, err := m.m.Authenticate(ctx, host)
	if err != nil {
		return nil, nil, err
	}
	return session{sess}, first, nil
}

type session struct{ s sasl.Session }

func (s session) Next(_ context.Context, challenge []byte) (bool, []byte, error) {
	return s.s.Challenge(challenge)
}
