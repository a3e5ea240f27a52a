// Command sharegroup sends each notification once from a share group with
// more members than the topic has partitions:
//
//	go run ./examples/sharegroup
//
// The topic has one partition, and a consumer group could give it to one
// member only. Each notification waits on a partner (a slow API, 20 ms by
// default), so one member is slow however fast the database is. In a share
// group (KIP-932, consumer.ShareGroup) the broker hands each record to one
// of any number of members under an acquisition lock, so four worker
// processes share the partition. The handler "sends" the notification by
// writing a row to sent_notifications in the same transaction as
// kafkaonce's claim.
//
// Mid-run one worker process is killed with SIGKILL, holding records it
// had been handed and not settled; it is started again. The broker hands
// those records out again (when it sees the member gone, at the latest
// when their locks run out), and any the dead worker's transaction had
// committed are found claimed: the second delivery sends nothing.
// Notifications are also produced twice now and then, as a producer retry
// does. At the end every notification produced must have exactly one row.
//
// With no setup it uses an in-process Kafka broker and Postgres from
// DATABASE_URL, else local binaries. Progress goes to stderr; the last line
// on stdout is a JSON summary. The exit code is 0 only when every
// notification was sent once.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kafkaonce/kafkaonce/consumer"
	"github.com/kafkaonce/kafkaonce/devenv"
)

const schemaName = "sharegroup_example"

// workerEnv carries a worker process's configuration, as JSON: set, this
// program is a worker, not the run that starts them.
const workerEnv = "SHAREGROUP_EXAMPLE_WORKER"

// workerConfig is what a worker process is told by the run that starts it.
type workerConfig struct {
	Name        string   `json:"name"`
	DatabaseURL string   `json:"database_url"`
	Brokers     []string `json:"brokers"`
	Topic       string   `json:"topic"`
	Group       string   `json:"group"`
	PartnerWait string   `json:"partner_wait"`
}

// Notification is the event.
type Notification struct {
	ID   string `json:"id"`
	User string `json:"user"`
	Text string `json:"text"`
}

type summary struct {
	Postgres              string         `json:"postgres"`
	Kafka                 string         `json:"kafka"`
	Partitions            int            `json:"partitions"`
	Members               int            `json:"members"`
	Notifications         int            `json:"notifications"`
	EventsProduced        int            `json:"events_produced"`
	WorkerKills           int            `json:"worker_kills"`
	Sent                  int            `json:"sent"`
	SentTwice             int            `json:"sent_twice"`
	NotSent               int            `json:"not_sent"`
	SetAside              int            `json:"set_aside"`
	SentBy                map[string]int `json:"sent_by_member"`
	Seconds               float64        `json:"seconds"`
	EveryNotificationOnce bool           `json:"every_notification_sent_once"`
}

func main() {
	if raw := os.Getenv(workerEnv); raw != "" {
		var cfg workerConfig
		if err := json.Unmarshal([]byte(raw), &cfg); err != nil {
			log.Fatalf("%s: %v", workerEnv, err)
		}
		if err := runWorker(cfg); err != nil {
			log.Fatal(err)
		}
		return
	}
	n := flag.Int("notifications", 400, "notifications to send")
	members := flag.Int("members", 4, "worker processes in the share group (the topic has one partition)")
	dupEvery := flag.Int("duplicate-every", 9, "produce every Nth notification twice")
	wait := flag.Duration("partner-wait", 20*time.Millisecond, "how long each send waits on its partner")
	applyEnv := devenv.RegisterFlags(flag.CommandLine)
	flag.Parse()
	applyEnv()
	log.SetFlags(0)
	log.SetPrefix("[sharegroup] ")
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	s, err := run(ctx, *n, *members, *dupEvery, *wait)
	if err != nil {
		log.Fatal(err)
	}
	out, _ := json.Marshal(s)
	fmt.Println(string(out))
	if !s.EveryNotificationOnce {
		os.Exit(1)
	}
}

func run(ctx context.Context, n, members, dupEvery int, wait time.Duration) (summary, error) {
	s := summary{Partitions: 1, Members: members}
	env, err := devenv.Start(ctx)
	if err != nil {
		return s, err
	}
	defer env.Close()
	env.Own(schemaName) // dropped when the example ends, unless -keep
	log.Print(env)
	pool := env.Pool
	s.Postgres, s.Kafka = env.PostgresSource, env.KafkaSource
	if _, err := pool.Exec(ctx, `DROP SCHEMA IF EXISTS `+schemaName+` CASCADE`); err != nil {
		return s, err
	}
	if _, err := consumer.Migrate(ctx, pool, schemaName); err != nil {
		return s, err
	}
	// No unique key on purpose: a notification sent twice would be two
	// rows, and the check below would count it.
	if _, err := pool.Exec(ctx, `CREATE TABLE `+schemaName+`.sent_notifications (
		notification_id text NOT NULL, user_id text NOT NULL, member text NOT NULL, sent_at timestamptz NOT NULL DEFAULT now())`); err != nil {
		return s, err
	}

	runID := strconv.FormatInt(time.Now().UnixNano(), 36)
	topic, group := "notifications-"+runID, "notifier-"+runID
	if err := env.CreateTopic(ctx, topic, 1); err != nil {
		return s, err
	}
	// A share group starts at the log's end unless told otherwise, and
	// the notifications are produced before its members start.
	if err := env.SetShareStart(ctx, group, "earliest"); err != nil {
		return s, err
	}
	var msgs []devenv.Message
	for i := range n {
		e := Notification{ID: fmt.Sprintf("ntf-%s-%05d", runID, i), User: fmt.Sprintf("user-%03d", i%97), Text: fmt.Sprintf("Your parcel %d has shipped", i)}
		v, _ := json.Marshal(e)
		m := devenv.Message{ID: e.ID, Key: []byte(e.User), Value: v}
		msgs = append(msgs, m)
		if dupEvery > 0 && i%dupEvery == 0 {
			msgs = append(msgs, m) // a producer retry
		}
	}
	if err := env.Produce(ctx, topic, msgs...); err != nil {
		return s, err
	}
	s.Notifications, s.EventsProduced = n, len(msgs)
	log.Printf("produced %d events for %d notifications on a topic of one partition", len(msgs), n)

	started := time.Now()
	workers := make([]*workerProcess, members)
	for i := range workers {
		workers[i] = &workerProcess{cfg: workerConfig{Name: fmt.Sprintf("member-%d", i+1), DatabaseURL: env.DatabaseURL,
			Brokers: env.Brokers, Topic: topic, Group: group, PartnerWait: wait.String()}}
		if err := workers[i].start(); err != nil {
			return s, err
		}
		defer workers[i].stop()
	}

	sent := func() (rows, distinct int, err error) {
		err = pool.QueryRow(ctx, `SELECT count(*), count(DISTINCT notification_id) FROM `+schemaName+`.sent_notifications`).Scan(&rows, &distinct)
		return rows, distinct, err
	}
	// A third of the way through, the first worker is killed, and started
	// again.
	killed := false
	deadline := time.Now().Add(3 * time.Minute)
	for {
		rows, distinct, err := sent()
		if err != nil {
			return s, err
		}
		if !killed && distinct >= n/3 {
			log.Printf("%d of %d notifications sent: killing %s with SIGKILL", distinct, n, workers[0].cfg.Name)
			if err := workers[0].kill(); err != nil {
				return s, err
			}
			s.WorkerKills++
			killed = true
			if err := workers[0].start(); err != nil {
				return s, err
			}
			log.Printf("%s started again; the records it held are handed out again", workers[0].cfg.Name)
		}
		if killed && distinct >= n {
			break
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return s, fmt.Errorf("stopped with %d of %d notifications sent (%d rows)", distinct, n, rows)
		}
		log.Printf("sent %d/%d", distinct, n)
		time.Sleep(time.Second)
	}
	s.Seconds = time.Since(started).Seconds()
	// Every notification is sent: a while more, for any late second send
	// to show, then the members stop.
	time.Sleep(2 * time.Second)
	for _, w := range workers {
		w.stop()
	}

	s.SentBy = map[string]int{}
	rows, err := pool.Query(ctx, `SELECT member, count(*) FROM `+schemaName+`.sent_notifications GROUP BY member ORDER BY member`)
	if err != nil {
		return s, err
	}
	for rows.Next() {
		var m string
		var c int
		if err := rows.Scan(&m, &c); err != nil {
			return s, err
		}
		s.SentBy[m] = c
	}
	if err := rows.Err(); err != nil {
		return s, err
	}
	var distinct int
	if s.Sent, distinct, err = sent(); err != nil {
		return s, err
	}
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM (SELECT 1 FROM `+schemaName+`.sent_notifications GROUP BY notification_id HAVING count(*) > 1) t`).Scan(&s.SentTwice); err != nil {
		return s, err
	}
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM `+schemaName+`.dead_letters`).Scan(&s.SetAside); err != nil {
		return s, err
	}
	s.NotSent = n - distinct
	s.EveryNotificationOnce = s.Sent == n && s.SentTwice == 0 && s.NotSent == 0 && s.SetAside == 0
	log.Printf("%d notifications, %d sent (%d twice, %d not at all), %d set aside, by member %v, in %.1fs",
		n, s.Sent, s.SentTwice, s.NotSent, s.SetAside, s.SentBy, s.Seconds)
	return s, nil
}

// runWorker is a worker process: one member of the share group, sending
// each notification it is handed, until it is stopped or killed.
func runWorker(cfg workerConfig) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	log.SetFlags(0)
	log.SetPrefix(fmt.Sprintf("[%s %d] ", cfg.Name, os.Getpid()))
	wait, err := time.ParseDuration(cfg.PartnerWait)
	if err != nil {
		return err
	}
	pool, err := pgxpool.New(ctx, cfg.DatabaseURL)
	if err != nil {
		return err
	}
	defer pool.Close()
	c, err := consumer.New(pool, &consumer.Config{
		Name: "notifier", GroupID: cfg.Group, Brokers: cfg.Brokers, Topics: []string{cfg.Topic}, Schema: schemaName,
		GroupType: consumer.ShareGroup,
		// A small batch: what a killed member holds is what it was handed.
		MaxBatch: 10,
		Logger:   slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError})),
		Handler: consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
			var e Notification
			if err := json.Unmarshal(m.Value, &e); err != nil {
				return consumer.Permanent(err)
			}
			// The partner (a push or SMS API) takes its time.
			select {
			case <-time.After(wait):
			case <-ctx.Done():
				return ctx.Err()
			}
			_, err := tx.Exec(ctx, `INSERT INTO `+schemaName+`.sent_notifications (notification_id, user_id, member) VALUES ($1, $2, $3)`,
				e.ID, e.User, cfg.Name)
			return err
		}),
	})
	if err != nil {
		return err
	}
	return c.Run(ctx)
}

// workerProcess is a worker, a process of its own, so that it can be
// killed as a real one is.
type workerProcess struct {
	cfg workerConfig
	cmd *exec.Cmd
}

func (w *workerProcess) start() error {
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	raw, _ := json.Marshal(w.cfg)
	w.cmd = exec.Command(exe)
	w.cmd.Env = append(os.Environ(), workerEnv+"="+string(raw))
	w.cmd.Stderr = os.Stderr
	if err := w.cmd.Start(); err != nil {
		return fmt.Errorf("start %s: %w", w.cfg.Name, err)
	}
	return nil
}

// kill kills the worker with SIGKILL: no deferred call, no shutdown, its
// transaction and its records' locks left where they were.
func (w *workerProcess) kill() error {
	if err := w.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		return err
	}
	_ = w.cmd.Wait()
	return nil
}

// stop stops the worker gracefully.
func (w *workerProcess) stop() {
	if w.cmd == nil || w.cmd.ProcessState != nil {
		return
	}
	_ = w.cmd.Process.Signal(syscall.SIGTERM)
	_ = w.cmd.Wait()
}
