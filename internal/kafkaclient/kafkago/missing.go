package kafkago

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/segmentio/kafka-go"
)

// kafka-go's ConsumerGroup cannot run a generation while one of its topics
// is missing: every generation fails as it starts, is assigned nothing and
// joins again, for ever, and the other topics are never fetched again. It
// says so only to its error logger. So every time it complains, the
// brokers are asked whether the group's topics exist: one that stays
// missing ends RunGroup with a *MissingTopicError, and one that comes back
// (re-created) makes the member join again, to be assigned it.

// MissingTopicError ends RunGroup when topics of the group do not exist.
type MissingTopicError struct{ Topics []string }

func (e *MissingTopicError) Error() string {
	return fmt.Sprintf("kafkago: topic %s does not exist (deleted?); kafka-go's consumer group cannot run without it and would rejoin for ever, processing none of the other topics. Create it again, take it out of Config.Topics, or use the franz-go client (consumer.FranzGo), whose group goes on with the other topics",
		strings.Join(e.Topics, ", "))
}

// missingCheckEvery bounds how often kafka-go's complaints lead to a look
// at the brokers' metadata; missingFor is how long a topic must stay
// missing before the run ends, so that an operator who deletes a topic
// and creates it again at once (the stored positions then tell the new
// topic from the old) does not stop the consumer.
const (
	missingCheckEvery = time.Second
	missingFor        = 5 * time.Second
)

// topicWatch connects a group run with the watch of its topics.
type topicWatch struct {
	// complaints is signalled when kafka-go logs an error; rejoin by the
	// watch when a topic that was missing exists again.
	complaints, rejoin chan struct{}
}

func (w *topicWatch) complain() { signal(w.complaints) }

func signal(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// watchTopics asks the brokers whether topics exist each time kafka-go
// complains, and every missingCheckEvery while one is missing, until ctx
// is done. It calls found with the topics missing at every look for
// missingFor, and asks w for a rejoin when a missing topic exists again:
// a member whose last assignment was made while the topic was missing was
// assigned none of it, and kafka-go's partition watch, which compares
// partition counts from its own first look on, would never notice.
func (c *Client) watchTopics(ctx context.Context, topics []string, w *topicWatch, found func(*MissingTopicError)) {
	since := map[string]time.Time{} // when each missing topic was first seen missing
	for {
		if len(since) == 0 {
			select {
			case <-ctx.Done():
				return
			case <-w.complaints:
			}
		}
		if missing, err := c.missingTopics(ctx, topics); err == nil {
			now, gone, back := time.Now(), []string(nil), false
			for t := range since {
				if !slices.Contains(missing, t) {
					delete(since, t)
					back = true
				}
			}
			for _, t := range missing {
				if _, ok := since[t]; !ok {
					since[t] = now
				}
				if now.Sub(since[t]) >= missingFor {
					gone = append(gone, t)
				}
			}
			if len(gone) > 0 {
				found(&MissingTopicError{Topics: gone})
				return
			}
			if back {
				signal(w.rejoin)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(missingCheckEvery):
		}
	}
}

// missingTopics returns the topics the brokers say they do not have.
func (c *Client) missingTopics(ctx context.Context, topics []string) ([]string, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	meta, err := c.admin.Metadata(ctx, &kafka.MetadataRequest{Topics: topics})
	if err != nil {
		return nil, err
	}
	var missing []string
	for _, t := range meta.Topics {
		if errors.Is(t.Error, kafka.UnknownTopicOrPartition) {
			missing = append(missing, t.Name)
		}
	}
	return missing, nil
}
