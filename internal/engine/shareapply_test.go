package engine

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kafkaonce/kafkaonce/kafkaoncetype"
)

// A share run's next transaction: no savepoint until a handler failed (a
// savepoint is a round trip per call), then every call in one; one record
// per transaction once a COMMIT over several was refused; the records to
// set aside, and those without an id, marked.
func TestShareRunPlan(t *testing.T) {
	poison := &failure{class: classPermanent, err: errors.New("partner says no")}
	msgAt := func(offset int64) kafkaoncetype.Message { return kafkaoncetype.Message{Topic: "jobs", Offset: offset} }
	items := func() []item {
		return []item{{msg: msgAt(10)}, {msg: msgAt(11)}, {msg: msgAt(12), idErr: errors.New("no id")}, {msg: msgAt(13)}}
	}
	cases := []struct {
		name    string
		run     shareRun
		batched bool
		want    plan
		letters []int
	}{
		{"a Handler that has not failed: no savepoint", shareRun{}, false, plan{n: 4, savepointFrom: 4}, []int{2}},
		{"a Handler that failed: every call in a savepoint", shareRun{failed: true}, false, plan{n: 4, savepointFrom: 0}, []int{2}},
		{"a BatchHandler: one call, no savepoint", shareRun{}, true, plan{n: 4, savepointFrom: 4}, []int{2}},
		{"a BatchHandler whose call failed over several: one call each, in a savepoint", shareRun{isolated: true}, true, plan{n: 4, savepointFrom: 0}, []int{2}},
		{"a Handler's failure does not isolate a BatchHandler", shareRun{failed: true}, true, plan{n: 4, savepointFrom: 4}, []int{2}},
		{"a COMMIT refused over several: one record per transaction", shareRun{oneByOne: true}, false, plan{n: 1, savepointFrom: 4}, nil},
		{"a record to set aside", shareRun{setAside: map[int64]*failure{11: poison}}, false, plan{n: 4, savepointFrom: 4}, []int{1, 2}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := c.run
			r.items = items()
			p := r.plan(c.batched)
			require.Equal(t, c.want.n, p.n, "records in the transaction")
			require.Equal(t, c.want.savepointFrom, p.savepointFrom, "savepoints from")
			var letters []int
			for i := range p.n {
				if p.deadLetter[i] != nil {
					letters = append(letters, i)
				}
			}
			require.Equal(t, c.letters, letters, "set aside")
		})
	}
}
