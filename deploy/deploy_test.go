// Package deploy holds the files that run the sweeper elsewhere (compose,
// Kubernetes, Prometheus rules, a Grafana dashboard). Its test parses every one
// of them, so a file that its tool would refuse fails `make check-deploy`.
package deploy

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

func TestEveryFileParses(t *testing.T) {
	t.Parallel()
	n := 0
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		switch strings.ToLower(filepath.Ext(path)) {
		case ".yml", ".yaml":
			n++
			t.Run(path, func(t *testing.T) { parseYAML(t, path) })
		case ".json":
			n++
			t.Run(path, func(t *testing.T) {
				b, err := os.ReadFile(path)
				if err != nil {
					t.Fatal(err)
				}
				if !json.Valid(b) {
					var v any
					t.Fatalf("%s is not JSON: %v", path, json.Unmarshal(b, &v))
				}
			})
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if n < 4 {
		t.Fatalf("found %d deploy files, want at least the compose file, the manifest, the rules and the dashboard", n)
	}
}

// parseYAML decodes every document of the file (a Kubernetes manifest holds
// several) and fails on the first error, naming the line.
func parseYAML(t *testing.T, path string) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	dec := yaml.NewDecoder(bytes.NewReader(b))
	docs := 0
	for {
		var v any
		err := dec.Decode(&v)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		docs++
	}
	if docs == 0 {
		t.Fatalf("%s holds no YAML document", path)
	}
}
