package clustertest

import (
	"context"
	"fmt"
	"strings"
	"testing"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
)

// NewLink starts a toxiproxy proxy to upstream (host:port) on a free
// loopback port, for as long as the test: a process reached through it
// can be cut off the network. Its address stays the same across the
// processes' restarts.
func NewLink(t testing.TB, name, upstream string) *toxiproxy.Proxy {
	t.Helper()
	tp := toxiproxy.NewServer(toxiproxy.NewMetricsContainer(prometheus.NewRegistry()), zerolog.Nop())
	p := toxiproxy.NewProxy(tp, name, "127.0.0.1:0", upstream)
	if err := p.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Stop)
	return p
}

// Cut blackholes a link both ways: what is sent (on open connections and
// on new ones, which the proxy still accepts) is held until Mend, as a
// network partition holds it — no reset, no refusal, only silence.
func Cut(p *toxiproxy.Proxy) error {
	for _, stream := range []string{"upstream", "downstream"} {
		toxic := fmt.Sprintf(`{"name":"cut-%s","type":"timeout","stream":%q,"attributes":{"timeout":0}}`, stream, stream)
		if _, err := p.Toxics.AddToxicJson(strings.NewReader(toxic)); err != nil {
			return fmt.Errorf("cut %s: %w", p.Name, err)
		}
	}
	return nil
}

// Mend heals a cut link.
func Mend(p *toxiproxy.Proxy) error {
	for _, stream := range []string{"upstream", "downstream"} {
		if err := p.Toxics.RemoveToxic(context.Background(), "cut-"+stream); err != nil {
			return fmt.Errorf("mend %s: %w", p.Name, err)
		}
	}
	return nil
}
