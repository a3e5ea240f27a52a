package docscheck

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

// docker-compose.yml parses, and names what its own header and the
// README tell a user to export: Apache Kafka in KRaft mode on
// localhost:9092 and Postgres on localhost:5432 with the password
// "postgres", each with a health check, so that docker compose up --wait
// returns once both answer. (Running it needs a container engine, which
// CI has not.)
func TestDockerComposeNamesKafkaAndPostgres(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join("..", "..", "docker-compose.yml"))
	if err != nil {
		t.Fatal(err)
	}
	var file struct {
		Services map[string]struct {
			Image       string            `yaml:"image"`
			Ports       []string          `yaml:"ports"`
			Environment map[string]string `yaml:"environment"`
			Healthcheck struct {
				Test []string `yaml:"test"`
			} `yaml:"healthcheck"`
		} `yaml:"services"`
	}
	if err := yaml.Unmarshal(raw, &file); err != nil {
		t.Fatalf("docker-compose.yml does not parse: %v", err)
	}
	header := string(raw)
	for _, c := range []struct {
		service, image, port, export string
		env                          map[string]string
	}{
		{"kafka", "apache/kafka:", "9092:9092", "KAFKA_BROKERS=localhost:9092",
			map[string]string{"KAFKA_PROCESS_ROLES": "broker,controller", "KAFKA_ADVERTISED_LISTENERS": "PLAINTEXT://localhost:9092"}},
		{"postgres", "postgres:", "5432:5432", "postgres://postgres:postgres@localhost:5432/",
			map[string]string{"POSTGRES_PASSWORD": "postgres"}},
	} {
		s, ok := file.Services[c.service]
		switch {
		case !ok:
			t.Errorf("docker-compose.yml has no service %q", c.service)
			continue
		case !strings.HasPrefix(s.Image, c.image):
			t.Errorf("service %s runs image %q, not %s…", c.service, s.Image, c.image)
		case !slices.Contains(s.Ports, c.port):
			t.Errorf("service %s publishes %q, not %s", c.service, s.Ports, c.port)
		case len(s.Healthcheck.Test) == 0:
			t.Errorf("service %s has no health check: docker compose up --wait would not wait for it", c.service)
		case !strings.Contains(header, c.export):
			t.Errorf("docker-compose.yml's header does not tell to export %s for service %s", c.export, c.service)
		}
		for k, v := range c.env {
			if s.Environment[k] != v {
				t.Errorf("service %s sets %s=%q, not %q", c.service, k, s.Environment[k], v)
			}
		}
	}
}
