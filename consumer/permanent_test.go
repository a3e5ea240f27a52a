package consumer_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kafkaonce/kafkaonce/consumer"
	"github.com/kafkaonce/kafkaonce/outbox"
)

func TestIsPermanentSeesTheMarkThroughWrapping(t *testing.T) {
	t.Parallel()
	bad := errors.New("not json")
	require.True(t, consumer.IsPermanent(consumer.Permanent(bad)))
	require.True(t, consumer.IsPermanent(fmt.Errorf("decode order: %w", consumer.Permanent(bad))), "wrapped by the handler")
	require.True(t, consumer.IsPermanent(outbox.Permanent(bad)), "one mark for both packages")
	require.False(t, consumer.IsPermanent(bad))
	require.False(t, consumer.IsPermanent(nil))
	require.False(t, consumer.IsPermanent(consumer.Permanent(nil)))
}
