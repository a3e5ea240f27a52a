// Command kafkaonce-httpbench measures what package idempotency costs an
// HTTP API: a trivial endpoint that inserts a row, served behind the
// middleware and served plain (its own transaction, no key), side by side
// in one run on loopback, in interleaved rounds. It prints a table and the
// ratios, and with -markdown writes them into BENCHMARKS.md between the
// markers that kafkaonce-bench keeps when it rewrites the file.
//
//	go run ./cmd/kafkaonce-httpbench [-seconds 5] [-rounds 3] [-clients 16] [-markdown BENCHMARKS.md]
//
// Postgres is DATABASE_URL's, or a throwaway local cluster.
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"os"
	"time"

	"github.com/kafkaonce/kafkaonce/internal/devenv"
)

func main() {
	seconds := flag.Float64("seconds", 5, "how long each mode runs in each round")
	rounds := flag.Int("rounds", 3, "rounds of interleaved runs")
	clients := flag.Int("clients", 16, "concurrent clients at full load")
	markdown := flag.String("markdown", "", "write the results into this BENCHMARKS.md (between its http markers)")
	flag.Parse()
	ctx := context.Background()
	pg, err := devenv.StartPostgres(ctx, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer pg.Close()
	b, err := newBench(ctx, pg.URL, *clients)
	if err != nil {
		log.Fatal(err)
	}
	defer b.close()
	res, err := b.run(ctx, time.Duration(*seconds*float64(time.Second)), *rounds)
	if err != nil {
		log.Fatal(err)
	}
	res.print(os.Stdout)
	if *markdown != "" {
		if err := res.writeMarkdown(*markdown, pg.Source); err != nil {
			log.Fatal(err)
		}
		fmt.Fprintf(os.Stderr, "wrote the HTTP section of %s\n", *markdown)
	}
}
