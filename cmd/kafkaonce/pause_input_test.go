package main

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestStatusShowsPauses: operations.md ("status lists the pauses and
// marks each partition a pause holds"), failures.md and Consumer.Pause's
// godoc ("kafkaonce status and the page show the pauses") promise that an
// operator sees who paused what, when and why.
func TestStatusShowsPauses(t *testing.T) {
	t.Parallel()
	w := newWorld(t, 1)
	w.produce(4, "s")
	w.runConsumer()
	waitUntilRecorded(t, w)
	_, errOut, code := w.cli("pause", "--consumer", w.name, "--topic", w.topic, "--by", "alice", "--reason", "mail partner down")
	require.Equal(t, 0, code, errOut)

	out, errOut, code := w.cli("status", "--consumer", w.name)
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "mail partner down", "status does not list the pause")
	out, errOut, code = w.cli("--json", "status", "--consumer", w.name)
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "mail partner down", "status --json does not list the pause")
}

// TestPauseRefusesWhatNoMemberWouldObey: text Postgres refuses is cleaned, a scope no
// Kafka partition can have is refused as a usage error (exit 2), and a
// topic the consumer does not record reading is refused ("its pause would
// hold nothing") — also when the --consumer named has recorded nothing at
// all (a typo of the consumer's name pauses nothing either).
func TestPauseRefusesWhatNoMemberWouldObey(t *testing.T) {
	t.Parallel()
	w := newWorld(t, 1)
	for _, c := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"pause", "--consumer", w.name, "--topic", "t\x00"}, 2, "holds a NUL byte"},
		{[]string{"pause", "--consumer", w.name, "--topic", "t\xff"}, 2, "not valid UTF-8"},
		{[]string{"pause", "--consumer", w.name, "--topic", w.topic, "--partition", "2147483648"}, 2, "past the largest partition number"},
		{[]string{"pause", "--consumer", w.name, "--unrecorded", "--reason", "a\x00b\xff" + strings.Repeat("é", 3000), "--by", "x\x00"}, 0, "paused every topic"},
		{[]string{"resume", "--consumer", w.name}, 0, "resumed every topic"},
		// Never started: it records no topics, and no member reads "typo".
		{[]string{"pause", "--consumer", w.name, "--topic", "typo"}, 2, "topic typo it never reads"},
		{[]string{"pause", "--consumer", w.name}, 2, "pass --unrecorded to pause a consumer before its first start"},
		{[]string{"pause", "--consumer", "no-such-consumer", "--topic", w.topic}, 2, "no-such-consumer"},
	} {
		out, errOut, code := w.cli(c.args...)
		assert.Equalf(t, c.code, code, "%q: exit code; out %q, err %q", c.args, out, errOut)
		assert.Containsf(t, out+errOut, c.want, "%q", c.args)
	}
	rows := w.db.Int(t, `SELECT count(*) FROM `+w.db.Table("pauses"))
	assert.Zero(t, rows, "pauses stored that no member obeys")
}

// waitUntilRecorded waits for the running consumer's record of its settings.
func waitUntilRecorded(t *testing.T, w *world) {
	t.Helper()
	waitUntil(t, 2*time.Minute, "the consumer running (its settings recorded at start)", func() bool { return w.position(0) == 4 })
}
