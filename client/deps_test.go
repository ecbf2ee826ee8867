package client

import (
	"os/exec"
	"strings"
	"testing"
)

// TestNoServerDependencies keeps package client light for HTTP users: no
// storage engine, no etcd, no server. The embedded transport, which
// brings them, lives in client/embedded.
func TestNoServerDependencies(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", ".").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	for _, dep := range strings.Fields(string(out)) {
		for _, banned := range []string{"cockroachdb/pebble", "go.etcd.io/", "google.golang.org/grpc", "cortado/internal/server", "cortado/internal/node", "cortado/internal/router", "cortado/internal/storage"} {
			if strings.Contains(dep, banned) {
				t.Errorf("package client depends on %s", dep)
			}
		}
	}
}
