package topo

import (
	"context"
	"encoding/json"
	"slices"
	"strings"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// Roles of Process.Role.
const (
	RoleRelay      = "relay"
	RoleRouter     = "router"
	RoleController = "controller"
)

// Process is a relay, router or controller as it registers itself under
// its lease, so that an operator sees which build every process of the
// cluster runs (GET /_cluster, `cortado cluster status`) during a rolling
// upgrade. Storage nodes register as NodeInfo instead. Processes of
// releases up to 99f8c6e register none.
type Process struct {
	Role string `json:"role"`
	ID   string `json:"id"`
	// URL is where the process is reached: a relay's log API, a router's
	// document API (its listen address); none for a controller.
	URL string `json:"url,omitempty"`
	// Build is the commit the binary was built from
	// (release.Info.Revision), Protocol the newest internal protocol
	// version it speaks.
	Build    string `json:"build,omitempty"`
	Protocol uint32 `json:"protocol,omitempty"`
}

// ProcessesPrefix holds one key a process: <prefix>/processes/<role>/<id>.
func ProcessesPrefix(prefix string) string { return prefix + "/processes/" }

// KV is the process's record, for PutLeased.
func (p Process) KV(prefix string) KV {
	v, _ := json.Marshal(p)
	return KV{Key: ProcessesPrefix(prefix) + p.Role + "/" + p.ID, Value: string(v)}
}

// RegisterProcess publishes p under a lease of ttlSeconds until ctx ends.
func RegisterProcess(ctx context.Context, cli *clientv3.Client, prefix string, p Process, ttlSeconds int) (*Registration, error) {
	kv := p.KV(prefix)
	return PutLeased(ctx, cli, kv.Key, kv.Value, ttlSeconds)
}

// Processes lists the registered relays, routers and controllers, by role
// and ID. A record it cannot read is listed by its key alone.
func Processes(ctx context.Context, cli *clientv3.Client, prefix string) ([]Process, error) {
	resp, err := cli.Get(ctx, ProcessesPrefix(prefix), clientv3.WithPrefix())
	if err != nil {
		return nil, err
	}
	out := make([]Process, 0, len(resp.Kvs))
	for _, kv := range resp.Kvs {
		var p Process
		if json.Unmarshal(kv.Value, &p) != nil {
			role, id, _ := strings.Cut(strings.TrimPrefix(string(kv.Key), ProcessesPrefix(prefix)), "/")
			p = Process{Role: role, ID: id}
		}
		out = append(out, p)
	}
	slices.SortFunc(out, func(a, b Process) int {
		if c := strings.Compare(a.Role, b.Role); c != 0 {
			return c
		}
		return strings.Compare(a.ID, b.ID)
	})
	return out, nil
}
