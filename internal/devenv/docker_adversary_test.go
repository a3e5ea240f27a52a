package devenv

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

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
func TestAdversaryAContainerStartedWhileTheContextEndsIsLeft(t *testing.T) {
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
	if _, err := postgresContainer(ctx); err == nil {
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
