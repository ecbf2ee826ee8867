package node

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"

	"github.com/cortado-db/cortado/internal/registry"
	"github.com/cortado-db/cortado/internal/schema"
	"github.com/cortado-db/cortado/internal/storage"
)

// The storage node's internal API: POST /_node/{get,multiget,scan,write,log,status,checksum}
// with the request as JSON, answered with the result as JSON or with a
// wireError. Routers reach remote nodes through it; nothing else should.

// wireError carries an error across the network so the router can map it
// exactly as it maps a local one.
type wireError struct {
	Kind    string `json:"kind"`
	Message string `json:"message"`
	Path    string `json:"path,omitempty"`
	Op      *int   `json:"op,omitempty"`
	Item    *Item  `json:"item,omitempty"` // the headers of a not-modified read
}

var wireKinds = []struct {
	kind string
	err  error
}{
	{"not-found", ErrNotFound},
	{"precondition-failed", ErrPreconditionFailed},
	{"not-modified", ErrNotModified},
	{"not-master", ErrNotMaster},
	{"not-enough-replicas", ErrNotEnoughReplicas},
	{"truncate-acknowledged", storage.ErrTruncateAcknowledged},
	{"drain-incomplete", ErrDrainIncomplete},
	{"storage-failed", storage.ErrFailed},
	{"not-replicated", ErrNotReplicated},
	{"too-stale", ErrTooStale},
	{"bad-patch", ErrBadPatch},
	{"no-database", registry.ErrNoDatabase},
	{"no-table", registry.ErrNoTable},
	{"no-version", registry.ErrNoVersion},
	{"deadline", context.DeadlineExceeded},
	{"passed", storage.ErrPassed},
}

func toWire(err error) wireError {
	w := wireError{Kind: "internal", Message: err.Error()}
	var oe *OpError
	if errors.As(err, &oe) {
		i := oe.Index
		w.Op = &i
	}
	var fe *schema.FieldError
	if errors.As(err, &fe) {
		w.Kind, w.Path, w.Message = "field", fe.Path, fe.Reason
		return w
	}
	for _, k := range wireKinds {
		if errors.Is(err, k.err) {
			w.Kind = k.kind
			return w
		}
	}
	return w
}

func (w wireError) err() error {
	var err error = &remoteError{msg: w.Message}
	if w.Kind == "field" {
		err = &schema.FieldError{Path: w.Path, Reason: w.Message}
	}
	for _, k := range wireKinds {
		if k.kind == w.Kind {
			err = &remoteError{msg: w.Message, is: k.err}
		}
	}
	if w.Op != nil {
		err = &OpError{Index: *w.Op, Err: err}
	}
	return err
}

// remoteError is an error reported by a remote node; it matches the
// sentinel it was made from with errors.Is.
type remoteError struct {
	msg string
	is  error
}

func (e *remoteError) Error() string { return e.msg }
func (e *remoteError) Unwrap() error { return e.is }

// LogHandler serves only POST /_node/log, with log: what a relay serves.
func LogHandler(log func(context.Context, LogRequest) (*LogResult, error)) http.Handler {
	mux := http.NewServeMux()
	handleCall(mux, "log", func(ctx context.Context, dec *json.Decoder) (any, error) {
		var req LogRequest
		if err := dec.Decode(&req); err != nil {
			return nil, err
		}
		return log(ctx, req)
	})
	return mux
}

// Handler serves this node's internal API.
func Handler(n *Node) http.Handler {
	mux := http.NewServeMux()
	handle := func(name string, do func(context.Context, *json.Decoder) (any, error)) {
		handleCall(mux, name, do)
	}
	handle("get", func(ctx context.Context, dec *json.Decoder) (any, error) {
		var req GetRequest
		if err := dec.Decode(&req); err != nil {
			return nil, err
		}
		return n.Get(ctx, req)
	})
	handle("multiget", func(ctx context.Context, dec *json.Decoder) (any, error) {
		var req MultiGetRequest
		if err := dec.Decode(&req); err != nil {
			return nil, err
		}
		return n.MultiGet(ctx, req)
	})
	handle("scan", func(ctx context.Context, dec *json.Decoder) (any, error) {
		var req ScanRequest
		if err := dec.Decode(&req); err != nil {
			return nil, err
		}
		return n.Scan(ctx, req)
	})
	handle("log", func(ctx context.Context, dec *json.Decoder) (any, error) {
		var req LogRequest
		if err := dec.Decode(&req); err != nil {
			return nil, err
		}
		return n.Log(ctx, req)
	})
	handle("ack", func(ctx context.Context, dec *json.Decoder) (any, error) {
		var req AckRequest
		if err := dec.Decode(&req); err != nil {
			return nil, err
		}
		return n.Ack(ctx, req)
	})
	handle("status", func(ctx context.Context, dec *json.Decoder) (any, error) {
		var req StatusRequest
		if err := dec.Decode(&req); err != nil {
			return nil, err
		}
		return n.Status(ctx, req)
	})
	handle("checksum", func(ctx context.Context, dec *json.Decoder) (any, error) {
		var req ChecksumRequest
		if err := dec.Decode(&req); err != nil {
			return nil, err
		}
		return n.Checksum(ctx, req)
	})
	handle("write", func(ctx context.Context, dec *json.Decoder) (any, error) {
		var req WriteRequest
		if err := dec.Decode(&req); err != nil {
			return nil, err
		}
		return n.Write(ctx, req)
	})
	return mux
}

// Remote is a storage node reached over its internal API.
type Remote struct {
	base string
	hc   *http.Client
}

// NewRemote returns the Service of the node at base (e.g.
// "http://10.0.0.5:7070").
func NewRemote(base string, hc *http.Client) *Remote {
	if hc == nil {
		hc = &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64, MaxConnsPerHost: 256}}
	}
	return &Remote{base: strings.TrimSuffix(base, "/"), hc: hc}
}

// NewLogRemote returns a Remote for log streams: many long-polls to one
// host at once (a relay serving every partition's slaves, a node's slaves
// reading through one relay), so no cap on connections per host, unlike
// NewRemote's pool for request traffic.
func NewLogRemote(base string) *Remote {
	return NewRemote(base, &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 4096}})
}

var _ Service = (*Remote)(nil)

func (r *Remote) call(ctx context.Context, name string, req, res any) error {
	body, err := json.Marshal(req)
	if err != nil {
		return err
	}
	hr, err := http.NewRequestWithContext(ctx, http.MethodPost, r.base+"/_node/"+name, bytes.NewReader(body))
	if err != nil {
		return err
	}
	hr.Header.Set("Content-Type", "application/json")
	resp, err := r.hc.Do(hr)
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		var op *net.OpError
		if errors.As(err, &op) && op.Op == "dial" {
			return fmt.Errorf("storage node %s: %w (%w): %v", r.base, ErrUnavailable, ErrNotDelivered, err)
		}
		return fmt.Errorf("storage node %s: %w: %v", r.base, ErrUnavailable, err)
	}
	defer resp.Body.Close()
	dec := json.NewDecoder(resp.Body)
	dec.UseNumber()
	switch resp.StatusCode {
	case http.StatusOK:
		return dec.Decode(res)
	case http.StatusConflict:
		var we wireError
		if err := dec.Decode(&we); err != nil {
			return fmt.Errorf("storage node %s: bad error body: %w", r.base, err)
		}
		if we.Item != nil {
			if it, ok := res.(**Item); ok {
				*it = we.Item
			}
		}
		return we.err()
	}
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	return fmt.Errorf("storage node %s: %s: %s", r.base, resp.Status, b)
}

// Get implements Service.
func (r *Remote) Get(ctx context.Context, req GetRequest) (*Item, error) {
	var it *Item
	err := r.call(ctx, "get", req, &it)
	return it, err
}

// MultiGet implements Service.
func (r *Remote) MultiGet(ctx context.Context, req MultiGetRequest) ([]*Item, error) {
	var items []*Item
	return items, r.call(ctx, "multiget", req, &items)
}

// Scan implements Service.
func (r *Remote) Scan(ctx context.Context, req ScanRequest) (*ScanResult, error) {
	var res ScanResult
	if err := r.call(ctx, "scan", req, &res); err != nil {
		return nil, err
	}
	return &res, nil
}

// Log implements LogSource.
func (r *Remote) Log(ctx context.Context, req LogRequest) (*LogResult, error) {
	var res LogResult
	if err := r.call(ctx, "log", req, &res); err != nil {
		return nil, err
	}
	return &res, nil
}

// Ack implements Acker.
func (r *Remote) Ack(ctx context.Context, req AckRequest) (*AckResult, error) {
	var res AckResult
	if err := r.call(ctx, "ack", req, &res); err != nil {
		return nil, err
	}
	return &res, nil
}

// Write implements Service.
func (r *Remote) Write(ctx context.Context, req WriteRequest) (*WriteResult, error) {
	var res WriteResult
	if err := r.call(ctx, "write", req, &res); err != nil {
		return nil, err
	}
	return &res, nil
}

// Status lists the remote node's partitions.
func (r *Remote) Status(ctx context.Context, req StatusRequest) ([]PartitionStatus, error) {
	var res []PartitionStatus
	return res, r.call(ctx, "status", req, &res)
}

// Checksum checksums a partition on the remote node.
func (r *Remote) Checksum(ctx context.Context, req ChecksumRequest) (*ChecksumResult, error) {
	var res ChecksumResult
	if err := r.call(ctx, "checksum", req, &res); err != nil {
		return nil, err
	}
	return &res, nil
}

// handleCall serves POST /_node/{name}: the request as JSON in, the result
// as JSON out, or a wireError with 409.
// maxCallBytes bounds an internal request body: a write carries at most
// a transaction of documents the router accepted (bodies of a few MiB),
// base64 in JSON.
const maxCallBytes = 64 << 20

func handleCall(mux *http.ServeMux, name string, do func(context.Context, *json.Decoder) (any, error)) {
	mux.HandleFunc("POST /_node/"+name, func(w http.ResponseWriter, r *http.Request) {
		dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxCallBytes))
		dec.UseNumber()
		res, err := do(r.Context(), dec)
		w.Header().Set("Content-Type", "application/json")
		if err != nil {
			we := toWire(err)
			if errors.Is(err, ErrNotModified) {
				we.Item, _ = res.(*Item)
			}
			w.WriteHeader(http.StatusConflict)
			json.NewEncoder(w).Encode(we)
			return
		}
		json.NewEncoder(w).Encode(res)
	})
}

// Remotes hands out one Remote per base URL, made on first use, so a
// caller that reaches many nodes reuses their connections. The zero value
// makes Remotes with NewRemote's request pool.
type Remotes struct {
	// New makes the Remote for a URL; nil is NewRemote(base, nil). Set it
	// before first use.
	New func(base string) *Remote

	mu sync.Mutex
	m  map[string]*Remote
}

// Get returns the Remote for base.
func (rs *Remotes) Get(base string) *Remote {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	r, ok := rs.m[base]
	if !ok {
		if rs.New != nil {
			r = rs.New(base)
		} else {
			r = NewRemote(base, nil)
		}
		if rs.m == nil {
			rs.m = map[string]*Remote{}
		}
		rs.m[base] = r
	}
	return r
}
