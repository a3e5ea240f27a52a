package main

import (
	"fmt"
	"io"
	"time"

	"github.com/kafkaonce/kafkaonce/pauses"
)

// printPauses shows the consumer's pauses.
func printPauses(w io.Writer, r statusReport) {
	for _, p := range r.Pauses {
		fmt.Fprintf(w, "PAUSED %s since %s %s by %s", p.Scope, p.Since.UTC().Format(time.RFC3339), pauseEnd(p.Until), orDash(p.By))
		if p.Reason != "" {
			fmt.Fprintf(w, ": %s", firstLine(p.Reason))
		}
		fmt.Fprintf(w, " (kafkaonce resume --consumer %s%s)\n", r.Consumer, scopeFlags(scopeOfView(p)))
	}
}

func scopeOfView(p pauseView) pauses.Scope {
	switch {
	case p.Topic == "":
		return pauses.All()
	case p.Partition < 0:
		return pauses.Topic(p.Topic)
	}
	return pauses.Partition(p.Topic, p.Partition)
}
