package main

import (
	"errors"
	"fmt"
	"io"

	"github.com/spf13/cobra"

	"github.com/kafkaonce/kafkaonce/offsets"
)

// topicRecreatedReport is what topic-recreated changed.
type topicRecreatedReport struct {
	Consumer       string `json:"consumer"`
	Topic          string `json:"topic"`
	Positions      int64  `json:"positions"`
	Dropped        int64  `json:"dropped"`
	RetiredClaims  int64  `json:"retired_claims"`
	RetiredLetters int64  `json:"retired_letters"`
	Attempts       int64  `json:"attempts"`
	Suffix         string `json:"suffix"`
	Kept           int64  `json:"kept"`
}

func topicRecreatedCmd(s *settings) *cobra.Command {
	var consumerName, topic string
	var partitions int
	cmd := &cobra.Command{
		Use:   "topic-recreated",
		Short: "Start a consumer afresh on a topic that was deleted and created again",
		Long: `topic-recreated is the step a topic's re-creation needs, run after the
topic is created again and before the consumer starts on it, with no member
of the consumer running: a re-created topic's offsets start at 0 again, and
its messages are other messages than the old topic's at the same offsets.

In one statement it sets the positions of the new topic's partitions (0 to
--partitions - 1) to 0 and deletes those of partitions it no longer has;
deletes the records of the old messages' failed attempts; and renames the
claims and dead letters of the old messages whose id was their position
(consumer.IDFromPosition: "topic/partition/offset"), which the new messages
repeat and would otherwise be set aside as conflicting copies of. Ids of any
other kind keep their claims: a producer's id names the same operation in
either topic. It reads the new topic's id from Kafka: partitions processed in
the new topic already (ones the old topic did not have) are left as they are,
and the others take the new topic's id at their next assignment.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			switch {
			case consumerName == "":
				return errors.New("--consumer is required: the consumer's Name")
			case topic == "":
				return errors.New("--topic is required: the topic that was re-created")
			case partitions < 1:
				return errors.New("--partitions is required: how many partitions the re-created topic has (at least 1)")
			}
			ctx := cmd.Context()
			c, err := s.connect(ctx, consumerName)
			if err != nil {
				return err
			}
			defer c.close()
			// The new topic's id: partitions whose position counts in it
			// already (processed since the re-creation) are left alone.
			bounds, err := c.admin.LogBounds(ctx, topic, []int{0})
			if err != nil {
				return fmt.Errorf("reading the re-created topic's id: %w", err)
			}
			store, err := offsets.NewStore(s.schema)
			if err != nil {
				return err
			}
			res, err := store.TopicRecreatedAs(ctx, c.pool, consumerName, topic, partitions, bounds[0].TopicID)
			if err != nil {
				return err
			}
			r := topicRecreatedReport{Consumer: consumerName, Topic: topic, Positions: res.Positions, Dropped: res.Dropped,
				RetiredClaims: res.RetiredClaims, RetiredLetters: res.RetiredLetters, Attempts: res.Attempts, Suffix: res.Suffix, Kept: res.Kept}
			return s.emit(r, func(w io.Writer) {
				fmt.Fprintf(w, "%s on %s starts afresh: %d positions set to 0, %d of partitions the topic no longer has deleted\n", r.Consumer, r.Topic, r.Positions, r.Dropped)
				if r.Kept > 0 {
					fmt.Fprintf(w, "%d partitions processed in the new topic already were left as they are\n", r.Kept)
				}
				fmt.Fprintf(w, "retired the position ids of the old topic's messages: %d claims and %d dead letters renamed with %q\n", r.RetiredClaims, r.RetiredLetters, r.Suffix)
				fmt.Fprintf(w, "deleted %d records of the old messages' failed attempts\n", r.Attempts)
			})
		},
	}
	cmd.Flags().StringVar(&consumerName, "consumer", "", "the consumer's Name (required)")
	cmd.Flags().StringVar(&topic, "topic", "", "the re-created topic (required)")
	cmd.Flags().IntVar(&partitions, "partitions", 0, "how many partitions the re-created topic has (required)")
	return cmd
}
