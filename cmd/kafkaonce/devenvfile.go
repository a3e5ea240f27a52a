package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// devEnvFile is where a running kafkaonce dev keeps the line to export, so
// that dev --print-env, in another terminal, prints it and exits: the
// output of dev itself never ends while dev runs, so an eval of it would
// wait for good. One file per pair of ports, so that two devs on other
// ports do not meet; in $XDG_RUNTIME_DIR (private to the user) when set,
// else the temporary directory.
func devEnvFile(s *settings, pgPort, kafkaPort int) string {
	dir := s.st.getenv("XDG_RUNTIME_DIR")
	if dir == "" {
		dir = os.TempDir()
	}
	return filepath.Join(dir, fmt.Sprintf("kafkaonce-dev-%d-%d.env", pgPort, kafkaPort))
}

// devPIDPrefix starts the file's second line: the pid of the dev that
// wrote it, which --print-env checks is still running.
const devPIDPrefix = "# kafkaonce dev pid "

// writeDevEnv writes exports to path for --print-env, readable by the user
// alone (the line holds the database URL), and returns a func that removes
// the file if it is still this process's.
func writeDevEnv(path, exports string) (remove func(), err error) {
	content := exports + "\n" + devPIDPrefix + strconv.Itoa(os.Getpid()) + "\n"
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(content), 0o600); err != nil {
		return nil, fmt.Errorf("dev: write %s for --print-env: %w", path, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		_ = os.Remove(tmp)
		return nil, fmt.Errorf("dev: write %s for --print-env: %w", path, err)
	}
	return func() {
		if b, err := os.ReadFile(path); err == nil && string(b) == content {
			_ = os.Remove(path)
		}
	}, nil
}

// readDevEnv returns the line to export of the dev running on the ports
// whose file is path: an error that says how to start one when none runs
// (no file, or one left by a dev that was killed).
func readDevEnv(path string, pgPort, kafkaPort int) (string, error) {
	notRunning := fmt.Errorf("no kafkaonce dev is running on ports %d and %d: start one in another terminal (kafkaonce dev --pg-port %d --kafka-port %d), or give the ports of the one that runs",
		pgPort, kafkaPort, pgPort, kafkaPort)
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return "", notRunning
	}
	if err != nil {
		return "", fmt.Errorf("dev: read %s: %w", path, err)
	}
	exports, rest, _ := strings.Cut(string(b), "\n")
	pid, err := strconv.Atoi(strings.TrimSpace(strings.TrimPrefix(rest, devPIDPrefix)))
	if !strings.HasPrefix(exports, "export ") || !strings.HasPrefix(rest, devPIDPrefix) || err != nil {
		return "", fmt.Errorf("dev: %s is not a file kafkaonce dev wrote: remove it, and start dev again", path)
	}
	if !running(pid) {
		_ = os.Remove(path)
		return "", notRunning
	}
	return exports, nil
}

// running reports whether a process of pid runs (one of another user's
// counts: signal 0 is refused, not unanswered).
func running(pid int) bool {
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}
