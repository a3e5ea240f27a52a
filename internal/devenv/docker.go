package devenv

import (
	"context"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/testcontainers/testcontainers-go"
)

var dockerOnce struct {
	sync.Once
	ok bool
}

// DockerAvailable reports whether a Docker engine answers. The answer is
// computed once per process; it costs nothing when no Docker socket exists.
func DockerAvailable() bool {
	dockerOnce.Do(func() { dockerOnce.ok = probeDocker() })
	return dockerOnce.ok
}

func probeDocker() bool {
	if os.Getenv("KAFKAONCE_DOCKER") == "off" {
		return false
	}
	if os.Getenv("DOCKER_HOST") == "" && !anyExists(dockerSockets()) {
		return false
	}
	p, err := testcontainers.NewDockerProvider()
	if err != nil {
		return false
	}
	defer p.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return p.Health(ctx) == nil
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
