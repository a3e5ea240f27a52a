package devenv

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"
)

// Containers are run through the docker command line rather than a Docker
// client library: the command is all a developer with Docker has anyway, and
// a client library would put dozens of modules into the go.mod of every
// module that imports kafkaonce's dev environment.

var dockerOnce struct {
	sync.Once
	ok bool
}

// DockerAvailable reports whether a Docker engine answers. The answer is
// computed once per process; it costs nothing when there is no docker
// command or no Docker socket.
func DockerAvailable() bool {
	dockerOnce.Do(func() { dockerOnce.ok = probeDocker(context.Background()) })
	return dockerOnce.ok
}

// probeDocker asks the engine for its version, bounded by a few seconds, so
// that a machine whose engine hangs never holds a test up.
func probeDocker(ctx context.Context) bool {
	if os.Getenv("KAFKAONCE_DOCKER") == "off" {
		return false
	}
	if _, err := exec.LookPath("docker"); err != nil {
		return false
	}
	if os.Getenv("DOCKER_HOST") == "" && !anyExists(dockerSockets()) {
		return false
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	_, err := docker(ctx, "version", "--format", "{{.Server.Version}}")
	return err == nil
}

func dockerSockets() []string {
	socks := []string{"/var/run/docker.sock"}
	if home, err := os.UserHomeDir(); err == nil {
		socks = append(socks, filepath.Join(home, ".docker", "run", "docker.sock"), filepath.Join(home, ".docker", "desktop", "docker.sock"))
	}
	if xdg := os.Getenv("XDG_RUNTIME_DIR"); xdg != "" {
		socks = append(socks, filepath.Join(xdg, "docker.sock"))
	}
	return socks
}

func anyExists(paths []string) bool {
	for _, p := range paths {
		if _, err := os.Stat(p); err == nil {
			return true
		}
	}
	return false
}

// docker runs the docker command and returns its standard output, trimmed.
// Its error carries what the command printed on standard error.
func docker(ctx context.Context, args ...string) (string, error) {
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, "docker", args...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("docker %s: %w: %s", args[0], err, strings.TrimSpace(stderr.String()))
	}
	return strings.TrimSpace(stdout.String()), nil
}

// container is a container this process started, by its name; remove
// stops and deletes it.
type container struct{ id string }

// runContainer starts image detached with args (flags before the image,
// then the command after it). The container gets a name of its own, so
// that it can be removed even when docker run fails or its context ends
// after the engine created it (the id it would have printed is then never
// read, and --rm only removes a container that exits, which a server does
// not).
func runContainer(ctx context.Context, flags []string, image string, command ...string) (*container, error) {
	var b [6]byte
	_, _ = rand.Read(b[:])
	c := &container{id: "kafkaonce-devenv-" + hex.EncodeToString(b[:])}
	args := append(append([]string{"run", "--detach", "--rm", "--name", c.id, "--label", "kafkaonce.devenv=1"}, flags...), image)
	if _, err := docker(ctx, append(args, command...)...); err != nil {
		_ = c.remove() // nothing to remove when the engine created nothing
		return nil, err
	}
	return c, nil
}

// hostAddr is the host address that port (as "5432/tcp") of the container
// is published on.
func (c *container) hostAddr(ctx context.Context, port string) (string, error) {
	out, err := docker(ctx, "port", c.id, port)
	if err != nil {
		return "", err
	}
	// One line per published address ("0.0.0.0:49153", "[::]:49153"): the
	// first IPv4 one, with a wildcard host read as loopback.
	for _, line := range strings.Split(out, "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "[") {
			continue
		}
		return strings.Replace(line, "0.0.0.0:", "127.0.0.1:", 1), nil
	}
	return "", fmt.Errorf("docker port %s %s printed no IPv4 address: %q", c.id, port, out)
}

func (c *container) remove() error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, err := docker(ctx, "rm", "--force", c.id)
	return err
}

// waitReady calls ready until it succeeds or d passes; the error names what
// was being waited for and the last failure.
func waitReady(ctx context.Context, d time.Duration, what string, ready func(context.Context) error) error {
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	start := time.Now()
	for {
		err := ready(ctx)
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s not ready after %v: %w", what, time.Since(start).Round(time.Second), err)
		case <-time.After(250 * time.Millisecond):
		}
	}
}
