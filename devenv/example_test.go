package devenv_test

import (
	"context"
	"log"
	"testing"

	"github.com/kafkaonce/kafkaonce/consumer"
	"github.com/kafkaonce/kafkaonce/devenv"
)

// A program that runs a consumer against whatever the machine offers:
// DATABASE_URL and KAFKA_BROKERS, or a throwaway cluster and an in-process
// broker.
func ExampleStart() {
	ctx := context.Background()
	env, err := devenv.Start(ctx)
	if err != nil {
		log.Fatal(err)
	}
	defer env.Close()
	log.Print(env) // where the database and the broker came from

	if _, err := consumer.Migrate(ctx, env.Pool, ""); err != nil {
		log.Fatal(err)
	}
	if err := env.CreateTopic(ctx, "credits", 3); err != nil {
		log.Fatal(err)
	}
	if err := env.Produce(ctx, "credits", devenv.Message{ID: "credit-1", Key: []byte("alice"), Value: []byte("5")}); err != nil {
		log.Fatal(err)
	}
	c, err := consumer.New(env.Pool, &consumer.Config{Name: "credits", Brokers: env.Brokers, Topics: []string{"credits"}, Handler: credit})
	if err != nil {
		log.Fatal(err)
	}
	_ = c.Run(ctx) // until ctx ends
}

// A test with a schema, a topic and a consumer name of its own: tests
// sharing one database and one broker never see each other's claims.
func ExampleForTest() {
	var t *testing.T // the test's
	env := devenv.ForTest(t)
	topic := env.Topic(3)
	if err := env.Produce(context.Background(), topic, devenv.Message{ID: "credit-1", Value: []byte("5")}); err != nil {
		t.Fatal(err)
	}
	cfg := &consumer.Config{Name: env.Name("credits"), Brokers: env.Brokers, Topics: []string{topic}, Schema: env.Schema, Handler: credit}
	_ = cfg // consumer.New(env.Pool, cfg), run it, and check its effects in env.Pool
}

var credit consumer.Handler
