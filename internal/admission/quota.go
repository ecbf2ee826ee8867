package admission

import (
	"math"
	"sync"
	"time"
)

// HeaderClient names the client a request counts against for quotas.
const HeaderClient = "X-Cortado-Client"

// MaxClientID bounds a client name.
const MaxClientID = 128

// QuotaOptions configure per-client quotas: each client (X-Cortado-Client)
// may make Rate requests a second on average, Burst at once. Requests
// that name no client share the quota of client "". Zero Rate: off.
type QuotaOptions struct {
	Rate  float64
	Burst float64 // default: one second's worth, at least 1
	// MaxClients bounds the clients tracked (default 10,000): when full,
	// clients idle for a minute are forgotten (looked for at most once a
	// second), and a new client beyond that shares the quota of the
	// others it cannot be told apart from.
	MaxClients int
}

// Quotas are token buckets per client.
type Quotas struct {
	opts QuotaOptions
	mu   sync.Mutex
	m    map[string]*bucket
	// swept is when idle clients were last looked for: once a second at
	// most, since a look walks every client under mu, and names are the
	// caller's to choose (a stream of new names would otherwise have
	// every request walk them all).
	swept time.Time
}

type bucket struct {
	tokens float64
	last   time.Time
}

// NewQuotas returns per-client quotas, nil when o.Rate is zero (off).
func NewQuotas(o QuotaOptions) *Quotas {
	if o.Rate <= 0 {
		return nil
	}
	if o.Burst < 1 {
		o.Burst = math.Max(1, o.Rate)
	}
	if o.MaxClients == 0 {
		o.MaxClients = 10000
	}
	return &Quotas{opts: o, m: map[string]*bucket{}}
}

// overflow is the bucket clients share once MaxClients are tracked.
const overflow = "\x00overflow"

// Take spends one request of client's quota; when there is none it
// returns how long until there is.
func (q *Quotas) Take(client string, now time.Time) (ok bool, retryAfter time.Duration) {
	if q == nil {
		return true, 0
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	b := q.m[client]
	if b == nil {
		if len(q.m) >= q.opts.MaxClients && now.Sub(q.swept) >= time.Second {
			q.swept = now
			for c, o := range q.m {
				if now.Sub(o.last) > time.Minute {
					delete(q.m, c)
				}
			}
		}
		if len(q.m) >= q.opts.MaxClients {
			client = overflow
			b = q.m[client]
		}
		if b == nil {
			b = &bucket{tokens: q.opts.Burst, last: now}
			q.m[client] = b
		}
	}
	b.tokens = math.Min(q.opts.Burst, b.tokens+now.Sub(b.last).Seconds()*q.opts.Rate)
	b.last = now
	if b.tokens < 1 {
		return false, time.Duration((1 - b.tokens) / q.opts.Rate * float64(time.Second))
	}
	b.tokens--
	return true, 0
}
