package devenv

import (
	"context"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// fakeDocker puts a docker command on PATH that answers as an engine would,
// publishing the container's port at addr, and records every call in the
// returned log file. No Docker engine is needed: what is tested is how this
// package drives the command.
func fakeDocker(t *testing.T, addr string) (calls string) {
	t.Helper()
	dir := t.TempDir()
	calls = filepath.Join(dir, "calls")
	script := `#!/bin/sh
echo "$*" >> ` + calls + `
case "$1" in
version) echo 27.3.1 ;;
run) echo "Unable to find image locally; pulling" >&2; echo 0123456789abcdef ;;
port) echo "0.0.0.0:` + addr[strings.LastIndex(addr, ":")+1:] + `"; echo "[::]:1" ;;
rm) echo "$3" ;;
*) echo "unexpected docker $1" >&2; exit 1 ;;
esac
`
	if err := os.WriteFile(filepath.Join(dir, "docker"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", dir+string(os.PathListSeparator)+os.Getenv("PATH"))
	t.Setenv("DOCKER_HOST", "unix://"+filepath.Join(dir, "docker.sock"))
	t.Setenv("KAFKAONCE_DOCKER", "")
	return calls
}

func TestAPostgresContainerIsRunReachedAndRemoved(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	real, err := StartPostgres(ctx, LocalFirst) // the server the fake engine "publishes"
	if err != nil {
		t.Fatal(err)
	}
	defer real.Close()
	u, err := url.Parse(real.URL)
	if err != nil {
		t.Fatal(err)
	}
	calls := fakeDocker(t, u.Host)

	if !probeDocker(ctx) {
		t.Fatal("probeDocker: false, want true with a docker command that answers")
	}
	pg, err := postgresContainerOn(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	if want := "127.0.0.1:" + u.Port(); !strings.Contains(pg.URL, "@"+want+"/") {
		t.Errorf("URL %s, want the published address %s", pg.URL, want)
	}
	if err := pg.Close(); err != nil {
		t.Fatal(err)
	}
	log, _ := os.ReadFile(calls)
	got := string(log)
	for _, want := range []string{
		"--publish 127.0.0.1::5432 --env POSTGRES_HOST_AUTH_METHOD=trust postgres:15-alpine postgres",
		"port kafkaonce-devenv-",
		"rm --force kafkaonce-devenv-",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("docker was not called with %q; calls:\n%s", want, got)
		}
	}
}

func TestDockerIsNotAskedWhenItCannotAnswer(t *testing.T) {
	calls := fakeDocker(t, "127.0.0.1:1")
	t.Setenv("KAFKAONCE_DOCKER", "off")
	if probeDocker(context.Background()) {
		t.Error("probeDocker with KAFKAONCE_DOCKER=off: true")
	}
	t.Setenv("KAFKAONCE_DOCKER", "")
	t.Setenv("DOCKER_HOST", "")
	t.Setenv("HOME", t.TempDir())
	t.Setenv("XDG_RUNTIME_DIR", "")
	if _, err := os.Stat("/var/run/docker.sock"); err != nil && probeDocker(context.Background()) {
		t.Error("probeDocker with no socket and no DOCKER_HOST: true")
	}
	t.Setenv("PATH", t.TempDir())
	t.Setenv("DOCKER_HOST", "unix:///nowhere")
	if probeDocker(context.Background()) {
		t.Error("probeDocker with no docker command: true")
	}
	if log, _ := os.ReadFile(calls); len(log) != 0 {
		t.Errorf("docker was run although it could not answer:\n%s", log)
	}
}

func TestAContainerThatNeverGetsReadyIsRemoved(t *testing.T) {
	calls := fakeDocker(t, "127.0.0.1:1") // nothing listens on port 1
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	if _, err := postgresContainerOn(ctx, 0); err == nil {
		t.Fatal("postgresContainer succeeded with nothing listening")
	} else if !strings.Contains(err.Error(), "Postgres container not ready") {
		t.Errorf("error %q does not say what was not ready", err)
	}
	if log, _ := os.ReadFile(calls); !strings.Contains(string(log), "rm --force kafkaonce-devenv-") {
		t.Errorf("the container was left running; calls:\n%s", log)
	}
}

// runContainer runs `docker run --detach --rm` under the caller's context
// and learns the container's id only from what the command prints. When
// the context ends while the command runs (Ctrl-C in a program that
// called devenv.Start with a signal context, Start's own deadline), the
// command is killed after the engine may have created and started the
// container: its id is never read, nothing removes it, and --rm only
// removes a container that exits, which a Postgres or Kafka server does
// not. Nothing names the container (no --name, --cidfile or --label), so
// it cannot be found afterwards either.
//
// The fake engine below creates the container (it logs "created") and
// then is slow to answer, as a start under load is; the caller's context
// ends first. Nothing asks the engine to remove what it made.
func TestAContainerStartedWhileTheContextEndsIsLeft(t *testing.T) {
	dir := t.TempDir()
	calls := filepath.Join(dir, "calls")
	script := `#!/bin/sh
echo "$*" >> ` + calls + `
case "$1" in
version) echo 27.3.1 ;;
run) echo "created 0123456789abcdef" >> ` + calls + `; exec sleep 30 ;;
rm|kill|stop) echo "$3" ;;
*) echo "unexpected docker $1" >&2; exit 1 ;;
esac
`
	if err := os.WriteFile(filepath.Join(dir, "docker"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", dir+string(os.PathListSeparator)+os.Getenv("PATH"))
	t.Setenv("DOCKER_HOST", "unix://"+filepath.Join(dir, "docker.sock"))
	t.Setenv("KAFKAONCE_DOCKER", "")

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if _, err := postgresContainerOn(ctx, 0); err == nil {
		t.Fatal("postgresContainer succeeded although its context ended during docker run")
	}
	log, _ := os.ReadFile(calls)
	t.Logf("docker calls:\n%s", log)
	if !strings.Contains(string(log), "created") {
		t.Fatal("the fake engine did not create the container")
	}
	for _, line := range strings.Split(string(log), "\n") {
		if strings.HasPrefix(line, "rm ") || strings.HasPrefix(line, "kill ") || strings.HasPrefix(line, "stop ") {
			return
		}
	}
	t.Error("the container the engine created while the context ended was never removed: it runs on after the program")
}
