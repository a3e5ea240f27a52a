// Package scripts_test checks that the scripts CI and developers run say
// why they fail: a failure with no output costs a newcomer an hour.
package scripts_test

import (
	"bytes"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strings"
	"testing"
)

func run(t *testing.T, script string, args ...string) (stderr string, err error) {
	t.Helper()
	cmd := exec.Command("./"+script, args...)
	var e bytes.Buffer
	cmd.Stderr = &e
	err = cmd.Run()
	return e.String(), err
}

// The report of issue 23: a directory the postgres user cannot reach made
// `start` exit 1 with no output.
func TestPostgresStartSaysWhenThePostgresUserCannotReachItsDirectory(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("only root hands the directory to the postgres user")
	}
	if _, err := user.Lookup("postgres"); err != nil {
		t.Skip("no postgres user")
	}
	parent := t.TempDir()
	if err := os.Chmod(parent, 0o700); err != nil { // root's alone: not searchable by postgres
		t.Fatal(err)
	}
	stderr, err := run(t, "postgres.sh", "start", "25999", filepath.Join(parent, "pg"))
	if err == nil {
		_, _ = run(t, "postgres.sh", "stop", filepath.Join(parent, "pg"))
		t.Fatal("start succeeded in a directory the postgres user cannot reach")
	}
	if !strings.Contains(stderr, "cannot reach") || !strings.Contains(stderr, "chmod 755") {
		t.Fatalf("start failed without saying why (exit %v); stderr:\n%s", err, stderr)
	}
}

func TestScriptsPrintTheirUsage(t *testing.T) {
	for _, script := range []string{"postgres.sh", "kafka-broker.sh"} {
		stderr, err := run(t, script, "no-such-command")
		if err == nil {
			t.Errorf("%s no-such-command: exit 0", script)
		}
		if !strings.Contains(stderr, "usage") && !strings.Contains(stderr, "Usage") {
			t.Errorf("%s no-such-command: no usage on stderr:\n%s", script, stderr)
		}
	}
}

func TestPostgresStartSaysWhenItCannotCreateItsDirectory(t *testing.T) {
	file := filepath.Join(t.TempDir(), "a-file")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	stderr, err := run(t, "postgres.sh", "start", "25998", filepath.Join(file, "pg"))
	if err == nil {
		t.Fatal("start succeeded under a file")
	}
	if !strings.Contains(stderr, "cannot create "+filepath.Join(file, "pg")) {
		t.Fatalf("start failed without saying why (exit %v); stderr:\n%s", err, stderr)
	}
}
