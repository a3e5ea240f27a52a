package examples_test

import (
	"bufio"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestEveryExampleStopsOnSIGTERM: Kubernetes and systemd stop a process
// with SIGTERM, not Ctrl-C. Each example, started with nothing set up (so
// it starts a throwaway Postgres of its own), is sent SIGTERM mid-run: it
// must exit by itself, promptly, and leave no server behind.
func TestEveryExampleStopsOnSIGTERM(t *testing.T) {
	if testing.Short() {
		t.Skip("starts five throwaway clusters: skipped with -short")
	}
	// Counts large enough that each is still running when the signal comes.
	runs := map[string][]string{
		"quickstart":    {"-messages", "5000000"},
		"ledger":        {"-transfers", "5000000"},
		"notifications": {"-orders", "500000"},
		"payments":      {"-payments", "500000"},
		"sharegroup":    {"-notifications", "200000"},
	}
	bin := t.TempDir()
	for name, args := range runs {
		t.Run(name, func(t *testing.T) {
			exe := filepath.Join(bin, name)
			goCmd(t, ".", "build", "-o", exe, "./"+name)
			// The cluster runs as the postgres user when the test is root:
			// its directory must be one that user can reach.
			tmp, err := os.MkdirTemp("", "kafkaonce-sigterm-")
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { os.RemoveAll(tmp) })
			if err := os.Chmod(tmp, 0o755); err != nil {
				t.Fatal(err)
			}
			cmd := exec.Command(exe, args...)
			cmd.Env = append(withoutEnv("DATABASE_URL", "KAFKA_BROKERS"), "TMPDIR="+tmp)
			stderr, err := cmd.StderrPipe()
			if err != nil {
				t.Fatal(err)
			}
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = cmd.Process.Kill() })

			// The example says where its database came from once it has
			// one: from then on it owns a running server.
			started, ended := make(chan struct{}), make(chan string, 1)
			go func() {
				s := bufio.NewScanner(stderr)
				var said []string
				for s.Scan() {
					said = append(said, s.Text())
					if strings.Contains(s.Text(), "postgres: local binaries") {
						close(started)
						break
					}
				}
				for s.Scan() {
				}
				ended <- strings.Join(said, "\n")
			}()
			select {
			case <-started:
			case said := <-ended:
				t.Fatalf("the example ended before it said it had a database:\n%s", said)
			case <-time.After(2 * time.Minute):
				t.Fatal("the example never said it had a database")
			}
			time.Sleep(time.Second) // mid-run, not at its first step
			if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
				t.Fatal(err)
			}
			exited := make(chan error, 1)
			go func() { exited <- cmd.Wait() }()
			select {
			case err := <-exited:
				var ee *exec.ExitError
				if errors.As(err, &ee) {
					if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
						t.Fatalf("SIGTERM killed the example instead of stopping it: %v", err)
					}
				}
			case <-time.After(time.Minute):
				t.Fatal("the example did not stop within a minute of SIGTERM")
			}
			requireNoServerUnder(t, tmp)
		})
	}
}

// withoutEnv is the environment without the variables named.
func withoutEnv(names ...string) []string {
	var env []string
	for _, kv := range os.Environ() {
		keep := true
		for _, n := range names {
			if strings.HasPrefix(kv, n+"=") {
				keep = false
			}
		}
		if keep {
			env = append(env, kv)
		}
	}
	return env
}

// requireNoServerUnder fails when a process still runs whose command line
// names dir (a Postgres server started from a data directory in it), or
// when a throwaway cluster's directory is left in it.
func requireNoServerUnder(t *testing.T, dir string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
		var left []string
		for _, p := range procs {
			b, err := os.ReadFile(p)
			if err == nil && strings.Contains(string(b), dir) {
				left = append(left, strings.ReplaceAll(string(b), "\x00", " "))
			}
		}
		clusters, _ := filepath.Glob(filepath.Join(dir, "kafkaonce-pg-*"))
		if len(left) == 0 && len(clusters) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("left behind after SIGTERM: processes %q, cluster directories %q", left, clusters)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
